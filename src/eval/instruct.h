// Instruction following, as the self-instruct paper measured it: for each held-out item the model
// answers greedily in the chat template, and the answer is compared with the reference output by
// ROUGE-L F-measure; the score is the mean over items.
//
// ROUGE-L (as rouge_score with its default tokenizer, no stemming): text is lower-cased, every
// character outside [a-z0-9] becomes a space, tokens are the whitespace-separated words.
//   LCS = longest common subsequence length of the two token lists
//   P = LCS / |prediction|, R = LCS / |reference|, F = 2PR / (P + R)   (0 when LCS = 0)
// Items come from self-instruct files (instruction + instances; the first instance of each record)
// or any file read_conversations accepts (the last assistant message is the reference).
#pragma once
#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

#include "model/causal_lm.h"
#include "io/tokenizer.h"

namespace linearize {

std::vector<std::string> rouge_tokens(const std::string& text);
double rouge_l_f(const std::string& prediction, const std::string& reference);

struct InstructOptions {
  std::string data;       // jsonl of held-out items
  int64_t limit = 0;      // 0: all
  int64_t max_new_tokens = 128;
  std::string system;     // system prompt ("" = none)
};

// {"task": "instruct", "data", "items", "rouge_l" (mean F, 0..1), "samples": [{prompt, reference,
// prediction, rouge_l}] (the first 5)}. on_item(done, total) reports progress.
nlohmann::json evaluate_instruct(CausalLM& model, const Tokenizer& tok, const std::string& model_folder,
                                 const InstructOptions& options,
                                 const std::function<void(int64_t, int64_t)>& on_item = nullptr);

}  // namespace linearize
