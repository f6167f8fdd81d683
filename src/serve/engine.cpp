// The serving engine: admission, prefill, batched decoding steps and streaming text (see engine.h).
#include "serve/engine.h"

#include <algorithm>
#include <cmath>
#include <iostream>

#include "io/error.h"
#include "serve/batched_decode.h"

namespace linearize {

const char* finish_reason(Finish f) {
  switch (f) {
    case Finish::stop: return "stop";
    case Finish::length: return "length";
    case Finish::cancelled: return "cancelled";
    case Finish::running: break;
  }
  return "running";
}

void Generation::post(const std::string& text, Finish finish, int64_t completion_tokens) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ += text;
    if (finish_ == Finish::running) finish_ = finish;
    completion_tokens_ = completion_tokens;
  }
  cv_.notify_all();
}

Generation::Update Generation::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !pending_.empty() || finish_ != Finish::running; });
  Update u;
  u.text.swap(pending_);
  u.finish = finish_;
  u.prompt_tokens = prompt_tokens_;
  u.completion_tokens = completion_tokens_;
  return u;
}

void Generation::cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancel_ = true;
}

bool Generation::cancelled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancel_;
}

struct Engine::Sequence {
  Sequence(std::shared_ptr<Generation> g, GenerationRequest r, const Tokenizer& tok)
      : client(std::move(g)), request(std::move(r)), sampler(request.sampling), decoder(tok) {}
  std::shared_ptr<Generation> client;
  GenerationRequest request;
  Sampler sampler;
  StreamDecoder decoder;
  ModelState state;
  std::string text;  // the completion decoded so far
  size_t sent = 0;   // bytes of text given to the client
  int32_t next = -1;  // the token to feed at the next step
  int64_t generated = 0, reserved = 0;
};

Engine::Engine(CausalLM model, std::shared_ptr<const Tokenizer> tokenizer, const EngineOptions& options)
    : model_(std::move(model)), tok_(std::move(tokenizer)), options_(options) {
  if (options_.max_sequences < 1) throw Error("--max-sequences must be at least 1");
  if (options_.max_queue < 0) throw Error("--max-queue must be 0 or more");
  if (options_.max_prefill_tokens < 0) throw Error("--max-prefill-tokens must be 0 (automatic) or more");
  if (!(options_.max_memory_gib >= 0) || !std::isfinite(options_.max_memory_gib))
    throw Error("--max-memory-gib must be 0 (no limit) or positive");
  model_->eval();
  max_context_ = options_.max_context > 0 ? options_.max_context : model_->config.max_position_embeddings;
  budget_ = static_cast<int64_t>(options_.max_memory_gib * 1024.0 * 1024.0 * 1024.0);
  // What a sequence's state weighs: a fixed part (student mixers) and KV entries per token (attention).
  {
    torch::NoGradGuard no_grad;
    ModelState probe = model_->new_state();
    const auto device = model_->lm_head_weight().device();
    model_->forward(torch::zeros({1, 1}, torch::TensorOptions().dtype(torch::kLong).device(device)), &probe);
    for (int64_t l = 0; l < model_->num_layers(); ++l) {
      const auto& s = probe[static_cast<size_t>(l)];
      if (model_->layer(l)->mixer->kind() == "softmax_attention") {
        const auto k = s.get("k");
        bytes_per_token_ += 2 * k.size(1) * k.size(3) * static_cast<int64_t>(k.element_size());
      } else {
        fixed_bytes_ += s.bytes();
      }
    }
  }
  if (options_.max_prefill_tokens == 0)
    options_.max_prefill_tokens = model_->lm_head_weight().device().is_cpu() ? 1 : 8192;
  batch_ = std::make_unique<DecodeBatch>(model_, options_.graphs);
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() { shutdown(); }

int64_t Engine::state_bytes_for(int64_t tokens) const {
  const int64_t block = 256;  // the KV cache grows in blocks of 256 entries (model/llama.cpp)
  return fixed_bytes_ + bytes_per_token_ * ((tokens + block - 1) / block * block);
}

std::shared_ptr<Generation> Engine::submit(GenerationRequest request) {
  if (request.prompt.empty()) throw RequestRefused(400, "the prompt is empty", "prompt");
  if (request.max_tokens < 1) throw RequestRefused(400, "max_tokens must be at least 1", "max_tokens");
  const int64_t total = static_cast<int64_t>(request.prompt.size()) + request.max_tokens;
  if (total > max_context_)
    throw RequestRefused(400,
                         "the prompt (" + std::to_string(request.prompt.size()) + " tokens) plus max_tokens (" +
                             std::to_string(request.max_tokens) + ") is over this server's context of " +
                             std::to_string(max_context_) + " tokens",
                         static_cast<int64_t>(request.prompt.size()) >= max_context_ ? "prompt" : "max_tokens");
  const int64_t need = state_bytes_for(total);
  if (budget_ > 0 && need > budget_)
    throw RequestRefused(400,
                         "the sequence's state needs " + std::to_string(need) + " bytes, over the server's " +
                             std::to_string(budget_) + " (--max-memory-gib)",
                         "max_tokens");
  auto client = std::make_shared<Generation>();
  client->prompt_tokens_ = static_cast<int64_t>(request.prompt.size());
  auto seq = std::make_unique<Sequence>(client, std::move(request), *tok_);
  seq->reserved = need;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) throw RequestRefused(503, "the server is shutting down", "");
    // A request that a free slot will take at the next step does not count as waiting.
    const int64_t free_slots = std::max<int64_t>(0, options_.max_sequences - running_count_);
    if (static_cast<int64_t>(waiting_.size()) >= options_.max_queue + free_slots)
      throw RequestRefused(429,
                           "the server is busy: " + std::to_string(running_count_) + " sequences running and " +
                               std::to_string(waiting_.size()) + " requests waiting (--max-queue); try again later",
                           "");
    waiting_.push_back(std::move(seq));
  }
  cv_.notify_all();
  return client;
}

