// Chat session (see chat.h).
#include "infer/chat.h"

#include <algorithm>

#include "distill/sft.h"
#include "io/error.h"

namespace linearize {

ChatTokens chat_tokens(const Tokenizer& tok, const std::string& folder, const LlamaConfig& config) {
  auto s = find_added_token(tok, folder, kImStart), e = find_added_token(tok, folder, kImEnd);
  if (!s || !e)
    throw Error(folder + ": the tokenizer has no <|im_start|> / <|im_end|> tokens; fine-tune the model with "
                "`linearize sft` first (it adds them)");
  if (std::max(*s, *e) >= config.vocab_size)
    throw Error(folder + ": chat token ids exceed the model's vocab_size " + std::to_string(config.vocab_size));
  return {*s, *e, chat_prefix(config, tok)};
}

ChatSession::ChatSession(CausalLM model, const Tokenizer& tok, const std::string& folder, const ChatOptions& options)
    : model_(std::move(model)), tok_(tok), options_(options) {
  marks_ = chat_tokens(tok, folder, model_->config);
  state_ = model_->new_state();
  std::vector<int32_t> first = marks_.prefix;
  if (!options_.system.empty()) encode_message({"system", options_.system}, tok_, marks_, &first);
  feed(first);
  start_state_ = state_;  // a copy is a snapshot (layer_state.h)
  start_ids_ = ids_;
}

void ChatSession::feed(const std::vector<int32_t>& ids) {
  if (ids.empty()) return;
  torch::NoGradGuard ng;
  const auto device = model_->lm_head_weight().device();
  auto t = torch::tensor(std::vector<int64_t>(ids.begin(), ids.end()), torch::kLong).to(device).unsqueeze(0);
  model_->hidden_states(t, &state_);
  ids_.insert(ids_.end(), ids.begin(), ids.end());
}

std::string ChatSession::reply(const std::string& user_text, const std::function<void(const std::string&)>& on_text) {
  std::vector<int32_t> turn;
  encode_message({"user", user_text}, tok_, marks_, &turn);
  auto g = encode_generation_prompt(tok_, marks_);
  turn.insert(turn.end(), g.begin(), g.end());

  GenerateOptions go;
  go.max_new_tokens = options_.max_new_tokens;
  go.sampling = options_.sampling;
  go.stop_ids = {marks_.im_end, marks_.im_start};
  for (auto id : model_->config.eos_token_ids) go.stop_ids.push_back(static_cast<int32_t>(id));
  StreamDecoder decoder(tok_);
  std::string text;
  auto on_token = [&](int32_t id) {
    if (std::find(go.stop_ids.begin(), go.stop_ids.end(), id) != go.stop_ids.end() || id >= tok_.vocab_size()) return;
    auto piece = decoder.push(id);
    text += piece;
    if (on_text && !piece.empty()) on_text(piece);
  };
  // generate() encodes `turn` from the state and leaves the state after the last token it fed.
  auto out = generate(model_, turn, go, on_token, &state_);
  auto rest = decoder.flush();
  text += rest;
  if (on_text && !rest.empty()) on_text(rest);
  ids_.insert(ids_.end(), turn.begin(), turn.end());
  // The reply's tokens except the last one are in the state; close the message with <|im_end|>\n.
  std::vector<int32_t> body(out.begin(), out.end());
  if (!body.empty() && std::find(go.stop_ids.begin(), go.stop_ids.end(), body.back()) != go.stop_ids.end())
    body.pop_back();
  std::vector<int32_t> tail;  // fed now: the last generated token (when not a stop) + closing
  if (!out.empty() && body.size() == out.size()) tail.push_back(body.back());
  ids_.insert(ids_.end(), body.begin(), body.end() - static_cast<int64_t>(tail.size()));
  tail.push_back(marks_.im_end);
  auto nl = tok_.encode("\n", false);
  tail.insert(tail.end(), nl.begin(), nl.end());
  feed(tail);
  conversation_.push_back({"user", user_text});
  conversation_.push_back({"assistant", text});
  return text;
}

void ChatSession::reset() {
  state_ = start_state_;
  ids_ = start_ids_;
  conversation_.clear();
}

int64_t ChatSession::state_bytes() const { return linearize::state_bytes(state_); }

}  // namespace linearize
