// Needle in a haystack as RULER's single-needle tasks define it (the text: data/niah_text.h):
//   s_niah_1  haystack = RULER's noise paragraph repeated, value = a 7-digit number
//   s_niah_2  haystack = prose (--haystack; RULER's Paul Graham essays are not at hand, so by default a
//             public-domain novel: the one difference from RULER), value = a 7-digit number
//   s_niah_3  haystack = prose, value = a UUID
// Each sample draws its key, value and needle depth from the seed; its prompt is filled to the length in
// the model's own tokens (prompt + generation budget <= length). The model decodes greedily up to
// max_new_tokens (RULER: 128), ending early at EOS or, with stop_at_newline (the default), at the first
// newline: the answer sits on the answer prefix's line, so this only saves time. Scoring as RULER's
// string_match_all: the output is stripped, control characters become newlines, and the sample is right
// when the value occurs in it, case-insensitively. With `chat`, the question goes through the model
// folder's chat template as a user turn and the answer prefix opens the assistant's reply (as RULER
// does for chat models).
//
// Results JSON ("niah" section of an eval result):
//   {"task", "haystack", "lengths": [...], "samples" (per length), "max_new_tokens", "stop_at_newline",
//    "chat", "seed", "per_length": {"512": acc, ...}, "average",
//    "depths": [bin centres], "grid": [[acc per depth bin, null when no sample fell in it] per length]}
// The depth bins only summarise where the random needles fell, for the report's heatmaps.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/niah_text.h"
#include "io/tokenizer.h"
#include "model/causal_lm.h"

namespace linearize {

struct NiahOptions {
  std::string task = "s_niah_1";
  std::vector<int64_t> lengths = {512, 1024, 2048, 4096};
  int64_t samples = 20;          // per length (RULER: 500)
  int64_t max_new_tokens = 128;  // RULER's tokens_to_generate for NIAH
  bool stop_at_newline = true;
  bool chat = false;             // ask through the model folder's chat template
  int64_t depth_bins = 5;        // for the summary grid
  std::string haystack_file;     // prose for s_niah_2/3
  uint64_t seed = 0;
  std::string dump;              // jsonl of every prompt, reference and output ("" = none)
};

// Whether the task's needle value is a UUID (s_niah_3) rather than a 7-digit number; unknown task: Error.
bool niah_uses_uuid(const std::string& task);
// The haystack a task reads: noise for s_niah_1, the prose file for s_niah_2/3.
Haystack niah_haystack(const std::string& task, const std::string& haystack_file);

// RULER's scoring of one output: true when `value` occurs in the post-processed output, case-insensitively.
bool niah_match(const std::string& output, const std::string& value);
// RULER's post-processing: strip, control characters to newlines, strip again.
std::string niah_postprocess(const std::string& output);

// How prompts become ids for `model_folder`'s model: plain text after the tokenizer's BOS where it
// needs one, or (chat) through the folder's chat template; Error when chat is asked of a folder
// without the chat tokens.
PromptEncoder niah_encoder(CausalLM& model, const Tokenizer& tokenizer, const std::string& model_folder, bool chat);

// Runs every length's samples through greedy generation; progress(done, total).
nlohmann::json run_niah(CausalLM& model, const Tokenizer& tokenizer, const NiahOptions& options,
                        const PromptEncoder& encode, const std::function<void(int64_t, int64_t)>& progress = nullptr);

}  // namespace linearize