void Engine::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

double Engine::warm_up() {
  const auto t0 = std::chrono::steady_clock::now();
  if (max_context_ < 3) return 0;  // no request of its size fits
  GenerationRequest r;
  r.prompt = {0};
  r.max_tokens = 2;  // a prefill and one decoding step
  auto g = submit(std::move(r));
  while (g->wait(std::chrono::milliseconds(100)).finish == Finish::running) {
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Engine::Stats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s;
  s.running = running_count_;
  s.waiting = static_cast<int64_t>(waiting_.size());
  s.reserved_bytes = reserved_;
  s.budget_bytes = budget_;
  s.steps = steps_;
  s.tokens = tokens_;
  return s;
}

namespace {

// Bytes at the end of `text` that could be the start of a stop string (held back while streaming).
size_t stop_prefix_at_end(const std::string& text, size_t from, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const auto& s : stops)
    for (size_t n = std::min(s.size() - 1, text.size() - from); n > hold; --n)
      if (text.compare(text.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
  return hold;
}

}  // namespace

bool Engine::emit(Sequence& s, int32_t token) {
  ++s.generated;
  const auto& r = s.request;
  const bool stop_id = std::find(r.stop_ids.begin(), r.stop_ids.end(), token) != r.stop_ids.end();
  // Ids past the tokenizer's vocabulary (chat markers added by sft) are not text.
  if (!stop_id && token < tok_->vocab_size()) s.text += s.decoder.push(token);
  Finish finish = Finish::running;
  size_t cut = std::string::npos;
  for (const auto& stop : r.stop) {
    const size_t from = s.sent >= stop.size() ? s.sent - stop.size() + 1 : 0;
    const size_t at = s.text.find(stop, from);
    if (at != std::string::npos) cut = std::min(cut, at);
  }
  if (cut != std::string::npos) {
    s.text.resize(std::max(cut, s.sent));
    finish = Finish::stop;
  } else if (stop_id || s.generated >= r.max_tokens) {
    s.text += s.decoder.flush();
    finish = stop_id ? Finish::stop : Finish::length;
  }
  size_t upto = s.text.size();
  if (finish == Finish::running) upto -= stop_prefix_at_end(s.text, s.sent, r.stop);
  else release(s);  // before the client hears of the end, so that what it reads next is settled
  s.client->post(s.text.substr(s.sent, upto - s.sent), finish, s.generated);
  s.sent = upto;
  s.next = token;
  return finish != Finish::running;
}

void Engine::admit(std::vector<std::unique_ptr<Sequence>>& group) {
  std::vector<const std::vector<int32_t>*> prompts;
  std::vector<ModelState*> states;
  for (auto& s : group) {
    prompts.push_back(&s->request.prompt);
    states.push_back(&s->state);
    // The completion's first piece decodes as it would after the text it continues (as `generate` prints it).
    for (int32_t id : s->request.decode_after) s->decoder.push(id);
  }
  const auto logits = prefill_rows(model_, prompts, states);  // [N, V]
  std::vector<Sampler*> samplers;
  for (auto& s : group) samplers.push_back(&s->sampler);
  const auto next = next_tokens(logits, samplers);
  for (size_t i = 0; i < group.size(); ++i)
    if (emit(*group[i], static_cast<int32_t>(next[i]))) group[i].reset();
}

// By prompt length, each group's shortest prompt at least half its longest (the shared batch covers half
// of every prompt or more) and its shared batch within max_prefill_tokens.
std::vector<std::vector<std::unique_ptr<Engine::Sequence>>> Engine::prefill_groups(
    std::vector<std::unique_ptr<Sequence>> joining) const {
  std::stable_sort(joining.begin(), joining.end(),
                   [](const auto& a, const auto& b) { return a->request.prompt.size() < b->request.prompt.size(); });
  std::vector<std::vector<std::unique_ptr<Sequence>>> groups;
  for (auto& s : joining) {
    const auto n = static_cast<int64_t>(s->request.prompt.size());
    if (!groups.empty()) {
      auto& g = groups.back();
      const auto shortest = static_cast<int64_t>(g.front()->request.prompt.size());
      if (2 * shortest >= n && (static_cast<int64_t>(g.size()) + 1) * (shortest - 1) <= options_.max_prefill_tokens) {
        g.push_back(std::move(s));
        continue;
      }
    }
    groups.emplace_back();
    groups.back().push_back(std::move(s));
  }
  return groups;
}

void Engine::release(Sequence& s) {
  std::lock_guard<std::mutex> lock(mu_);
  reserved_ -= s.reserved;
  --running_count_;
}

void Engine::end_cancelled(Sequence& s) {
  release(s);
  s.client->post("", Finish::cancelled, s.generated);
}

void Engine::loop() {
  while (true) {
    std::vector<std::unique_ptr<Sequence>> joining;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !waiting_.empty() || !running_.empty(); });
      if (stop_) break;
      while (!waiting_.empty() && running_count_ < options_.max_sequences &&
             (budget_ == 0 || reserved_ + waiting_.front()->reserved <= budget_)) {
        reserved_ += waiting_.front()->reserved;
        ++running_count_;
        joining.push_back(std::move(waiting_.front()));
        waiting_.pop_front();
      }
    }
    std::vector<std::unique_ptr<Sequence>> prefill;
    for (auto& s : joining) {
      if (s->client->cancelled()) end_cancelled(*s);
      else prefill.push_back(std::move(s));
    }
    for (auto& group : prefill_groups(std::move(prefill))) {
      try {
        admit(group);  // releases what finishes at its first token
      } catch (const std::exception& e) {
        std::cerr << "[serve] " << group.size() << " request(s) failed in prefill: " << e.what() << "\n";
        for (auto& s : group)
          if (s) end_cancelled(*s), s.reset();
      }
      for (auto& s : group)
        if (s) running_.push_back(std::move(s));
    }
    // Clients that left give their slot back before the step (their states are written back first:
    // the batch holds views of them).
    bool leaving = false;
    for (auto& s : running_) leaving = leaving || s->client->cancelled();
    if (leaving) batch_->flush();
    for (auto& s : running_)
      if (s->client->cancelled()) {
        end_cancelled(*s);
        s.reset();
      }
    running_.erase(std::remove(running_.begin(), running_.end(), nullptr), running_.end());
    if (running_.empty()) continue;

    std::vector<DecodeRow> rows;
    for (auto& s : running_) rows.push_back({&s->state, s->next});
    torch::Tensor logits;
    try {
      logits = batch_->step(rows);
    } catch (const std::exception& e) {
      std::cerr << "[serve] a decoding step failed: " << e.what() << "\n";
      batch_->forget();
      for (auto& s : running_) end_cancelled(*s);
      running_.clear();
      continue;
    }
    std::vector<Sampler*> samplers;
    for (auto& s : running_) samplers.push_back(&s->sampler);
    const auto next = next_tokens(logits, samplers);  // one transfer from the device per step
    std::vector<bool> finished(running_.size());
    for (size_t i = 0; i < running_.size(); ++i) finished[i] = emit(*running_[i], static_cast<int32_t>(next[i]));
    if (std::find(finished.begin(), finished.end(), true) != finished.end()) {
      batch_->flush();  // before any state it holds views of goes
      for (size_t i = 0; i < running_.size(); ++i)
        if (finished[i]) running_[i].reset();
    }
    running_.erase(std::remove(running_.begin(), running_.end(), nullptr), running_.end());
    std::lock_guard<std::mutex> lock(mu_);
    ++steps_;
    tokens_ += static_cast<int64_t>(rows.size());
  }
  // Shutdown: everything queued or in flight ends as cancelled.
  batch_->forget();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& s : waiting_) s->client->post("", Finish::cancelled, 0);
  for (auto& s : running_) s->client->post("", Finish::cancelled, s->generated);
  waiting_.clear();
  running_.clear();
  running_count_ = 0;
  reserved_ = 0;
}

}  // namespace linearize
