// Zero-shot benchmark tasks with lm-eval-harness semantics, read from the llm-foundry jsonl files and
// the klosax HellaSwag text file in ../shared/data/eval.
//
//   multiple choice (ARC-Easy, ARC-Challenge, PIQA, OpenBookQA, HellaSwag): every choice is scored as a
//     continuation of the same context by its summed log-likelihood; acc = argmax is gold, acc_norm =
//     argmax of loglik / length in characters of the choice text (the choice without the " " delimiter,
//     as lm-eval divides by Python's len(choice)).
//   WinoGrande (partial scoring): each option makes its own context; the shared continuation after it is
//     scored; acc_norm equals acc (the continuation is the same for every option).
//   LAMBADA: acc = greedy decoding reproduces every continuation token; ppl = exp(-mean over documents
//     of the continuation log-likelihood), as lm-eval aggregates its "perplexity".
//
// Tokenization follows lm-eval's encode-pair: trailing spaces of the context move to the continuation,
// whole = encode(context + continuation), ctx = encode(context), continuation tokens = whole[len(ctx):]
// (the tail), so the split matches how the text is tokenized in one piece. SentencePiece models get
// BOS in front of the context; byte-level BPE models get nothing (EOS/BOS only when a context is empty).
// Sequences longer than the model's max_position_embeddings keep their last tokens (left truncation).
//
// Prompt formats (lm-eval's): ARC "Question: q\nAnswer:" + " choice"; PIQA "Question: goal\nAnswer:" +
// " choice"; OpenBookQA "stem" + " choice"; HellaSwag preprocessed "label: ctx" + " ending"; WinoGrande
// "sentence up to the blank with the option" + " rest"; LAMBADA "context" + " last word".
//
// Results JSON (written by results_json / `linearize eval tasks --json`):
//   {"model": "DIR",
//    "tasks": {"arc_easy": {"n": 2376, "acc": 0.61, "acc_stderr": 0.01, "acc_norm": 0.57,
//                           "acc_norm_stderr": 0.01, "metric": "acc", "score": 0.61}, ...
//              "lambada": {..., "ppl": 12.3}},
//    "average": mean of "score" over the tasks}
// stderr = sqrt(p (1 - p) / (n - 1)).
//
// Not done here: few-shot prompting, generation-based tasks, chat templates, the remaining lm-eval
// metrics (mcc, f1, bits per byte).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "io/tokenizer.h"
#include "model/causal_lm.h"

namespace linearize {

// ---- one task's items, as text ----

// One scored option: the continuation's log-likelihood given the context.
struct TextPair {
  std::string context, continuation;
};

struct TaskItem {
  std::vector<TextPair> options;    // one per choice; LAMBADA has exactly one
  int64_t gold = 0;                 // index of the right option (0 for LAMBADA)
  std::vector<int64_t> norm_chars;  // per option: length in characters used by acc_norm (lm-eval)
};

enum class TaskKind { MultipleChoice, Lambada };

struct TaskData {
  std::string name;         // arc_easy, arc_challenge, hellaswag, piqa, winogrande, lambada, openbookqa
  std::string metric;       // headline metric: "acc" or "acc_norm"
  TaskKind kind = TaskKind::MultipleChoice;
  std::vector<TaskItem> items;
};

// The task names known, in the order of the paper's table.
const std::vector<std::string>& task_names();

// Reads a task from `data_dir` (first `limit` items; limit < 0 = all). Throws linearize::Error naming
// FILE:LINE and the field for a malformed line, and the path for a missing file.
TaskData load_task(const std::string& name, const std::string& data_dir, int64_t limit = -1);

// Parsers behind load_task, usable on any file of the same format.
TaskData load_multiple_choice_jsonl(const std::string& name, const std::string& path, int64_t limit);
TaskData load_winogrande_jsonl(const std::string& path, int64_t limit);
TaskData load_lambada_jsonl(const std::string& path, int64_t limit);
TaskData load_hellaswag_text(const std::string& path, int64_t limit);  // .txt or .bz2

// lm-eval's HellaSwag cleanup: strip, " [title]" -> ". ", drop "[...]" spans, "  " -> " " (one pass).
std::string hellaswag_preprocess(const std::string& text);
// The klosax file joins ctx_a and ctx_b; lm-eval capitalises ctx_b. We upper-case the first letter
// of the fragment after the last ". " when it is a lower-case ASCII letter (an approximation).
std::string hellaswag_capitalize_tail(const std::string& ctx);

// The whole content of a text file, decompressed when the name ends in .bz2.
std::string read_text_maybe_bz2(const std::string& path);

// ---- tokens and scoring ----

struct TokenPair {
  std::vector<int32_t> context, continuation;
};

// Tokens a scored context starts with: BOS for SentencePiece models, nothing for byte-level BPE.
std::vector<int32_t> eval_prefix(const LlamaConfig& config, const Tokenizer& tokenizer);
// An id to put in front of an empty context (BOS, else EOS).
int32_t empty_context_id(const LlamaConfig& config);

// lm-eval's encode-pair (see the top of this file).
TokenPair encode_pair(const Tokenizer& tokenizer, const std::vector<int32_t>& prefix, int32_t empty_id,
                      const TextPair& text);

struct ContinuationScore {
  double loglik = 0;    // sum of log p(continuation token | everything before)
  bool greedy = false;  // every continuation token is the argmax
  int64_t tokens = 0;   // continuation tokens scored
};

struct ScoreOptions {
  int64_t batch = 16;
  int64_t max_length = 0;  // tokens per sequence (0: model's max_position_embeddings)
  std::function<void(int64_t done, int64_t total)> progress;
};

// Scores every request; sequences are sorted by length, batched with right padding, and the log-probs
// of the continuation positions gathered. Output order matches `requests`.
std::vector<ContinuationScore> score_continuations(CausalLM& model, const std::vector<TokenPair>& requests,
                                                   const ScoreOptions& options);

// ---- metrics ----

struct TaskResult {
  std::string name, metric;
  int64_t n = 0;
  double acc = 0, acc_stderr = 0, acc_norm = 0, acc_norm_stderr = 0;
  double ppl = 0;  // LAMBADA only
  double score() const { return metric == "acc_norm" ? acc_norm : acc; }
};

double binomial_stderr(double p, int64_t n);  // sqrt(p (1 - p) / (n - 1)); 0 when n < 2
int64_t argmax_index(const std::vector<double>& values);  // first index of the maximum

// Metrics from the scores of each item's options (scores[i][j] = item i, option j).
TaskResult multiple_choice_metrics(const TaskData& task, const std::vector<std::vector<ContinuationScore>>& scores);
TaskResult lambada_metrics(const TaskData& task, const std::vector<std::vector<ContinuationScore>>& scores);

// Encodes, scores and measures one task.
TaskResult evaluate_task(CausalLM& model, const Tokenizer& tokenizer, const TaskData& task,
                         const ScoreOptions& options);

nlohmann::json task_result_json(const TaskResult& r);
// {"model", "tasks", "average"} for the given results.
nlohmann::json results_json(const std::string& model, const std::vector<TaskResult>& results);

}  // namespace linearize
