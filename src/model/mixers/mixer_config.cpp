// MixerConfig: defaults per kind, validation, JSON round trip and the teacher presets (see the header).
#include "model/mixers/mixer_config.h"

#include <algorithm>
#include <cmath>

#include "io/error.h"

namespace linearize {

namespace {

std::string join(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

bool contains(const std::vector<std::string>& names, const std::string& n) {
  return std::find(names.begin(), names.end(), n) != names.end();
}

const std::vector<std::string> kFeatureMaps = {"elementwise_product", "hedgehog", "t2r", "dpfp", "elu", "relu", "identity"};
const std::vector<std::string> kKdaGateModes = {"multiply", "add_in_norm"};
const std::vector<std::string> kDtBiasInits = {"mamba", "zeros"};

}  // namespace

std::string to_string(MixerKind kind) {
  switch (kind) {
    case MixerKind::linear_attention: return "linear_attention";
    case MixerKind::retnet: return "retnet";
    case MixerKind::gla: return "gla";
    case MixerKind::deltanet: return "deltanet";
    case MixerKind::gated_deltanet: return "gated_deltanet";
    case MixerKind::kda: return "kda";
    case MixerKind::mlstm: return "mlstm";
  }
  throw Error("mixer kind " + std::to_string(static_cast<int>(kind)) + " out of range");
}

const std::vector<MixerKind>& all_mixer_kinds() {
  static const std::vector<MixerKind> kinds = {MixerKind::linear_attention, MixerKind::retnet,
                                               MixerKind::gla,              MixerKind::deltanet,
                                               MixerKind::gated_deltanet,   MixerKind::kda,
                                               MixerKind::mlstm};
  return kinds;
}

std::vector<std::string> mixer_kinds() {
  std::vector<std::string> names;
  for (MixerKind k : all_mixer_kinds()) names.push_back(to_string(k));
  return names;
}

MixerKind parse_mixer_kind(const std::string& name, const std::string& what) {
  for (MixerKind k : all_mixer_kinds())
    if (to_string(k) == name) return k;
  throw Error("unknown " + what + " '" + name + "'; expected one of: " + join(mixer_kinds()));
}

std::vector<std::string> mixer_presets() { return {"default", "paper"}; }

MixerConfig MixerConfig::defaults_for(MixerKind kind) {
  MixerConfig c;
  c.kind = kind;
  c.use_short_conv = is_delta_rule(kind);
  c.use_output_gate = kind != MixerKind::linear_attention && kind != MixerKind::deltanet;
  return c;
}

MixerConfig& MixerConfig::resolve() {
  const std::string name = to_string(kind);
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) throw Error("mixer config (" + name + "): " + what);
  };
  need(hidden_size > 0, "hidden_size must be > 0, found " + std::to_string(hidden_size));
  need(num_heads > 0, "num_heads must be > 0, found " + std::to_string(num_heads));
  if (head_k_dim == 0 || head_v_dim == 0)
    need(hidden_size % num_heads == 0, "hidden_size " + std::to_string(hidden_size) +
                                           " is not divisible by num_heads " + std::to_string(num_heads) +
                                           "; give head_k_dim and head_v_dim");
  if (head_k_dim == 0) head_k_dim = hidden_size / num_heads;
  if (head_v_dim == 0) head_v_dim = hidden_size / num_heads;
  if (num_kv_heads == 0) num_kv_heads = num_heads;
  const bool native_gqa = shares_kv_heads(kind);
  need(num_heads % num_kv_heads == 0, "num_heads " + std::to_string(num_heads) +
                                          " is not a multiple of num_kv_heads " + std::to_string(num_kv_heads));
  need(native_gqa || num_kv_heads == num_heads,
       "num_kv_heads (" + std::to_string(num_kv_heads) + ") must equal num_heads (" + std::to_string(num_heads) +
           "): only linear_attention, retnet and gla share KV heads natively");
  const bool gva = has_value_heads(kind);
  if (num_v_heads == 0) num_v_heads = num_heads;
  need(num_v_heads > 0 && num_v_heads % num_heads == 0,
       "num_v_heads " + std::to_string(num_v_heads) + " must be a positive multiple of num_heads " +
           std::to_string(num_heads));
  need(gva || num_v_heads == num_heads, "num_v_heads (" + std::to_string(num_v_heads) + ") must equal num_heads (" +
                                            std::to_string(num_heads) + "): only gated_deltanet and kda have value heads");
  need(conv_size >= 1, "conv_size must be >= 1");
  need(!qk_norm || qk_norm_eps > 0, "qk_norm_eps must be > 0");
  need(chunk_size >= 1, "chunk_size must be >= 1");
  need(!(use_short_conv && kind == MixerKind::mlstm), "use_short_conv is not available for " + name);
  need(!(use_output_gate && kind == MixerKind::linear_attention), "use_output_gate is not available for linear_attention");
  need(use_output_norm || kind == MixerKind::linear_attention, "use_output_norm=false is only available for linear_attention");
  need(contains(kFeatureMaps, feature_map),
       "unknown feature_map '" + feature_map + "'; expected one of: " + join(kFeatureMaps));
  need(kind == MixerKind::linear_attention || (!norm_q && !norm_k && !feature_map_norm),
       "norm_q, norm_k and feature_map_norm are only available for linear_attention");
  need(contains(kKdaGateModes, kda_gate_mode),
       "unknown kda_gate_mode '" + kda_gate_mode + "'; expected one of: " + join(kKdaGateModes));
  need(contains(kDtBiasInits, dt_bias_init),
       "unknown dt_bias_init '" + dt_bias_init + "'; expected one of: " + join(kDtBiasInits));
  need(std::isfinite(lower_bound) && lower_bound <= 0, "lower_bound must be 0 (off) or negative, found " +
                                                           std::to_string(lower_bound));
  need(kind == MixerKind::kda || (lower_bound == 0 && !safe_gate), "lower_bound and safe_gate are only available for kda");
  need(!safe_gate || (lower_bound >= -5 && lower_bound < 0),
       "safe_gate needs -5 <= lower_bound < 0, found lower_bound " + std::to_string(lower_bound));
  if (kind == MixerKind::retnet) need(head_k_dim % 2 == 0, "retnet needs an even head_k_dim for the rotary embedding");
  return *this;
}

