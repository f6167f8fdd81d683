// make_mixer and init_mixer_from_teacher (see factory.h).
#include "model/mixers/factory.h"

#include <sstream>
#include <tuple>

#include "io/error.h"
#include "model/mixers/blocks.h"
#include "model/mixers/deltanet.h"
#include "model/mixers/gated_deltanet.h"
#include "model/mixers/gla.h"
#include "model/mixers/kda.h"
#include "model/mixers/linear_attention.h"
#include "model/mixers/mlstm.h"
#include "model/mixers/retnet.h"

namespace linearize {

std::shared_ptr<TokenMixer> make_mixer(const MixerConfig& config) {
  switch (config.kind) {
    case MixerKind::linear_attention: return std::make_shared<LinearAttention>(config);
    case MixerKind::retnet: return std::make_shared<RetNet>(config);
    case MixerKind::gla: return std::make_shared<GLA>(config);
    case MixerKind::deltanet: return std::make_shared<DeltaNet>(config);
    case MixerKind::gated_deltanet: return std::make_shared<GatedDeltaNet>(config);
    case MixerKind::kda: return std::make_shared<KDA>(config);
    case MixerKind::mlstm: return std::make_shared<MLSTM>(config);
  }
  throw Error("make_mixer: mixer kind " + std::to_string(static_cast<int>(config.kind)) + " out of range");
}

namespace {

std::string shape_str(const torch::Tensor& t) {
  std::ostringstream s;
  s << t.sizes();
  return s.str();
}

}  // namespace

torch::Tensor repeat_kv_rows(const torch::Tensor& w, int64_t kv_heads, int64_t groups) {
  const int64_t d = w.size(0) / kv_heads;
  return w.reshape({kv_heads, 1, d, w.size(1)}).expand({kv_heads, groups, d, w.size(1)}).reshape({kv_heads * groups * d, w.size(1)});
}

torch::Tensor study_repeat_kv_rows(const torch::Tensor& w, int64_t groups) {
  const int64_t chunk = 32;
  if (w.size(0) % chunk != 0)
    throw Error("the study's GQA unroll needs K/V rows in multiples of 32, found " + std::to_string(w.size(0)));
  return repeat_kv_rows(w, w.size(0) / chunk, groups);
}

std::vector<std::string> init_mixer_from_teacher(TokenMixer& mixer, const LlamaAttention& teacher,
                                                 const MixerConfig& config, bool study_gqa_unroll) {
  std::vector<std::string> notes;
  auto params = mixer.named_parameters(/*recurse=*/true);
  const bool xlstm = config.kind == MixerKind::mlstm;
  const std::string qn = xlstm ? "q" : "q_proj", kn = xlstm ? "k" : "k_proj", vn = xlstm ? "v" : "v_proj",
                    on = xlstm ? "out_proj" : "o_proj";
  const int64_t groups = teacher.num_heads / teacher.num_kv_heads;
  torch::NoGradGuard no_grad;

  auto copy = [&](const std::string& name, const torch::Tensor& src, bool kv) {
    auto* dst = params.find(name + ".weight");
    if (!dst) {
      notes.push_back("left fresh " + name + ": the mixer has no " + name + ".weight");
      return;
    }
    if (dst->sizes() == src.sizes()) {
      dst->copy_(src);
      notes.push_back("copied " + name + ".weight " + shape_str(src));
    } else if (kv && groups > 1 && dst->sizes() == repeat_kv_rows(src, teacher.num_kv_heads, groups).sizes()) {
      if (study_gqa_unroll) {
        dst->copy_(study_repeat_kv_rows(src, groups));
        notes.push_back("copied " + name + ".weight " + shape_str(*dst) + " with the study's unroll (32-row chunks x" +
                        std::to_string(groups) + ")");
      } else {
        dst->copy_(repeat_kv_rows(src, teacher.num_kv_heads, groups));
        notes.push_back("copied " + name + ".weight " + shape_str(*dst) + " (each of the teacher's " +
                        std::to_string(teacher.num_kv_heads) + " KV heads repeated x" + std::to_string(groups) + ")");
      }
    } else {
      notes.push_back("left fresh " + name + ".weight: student " + shape_str(*dst) + " vs teacher " + shape_str(src));
    }
  };
  copy(qn, teacher.q_proj->weight, false);
  copy(kn, teacher.k_proj->weight, true);
  copy(vn, teacher.v_proj->weight, true);
  copy(on, teacher.o_proj->weight, false);
  // Biases (Qwen2's q, k, v): a bias is a weight of one column, repeated over KV heads as its rows are.
  for (const auto& [name, src, kv] : {std::make_tuple(qn, teacher.q_proj->bias, false),
                                      std::make_tuple(kn, teacher.k_proj->bias, true),
                                      std::make_tuple(vn, teacher.v_proj->bias, true),
                                      std::make_tuple(on, teacher.o_proj->bias, false)}) {
    if (!src.defined()) continue;
    auto* dst = params.find(name + ".bias");
    if (!dst) throw Error("init_mixer_from_teacher: the teacher's " + name + " has a bias but the mixer's has none");
    const auto column = src.unsqueeze(1);
    if (dst->size(0) == src.size(0)) dst->copy_(src);
    else if (kv && dst->size(0) == src.size(0) * groups)
      dst->copy_((study_gqa_unroll ? study_repeat_kv_rows(column, groups) : repeat_kv_rows(column, teacher.num_kv_heads, groups)).squeeze(1));
    else throw Error("init_mixer_from_teacher: " + name + ".bias " + shape_str(*dst) + " vs the teacher's " + shape_str(src));
    notes.push_back("copied " + name + ".bias " + shape_str(*dst));
  }
  // Qwen3's per-head q/k norms: one weight per channel of a head, so they carry when the head size does.
  for (const auto& [name, src] : {std::make_pair(std::string("q_norm"), teacher.q_norm),
                                  std::make_pair(std::string("k_norm"), teacher.k_norm)}) {
    if (!src) continue;
    auto* dst = params.find(name + ".weight");
    if (!dst) throw Error("init_mixer_from_teacher: the teacher has " + name + " but the mixer has none");
    if (dst->sizes() == src->weight.sizes()) {
      dst->copy_(src->weight);
      notes.push_back("copied " + name + ".weight " + shape_str(*dst));
    } else {
      notes.push_back("left " + name + ".weight at ones: student heads of " + shape_str(*dst) + " vs the teacher's " +
                      shape_str(src->weight));
    }
  }

  for (const auto& item : mixer.named_modules("", /*include_self=*/false)) {
    if (auto* conv = item.value()->as<mixers::ShortConvImpl>()) {
      conv->init_identity();
      notes.push_back("identity init " + item.key());
    }
  }
  return notes;
}

}  // namespace linearize
