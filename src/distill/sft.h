// Supervised fine-tuning (docs/design.md, "Post-training"): conversations in the ChatML template, next-token
// cross-entropy on assistant tokens only, through the shared training loop (checkpoints, exact
// resume, metrics.jsonl). Works for a Llama teacher and for any student folder.
//
//   loss = sum_t mask_t * CE(logits_t, target_t) / sum_t mask_t      (per micro-batch)
// mask_t = 1 when target t is an assistant token (or the <|im_end|> closing a reply) of the same
// document as input t. With packing, the model runs with hidden_states_packed: the teacher's
// attention is block-diagonal, students restart every state at each document boundary.
//
// When the tokenizer has no <|im_start|> / <|im_end|>, they are added as special tokens with new ids
// after the model's vocabulary: the embedding (and an untied LM head) grow by those rows, initialised
// to the mean of the existing rows; the output folder's tokenizer.json (byte-level BPE) and
// tokenizer_config.json ("added_tokens_decoder", read back for SentencePiece models) record them.
#pragma once
#include <string>
#include <vector>

#include "io/chat_template.h"
#include "model/causal_lm.h"
#include "train/trainer.h"

namespace linearize {

struct SftOptions {
  std::string model;   // teacher or student folder
  std::string data;    // jsonl conversations / instruction records
  std::string out;     // fine-tuned folder (also holds checkpoints and metrics.jsonl)
  std::string system;  // default system prompt for conversations without one
  bool system_given = false;  // false: the folder's template default (if any)
  int64_t seq_len = 1024;
  double epochs = 1;
  bool packing = false;
  int64_t max_steps = 0;  // 0: epochs decide
  TrainLoopOptions loop = loop_with_schedule(ScheduleKind::cosine, 3e-4);
};

struct SftResult {
  double loss_before = 0, loss_after = 0;  // mean assistant-token CE on the first (up to) 16 rows
  int64_t steps = 0;
  bool finished = false;
};

SftResult run_sft(const SftOptions& options);

// Per-target next-token CE of rows [B, 3, T+1] (sft_data.h): loss [B, T] fp32, mask [B, T] (1 where
// the target counts), doc [B, T] (document index of each target).
struct TokenLosses {
  torch::Tensor loss, mask, doc;
};
TokenLosses sft_token_losses(CausalLM& model, const torch::Tensor& rows, bool packed);

// The chat markers of `model` + tokenizer (folder: where added ids are recorded). Missing markers are
// added (the model grows, see above) and their contents listed in *added.
ChatTokens prepare_chat_tokens(CausalLM& model, const Tokenizer& tok, const std::string& folder,
                               std::vector<std::pair<std::string, int32_t>>* added);

// A copy of `model` with vocab_size rows of embedding / LM head; new rows = mean of the old ones.
CausalLM grow_vocab(CausalLM& model, int64_t vocab_size);

// Records added tokens in folder's tokenizer.json / tokenizer_config.json and puts the ChatML
// template into tokenizer_config.json when it has none.
void write_chat_tokenizer_files(const std::string& folder, const std::vector<std::pair<std::string, int32_t>>& added);

// Ids sequences start with: BOS for SentencePiece tokenizers (as generate does), none otherwise.
std::vector<int32_t> chat_prefix(const LlamaConfig& config, const Tokenizer& tok);

}  // namespace linearize