nlohmann::json MixerConfig::to_json() const {
  return {{"kind", to_string(kind)},
          {"hidden_size", hidden_size},
          {"num_heads", num_heads},
          {"num_kv_heads", num_kv_heads},
          {"num_v_heads", num_v_heads},
          {"head_k_dim", head_k_dim},
          {"head_v_dim", head_v_dim},
          {"qkv_bias", qkv_bias},
          {"o_bias", o_bias},
          {"qk_norm", qk_norm},
          {"qk_norm_eps", qk_norm_eps},
          {"use_short_conv", use_short_conv},
          {"conv_size", conv_size},
          {"conv_bias", conv_bias},
          {"use_output_gate", use_output_gate},
          {"use_output_norm", use_output_norm},
          {"feature_map", feature_map},
          {"norm_q", norm_q},
          {"norm_k", norm_k},
          {"feature_map_norm", feature_map_norm},
          {"norm_eps", norm_eps},
          {"rope_theta", rope_theta},
          {"gate_logit_normalizer", gate_logit_normalizer},
          {"gate_low_rank_dim", gate_low_rank_dim},
          {"use_beta", use_beta},
          {"allow_neg_eigval", allow_neg_eigval},
          {"kda_gate_mode", kda_gate_mode},
          {"kda_gate_low_rank", kda_gate_low_rank},
          {"lower_bound", lower_bound},
          {"safe_gate", safe_gate},
          {"dt_bias_init", dt_bias_init},
          {"chunk_size", chunk_size},
          {"mlstm_gate_soft_cap", mlstm_gate_soft_cap},
          {"mlstm_igate_bias_init", mlstm_igate_bias_init},
          {"mlstm_fgate_bias_min", mlstm_fgate_bias_min},
          {"mlstm_fgate_bias_max", mlstm_fgate_bias_max},
          {"mlstm_norm_eps", mlstm_norm_eps},
          {"mlstm_eps", mlstm_eps},
          {"init_std", init_std}};
}

