// The fla export (see fla_export.h).
#include "model/fla_export.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <regex>

#include "io/atomic_file.h"
#include "io/error.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "model/model_io.h"
#include "model/student.h"

namespace linearize {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Student {
  LlamaConfig config;
  StudentSpec spec;
};

Student read_student(const std::string& dir) {
  Student s{LlamaConfig::load(dir), {}};
  if (!s.config.raw.contains("linearize"))
    throw Error(dir + ": not a linearized student (config.json has no \"linearize\" section); fla has no Llama model");
  s.spec = StudentSpec::from_json(s.config.raw["linearize"], dir + "/config.json");
  return s;
}

// fla computes key_dim = int(hidden * expand): the ratio must give back the exact width.
double ratio(int64_t width, int64_t base, const std::string& what) {
  const double r = static_cast<double>(width) / static_cast<double>(base);
  if (static_cast<int64_t>(static_cast<double>(base) * r) != width)
    throw Error("fla export: " + what + " " + std::to_string(width) + " is not int(" + std::to_string(base) +
                " * ratio) for any ratio fla reads back exactly");
  return r;
}

// fla's model of each mixer it has: its model_type and CausalLM class.
struct FlaModel {
  MixerKind kind;
  const char* model_type;
  const char* causal_lm;
};
const FlaModel kFlaModels[] = {{MixerKind::linear_attention, "linear_attn", "LinearAttentionForCausalLM"},
                               {MixerKind::retnet, "retnet", "RetNetForCausalLM"},
                               {MixerKind::gla, "gla", "GLAForCausalLM"},
                               {MixerKind::deltanet, "delta_net", "DeltaNetForCausalLM"},
                               {MixerKind::gated_deltanet, "gated_deltanet", "GatedDeltaNetForCausalLM"},
                               {MixerKind::kda, "kda", "KDAForCausalLM"}};

using Renames = std::vector<std::pair<std::regex, std::string>>;

// Writes `to`: the tensors of the folder `from`, each under the name the first matching rename gives it,
// config.json and the tokenizer files. A tensor no rename matches is an Error: `unnamed` + its name.
void write_renamed(const std::string& from, const std::string& to, const Renames& renames, const json& config,
                   const std::string& unnamed, const std::map<std::string, std::string>& metadata) {
  WeightStore store(from);
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& name : store.names()) {
    std::string renamed;
    for (const auto& [re, to_name] : renames)
      if (std::regex_match(name, re)) {
        renamed = std::regex_replace(name, re, to_name);
        break;
      }
    if (renamed.empty()) throw Error(unnamed + name);
    tensors.emplace_back(renamed, store.get(name));
  }
  fs::create_directories(to);
  save_safetensors((fs::path(to) / "model.safetensors").string(), tensors, metadata);
  write_file_atomic((fs::path(to) / "config.json").string(), [&](std::ostream& o) { o << config.dump(2) << "\n"; });
  copy_tokenizer_files(from, to);
}

// The layers a hybrid keeps as softmax attention, as fla's `attn` spec: fla's Attention derives head_dim
// from hidden / num_heads, has no q/k norms, no o_proj bias and plain RoPE; its window_size w sees the
// query and w - 1 positions before, as our sliding_window does.
json hybrid_attention(const LlamaConfig& c, const StudentSpec& spec, const std::string& dir) {
  auto refuse = [&](const std::string& why) { throw Error(dir + ": cannot export to fla: " + why); };
  std::vector<int64_t> kept;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    if (std::find(spec.layers.begin(), spec.layers.end(), i) == spec.layers.end()) kept.push_back(i);
  if (c.head_dim * c.num_attention_heads != c.hidden_size)
    refuse("the attention layers have head_dim " + std::to_string(c.head_dim) + " x " +
           std::to_string(c.num_attention_heads) + " heads != hidden " + std::to_string(c.hidden_size) +
           "; fla's hybrid attention derives head_dim from hidden / num_heads");
  if (c.qk_norm) refuse("the attention layers have q/k norms (Qwen3); fla's hybrid attention has none");
  if (c.o_bias) refuse("the attention layers have an o_proj bias; fla's hybrid attention has none");
  if (c.rope_scaling.type != "default")
    refuse("the attention layers use " + c.rope_scaling.type + " RoPE scaling; fla's hybrid attention has plain RoPE");
  return {{"layers", kept},
          {"num_heads", c.num_attention_heads},
          {"num_kv_heads", c.num_key_value_heads},
          {"qkv_bias", c.qkv_bias},
          {"window_size", c.sliding_window > 0 ? json(c.sliding_window) : json()},
          {"rope_theta", c.rope_theta}};
}

