// The three-stage distillation of a student from its teacher (docs/design.md, "Distillation"):
//   1. attention-output alignment: every replaced layer l, input = the teacher's residual stream h_l,
//      loss = MSE(mixer(input_layernorm(h_l)), teacher attention output of layer l), summed over
//      layers; only the mixers and their input norms train.
//   2. hidden-state alignment: each replaced block l maps the teacher's h_l to h_{l+1}; loss = MSE
//      (default) or the study's `l2`, the mean over tokens of each token's L2 norm of the difference,
//      summed over layers; all block parameters train. The study's code (paper preset) regresses the
//      last layer onto the teacher's final-normed hidden state instead of h_L.
//   3. end-to-end: full student forward, loss = ce_weight * CE(next token) + kl_weight *
//      KL(teacher || student) at temperature T; per-token mean KL times T^2 (default) or the
//      study's `batchmean` (KL summed over tokens and vocabulary, divided by the batch size, which
//      weighs it about seq_len times the CE); all parameters train.
// The teacher runs without gradients. Each stage reads its own consecutive slice of the token stream.
// Stages checkpoint under <out>/checkpoint-stage{1,2,3}; --resume skips finished stages and continues
// the interrupted one exactly.
#pragma once
#include <string>
#include <vector>

#include "model/causal_lm.h"
#include "model/mixers/mixer_config.h"
#include "train/trainer.h"

namespace linearize {

struct StageSettings {
  double lr = 3e-4;
  ScheduleKind schedule = ScheduleKind::wsd;
  double warmup = 0.1;
  double decay = 0.2;         // wsd: fraction of the steps the decay takes
  bool cosine_decay = false;  // wsd: half-cosine decay (the study's, via Hugging Face) instead of linear
  double min_lr_frac = 0.0;   // the decay's floor, as a fraction of lr
};

// The study code's defects, each switched on alone (--paper-defects) to measure what it does:
//   gqa           K/V rows unrolled in chunks of 32 whatever the teacher's head size, so with head size 64
//                 and G query heads a KV head only every G-th student head gets its own KV head's rows
//   kda_gate      KDA's output gate added inside the output norm, RMSNorm(o + g) * w, not multiplied
//   kl_batchmean  stage 3's KL summed over the tokens and divided by the batch size (~seq_len x the CE)
//   stage2_lr     stage 2's learning rate never decays (its 20% warmup and 80% plateau fill the stage)
//   bf16_weights  the student's weights, gradients and optimizer state in bf16 only (no fp32 master copy)
std::vector<std::string> paper_defect_names();

// Stage 2's distance between the student's and the teacher's hidden states: the mean squared error per
// element (ours), or the mean over tokens of the L2 norm of the difference (the study's).
enum class Stage2Loss { mse, l2 };
// Stage 3's KL term: the mean over tokens (ours), or summed and divided by the batch size ("batchmean", the
// study's), which grows with the sequence length.
enum class KlReduction { token_mean, batchmean };
// The names used on the command line and in study files ("mse", "l2"; "token_mean", "batchmean"); the parsers
// throw an Error naming `what` (the option or key) and the accepted names.
Stage2Loss parse_stage2_loss(const std::string& name, const std::string& what);
KlReduction parse_kl_reduction(const std::string& name, const std::string& what);
std::string to_string(Stage2Loss loss);
std::string to_string(KlReduction reduction);

struct DistillOptions {
  std::string teacher;  // teacher model folder
  std::string data;     // .u32 shard (or text)
  std::string out;      // student folder (also holds checkpoints and metrics.jsonl)
  MixerKind mixer = MixerKind::gated_deltanet;
  std::string preset = "default";  // default | paper
  std::vector<std::string> defects;  // some of paper_defect_names(), on top of the preset
  nlohmann::json mixer_overrides = nlohmann::json::object();  // fields of the mixer config (--mixer-config)
  std::vector<int64_t> layers;     // replaced layers; empty = all
  std::vector<int> stages = {1, 2, 3};
  int64_t seq_len = 512;
  int64_t tokens = 0;  // total token budget over the stages (0: each stage one pass over its slice)
  std::vector<double> splits = {0.026, 0.053, 0.92};
  StageSettings stage[3] = {{2e-4, ScheduleKind::wsd, 0.1}, {2e-3, ScheduleKind::wsd, 0.1}, {3e-4, ScheduleKind::linear, 0.1}};
  Stage2Loss stage2_loss = Stage2Loss::mse;
  bool stage2_final_norm_target = false;  // the last layer's stage-2 target: the teacher's final-normed state
  double ce_weight = 1.0;
  double kl_weight = 1.0;
  double kl_temperature = 1.0;
  KlReduction kl_reduction = KlReduction::token_mean;
  TrainLoopOptions loop;  // batch, grad_accum, clip, device, seed, resume, checkpoint_every, ...
};

// The settings of `preset` applied to `o`:
//   default  our choices: MSE stage-2 loss, WSD with linear decay over the last 20% in stages 1-2.
//   paper    as the study's code trains, its defects corrected: the `l2` stage-2 loss with the final-norm
//            target of the last layer, WSD with a half-cosine decay over the last 10% to 1e-4 lr (stage 2
//            warming up over 20%), the mixers' paper preset (model/mixers/mixer_config.h).
// Both: per-token-mean KL, stage 3 linear decay with 10% warmup.
void apply_distill_preset(DistillOptions& o, const std::string& preset);
// Switches on the named defects (see paper_defect_names; unknown or repeated names are an Error).
void apply_paper_defects(DistillOptions& o, const std::vector<std::string>& defects);

struct DistillResult {
  std::vector<double> final_loss;  // per stage run
  bool finished = false;
};

DistillResult distill(const DistillOptions& options);

// Stage 2's loss for one batch, from the teacher's trace of it: each of `layers` (student blocks) run on
// the teacher's input to that layer against its target (the teacher's output of the layer; for the last
// layer the final-normed state with stage2_final_norm_target), MSE or the per-token L2 norm's mean (`l2`),
// summed over the layers.
torch::Tensor stage2_loss(const DistillOptions& o, CausalLM& student, const Trace& trace,
                          const std::vector<int64_t>& layers);

// Stage 3's loss: ce_weight * CE(next token) + kl_weight * KL(teacher || student) at o.kl_temperature,
// reduced as o.kl_reduction says; logits [B, T, V] (any float dtype, computed in fp32), targets [B, T] (those
// outside [0, V) ignored). The per-token terms come from ops::distill_loss_terms (one kernel each way on a GPU).
torch::Tensor stage3_loss(const DistillOptions& o, const torch::Tensor& s_logits, const torch::Tensor& t_logits,
                          const torch::Tensor& targets);

}  // namespace linearize
