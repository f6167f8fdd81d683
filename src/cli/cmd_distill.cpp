// linearize distill: three-stage distillation of a linear-time student from a Llama teacher.
#include <iostream>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/sft_options.h"
#include "distill/recipes.h"
#include "distill/stages.h"
#include "io/atomic_file.h"
#include "io/error.h"
#include "model/mixers/mixer_config.h"

namespace linearize::cli {

namespace {

std::vector<double> parse_splits(const std::string& s) {
  std::vector<double> out;
  std::string cur;
  for (char c : s + "|") {
    if (c == '|' || c == ',') {
      try {
        size_t used = 0;
        out.push_back(std::stod(cur, &used));
        if (used != cur.size()) throw 0;
      } catch (...) {
        throw Error("--splits expects three numbers a|b|c (fractions or token counts), got \"" + s + "\"");
      }
      cur.clear();
    } else {
      cur += c;
    }
  }
  return out;
}

// --mixer-config: a JSON object given inline or in a file.
nlohmann::json parse_mixer_overrides(const std::string& s) {
  const bool inline_json = s.find_first_not_of(" \t\n") != std::string::npos && s[s.find_first_not_of(" \t\n")] == '{';
  const std::string text = inline_json ? s : read_file(s);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error("--mixer-config: malformed JSON" + (inline_json ? std::string() : " in " + s) + ": " + e.what());
  }
  if (!j.is_object()) throw Error("--mixer-config: expected a JSON object of mixer settings, e.g. {\"num_heads\": 8}");
  return j;
}

}  // namespace