json fla_config_of(const Student& student, const std::string& dir) {
  const auto& [c, spec] = student;
  const auto& m = spec.mixer_config;
  const std::string kind = to_string(m.kind);
  auto refuse = [&](const std::string& why) { throw Error(dir + ": cannot export to fla: " + why); };
  if (m.kind == MixerKind::mlstm) refuse("fla has no mLSTM model");
  if (m.qkv_bias || m.o_bias) refuse("the mixer has attention biases (carried from the teacher); fla's layers have none");
  if (m.qk_norm) refuse("the mixer has per-head q/k norms (carried from a Qwen3 teacher); fla's layers have none");
  if (c.mlp_bias) refuse("the MLP has biases; fla's GatedMLP has none");
  if (m.use_short_conv && m.conv_bias) refuse("the short convolutions have biases; fla's config cannot ask for them");
  if (m.norm_eps != c.rms_norm_eps)
    refuse("fla uses one norm_eps for the block norms and the mixer's output norm; the student has " +
           std::to_string(c.rms_norm_eps) + " and " + std::to_string(m.norm_eps));
  json j = {{"architectures", json::array()},
            {"hidden_size", c.hidden_size},
            {"num_hidden_layers", c.num_hidden_layers},
            {"num_heads", m.num_heads},
            {"use_short_conv", m.use_short_conv},
            {"conv_size", m.conv_size},
            {"hidden_act", "swish"},
            {"hidden_ratio", 4},
            {"intermediate_size", c.intermediate_size},
            {"max_position_embeddings", c.max_position_embeddings},
            {"norm_eps", c.rms_norm_eps},
            {"attn", nullptr},
            {"attn_mode", "chunk"},
            {"vocab_size", c.vocab_size},
            {"tie_word_embeddings", c.tie_word_embeddings},
            {"bos_token_id", c.bos_token_id ? json(*c.bos_token_id) : json()},
            {"eos_token_id", c.eos_token_ids.empty() ? json() : json(c.eos_token_ids.front())},
            {"pad_token_id", c.pad_token_id ? json(*c.pad_token_id) : json()},
            {"use_cache", true},
            {"initializer_range", 0.02},
            {"fuse_norm", true},
            {"fuse_swiglu", true},
            {"fuse_cross_entropy", true},
            {"fuse_linear_cross_entropy", false},
            {"use_l2warp", false},
            {"torch_dtype", c.torch_dtype}};
  for (const auto& f : kFlaModels)
    if (f.kind == m.kind) j["model_type"] = f.model_type, j["architectures"] = {f.causal_lm};
  if (!spec.layers.empty()) j["attn"] = hybrid_attention(c, spec, dir);
  if (m.kind == MixerKind::gated_deltanet) {
    j["use_gate"] = m.use_output_gate;
  } else if (m.kind == MixerKind::deltanet) {
    j["expand_k"] = ratio(m.key_dim(), c.hidden_size, "the key width");
    j["expand_v"] = ratio(m.value_dim(), c.hidden_size, "the value width");
    j["use_gate"] = m.use_output_gate;
    j["use_beta"] = m.use_beta;
    j["allow_neg_eigval"] = m.allow_neg_eigval;
    j["qk_norm"] = "l2";          // q and k L2-normalised, as ours
    j["qk_activation"] = "silu";  // after the short convolution, as ours
    j["use_output_norm"] = true;
  } else if (m.kind == MixerKind::kda) {
    if (!m.use_output_gate) refuse("the output gate is off; fla's KDA is always gated");
    if (m.kda_gate_mode != "multiply")
      refuse("the output gate is added inside the norm (the study's kda_gate defect); fla multiplies by sigmoid(g)");
    if (!m.kda_gate_low_rank) refuse("the output gate is full rank; fla's KDA gate is low rank (head_v_dim)");
    j["safe_gate"] = m.safe_gate;
    j["lower_bound"] = m.lower_bound < 0 ? json(m.lower_bound) : json();
    j.erase("fuse_linear_cross_entropy");  // not a field of fla's KDA config
  } else if (m.kind == MixerKind::linear_attention) {
    if (m.use_short_conv) refuse("the student has short convolutions (the paper preset); fla's linear attention has none");
    if (!m.use_output_norm) refuse("the output norm is off (the paper preset); fla's linear attention model always has it");
    j["attn_mode"] = "fused_chunk";
    j["expand_k"] = ratio(m.key_dim(), c.hidden_size, "the key width");
    j["expand_v"] = ratio(m.value_dim(), c.hidden_size, "the value width");
    j["num_kv_heads"] = m.kv_heads();
    j["feature_map"] = m.feature_map;
    j["tie_feature_map_qk"] = false;
    j["norm_q"] = m.norm_q;
    j["norm_k"] = m.norm_k;
    j["norm_feature_map"] = m.feature_map_norm;
    j["elementwise_affine"] = true;
    j.erase("use_short_conv");
    j.erase("conv_size");
  } else if (m.kind == MixerKind::retnet) {
    if (m.use_short_conv) refuse("the student's RetNet has short convolutions; fla's RetNet model cannot have them");
    if (m.rope_theta != 10000.0)
      refuse("fla's RetNet rotates with base 10000; this student's base is " + std::to_string(m.rope_theta) +
             " (the teacher's; the paper preset uses 10000)");
    if (m.head_k_dim > 256) refuse("fla's RetNet allows head_k_dim up to 256");
    j["expand_k"] = ratio(m.key_dim(), c.hidden_size, "the key width");
    j["expand_v"] = ratio(m.value_dim(), c.hidden_size, "the value width");
    j["num_kv_heads"] = m.kv_heads();
    j["use_output_gate"] = m.use_output_gate;
    j["feature_map"] = nullptr;
    j["elementwise_affine"] = true;
  } else {  // gla
    if (m.gate_low_rank_dim != 16 || m.gate_logit_normalizer != 16.0)
      refuse("fla's GLA model fixes the gate's rank and normalizer at 16 and 16; the student has " +
             std::to_string(m.gate_low_rank_dim) + " and " + std::to_string(m.gate_logit_normalizer));
    j["expand_k"] = ratio(m.key_dim(), c.hidden_size, "the key width");
    j["expand_v"] = ratio(m.value_dim(), c.hidden_size, "the value width");
    j["num_kv_heads"] = m.kv_heads();
    j["use_output_gate"] = m.use_output_gate;
    j["feature_map"] = nullptr;
    j["clamp_min"] = nullptr;
    j["elementwise_affine"] = true;
  }
  if (m.kind == MixerKind::gated_deltanet || m.kind == MixerKind::kda) {  // head sizes, not ratios of hidden
    const std::string name = m.kind == MixerKind::kda ? "KDA" : "Gated DeltaNet";
    if (!m.use_beta) refuse("beta is off (use_beta false); fla's " + name + " always uses sigmoid(b_proj x)");
    j["head_dim"] = m.head_k_dim;
    j["expand_v"] = ratio(m.head_v_dim, m.head_k_dim, "head_v_dim");
    j["num_v_heads"] = m.value_heads();
    j["allow_neg_eigval"] = m.allow_neg_eigval;
  }
  return j;
}

}  // namespace

