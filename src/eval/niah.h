// Needle in a haystack, RULER's single-needle tasks, generated here from a seed:
//   s_niah_1  haystack = the repeated noise sentences, needle value = a 7-digit number
//   s_niah_2  haystack = real prose (--haystack, default an Austen novel), value = a 7-digit number
//   s_niah_3  haystack = real prose, value = a UUID
// The needle "One of the special magic numbers for {key} is: {value}." (key: a random
// adjective-noun pair) sits between two haystack sentences at a chosen depth (0 = first, 1 = last).
// The prompt is RULER's template followed by the answer prefix; for s_niah_3 "numbers"/"number"
// read "uuids"/"uuid" as in RULER. Lengths count tokens of the model's own tokenizer: the prompt
// (BOS included) plus the generation budget fits the length, and the haystack fills it as far as
// whole sentences allow. The model decodes greedily (12 new tokens for numbers, 30 for UUIDs); a
// sample is right when the value appears in the generated text.
//
// Results JSON ("niah" section of an eval result, schema):
//   {"task": "s_niah_1", "lengths": [512, ...], "depths": [0, 0.25, ...], "samples": S,
//    "grid": [[acc at depths...] per length], "per_length": {"512": acc, ...}, "average": acc}
//
// Not done: RULER's multi-key/multi-value/multi-query variants, chat templates, answer
// post-processing beyond the substring match.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "io/tokenizer.h"
#include "model/causal_lm.h"

namespace linearize {

struct NiahOptions {
  std::string task = "s_niah_1";
  std::vector<int64_t> lengths = {512, 1024, 2048, 4096};
  int64_t depths = 5;   // spread evenly over 0..1
  int64_t samples = 10; // per (length, depth)
  std::string haystack_file;  // prose for s_niah_2/3
  uint64_t seed = 0;
};

// The haystack as sentences: the five noise sentences repeated (s_niah_1; cycled as needed) or the
// sentences of `text` with its whitespace runs collapsed.
std::vector<std::string> split_sentences(const std::string& text);
std::vector<std::string> noise_sentences();

// Depth fractions: n values spread evenly over [0, 1] (0.5 when n == 1).
std::vector<double> niah_depths(int64_t n);

// Whether the task's needle value is a UUID (s_niah_3) rather than a 7-digit number.
bool niah_uses_uuid(const std::string& task);
int64_t niah_max_new_tokens(const std::string& task);

struct NiahSample {
  std::string key, value, needle;
  std::string text;              // the prompt text (without BOS)
  std::vector<int32_t> ids;      // prefix + encode(text)
  int64_t sentences = 0;         // haystack sentences used
  int64_t needle_position = 0;   // needle placed before haystack sentence number needle_position
};

// One prompt of `length` tokens in all (prompt + generation budget) with the needle at `depth`.
// `haystack` is cycled when it has too few sentences. Throws when even an empty haystack does not fit.
NiahSample make_niah_sample(const Tokenizer& tokenizer, const std::vector<int32_t>& prefix, const std::string& task,
                            const std::vector<std::string>& haystack, int64_t length, double depth,
                            std::mt19937_64& rng);

// The template with {context} and {key} filled in, ending with the answer prefix.
std::string niah_prompt(const std::string& task, const std::string& context, const std::string& key);
std::string niah_needle(const std::string& task, const std::string& key, const std::string& value);

// True when `value` occurs in `generated`.
bool niah_match(const std::string& generated, const std::string& value);

// Runs the grid of lengths x depths x samples through greedy generation; progress(done, total).
nlohmann::json run_niah(CausalLM& model, const Tokenizer& tokenizer, const NiahOptions& options,
                        const std::function<void(int64_t, int64_t)>& progress = nullptr);

}  // namespace linearize