int cmd_distill(const std::vector<std::string>& argv) {
  const DistillOptions d;  // the help's defaults are the code's
  const SftOptions sft;
  std::string mixers;
  for (const auto& m : mixer_kinds()) mixers += " " + m;
  CommandSpec spec{
      "distill",
      "Linearize a Llama teacher: replace its attention layers with a linear-time mixer and train the\n"
      "student in three stages (1 attention-output alignment, 2 hidden-state alignment, 3 end-to-end\n"
      "CE + KL). Writes a student model folder.",
      "",
      "mixers:" + mixers + "\n"
      "presets: default (teacher head layout, MSE stage 2, WSD with linear decay, per-token KL)\n"
      "         paper   (as the study's code trains, its defects corrected: fla head counts, RetNet rotary\n"
      "                  base 10000, linear attention with short convs and no output norm, KDA with a\n"
      "                  full-rank output gate and dt_bias 0, the per-token L2 stage-2 loss with the last\n"
      "                  layer regressed onto the teacher's final norm, 20% stage-2 warmup, WSD with a\n"
      "                  cosine decay over the last 10%)\n"
      "defects (--paper-defects, on top of either preset; `all` for every one):\n"
      "         gqa (K/V unrolled in 32-row chunks), kda_gate (gate added inside the norm), kl_batchmean\n"
      "         (KL summed over tokens / batch), stage2_lr (stage-2 LR never decays), bf16_weights (no\n"
      "         fp32 master weights)\n"
      "--mixer-config overrides any mixer setting (JSON object or file), e.g. '{\"num_heads\": 8,\n"
      "         \"use_short_conv\": false}'; the keys are those of the student's config.json mixer_config.\n"
      "recipes: standard (the stages above)\n"
      "         instruct (instruction-aware distillation: stages 1-2 against an instruction-tuned\n"
      "                   teacher -> OUT/distilled, then `sft` of that student on --sft-data -> OUT;\n"
      "                   --system/--epochs/--packing/--max-steps and --sft-lr/--sft-seq-len apply to it)\n"
      "Every option can also come from --config FILE (a JSON object, e.g. {\"mixer\": \"gla\", \"seq-len\": 256}).",
      {{"teacher", "DIR", "teacher model folder (Hugging Face Llama)", "", true},
       {"mixer", "NAME", "mixer kind (see below)", "", true},
       {"data", "FILE", ".u32 token shard (or .txt/.jsonl)", "", true},
       {"out", "DIR", "student folder to write (holds checkpoints and metrics.jsonl)", "", true},
       {"stages", "LIST", "stages to run", default_text(d.stages, ',')},
       {"tokens", "N", "total token budget over the stages (default: one pass over each slice)"},
       {"splits", "A|B|C", "stream/budget split over the stages: fractions or token counts (instruct recipe:\n"
                           "0.2|0.8|0)", default_text(d.splits, '|')},
       {"preset", "NAME", "default or paper", d.preset},
       {"paper-defects", "LIST", "the study's defects to switch on (see below)"},
       {"mixer-config", "JSON", "mixer settings to override: a JSON object, inline or in a file"},
       {"layers", "LIST", "replace only these layers (hybrid); default all"},
       {"lr1", "X", "stage-1 learning rate", default_text(d.stage[0].lr)},
       {"lr2", "X", "stage-2 learning rate", default_text(d.stage[1].lr)},
       {"lr3", "X", "stage-3 learning rate", default_text(d.stage[2].lr)},
       {"schedule1", "KIND", "stage-1 schedule", to_string(d.stage[0].schedule)},
       {"schedule2", "KIND", "stage-2 schedule (paper preset: constant)"},
       {"schedule3", "KIND", "stage-3 schedule", to_string(d.stage[2].schedule)},
       {"stage2-loss", "KIND", "mse or l2 (preset decides when absent)"},
       {"ce-weight", "X", "stage-3 cross-entropy weight", default_text(d.ce_weight)},
       {"kl-weight", "X", "stage-3 KL weight", default_text(d.kl_weight)},
       {"kl-temperature", "T", "stage-3 KL temperature", default_text(d.kl_temperature)},
       {"kl-reduction", "KIND", "token_mean or batchmean (preset decides when absent)"},
       {"recipe", "NAME", "standard or instruct (see below)", "standard"},
       {"sft-data", "FILE", "instruct recipe: jsonl conversations for the SFT step"},
       {"sft-lr", "X", "instruct recipe: SFT learning rate (" + to_string(sft.loop.schedule.kind) + ")",
        default_text(sft.loop.schedule.lr)},
       {"sft-seq-len", "N", "instruct recipe: SFT sequence length", default_text(sft.seq_len)}},
      0,
      0};
  for (auto& opt : sft_options()) spec.options.push_back(opt);
  for (auto& opt : training_options(d.loop, d.seq_len, false)) spec.options.push_back(opt);
  Args args(spec, argv);
  if (args.help_requested()) return std::cout << help_text(spec), 0;
  if (args.has("config")) args.apply_config_file(args.str("config"));

  DistillOptions o;
  o.teacher = args.str("teacher");
  o.mixer = parse_mixer_kind(args.str("mixer"), "--mixer");
  o.data = args.str("data");
  o.out = args.str("out");
  apply_distill_preset(o, args.str("preset"));
  o.stages.clear();
  for (auto s : args.int_list("stages")) o.stages.push_back(static_cast<int>(s));
  if (args.has("tokens")) o.tokens = args.integer("tokens");
  o.splits = parse_splits(args.str("splits"));
  if (args.has("layers")) o.layers = args.int_list("layers");
  o.seq_len = args.integer("seq-len");
  for (int s = 0; s < 3; ++s) {
    const std::string n = std::to_string(s + 1);
    o.stage[s].lr = args.number("lr" + n);
    if (args.maybe("schedule" + n)) o.stage[s].schedule = parse_schedule_kind(args.str("schedule" + n), "--schedule" + n);
    if (args.has("warmup")) o.stage[s].warmup = args.number("warmup");
  }
  if (args.has("paper-defects")) {
    auto defects = args.str_list("paper-defects");
    if (defects == std::vector<std::string>{"all"}) defects = paper_defect_names();
    apply_paper_defects(o, defects);
  }
  if (args.has("mixer-config")) o.mixer_overrides = parse_mixer_overrides(args.str("mixer-config"));
  if (args.has("stage2-loss")) o.stage2_loss = parse_stage2_loss(args.str("stage2-loss"), "--stage2-loss");
  if (args.has("kl-reduction")) o.kl_reduction = parse_kl_reduction(args.str("kl-reduction"), "--kl-reduction");
  o.ce_weight = args.number("ce-weight");
  o.kl_weight = args.number("kl-weight");
  o.kl_temperature = args.number("kl-temperature");
  o.loop = loop_options(args);
  if (args.str("recipe") == "instruct") {
    if (!args.has("sft-data")) throw Error("--recipe instruct needs --sft-data FILE (jsonl conversations)");
    // Stages 1-2 spend the whole budget, as the study's instruct configuration (0.2 | 0.8).
    if (!args.has("splits")) o.splits = {0.2, 0.8, 0.0};
    SftOptions s = sft_settings(args);
    s.data = args.str("sft-data");
    s.seq_len = args.integer("sft-seq-len");
    s.loop.schedule.lr = args.number("sft-lr");
    s.loop.schedule.kind = ScheduleKind::cosine;
    auto r = run_instruct_recipe(o, s);
    if (!r.distill.finished || !r.sft.finished) std::cerr << "[distill] stopped early (--stop-after); resume with --resume\n";
    return 0;
  }
  if (args.str("recipe") != "standard")
    throw Error("--recipe: unknown recipe \"" + args.str("recipe") + "\" (expected standard or instruct)");
  auto r = distill(o);
  if (!r.finished) std::cerr << "[distill] stopped early (--stop-after); resume with --resume\n";
  return 0;
}

}  // namespace linearize::cli