json fla_config(const std::string& dir) { return fla_config_of(read_student(dir), dir); }

json export_fla(const std::string& dir, const std::string& out) {
  const Student student = read_student(dir);
  const json config = fla_config_of(student, dir);
  // GLA's and RetNet's gated output norm is fla's g_norm_swish_gate (fuse_norm, swish, a gate).
  const auto& m = student.spec.mixer_config;
  const bool gated_norm = (m.kind == MixerKind::gla || m.kind == MixerKind::retnet) && m.use_output_gate;
  // Teacher names to fla's; the mixers' names are fla's already.
  const Renames renames = {
      {std::regex(R"(^model\.embed_tokens\.weight$)"), "model.embeddings.weight"},
      {std::regex(R"(^model\.layers\.(\d+)\.input_layernorm\.weight$)"), "model.layers.$1.attn_norm.weight"},
      {std::regex(R"(^model\.layers\.(\d+)\.post_attention_layernorm\.weight$)"), "model.layers.$1.mlp_norm.weight"},
      {std::regex(R"(^model\.layers\.(\d+)\.mlp\.(gate|up|down)_proj\.weight$)"), "model.layers.$1.mlp.$2_proj.weight"},
      {std::regex(R"(^model\.layers\.(\d+)\.attn\.g_norm\.weight$)"),
       gated_norm ? "model.layers.$1.attn.g_norm_swish_gate.weight" : "model.layers.$1.attn.g_norm.weight"},
      {std::regex(R"(^model\.layers\.(\d+)\.attn\.(.+)$)"), "model.layers.$1.attn.$2"},
      // A hybrid's softmax layers: fla's Attention sits under the same name as a mixer.
      {std::regex(R"(^model\.layers\.(\d+)\.self_attn\.([qkvo])_proj\.(weight|bias)$)"), "model.layers.$1.attn.$2_proj.$3"},
      {std::regex(R"(^model\.norm\.weight$)"), "model.norm.weight"},
      {std::regex(R"(^lm_head\.weight$)"), "lm_head.weight"}};
  write_renamed(dir, out, renames, config, dir + ": cannot export to fla: no fla name for the tensor ", {{"format", "pt"}});
  return config;
}

