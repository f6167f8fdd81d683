// The three-stage distillation of a student from its teacher (DESIGN.md, "The pipeline"):
//   1. attention-output alignment: every replaced layer l, input = the teacher's residual stream h_l,
//      loss = MSE(mixer(input_layernorm(h_l)), teacher attention output of layer l), summed over
//      layers; only the mixers and their input norms train.
//   2. hidden-state alignment: each replaced block l maps the teacher's h_l to h_{l+1}; loss = MSE
//      (default) or the L2 norm of the difference (paper), summed over layers; all block parameters
//      train.
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

#include "train/trainer.h"

namespace linearize {

struct StageSettings {
  double lr = 3e-4;
  std::string schedule = "wsd";
  double warmup = 0.1;
};

struct DistillOptions {
  std::string teacher;  // teacher model folder
  std::string data;     // .u32 shard (or text)
  std::string out;      // student folder (also holds checkpoints and metrics.jsonl)
  std::string mixer;
  std::string preset = "default";  // default | paper
  std::vector<int64_t> layers;     // replaced layers; empty = all
  std::vector<int> stages = {1, 2, 3};
  int64_t seq_len = 512;
  int64_t tokens = 0;  // total token budget over the stages (0: each stage one pass over its slice)
  std::vector<double> splits = {0.026, 0.053, 0.92};
  StageSettings stage[3] = {{2e-4, "wsd", 0.1}, {2e-3, "wsd", 0.1}, {3e-4, "linear", 0.1}};
  std::string stage2_loss = "mse";  // mse | l2
  double ce_weight = 1.0;
  double kl_weight = 1.0;
  double kl_temperature = 1.0;
  std::string kl_reduction = "token_mean";  // token_mean | batchmean
  TrainLoopOptions loop;  // batch, grad_accum, clip, device, seed, resume, checkpoint_every, ...
};

// The study's settings for `preset` ("paper": L2 stage-2 loss, constant stage-2 LR, batchmean KL;
// "default": our corrected choices) applied to `o`.
void apply_distill_preset(DistillOptions& o, const std::string& preset);

struct DistillResult {
  std::vector<double> final_loss;  // per stage run
  bool finished = false;
};

DistillResult distill(const DistillOptions& options);

// Stage 3's loss: ce_weight * CE(next token) + kl_weight * KL(teacher || student) at o.kl_temperature,
// reduced as o.kl_reduction says; logits [B, T, V] (any float dtype, computed in fp32), targets [B, T] (those
// outside [0, V) ignored). The per-token terms come from ops::distill_loss_terms (one kernel each way on a GPU).
torch::Tensor stage3_loss(const DistillOptions& o, const torch::Tensor& s_logits, const torch::Tensor& t_logits,
                          const torch::Tensor& targets);

}  // namespace linearize