MixerConfig MixerConfig::from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw Error("mixer config: expected a JSON object, found " + std::string(j.type_name()));
  if (!j.contains("kind")) throw Error("mixer config: missing key 'kind'; expected one of: " + join(mixer_kinds()));
  if (!j.at("kind").is_string())
    throw Error("mixer config: 'kind' must be a string, found " + j.at("kind").dump());
  MixerConfig c = defaults_for(parse_mixer_kind(j.at("kind").get<std::string>()));
  for (const auto& [key, value] : j.items()) {
    try {
      if (key == "kind") continue;
      else if (key == "hidden_size") c.hidden_size = value.get<int64_t>();
      else if (key == "num_heads") c.num_heads = value.get<int64_t>();
      else if (key == "num_kv_heads") c.num_kv_heads = value.is_null() ? 0 : value.get<int64_t>();
      else if (key == "num_v_heads") c.num_v_heads = value.is_null() ? 0 : value.get<int64_t>();
      else if (key == "head_k_dim") c.head_k_dim = value.get<int64_t>();
      else if (key == "head_v_dim") c.head_v_dim = value.get<int64_t>();
      else if (key == "qkv_bias") c.qkv_bias = value.get<bool>();
      else if (key == "o_bias") c.o_bias = value.get<bool>();
      else if (key == "qk_norm") c.qk_norm = value.get<bool>();
      else if (key == "qk_norm_eps") c.qk_norm_eps = value.get<double>();
      else if (key == "use_short_conv") c.use_short_conv = value.get<bool>();
      else if (key == "conv_size") c.conv_size = value.get<int64_t>();
      else if (key == "conv_bias") c.conv_bias = value.get<bool>();
      else if (key == "use_output_gate") c.use_output_gate = value.get<bool>();
      else if (key == "use_output_norm") c.use_output_norm = value.get<bool>();
      else if (key == "feature_map") c.feature_map = value.get<std::string>();
      else if (key == "norm_q") c.norm_q = value.get<bool>();
      else if (key == "norm_k") c.norm_k = value.get<bool>();
      else if (key == "feature_map_norm") c.feature_map_norm = value.get<bool>();
      else if (key == "norm_eps") c.norm_eps = value.get<double>();
      else if (key == "rope_theta") c.rope_theta = value.get<double>();
      else if (key == "gate_logit_normalizer") c.gate_logit_normalizer = value.get<double>();
      else if (key == "gate_low_rank_dim") c.gate_low_rank_dim = value.get<int64_t>();
      else if (key == "use_beta") c.use_beta = value.get<bool>();
      else if (key == "allow_neg_eigval") c.allow_neg_eigval = value.get<bool>();
      else if (key == "kda_gate_mode") c.kda_gate_mode = value.get<std::string>();
      else if (key == "kda_gate_low_rank") c.kda_gate_low_rank = value.get<bool>();
      else if (key == "lower_bound") c.lower_bound = value.get<double>();
      else if (key == "safe_gate") c.safe_gate = value.get<bool>();
      else if (key == "dt_bias_init") c.dt_bias_init = value.get<std::string>();
      else if (key == "chunk_size") c.chunk_size = value.get<int64_t>();
      else if (key == "mlstm_gate_soft_cap") c.mlstm_gate_soft_cap = value.get<double>();
      else if (key == "mlstm_igate_bias_init") c.mlstm_igate_bias_init = value.get<double>();
      else if (key == "mlstm_fgate_bias_min") c.mlstm_fgate_bias_min = value.get<double>();
      else if (key == "mlstm_fgate_bias_max") c.mlstm_fgate_bias_max = value.get<double>();
      else if (key == "mlstm_norm_eps") c.mlstm_norm_eps = value.get<double>();
      else if (key == "mlstm_eps") c.mlstm_eps = value.get<double>();
      else if (key == "init_std") c.init_std = value.get<double>();
      else
        throw Error("mixer config: unknown key '" + key + "' (kind " + to_string(c.kind) + ")");
    } catch (const nlohmann::json::exception& e) {
      throw Error("mixer config: key '" + key + "' has the wrong type (" + value.dump() + "): " + e.what());
    }
  }
  return c.resolve();
}