// import_fla after the config file is found; nlohmann errors are turned into ours by the caller.
static void import_fla_checked(const std::string& dir, const std::string& path, const json& j, const std::string& out);

void import_fla(const std::string& dir, const std::string& out) {
  const std::string path = (fs::path(dir) / "config.json").string();
  if (!fs::exists(path)) throw Error(path + ": no such file (expected an fla model folder)");
  try {
    import_fla_checked(dir, path, json::parse(read_file(path)), out);
  } catch (const json::exception& e) {  // malformed JSON, a missing key or a value of the wrong type
    throw Error(path + ": " + e.what());
  }
}

static void import_fla_checked(const std::string& dir, const std::string& path, const json& j, const std::string& out) {
  const std::string type = j.value("model_type", std::string());
  auto refuse = [&](const std::string& why) { throw Error(path + ": cannot import from fla: " + why); };
  const FlaModel* model = nullptr;
  std::string known;
  for (const auto& f : kFlaModels) {
    if (type == f.model_type) model = &f;
    known += (known.empty() ? "" : ", ") + std::string(f.model_type);
  }
  if (!model) refuse("model_type \"" + type + "\" (expected one of " + known + ")");
  if (j.value("hidden_act", std::string("swish")) != "swish") refuse("hidden_act must be swish");
  const int64_t H = j.at("hidden_size").get<int64_t>(), heads = j.at("num_heads").get<int64_t>();
  MixerConfig m = MixerConfig::defaults_for(model->kind);
  m.hidden_size = H;
  m.num_heads = heads;
  m.norm_eps = j.value("norm_eps", 1e-6);
  m.conv_size = j.value("conv_size", int64_t{4});
  auto width = [&](const char* key, double dflt) { return static_cast<int64_t>(static_cast<double>(H) * j.value(key, dflt)); };
  switch (m.kind) {
    case MixerKind::gated_deltanet:
    case MixerKind::kda: {
      m.head_k_dim = j.at("head_dim").get<int64_t>();
      m.head_v_dim = static_cast<int64_t>(static_cast<double>(m.head_k_dim) * j.value("expand_v", 1.0));
      m.num_v_heads = j.value("num_v_heads", json()).is_null() ? heads : j["num_v_heads"].get<int64_t>();
      m.use_short_conv = j.value("use_short_conv", true);
      m.allow_neg_eigval = j.value("allow_neg_eigval", false);
      if (m.kind == MixerKind::gated_deltanet) {
        m.use_output_gate = j.value("use_gate", true);
      } else {
        m.safe_gate = j.value("safe_gate", false);
        m.lower_bound = j.value("lower_bound", json()).is_null() ? 0.0 : j["lower_bound"].get<double>();
      }
      break;
    }
    default: {
      const double ek = m.kind == MixerKind::gla ? 0.5 : 1.0;
      const double ev = m.kind == MixerKind::retnet ? 2.0 : 1.0;
      m.head_k_dim = width("expand_k", ek) / heads;
      m.head_v_dim = width("expand_v", ev) / heads;
      m.num_kv_heads = j.value("num_kv_heads", json()).is_null() ? heads : j["num_kv_heads"].get<int64_t>();
      if (m.kind == MixerKind::deltanet) {
        m.num_kv_heads = heads;
        m.use_short_conv = j.value("use_short_conv", true);
        m.use_output_gate = j.value("use_gate", false);
        m.use_beta = j.value("use_beta", true);
        m.allow_neg_eigval = j.value("allow_neg_eigval", false);
        if (j.value("qk_norm", std::string("l2")) != "l2" || j.value("qk_activation", std::string("silu")) != "silu")
          refuse("DeltaNet with qk_norm other than l2 or qk_activation other than silu");
      } else if (m.kind == MixerKind::gla) {
        m.use_short_conv = j.value("use_short_conv", false);
        m.use_output_gate = j.value("use_output_gate", true);
        if (!j.value("feature_map", json()).is_null() || !j.value("clamp_min", json()).is_null())
          refuse("GLA with a feature_map or clamp_min");
      } else if (m.kind == MixerKind::retnet) {
        m.use_short_conv = false;
        m.use_output_gate = j.value("use_output_gate", true);
        m.rope_theta = 10000.0;
        if (!j.value("feature_map", json()).is_null()) refuse("RetNet with a feature_map");
      } else {  // linear attention
        m.feature_map = j.value("feature_map", std::string("elementwise_product"));
        m.norm_q = j.value("norm_q", false);
        m.norm_k = j.value("norm_k", false);
        m.feature_map_norm = j.value("norm_feature_map", false);
        if (j.value("tie_feature_map_qk", false)) refuse("linear attention with tie_feature_map_qk");
      }
    }
  }
  if (!j.value("elementwise_affine", true)) refuse("elementwise_affine false (output norms without weights)");
  m.resolve();
  // The teacher-side fields of a student folder: the mixer's heads, the MLP and norms fla has.
  LlamaConfig c;
  c.architecture = Architecture::llama;
  c.vocab_size = j.at("vocab_size").get<int64_t>();
  c.hidden_size = H;
  c.num_hidden_layers = j.at("num_hidden_layers").get<int64_t>();
  c.num_attention_heads = heads;
  c.num_key_value_heads = m.kv_heads();
  c.head_dim = m.head_k_dim;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = m.norm_eps;
  c.max_position_embeddings = j.value("max_position_embeddings", int64_t{2048});
  c.tie_word_embeddings = j.value("tie_word_embeddings", false);
  if (j.value("intermediate_size", json()).is_null()) {
    const double ratio = j.value("hidden_ratio", json()).is_null() ? 4.0 : j["hidden_ratio"].get<double>();
    const auto i = static_cast<int64_t>(static_cast<double>(H) * ratio * 2.0 / 3.0);
    c.intermediate_size = 256 * ((i + 255) / 256);
  } else {
    c.intermediate_size = j["intermediate_size"].get<int64_t>();
  }
  if (j.contains("bos_token_id") && j["bos_token_id"].is_number_integer()) c.bos_token_id = j["bos_token_id"].get<int64_t>();
  if (j.contains("eos_token_id") && j["eos_token_id"].is_number_integer()) c.eos_token_ids = {j["eos_token_id"].get<int64_t>()};
  c.raw = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}};
  StudentSpec spec;
  spec.mixer_config = m;
  Renames renames;
  if (j.contains("attn") && !j["attn"].is_null()) {  // a hybrid: fla's softmax layers become ours
    const json& a = j["attn"];
    if (!a.is_object()) refuse("\"attn\" as a list of several specs (one spec for all softmax layers is supported)");
    const auto kept = a.at("layers").get<std::vector<int64_t>>();
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      if (std::find(kept.begin(), kept.end(), i) == kept.end()) spec.layers.push_back(i);
    for (const int64_t i : kept) {
      if (i < 0 || i >= c.num_hidden_layers) refuse("attn.layers holds " + std::to_string(i) + ", not a layer");
      renames.push_back({std::regex("^model\\.layers\\." + std::to_string(i) + "\\.attn\\.([qkvo])_proj\\.(weight|bias)$"),
                         "model.layers." + std::to_string(i) + ".self_attn.$1_proj.$2"});
    }
    if (spec.layers.empty()) refuse("attn.layers holds every layer: that is a softmax model, not a student");
    c.num_attention_heads = a.at("num_heads").get<int64_t>();
    c.num_key_value_heads = a.value("num_kv_heads", json()).is_null() ? c.num_attention_heads : a["num_kv_heads"].get<int64_t>();
    if (H % c.num_attention_heads != 0) refuse("attn.num_heads does not divide hidden_size");
    c.head_dim = H / c.num_attention_heads;
    c.qkv_bias = a.value("qkv_bias", false);
    c.sliding_window = a.value("window_size", json()).is_null() ? 0 : a["window_size"].get<int64_t>();
    c.rope_theta = a.value("rope_theta", 10000.0);
    // The family member that has these attention layers: q/k/v biases alone are Qwen2's, a window Mistral's.
    if (c.qkv_bias && c.sliding_window > 0) refuse("attention with both qkv_bias and a window (no teacher of ours has both)");
    c.architecture = c.qkv_bias ? Architecture::qwen2 : c.sliding_window > 0 ? Architecture::mistral : Architecture::llama;
    c.raw = {{"architectures", {to_string(c.architecture)}}, {"model_type", model_type_of(c.architecture)}};
  }
  nlohmann::json config = c.to_json();
  config["linearize"] = spec.to_json();

  // fla's names back to ours (after a hybrid's softmax layers).
  renames.insert(renames.end(), {
      {std::regex(R"(^model\.embeddings\.weight$)"), "model.embed_tokens.weight"},
      {std::regex(R"(^model\.layers\.(\d+)\.attn_norm\.weight$)"), "model.layers.$1.input_layernorm.weight"},
      {std::regex(R"(^model\.layers\.(\d+)\.mlp_norm\.weight$)"), "model.layers.$1.post_attention_layernorm.weight"},
      {std::regex(R"(^model\.layers\.(\d+)\.mlp\.(gate|up|down)_proj\.weight$)"), "model.layers.$1.mlp.$2_proj.weight"},
      {std::regex(R"(^model\.layers\.(\d+)\.attn\.g_norm_swish_gate\.weight$)"), "model.layers.$1.attn.g_norm.weight"},
      {std::regex(R"(^model\.layers\.(\d+)\.attn\.(.+)$)"), "model.layers.$1.attn.$2"},
      {std::regex(R"(^model\.norm\.weight$)"), "model.norm.weight"},
      {std::regex(R"(^lm_head\.weight$)"), "lm_head.weight"}});
  write_renamed(dir, out, renames, config, path + ": cannot import from fla: no linearize name for the tensor ", {});
}

}  // namespace linearize
