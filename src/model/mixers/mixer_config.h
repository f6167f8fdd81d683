// Settings of the seven linear-time token mixers, one struct for all of them, plus presets that derive
// a mixer's shape from a Llama teacher.
//
// Field names follow fla's layer arguments where fla has one (hidden_size, num_heads, num_kv_heads,
// use_short_conv, conv_size, gate_logit_normalizer, gate_low_rank_dim, norm_eps, ...); head sizes are
// given explicitly (head_k_dim, head_v_dim) instead of fla's expand_k / expand_v / head_dim, because the
// fla defaults differ per layer (docs/design.md, "Head sizes and fla's defaults") and a linearized student must mirror
// the teacher. A zero head count or head size means "derive": num_kv_heads 0 = num_heads, head dims 0 = hidden /
// num_heads.
//
// Presets (mixer_preset):
//   default  the teacher's layout: num_heads = teacher heads, head_k_dim = head_v_dim = teacher head_dim;
//            GQA kept natively where the mixer has num_kv_heads (linear_attention, retnet, gla);
//            RetNet rotary base = teacher rope_theta; KDA output gate multiplied: o_norm(o) * sigmoid(g).
//   paper    as the study's code builds them: fla's *layer* default head counts for GLA (4), RetNet (8)
//            and DeltaNet (4), no native GQA for those three (fla's num_kv_heads=None), head size =
//            hidden / heads and expand_k = expand_v = 1 so the teacher's q/k/v/o still fit; RetNet's
//            rotary base fla's 10000 (not the teacher's); linear attention with silu short convs on
//            q, k, v and no output norm; KDA with a full-rank output gate with bias and dt_bias = 0.
//            The study's defects are not in the preset (see paper_defects in distill/stages.h): with
//            the kda_gate defect KDA adds the gate inside the norm, y = RMSNorm(o + g) * w with g raw,
//            which is what calling fla's plain RMSNorm as o_norm(o, g) computes (its second argument
//            is a residual added before normalising).
// It does not choose training hyper-parameters; those live with the distillation stages.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "io/hf_config.h"

namespace linearize {

// The seven mixers, in the order of the table in docs/design.md, "The seven mixers". Their names
// (to_string) are what config files, the CLI and result files use.
enum class MixerKind { linear_attention, retnet, gla, deltanet, gated_deltanet, kda, mlstm };

std::string to_string(MixerKind kind);
// A mixer's name to its kind; anything else is an Error naming `what` (e.g. "--mixer") and the names.
MixerKind parse_mixer_kind(const std::string& name, const std::string& what = "mixer kind");
const std::vector<MixerKind>& all_mixer_kinds();  // table order
std::vector<std::string> mixer_kinds();           // their names, table order
inline bool shares_kv_heads(MixerKind k) {        // native grouped-query K/V heads
  return k == MixerKind::linear_attention || k == MixerKind::retnet || k == MixerKind::gla;
}
inline bool has_value_heads(MixerKind k) { return k == MixerKind::gated_deltanet || k == MixerKind::kda; }
inline bool is_delta_rule(MixerKind k) {
  return k == MixerKind::deltanet || k == MixerKind::gated_deltanet || k == MixerKind::kda;
}

struct MixerConfig {
  MixerKind kind = MixerKind::gated_deltanet;
  int64_t hidden_size = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // 0 = num_heads. Only linear_attention, retnet and gla share KV heads (GQA).
  // gated_deltanet, kda: value heads (fla num_v_heads, "GVA"); 0 = num_heads, else a multiple of it. Value
  // head i reads q/k head i / (num_v_heads / num_heads); beta, the gates and the state are per value head.
  int64_t num_v_heads = 0;
  int64_t head_k_dim = 0;    // 0 = hidden_size / num_heads
  int64_t head_v_dim = 0;    // 0 = hidden_size / num_heads

  // Biases on the q, k, v projections and on the output projection: off in fla's layers; on where the
  // teacher's attention has them (Qwen2: q, k, v), so that its projections carry over whole.
  bool qkv_bias = false, o_bias = false;
  // A Qwen3 teacher's RMSNorm over each head of the projected q and k (q_norm, k_norm; weights copied),
  // applied before the mixer's own convolutions and feature maps; its eps is the teacher's rms_norm_eps.
  bool qk_norm = false;
  double qk_norm_eps = 1e-6;

  // Short causal depthwise convolutions on the projected q, k, v (with silu). fla default: on for
  // deltanet, gated_deltanet, kda; off for linear_attention (the study's student has them), retnet,
  // gla; not available for mlstm.
  bool use_short_conv = false;
  int64_t conv_size = 4;
  bool conv_bias = false;