MixerConfig MixerConfig::with_overrides(const nlohmann::json& overrides) const {
  if (!overrides.is_object())
    throw Error("mixer config overrides: expected a JSON object, found " + std::string(overrides.type_name()));
  nlohmann::json j = to_json();
  for (const auto& [key, value] : overrides.items()) {
    if (key == "kind" && value != j["kind"])
      throw Error("mixer config overrides: 'kind' is " + value.dump() + " but the mixer is '" + to_string(kind) +
                  "' (choose the mixer with --mixer)");
    if (!j.contains(key)) {
      std::string known;
      for (const auto& [k, v] : j.items()) known += (known.empty() ? "" : ", ") + k;
      throw Error("mixer config overrides: unknown key '" + key + "' (kind " + to_string(kind) + "; known: " + known + ")");
    }
    j[key] = value;
  }
  // A new head count re-derives what follows from it unless the overrides set that too.
  if (overrides.contains("num_heads")) {
    for (const char* derived : {"num_v_heads", "head_k_dim", "head_v_dim"})
      if (!overrides.contains(derived)) j[derived] = 0;
    // KV heads: kept where the mixer shares them natively and they still divide the heads, else one per head.
    const bool native_gqa = shares_kv_heads(kind);
    const auto heads = j["num_heads"];
    if (!overrides.contains("num_kv_heads") &&
        (!native_gqa || !heads.is_number_integer() || heads.get<int64_t>() % std::max<int64_t>(1, num_kv_heads) != 0))
      j["num_kv_heads"] = 0;
  }
  return from_json(j);
}

MixerConfig mixer_preset(MixerKind kind, const std::string& preset, const LlamaConfig& teacher) {
  if (!contains(mixer_presets(), preset))
    throw Error("unknown mixer preset '" + preset + "'; expected one of: " + join(mixer_presets()));
  MixerConfig c = MixerConfig::defaults_for(kind);
  c.hidden_size = teacher.hidden_size;
  c.num_heads = teacher.num_attention_heads;
  c.head_k_dim = c.head_v_dim = teacher.head_dim;
  c.num_kv_heads = shares_kv_heads(kind) ? teacher.num_key_value_heads : teacher.num_attention_heads;
  c.rope_theta = teacher.rope_theta;
  c.qkv_bias = teacher.qkv_bias;
  c.o_bias = teacher.o_bias;
  c.qk_norm = teacher.qk_norm;
  c.qk_norm_eps = teacher.rms_norm_eps;
  if (preset == "paper") {
    // fla layer defaults: GatedLinearAttention num_heads=4, MultiScaleRetention 8, DeltaNet 4; their
    // num_kv_heads=None (no GQA); expand_k = expand_v = 1 so the teacher's projections keep their shape.
    int64_t heads = kind == MixerKind::gla ? 4 : kind == MixerKind::retnet ? 8 : kind == MixerKind::deltanet ? 4 : 0;
    if (heads > 0) {
      const int64_t width = teacher.num_attention_heads * teacher.head_dim;
      if (width % heads != 0)
        throw Error("preset paper: the teacher's attention width " + std::to_string(width) +
                    " is not divisible by fla's default " + std::to_string(heads) + " heads for " + to_string(kind));
      c.num_heads = c.num_kv_heads = heads;
      c.head_k_dim = c.head_v_dim = width / heads;
    }
    if (kind == MixerKind::retnet) c.rope_theta = 10000.0;  // fla's RotaryEmbedding default, not the teacher's base
    if (kind == MixerKind::linear_attention) c.use_short_conv = true, c.use_output_norm = false;
    if (kind == MixerKind::kda) c.kda_gate_low_rank = false, c.dt_bias_init = "zeros";
  }
  return c.resolve();
}

}  // namespace linearize
