// The built-in studies (`linearize study --preset NAME`): paper, mini, gpu. Each is written out as a JSON
// file a user can copy and edit (`--write FILE`).
#include <string>
#include <utility>
#include <vector>

#include "data/retrieval_mixtures.h"
#include "io/error.h"
#include "model/mixers/mixer_config.h"
#include "study/study_spec.h"

namespace linearize {

namespace {

// What the GPU preset's teachers train on: real prose from `corpus` (file, weight: text files or token
// datasets), generated English-like documents, RULER-form retrieval episodes generated as training goes
// (short ones, which a small model learns from first, and long ones up to about its training length; 40%
// of them with repeated short statements as filler, without which a 6.5M-parameter teacher found no
// needle past 512 tokens of S-NIAH-1's repeated noise), and copy drills (dense practice for the induction
// that retrieval needs). The prose weights keep each file to about five passes over a teacher's 65M
// tokens: at 40 passes the teachers memorised the files and their WikiText-2 perplexity came out worse
// than a uniform guess. docs/study.md records the trials behind these weights.
nlohmann::json prose_and_retrieval_mixture(const std::vector<std::pair<std::string, double>>& corpus, double english,
                                           int64_t long_chars) {
  nlohmann::json sources = {
      {{"generator", "retrieval_episodes"}, {"weight", 0.3}, {"min_chars", 0}, {"max_chars", 300}, {"max_needles", 1},
       {"max_questions", 1}, {"noise_fraction", 0.4}},
      {{"generator", "retrieval_episodes"}, {"weight", 0.3}, {"min_chars", 300}, {"max_chars", long_chars},
       {"max_needles", 2}, {"max_questions", 2}, {"noise_fraction", 0.4}},
      {{"generator", "copy_drills"}, {"weight", 0.15}, {"max_values", 4}, {"max_filler", 2}}};
  for (const auto& [path, weight] : corpus) sources.push_back({{"path", path}, {"weight", weight}});
  sources.push_back({{"generator", "english_like"}, {"weight", english}});
  return {{"sources", sources}};
}

nlohmann::json teacher(const std::string& name, int64_t hidden, int64_t layers, int64_t heads, int64_t kv, int64_t seq,
                       int64_t batch, int64_t steps, double lr, bool deterministic = false) {
  nlohmann::json t = {{"name", name},
                      {"pretrain",
                       {{"hidden", hidden}, {"layers", layers}, {"heads", heads}, {"kv_heads", kv}, {"seq_len", seq},
                        {"batch", batch}, {"steps", steps}, {"lr", lr}, {"schedule", "wsd"}, {"warmup", 0.01}}}};
  if (deterministic) t["pretrain"]["deterministic"] = true;
  return t;
}

}  // namespace

nlohmann::json study_preset(const std::string& name, const std::vector<std::string>& teachers) {
  const auto mixers = mixer_kinds();
  if (name == "mini") {
    // CPU, about 15 minutes on 2 cores: three tiny teachers of growing width, seven mixers each.
    return {{"name", "mini"},
            {"notes", "CPU preset: three tiny teachers trained by the study on generated text, seven mixers each."},
            {"tokenizer", {{"train", {{"sample", {{"documents", 200}, {"episodes", 2000}}}, {"vocab", 1024}, {"isolate_digits", false}}}}},
            {"data", copy_drill_mixture()},  // the quick demo's recipe
            {"teachers",
             {teacher("tiny-32", 32, 2, 2, 1, 128, 4, 4000, 3e-3), teacher("tiny-48", 48, 2, 4, 2, 128, 4, 4000, 3e-3),
              teacher("tiny-64", 64, 2, 4, 2, 128, 4, 4000, 3e-3)}},
            {"mixers", mixers},
            {"budgets", {150000, 500000}},
            {"distill", {{"seq_len", 128}, {"batch", 8}, {"lr", {3e-3, 2e-3, 1e-3}}}},
            {"eval",
             {{"ppl", {{"data", {{"generator", "english_like"}, {"documents", 30}}}, {"seq_len", 128}}},
              {"niah", {{"tasks", {"s_niah_1"}}, {"lengths", {160, 256, 512}}, {"samples", 20}, {"max_new_tokens", 16}}}}},
            {"device", "cpu"}};
  }
  if (name == "gpu") {
    // One H100/H200: three teachers (6.5M, 27M and 94M parameters) trained on prose of the shared
    // corpus mixed with retrieval episodes; seven mixers each.
    return {{"name", "gpu"},
            {"notes", "GPU preset: teachers trained by the study on prose plus retrieval episodes; run with --device cuda."},
            {"tokenizer", {{"train", {{"inputs", {"corpus/austen_emma.txt", "corpus/web_bible.txt", "corpus/tinystories_val.txt"}},
                                      {"sample", {{"documents", 400}, {"episodes", 4000}}}, {"vocab", 8192}, {"isolate_digits", false}}}}},
            // 12% prose in proportion to the files' sizes (4.9, 0.9 and 0.8 MB), 13% English-like documents.
            {"data", prose_and_retrieval_mixture({{"corpus/web_bible.txt", 0.0896},
                                                  {"corpus/austen_emma.txt", 0.016},
                                                  {"corpus/tinystories_val.txt", 0.0144}},
                                                 0.13, 3600)},
            {"teachers",
             // t-40m and t-150m train 6000 steps: at 4000 they found 88% and 72% of S-NIAH-1's needles at 1024
             // tokens, t-40m 95% at 6000 (docs/study.md).
             {teacher("t-10m", 256, 6, 4, 2, 1024, 16, 4000, 1.5e-3), teacher("t-40m", 512, 8, 8, 4, 1024, 16, 6000, 1e-3),
              // The largest row takes about half an hour of one GPU: its teacher trains deterministically, so that
              // a machine that lost it can train it again, bit for bit, and finish the row.
              teacher("t-150m", 768, 14, 12, 4, 1024, 16, 6000, 8e-4, true)}},
            {"mixers", mixers},
            {"budgets", {4000000, 16000000}},
            {"distill", {{"seq_len", 1024}, {"batch", 16}, {"lr", {1e-3, 1e-3, 5e-4}}}},
            {"eval",
             // Perplexity on the last 5% of each prose file, which no teacher or student trains on.
             {{"ppl", {{"data", {{"held_out", 0.05}}}, {"seq_len", 1024}, {"max_tokens", 200000}}},
              {"niah", {{"tasks", {"s_niah_1"}}, {"lengths", {256, 512, 1024, 2048}}, {"samples", 40}, {"max_new_tokens", 24}}}}},
            {"device", "cuda"}};
  }
  if (name == "paper") {
    // The study's own grid on the user's SmolLM2-135M/360M/1.7B folders and data (data/tokens: `linearize
    // tokenize` of a fineweb-like corpus with the SmolLM2 tokenizer).
    if (teachers.size() != 3)
      throw Error("--preset paper needs --teachers A,B,C (the SmolLM2-135M, 360M and 1.7B folders), got " +
                  std::to_string(teachers.size()));
    return {{"name", "paper"},
            {"notes", "The study's grid: 3B distillation tokens split 0.026|0.053|0.92, its evaluation suite."},
            {"data", "tokens"},
            {"teachers",
             {{{"name", "smollm2-135m"}, {"path", teachers[0]}}, {{"name", "smollm2-360m"}, {"path", teachers[1]}},
              {{"name", "smollm2-1.7b"}, {"path", teachers[2]}}}},
            {"mixers", mixers},
            {"variants", {{{"name", "paper"}, {"preset", "paper"}, {"splits", {0.026, 0.053, 0.92}}}}},
            {"budgets", {3000000000LL}},
            {"distill", {{"seq_len", 512}, {"batch", 64}, {"lr", {2e-4, 2e-3, 3e-4}}}},
            {"eval",
             {{"ppl", {{"data", "heldout/wikitext2.valid.txt"}, {"seq_len", 512}}},
              {"tasks", {{"names", {"lambada", "arc_easy", "arc_challenge", "hellaswag", "piqa", "winogrande", "openbookqa"}},
                         {"data_dir", "eval"}}},
              {"niah", {{"tasks", {"s_niah_1", "s_niah_2", "s_niah_3"}}, {"lengths", {1024, 2048, 4096}}, {"samples", 500},
                        {"max_new_tokens", 128}, {"haystack", "corpus/austen_emma.txt"}}}}},
            {"device", "cuda"}};
  }
  throw Error("unknown study preset \"" + name + "\" (expected paper, mini or gpu)");
}

}  // namespace linearize
