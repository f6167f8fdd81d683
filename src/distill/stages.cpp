#include "distill/stages.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>

#include "io/atomic_file.h"
#include "io/error.h"
#include "io/token_shards.h"
#include "io/tokenizer.h"
#include "model/mixers/mixer_config.h"
#include "model/model_io.h"
#include "model/student.h"
#include "ops/ops.h"
#include "train/checkpoint.h"
#include "train/data_parallel.h"
#include "train/training_data.h"

namespace linearize {

namespace fs = std::filesystem;

Stage2Loss parse_stage2_loss(const std::string& name, const std::string& what) {
  if (name == "mse") return Stage2Loss::mse;
  if (name == "l2") return Stage2Loss::l2;
  throw Error(what + ": unknown stage-2 loss \"" + name + "\" (expected mse or l2)");
}

KlReduction parse_kl_reduction(const std::string& name, const std::string& what) {
  if (name == "token_mean") return KlReduction::token_mean;
  if (name == "batchmean") return KlReduction::batchmean;
  throw Error(what + ": unknown KL reduction \"" + name + "\" (expected token_mean or batchmean)");
}

std::string to_string(Stage2Loss loss) { return loss == Stage2Loss::l2 ? "l2" : "mse"; }
std::string to_string(KlReduction reduction) { return reduction == KlReduction::batchmean ? "batchmean" : "token_mean"; }

std::vector<std::string> paper_defect_names() { return {"gqa", "kda_gate", "kl_batchmean", "stage2_lr", "bf16_weights"}; }

void apply_distill_preset(DistillOptions& o, const std::string& preset) {
  if (preset == "paper") {
    o.stage2_loss = Stage2Loss::l2;
    o.stage2_final_norm_target = true;
    // Hugging Face's get_wsd_schedule as the study calls it: 10% warmup (20% in stage 2), cosine decay over
    // the last 10% to 1e-4 of the peak.
    for (int s : {0, 1}) o.stage[s] = {o.stage[s].lr, ScheduleKind::wsd, s == 0 ? 0.1 : 0.2, 0.1, true, 1e-4};
  } else if (preset == "default") {
    o.stage2_loss = Stage2Loss::mse;
    o.stage2_final_norm_target = false;
    for (int s : {0, 1}) o.stage[s] = {o.stage[s].lr, ScheduleKind::wsd, 0.1, 0.2, false, 0.0};
  } else {
    throw Error("unknown preset \"" + preset + "\" (expected default or paper)");
  }
  o.kl_reduction = KlReduction::token_mean;
  o.preset = preset;
}

void apply_paper_defects(DistillOptions& o, const std::vector<std::string>& defects) {
  const auto known = paper_defect_names();
  for (const auto& d : defects) {
    if (std::find(known.begin(), known.end(), d) == known.end()) {
      std::string list;
      for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
      throw Error("--paper-defects: unknown defect \"" + d + "\" (known: " + list + ")");
    }
    if (std::count(defects.begin(), defects.end(), d) > 1) throw Error("--paper-defects: \"" + d + "\" given twice");
    if (d == "kl_batchmean") o.kl_reduction = KlReduction::batchmean;
    if (d == "stage2_lr") o.stage[1].schedule = ScheduleKind::constant;
  }
  o.defects = defects;
}

namespace {

bool has_defect(const DistillOptions& o, const std::string& d) {
  return std::find(o.defects.begin(), o.defects.end(), d) != o.defects.end();
}

}  // namespace

namespace {

// Teacher trace of a batch, without gradients.
Trace teacher_trace(CausalLM& teacher, const torch::Tensor& x, torch::Tensor* logits = nullptr) {
  torch::NoGradGuard ng;
  Trace trace;
  auto h = teacher->hidden_states(x, nullptr, &trace);
  if (logits) *logits = teacher->logits_from_hidden(h);
  return trace;
}

std::vector<std::pair<std::string, torch::Tensor>> params_with_prefix(torch::nn::Module& m,
                                                                       const std::vector<std::string>& prefixes) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (auto& p : m.named_parameters(true)) {
    bool take = prefixes.empty();
    for (const auto& pre : prefixes)
      if (p.key().rfind(pre, 0) == 0) take = true;
    p.value().set_requires_grad(take);
    if (take) out.emplace_back(p.key(), p.value());
  }
  return out;
}

}  // namespace

torch::Tensor stage2_loss(const DistillOptions& o, CausalLM& student, const Trace& trace,
                          const std::vector<int64_t>& layers) {
  const int64_t last = student->num_layers() - 1;
  torch::Tensor loss = torch::zeros({}, torch::TensorOptions().device(trace.layer_in.front().device()));
  for (int64_t l : layers) {
    auto out = student->layer(l)->forward(trace.layer_in[l], nullptr).to(torch::kFloat);
    const auto& target = o.stage2_final_norm_target && l == last ? trace.final_norm_out : trace.layer_out[l];
    auto diff = out - target.to(torch::kFloat);  // [B,T,hidden]
    loss = loss + (o.stage2_loss == Stage2Loss::l2 ? diff.norm(2, -1).mean() : diff.pow(2).mean());
  }
  return loss;
}

