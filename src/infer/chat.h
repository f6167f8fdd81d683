// A chat session over any CausalLM: the ChatML template applied turn by turn, replies streamed as
// they are generated, and the model state carried from turn to turn so that no token is ever
// encoded twice. For a student that state is constant in size (matrix states and conv buffers);
// for a teacher it is the KV cache.
//
// Turn k feeds  <|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n  through the state,
// generates until <|im_end|> (or the token limit), then feeds the closing  <|im_end|>\n  so the state
// again ends at a message boundary. ids() is the whole conversation so far, exactly what
// encode_chat() would give for it; a fresh encode of ids() reaches the same state.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "infer/generate.h"
#include "io/chat_template.h"
#include "io/tokenizer.h"
#include "model/causal_lm.h"

namespace linearize {

// The chat markers of a model folder's tokenizer and the ids every conversation starts with; an Error naming
// the folder when it has none (`linearize sft` adds them).
ChatTokens chat_tokens(const Tokenizer& tok, const std::string& model_folder, const LlamaConfig& config);

struct ChatOptions {
  std::string system;           // system prompt ("" = none)
  int64_t max_new_tokens = 256;  // per reply
  SamplingOptions sampling;      // greedy by default
};

class ChatSession {
 public:
  // `model_folder` is where added chat tokens are looked up (tokenizer_config.json). Throws when the
  // tokenizer has no <|im_start|> / <|im_end|> (run `linearize sft` first).
  ChatSession(CausalLM model, const Tokenizer& tok, const std::string& model_folder, const ChatOptions& options);

  // Appends the user's message, streams the reply's text through on_text, returns the reply.
  std::string reply(const std::string& user_text, const std::function<void(const std::string&)>& on_text = nullptr);
  // Back to the state after the system prompt (a snapshot taken once).
  void reset();

  const std::vector<int32_t>& ids() const { return ids_; }
  const Conversation& conversation() const { return conversation_; }
  const ChatTokens& marks() const { return marks_; }
  int64_t state_bytes() const;

 private:
  void feed(const std::vector<int32_t>& ids);
  CausalLM model_;
  const Tokenizer& tok_;
  ChatOptions options_;
  ChatTokens marks_;
  ModelState state_, start_state_;
  std::vector<int32_t> ids_, start_ids_;
  Conversation conversation_;
};

}  // namespace linearize