  // Output gate: retnet, gla, gated_deltanet (swish), deltanet (fla use_gate, swish), kda (low rank,
  // sigmoid), mlstm (ogate_preact, sigmoid, always on). Not available for linear_attention.
  bool use_output_gate = true;
  // Output RMSNorm: only linear_attention can turn it off (fla output_norm='identity'); the other
  // mixers always normalise.
  bool use_output_norm = true;

  // linear_attention: the feature map (elementwise_product | hedgehog | t2r | dpfp | elu | relu | identity),
  // fla's sum-normalisation of q and k after it (norm_q, norm_k: x / (sum x + 1e-4)) and its output
  // normalisation (feature_map_norm, fla do_feature_map_norm: o_t / (s q_t . sum_{u<=t} k_u + 1e-10)).
  std::string feature_map = "elementwise_product";
  bool norm_q = false, norm_k = false, feature_map_norm = false;
  double norm_eps = 1e-5;                           // per-head RMSNorm eps (fla layer default)
  double rope_theta = 10000.0;                      // retnet rotary base (fla default 10000)
  double gate_logit_normalizer = 16.0;              // gla: g = logsigmoid(gk_proj(x)) / normalizer
  int64_t gate_low_rank_dim = 16;                   // gla: gk_proj rank
  bool use_beta = true;                             // deltanet: beta = sigmoid(b_proj(x)), else 1
  bool allow_neg_eigval = false;                    // delta rule family: beta in (0, 2)
  std::string kda_gate_mode = "multiply";           // kda: multiply = o_norm(o)*sigmoid(g); add_in_norm = RMSNorm(o + g)*w
  bool kda_gate_low_rank = true;   // kda output gate: fla's low rank (rank head_v_dim, bias) or full rank with bias
  // kda decay: 0 = -e^{A_log} softplus(f + dt_bias); < 0 = fla's lower-bound gate
  // lower_bound * sigmoid(e^{A_log} (f + dt_bias)), in [lower_bound, 0). safe_gate (fla): asks
  // -5 <= lower_bound < 0 and starts A_log at 0.
  double lower_bound = 0.0;
  bool safe_gate = false;
  std::string dt_bias_init = "mamba";  // gated_deltanet, kda: mamba (softplus^-1 of dt ~ logU(1e-3, 0.1)) | zeros
  int64_t chunk_size = 64;                          // chunked form's chunk length

  // mLSTM (xLSTM large layer)
  double mlstm_gate_soft_cap = 15.0;      // i, f pre-activations: cap * tanh(x / cap)
  double mlstm_igate_bias_init = 0.0;     // docs/design.md, "mLSTM": 0 (not xLSTM-7B's -10) so |n.q| sets the scale
  double mlstm_fgate_bias_min = 3.0;      // fgate bias = linspace(min, max, heads)
  double mlstm_fgate_bias_max = 6.0;
  double mlstm_norm_eps = 1e-6;           // multi-head LayerNorm eps
  double mlstm_eps = 1e-6;                // cell denominator eps

  double init_std = 0.02;  // N(0, std) for new linear/conv weights (fla _init_weights)

  // Derived sizes (after resolve()).
  int64_t kv_heads() const { return num_kv_heads > 0 ? num_kv_heads : num_heads; }
  int64_t value_heads() const { return num_v_heads > 0 ? num_v_heads : num_heads; }
  int64_t key_dim() const { return num_heads * head_k_dim; }
  int64_t value_dim() const { return value_heads() * head_v_dim; }

  // Fills derived fields and checks consistency; throws Error naming the field.
  MixerConfig& resolve();
  MixerConfig resolved() const { MixerConfig c = *this; return c.resolve(); }

  nlohmann::json to_json() const;
  // Starts from defaults_for(kind) and applies every key; unknown keys are an Error naming the key.
  static MixerConfig from_json(const nlohmann::json& j);
  // This config with the keys of `overrides` (a JSON object of the same fields) replaced; `kind` may be
  // repeated but not changed. A new num_heads re-derives num_v_heads, the head sizes (hidden / heads) and,
  // where they no longer divide or the mixer has no native GQA, num_kv_heads, unless the overrides give
  // them. Unknown keys and wrong types are an Error naming the key.
  MixerConfig with_overrides(const nlohmann::json& overrides) const;
  // fla's per-layer defaults for fields that differ by kind (short conv, output gate).
  static MixerConfig defaults_for(MixerKind kind);
};

std::vector<std::string> mixer_presets();

// kind x preset x teacher -> config (see the header comment). Unknown preset: Error listing the valid
// names.
MixerConfig mixer_preset(MixerKind kind, const std::string& preset, const LlamaConfig& teacher);

}  // namespace linearize