torch::Tensor stage3_loss(const DistillOptions& o, const torch::Tensor& s_logits, const torch::Tensor& t_logits,
                          const torch::Tensor& targets) {
  const int64_t V = s_logits.size(-1);
  auto y = targets.reshape({-1});
  auto terms = ops::distill_loss_terms(s_logits.reshape({-1, V}), t_logits.reshape({-1, V}), y, o.kl_temperature);
  // cross_entropy's mean: over the targets it does not ignore (those in [0, V)).
  auto ce = terms.ce.sum() / y.ge(0).logical_and(y.lt(V)).sum().to(torch::kFloat);
  const double T = o.kl_temperature;
  torch::Tensor kl;
  if (o.kl_reduction == KlReduction::batchmean) kl = terms.kl.sum() / static_cast<double>(s_logits.size(0));
  else kl = terms.kl.mean() * (T * T);
  return o.ce_weight * ce + o.kl_weight * kl;
}

DistillResult distill(const DistillOptions& o) {
  // Everything that can be wrong with the input is checked before any training starts.
  if (o.stages.empty()) throw Error("--stages: no stage given (expected some of 1,2,3 in order)");
  for (size_t i = 0; i < o.stages.size(); ++i) {
    const int s = o.stages[i];
    if (s < 1 || s > 3) throw Error("--stages: stage " + std::to_string(s) + " does not exist (1, 2 or 3)");
    if (i > 0 && s <= o.stages[i - 1])
      throw Error("--stages: stages must be given once each and in order (got " + std::to_string(o.stages[i - 1]) +
                  " then " + std::to_string(s) + ")");
  }
  if (!(o.kl_temperature > 0) || !std::isfinite(o.kl_temperature))
    throw Error("--kl-temperature must be greater than 0, got " + std::to_string(o.kl_temperature));
  for (double w : {o.kl_weight, o.ce_weight})
    if (!(w >= 0) || !std::isfinite(w)) throw Error("--kl-weight and --ce-weight must be finite and >= 0");
  if (o.splits.size() != 3) throw Error("--splits needs three parts a|b|c, one per stage");
  refuse_output_inside(o.out, o.teacher, "the teacher's folder");

  LoadOptions lo;
  lo.device = o.loop.device;
  lo.dtype = torch::kFloat;
  // On CUDA the teacher runs in bf16 (it only does inference), cast once the student is built from it.
  const auto teacher_dtype = lo.device.is_cuda() ? torch::kBFloat16 : torch::kFloat;
  auto teacher = load_model(o.teacher, lo);
  if (teacher->config.raw.contains("linearize"))
    throw Error(o.teacher + ": the teacher is itself a linearized student; give a Llama teacher folder");
  teacher->eval();
  for (auto& p : teacher->parameters()) p.set_requires_grad(false);
  auto tok = load_model_tokenizer(o.teacher, teacher->config);
  const int64_t eos = teacher->config.eos_token_ids.empty() ? -1 : teacher->config.eos_token_ids[0];
  const auto data = TrainingData::open(o.data, *tok, eos, teacher->config.vocab_size, o.teacher);
  if (o.tokens <= 0 && data.file_tokens() == 0)
    throw Error(o.data + ": only generated sources: give a token budget (--tokens)");

  auto spec = StudentSpec::make(o.mixer, o.preset, o.layers, teacher->config);
  if (has_defect(o, "kda_gate") && spec.mixer_config.kind == MixerKind::kda) spec.mixer_config.kda_gate_mode = "add_in_norm";
  spec.mixer_config = spec.mixer_config.with_overrides(o.mixer_overrides);
  spec.study_gqa_unroll = has_defect(o, "gqa");
  spec.defects = o.defects;
  torch::manual_seed(static_cast<int64_t>(o.loop.seed));
  std::vector<std::string> notes;
  // fp32 master weights, built from the fp32 teacher; only then is the teacher cast for inference.
  auto student = build_student(teacher, spec, &notes, torch::kFloat);
  if (has_defect(o, "bf16_weights")) {
    // The study: weights only in bf16, the teacher loaded in bf16 too (so its states feed the student as they are).
    student->to(torch::kBFloat16);
    teacher->to(torch::kBFloat16);
  } else if (teacher_dtype != torch::kFloat) {
    teacher->to(teacher_dtype);
  }
  student->recompute = o.loop.recompute;
  student->train();
  if (!o.loop.quiet) {
    std::cerr << "[distill] " << to_string(o.mixer) << " (" << o.preset << ") from " << o.teacher << ": "
              << (spec.layers.empty() ? "all" : std::to_string(spec.layers.size())) << " layers replaced, "
              << data.summary() << "\n";
    if (!notes.empty()) std::cerr << "[distill] init: " << notes.front() << (notes.size() > 1 ? " ..." : "") << "\n";
  }
  std::vector<int64_t> replaced;
  for (int64_t i = 0; i < teacher->num_layers(); ++i)
    if (spec.replaces(i)) replaced.push_back(i);

  // Loaders for all requested stages are built first, so a slice shorter than one window fails now.
  std::map<int, std::unique_ptr<BatchSource>> loaders;
  for (int s : o.stages)
    loaders[s] = data.loader(o.splits, static_cast<size_t>(s - 1), o.seq_len, o.loop.seed + s,
                             o.data + " (stage " + std::to_string(s) + " slice)");

  DistillResult result;
  for (int s : o.stages) {
    TrainLoopOptions loop = o.loop;
    loop.name = "stage" + std::to_string(s);
    loop.run_dir = o.out;
    loop.schedule.lr = o.stage[s - 1].lr;
    loop.schedule.kind = o.stage[s - 1].schedule;
    loop.schedule.warmup_frac = o.stage[s - 1].warmup;
    loop.schedule.decay_frac = o.stage[s - 1].decay;
    loop.schedule.cosine_decay = o.stage[s - 1].cosine_decay;
    loop.schedule.min_lr_frac = o.stage[s - 1].min_lr_frac;
    if (s != 3) loop.snapshot_steps.clear();  // snapshots are stage-3 branch points (study budgets)
    const int64_t stage_tokens = o.tokens > 0 ? static_cast<int64_t>(o.tokens * o.splits[s - 1] /
                                                                      (o.splits[0] + o.splits[1] + o.splits[2]))
                                              : split_stream(data.file_tokens(), o.splits)[s - 1].size();
    loop.steps = std::max<int64_t>(1, stage_tokens / (loop.batch * o.seq_len));
    const std::string ckpt = (fs::path(o.out) / ("checkpoint-" + loop.name)).string();
    if (o.loop.resume && checkpoint_exists(ckpt) && read_checkpoint_state(ckpt).value("finished", false)) {
      load_checkpoint_weights(ckpt, *student);
      if (!o.loop.quiet) std::cerr << "[" << loop.name << "] already finished; weights loaded from " << ckpt << "\n";
      result.final_loss.push_back(read_checkpoint_state(ckpt).value("loss", 0.0));
      continue;
    }

    std::vector<std::string> prefixes;
    StepFn step;
    if (s == 1) {
      for (int64_t l : replaced) {
        prefixes.push_back("model.layers." + std::to_string(l) + ".attn.");
        prefixes.push_back("model.layers." + std::to_string(l) + ".input_layernorm.");
      }
      step = [&, replaced](const torch::Tensor& batch) {
        auto x = batch.narrow(1, 0, o.seq_len);
        auto trace = teacher_trace(teacher, x);
        torch::Tensor loss = torch::zeros({}, torch::TensorOptions().device(x.device()));
        for (int64_t l : replaced) {
          auto layer = student->layer(l);
          auto out = layer->mixer->forward(layer->input_layernorm(trace.layer_in[l]), nullptr);
          loss = loss + torch::mse_loss(out.to(torch::kFloat), trace.attn_out[l].to(torch::kFloat));
        }
        return loss;
      };
    } else if (s == 2) {
      for (int64_t l : replaced) prefixes.push_back("model.layers." + std::to_string(l) + ".");
      step = [&, replaced](const torch::Tensor& batch) {
        auto x = batch.narrow(1, 0, o.seq_len);
        return stage2_loss(o, student, teacher_trace(teacher, x), replaced);
      };
    } else {
      step = [&](const torch::Tensor& batch) {
        auto x = batch.narrow(1, 0, o.seq_len), y = batch.narrow(1, 1, o.seq_len);
        torch::Tensor t_logits;
        teacher_trace(teacher, x, &t_logits);
        auto s_logits = student->forward(x);
        return stage3_loss(o, s_logits, t_logits, y);
      };
    }
    auto trainable = params_with_prefix(*student, prefixes);
    if (!o.loop.quiet)
      std::cerr << "[" << loop.name << "] " << loop.steps << " steps of " << loop.batch << " x " << o.seq_len
                << " tokens, lr " << loop.schedule.lr << " (" << to_string(loop.schedule.kind) << "), "
                << trainable.size() << " trainable tensors\n";
    auto r = run_training(*student, trainable, *loaders[s], step, loop);
    for (auto& p : student->parameters()) p.set_requires_grad(true);
    result.final_loss.push_back(r.last_loss);
    if (!r.finished) return result;  // stopped early (testing aid)
  }
  student->eval();
  if (is_main_process()) save_student(student, spec, o.out, o.teacher);
  result.finished = true;
  if (!o.loop.quiet) std::cerr << "[distill] wrote student " << o.out << "\n";
  return result;
}

}  // namespace linearize
