// A study: the grid of teachers x mixers x variants x token budgets x seeds that `linearize study` runs,
// read from one JSON file (paths relative to it; unknown keys are errors naming the key and the file):
//
// {"name": "mini",
//  "tokenizer": {"path": DIR} | {"train": {"inputs": [...], "sample": {...}, "vocab": 1024, "isolate_digits": false}},
//  "data": "tokens/" | "mixture.json" | {"sources": [...]},      distillation (and pretraining) data
//  "teachers": [{"name": "t1", "path": "SmolLM2-135M"},
//               {"name": "t2", "pretrain": {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "seq_len": 256,
//                                           "batch": 4, "steps": 4000, "lr": 3e-3, "schedule": "wsd", "warmup": 0.01,
//                                           "data": (default: the study's)}}],
//  "mixers": ["gated_deltanet", ...],
//  "variants": [{"name": "default", "preset": "default", "stages": [1,2,3], "splits": [...], "layers": [...],
//                "kl_weight": 1, "kl_reduction": "token_mean", "paper_defects": [...], "mixer_config": {...}}],
//  "budgets": [1e6, 4e6],   distillation tokens; smaller budgets are branches of the largest run (below)
//  "seeds": [0],
//  "distill": {"seq_len": 256, "batch": 8, "lr": [2e-4, 2e-3, 3e-4], "stage3_schedule": "wsd"},
//  "eval": {"ppl": {"data": FILE | {"generator": "english_like", "documents": 40} | {"held_out": 0.05},
//                   "seq_len": 256, "max_tokens": N},
//           "tasks": {"names": [...], "limit": 200, "data_dir": DIR},
//           "niah": {"tasks": ["s_niah_1"], "lengths": [...], "samples": 20, "max_new_tokens": 32, "haystack": FILE}},
//  "device": "cpu"}
//
// Budgets: the largest budget is one run whose stage 3 follows warmup-stable-decay (decay over the last
// 20%); each smaller budget b is a branch that leaves that run where the b-run would start its decay,
// with the same warmup steps, and decays over its own last 20%. A WSD run is the same as the stable run
// until its decay, so each branch is exactly the student a separate b-token run would give, for the cost
// of its decay steps alone.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace linearize {

struct StudyPretrain {
  int64_t hidden = 64, layers = 2, heads = 4, kv_heads = 2, seq_len = 256, batch = 8, steps = 1000;
  double lr = 3e-3, warmup = 0.01;
  std::string schedule = "wsd";
  std::string data;  // empty: the study's data
  bool deterministic = false;  // deterministic GPU algorithms, so that training it again gives the same teacher
};

struct StudyTeacher {
  std::string name;
  std::string path;                       // an existing model folder, or
  std::optional<StudyPretrain> pretrain;  // trained by the study into OUT/teachers/<name>
};

struct StudyVariant {
  std::string name = "default";
  nlohmann::json options = nlohmann::json::object();  // preset, stages, splits, layers, kl_*, paper_defects, mixer_config
};

struct StudyEval {
  std::string ppl_data;                 // a file, or generated (ppl_generated)
  nlohmann::json ppl_generated;         // {"generator": "english_like", "documents": N, "seed": S}
  double ppl_held_out = 0;              // {"held_out": F}: the last F of every text file of the mixture, which
                                        // then trains on the rest (teachers, students and tokenizer alike)
  int64_t ppl_seq_len = 256, ppl_max_tokens = 0;
  std::vector<std::string> tasks;       // zero-shot tasks (empty: none)
  int64_t tasks_limit = 0;
  std::string tasks_dir;
  std::vector<std::string> niah_tasks = {"s_niah_1"};
  std::vector<int64_t> niah_lengths = {512, 1024, 2048};
  int64_t niah_samples = 20, niah_max_new_tokens = 32;
  std::string niah_haystack;
};

struct StudySpec {
  std::string name, file, base;  // base: the folder relative paths start from
  nlohmann::json tokenizer;      // {"path"} or {"train"} (needed only by pretrain teachers)
  nlohmann::json data;           // a path string or an inline mixture object
  std::vector<StudyTeacher> teachers;
  std::vector<std::string> mixers;
  std::vector<StudyVariant> variants;
  std::vector<int64_t> budgets;
  std::vector<uint64_t> seeds = {0};
  int64_t seq_len = 256, batch = 8;
  double lr[3] = {2e-4, 2e-3, 3e-4};
  std::string device = "cpu";
  StudyEval eval;
  nlohmann::json raw;  // the file as read
};

// Reads and checks a study file: unknown keys, unknown mixers, missing teacher folders, budgets <= 0 and the
// like are one Error naming the file and the key, before anything runs.
StudySpec read_study(const std::string& path);

// Whether a source of an inline mixture is one that eval.ppl.data.held_out cuts in two: a "path" to a .txt file.
bool held_out_source(const nlohmann::json& source);
StudySpec parse_study(const nlohmann::json& j, const std::string& file, const std::string& base);

// Built-in studies: paper (needs three teacher folders), mini (CPU, ~15 min), gpu (one H100/H200).
std::vector<std::string> study_presets();
nlohmann::json study_preset(const std::string& name, const std::vector<std::string>& teachers);

// One run of the grid: a teacher, a mixer, a variant, a seed, with every budget.
struct StudyCell {
  const StudyTeacher* teacher;
  std::string mixer;
  const StudyVariant* variant;
  uint64_t seed;
  std::string id() const;                         // teacher__mixer__variant__sS
  std::string budget_id(int64_t budget) const;    // id() + "__" + budget in tokens
};
std::vector<StudyCell> study_cells(const StudySpec& spec);

}  // namespace linearize
