// The serving engine behind `linearize serve`: requests queue, join the batch between steps, and advance
// together one token per step (continuous batching, serve/batched_decode.h); each request's text streams
// out as it is decoded. A student's state per sequence is fixed in size; a teacher's KV cache grows with
// the sequence, so admission reserves each sequence's state at its full length (prompt + max_tokens)
// against --max-memory-gib. One thread owns the model; clients talk to it through Generation handles.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "infer/sampler.h"
#include "io/tokenizer.h"
#include "model/causal_lm.h"
#include "serve/batched_decode.h"

namespace linearize {

struct EngineOptions {
  int64_t max_sequences = 64;  // sequences in flight (decoded together) at most
  int64_t max_queue = 256;     // requests waiting for a slot at most; more are refused
  double max_memory_gib = 0;   // the states of the sequences in flight at most (0: no limit)
  int64_t max_context = 0;     // prompt + max_tokens at most (0: the model's max_position_embeddings)
  // Prompts that join together are prefilled together (serve/batched_decode.h, prefill_rows) in groups of
  // similar lengths whose shared batch holds at most this many tokens (1: each prompt alone). 0: 8192 on a
  // GPU, 1 on the CPU, where batching measured from 45% slower (GLA) to 25% faster (Gated DeltaNet) on two
  // cores (docs/serve.md).
  int64_t max_prefill_tokens = 0;
  // Students on a GPU step through captured CUDA graphs, one per batch size used (serve/batched_decode.h);
  // off: eager steps, a launch per kernel.
  DecodeGraphs graphs = DecodeGraphs::on;
};

struct GenerationRequest {
  std::vector<int32_t> prompt;  // non-empty
  int64_t max_tokens = 16;
  SamplingOptions sampling;
  std::vector<int32_t> stop_ids;  // ending tokens (not part of the text)
  std::vector<std::string> stop;  // ending strings (not part of the text)
  // Ids the completion's text continues (decoded first, not returned): the prompt's text for a
  // completion, nothing for a chat reply.
  std::vector<int32_t> decode_after;
};

// A request the engine cannot take: `status` 400 (can never fit) or 429 (queue full), `param` the field.
struct RequestRefused : std::runtime_error {
  RequestRefused(int status, const std::string& message, const std::string& param)
      : std::runtime_error(message), status(status), param(param) {}
  int status;
  std::string param;
};

enum class Finish { running, stop, length, cancelled };
const char* finish_reason(Finish f);  // "stop", "length", "cancelled"

// One request as its client sees it.
class Generation {
 public:
  struct Update {
    std::string text;  // decoded since the previous update
    Finish finish = Finish::running;
    int64_t prompt_tokens = 0, completion_tokens = 0;
  };
  // Waits up to `timeout` for new text or the end; returns what came (possibly nothing yet).
  Update wait(std::chrono::milliseconds timeout);
  // The client has gone: the sequence is dropped before the next step.
  void cancel();
  bool cancelled() const;

 private:
  friend class Engine;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string pending_;
  Finish finish_ = Finish::running;
  bool cancel_ = false;
  int64_t prompt_tokens_ = 0, completion_tokens_ = 0;
  void post(const std::string& text, Finish finish, int64_t completion_tokens);
};

class Engine {
 public:
  Engine(CausalLM model, std::shared_ptr<const Tokenizer> tokenizer, const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request; throws RequestRefused when it can never fit or the queue is full.
  std::shared_ptr<Generation> submit(GenerationRequest request);
  // Cancels everything queued or in flight and stops the loop (the destructor does too).
  void shutdown();
  // Runs one short request through the model and waits for it, so that the device's start-up work
  // (loading kernels, library handles, the first CUDA graph) is done before the first client comes.
  // Returns its seconds.
  double warm_up();

  struct Stats {
    int64_t running = 0, waiting = 0;
    int64_t reserved_bytes = 0, budget_bytes = 0;  // budget 0: no limit
    int64_t steps = 0, tokens = 0;                 // batched steps and tokens generated so far
  };
  Stats stats() const;
  int64_t max_context() const { return max_context_; }
  const EngineOptions& options() const { return options_; }
  // State bytes reserved for a sequence of `tokens` tokens.
  int64_t state_bytes_for(int64_t tokens) const;

 private:
  struct Sequence;
  void loop();
  // Prefills the sequences (joining together) and emits each one's first token; those already finished
  // at it are released and set to null.
  void admit(std::vector<std::unique_ptr<Sequence>>& group);
  // Sequences joining together, in groups to prefill together.
  std::vector<std::vector<std::unique_ptr<Sequence>>> prefill_groups(std::vector<std::unique_ptr<Sequence>> joining) const;
  bool emit(Sequence& s, int32_t token);  // true: finished (and released)
  void release(Sequence& s);              // gives back its slot and reserved memory
  void end_cancelled(Sequence& s);        // released, and its client told it was cancelled

  CausalLM model_;
  std::shared_ptr<const Tokenizer> tok_;
  EngineOptions options_;
  int64_t max_context_ = 0, fixed_bytes_ = 0, bytes_per_token_ = 0, budget_ = 0;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;  // touched by the loop thread only
  std::unique_ptr<DecodeBatch> batch_;              // their states, stacked while they stay the same
  int64_t running_count_ = 0, reserved_ = 0, steps_ = 0, tokens_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace linearize
