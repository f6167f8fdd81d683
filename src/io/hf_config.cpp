#include "io/hf_config.h"

#include <filesystem>

#include "io/atomic_file.h"
#include "io/error.h"

namespace linearize {

namespace {

// The family's members by their two names in config.json.
struct ArchitectureName {
  Architecture architecture;
  const char* causal_lm;   // "architectures"
  const char* model_type;  // "model_type"
};
const ArchitectureName kArchitectures[] = {{Architecture::llama, "LlamaForCausalLM", "llama"},
                                           {Architecture::qwen2, "Qwen2ForCausalLM", "qwen2"},
                                           {Architecture::qwen3, "Qwen3ForCausalLM", "qwen3"},
                                           {Architecture::mistral, "MistralForCausalLM", "mistral"}};

const ArchitectureName& name_of(Architecture a) {
  for (const auto& x : kArchitectures)
    if (x.architecture == a) return x;
  throw Error("architecture " + std::to_string(static_cast<int>(a)) + " out of range");
}

const nlohmann::json& required(const nlohmann::json& j, const char* field, const std::string& source) {
  if (!j.contains(field) || j[field].is_null())
    throw Error(source + ": missing config field \"" + field + "\"");
  return j[field];
}

int64_t positive_int(const nlohmann::json& j, const char* field, const std::string& source) {
  const auto& v = required(j, field, source);
  if (!v.is_number_integer() || v.get<int64_t>() <= 0)
    throw Error(source + ": config field \"" + field + "\" must be a positive integer, found " + v.dump());
  return v.get<int64_t>();
}

double number(const nlohmann::json& v, const char* field, const std::string& source) {
  if (!v.is_number()) throw Error(source + ": config field \"" + field + "\" must be a number, found " + v.dump());
  return v.get<double>();
}

std::optional<int64_t> optional_id(const nlohmann::json& j, const char* field) {
  if (j.contains(field) && j[field].is_number_integer()) return j[field].get<int64_t>();
  return std::nullopt;
}

RopeScaling parse_rope_scaling(const nlohmann::json& s, const std::string& source, const char* field) {
  RopeScaling r;
  if (s.is_null()) return r;
  if (!s.is_object()) throw Error(source + ": \"" + std::string(field) + "\" must be an object or null");
  std::string type = s.value("rope_type", s.value("type", std::string("default")));
  r.type = type;
  if (type == "default") return r;
  if (type == "linear") {
    r.factor = number(required(s, "factor", source + " " + field), "factor", source);
    return r;
  }
  if (type == "llama3") {
    const std::string where = source + " " + field;
    r.factor = number(required(s, "factor", where), "factor", source);
    r.low_freq_factor = number(required(s, "low_freq_factor", where), "low_freq_factor", source);
    r.high_freq_factor = number(required(s, "high_freq_factor", where), "high_freq_factor", source);
    r.original_max_position_embeddings = positive_int(s, "original_max_position_embeddings", where);
    return r;
  }
  throw Error(source + ": unsupported rope type \"" + type + "\" in \"" + field +
              "\" (supported: default, linear, llama3)");
}

}  // namespace

LlamaConfig LlamaConfig::from_json_fields(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) throw Error(source + ": config must be a JSON object");
  LlamaConfig c;
  c.raw = j;
  // The family member: from "architectures" when it names one, else from "model_type".
  const std::string model_type = j.value("model_type", std::string());
  std::optional<Architecture> arch;
  std::string named, supported;
  if (j.contains("architectures") && j["architectures"].is_array())
    for (const auto& a : j["architectures"])
      if (a.is_string()) {
        named += (named.empty() ? "" : ", ") + a.get<std::string>();
        for (const auto& x : kArchitectures)
          if (a.get<std::string>() == x.causal_lm) arch = x.architecture;
      }
  for (const auto& x : kArchitectures) {
    if (!arch && model_type == x.model_type) arch = x.architecture;
    supported += (supported.empty() ? "" : ", ") + std::string(x.causal_lm);
  }
  if (!arch)
    throw Error(source + ": unsupported model: architectures [" + named + "], model_type \"" + model_type +
                "\" (supported: " + supported + ")");
  c.architecture = *arch;

  c.vocab_size = positive_int(j, "vocab_size", source);
  c.hidden_size = positive_int(j, "hidden_size", source);
  c.intermediate_size = positive_int(j, "intermediate_size", source);
  c.num_hidden_layers = positive_int(j, "num_hidden_layers", source);
  c.num_attention_heads = positive_int(j, "num_attention_heads", source);
  c.num_key_value_heads = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                              ? positive_int(j, "num_key_value_heads", source)
                              : c.num_attention_heads;
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    throw Error(source + ": num_attention_heads (" + std::to_string(c.num_attention_heads) +
                ") must be a multiple of num_key_value_heads (" + std::to_string(c.num_key_value_heads) + ")");
  if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    c.head_dim = positive_int(j, "head_dim", source);
  } else {
    if (c.hidden_size % c.num_attention_heads != 0)
      throw Error(source + ": head_dim absent and hidden_size (" + std::to_string(c.hidden_size) +
                  ") is not divisible by num_attention_heads (" + std::to_string(c.num_attention_heads) + ")");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  c.max_position_embeddings = j.contains("max_position_embeddings")
                                  ? positive_int(j, "max_position_embeddings", source)
                                  : 2048;
  c.rms_norm_eps = number(required(j, "rms_norm_eps", source), "rms_norm_eps", source);

  // RoPE: transformers 5 nests everything in rope_parameters; transformers 4 has top-level fields.
  if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) {
    const auto& rp = j["rope_parameters"];
    if (!rp.is_object()) throw Error(source + ": \"rope_parameters\" must be an object");
    if (rp.contains("rope_theta")) {
      c.rope_theta = number(rp["rope_theta"], "rope_parameters.rope_theta", source);
      c.rope_scaling = parse_rope_scaling(rp, source, "rope_parameters");
    } else {
      throw Error(source + ": \"rope_parameters\" has no \"rope_theta\" (per-layer-type RoPE is not "
                  "supported for Llama models)");
    }
  } else {
    c.rope_theta = number(required(j, "rope_theta", source), "rope_theta", source);
    if (j.contains("rope_scaling")) c.rope_scaling = parse_rope_scaling(j["rope_scaling"], source, "rope_scaling");
  }
  if (c.rope_theta <= 0) throw Error(source + ": rope_theta must be positive");

  c.tie_word_embeddings = j.value("tie_word_embeddings", false);
  const bool attention_bias = j.value("attention_bias", false);
  c.qkv_bias = c.architecture == Architecture::qwen2 || attention_bias;
  c.o_bias = c.architecture != Architecture::qwen2 && attention_bias;
  c.qk_norm = c.architecture == Architecture::qwen3;
  c.mlp_bias = j.value("mlp_bias", false);
  if ((c.architecture == Architecture::qwen2 || c.architecture == Architecture::qwen3) &&
      j.value("use_sliding_window", false))
    throw Error(source + ": use_sliding_window is not supported for " + to_string(c.architecture) +
                " (its sliding layers are chosen per layer)");
  if (c.architecture == Architecture::mistral && j.contains("sliding_window") && !j["sliding_window"].is_null())
    c.sliding_window = positive_int(j, "sliding_window", source);
  const std::string act = j.value("hidden_act", std::string("silu"));
  if (act != "silu")
    throw Error(source + ": hidden_act \"" + act + "\" is not supported (expected \"silu\")");
  c.bos_token_id = optional_id(j, "bos_token_id");
  c.pad_token_id = optional_id(j, "pad_token_id");
  if (j.contains("eos_token_id")) {
    const auto& e = j["eos_token_id"];
    if (e.is_number_integer()) c.eos_token_ids.push_back(e.get<int64_t>());
    else if (e.is_array())
      for (const auto& x : e)
        if (x.is_number_integer()) c.eos_token_ids.push_back(x.get<int64_t>());
  }
  if (j.contains("torch_dtype") && j["torch_dtype"].is_string()) c.torch_dtype = j["torch_dtype"];
  else if (j.contains("dtype") && j["dtype"].is_string()) c.torch_dtype = j["dtype"];
  return c;
}

std::string to_string(Architecture a) { return name_of(a).causal_lm; }

std::string model_type_of(Architecture a) { return name_of(a).model_type; }

LlamaConfig LlamaConfig::load(const std::string& folder_or_file) {
  namespace fs = std::filesystem;
  std::string path = fs::is_directory(folder_or_file) ? (fs::path(folder_or_file) / "config.json").string()
                                                      : folder_or_file;
  if (!fs::exists(path)) throw Error(path + ": no such file (expected a Hugging Face model folder)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": malformed JSON: " + e.what());
  }
  return from_json(j, path);
}

LlamaConfig LlamaConfig::from_json(const nlohmann::json& j, const std::string& source) {
  try {
    return from_json_fields(j, source);
  } catch (const nlohmann::json::exception& e) {  // a field of the wrong type, e.g. "tie_word_embeddings": null
    throw Error(source + ": a field has an unexpected type: " + e.what());
  }
}

nlohmann::json LlamaConfig::to_json() const {
  nlohmann::json j = raw;
  if (!j.contains("architectures")) j["architectures"] = {to_string(architecture)};
  j["model_type"] = model_type_of(architecture);
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["tie_word_embeddings"] = tie_word_embeddings;
  if (architecture == Architecture::qwen2) j.erase("attention_bias");  // Qwen2's q/k/v biases are not optional
  else j["attention_bias"] = qkv_bias;
  if (architecture == Architecture::mistral) {
    if (sliding_window > 0) j["sliding_window"] = sliding_window;
    else j["sliding_window"] = nullptr;
  }
  j["mlp_bias"] = mlp_bias;
  j["hidden_act"] = "silu";
  j.erase("rope_parameters");
  j["rope_theta"] = rope_theta;
  if (rope_scaling.type == "default") {
    j["rope_scaling"] = nullptr;
  } else {
    nlohmann::json s = {{"rope_type", rope_scaling.type}, {"factor", rope_scaling.factor}};
    if (rope_scaling.type == "llama3") {
      s["low_freq_factor"] = rope_scaling.low_freq_factor;
      s["high_freq_factor"] = rope_scaling.high_freq_factor;
      s["original_max_position_embeddings"] = rope_scaling.original_max_position_embeddings;
    }
    j["rope_scaling"] = s;
  }
  if (bos_token_id) j["bos_token_id"] = *bos_token_id;
  if (eos_token_ids.size() == 1) j["eos_token_id"] = eos_token_ids[0];
  else if (!eos_token_ids.empty()) j["eos_token_id"] = eos_token_ids;
  if (pad_token_id) j["pad_token_id"] = *pad_token_id;
  j["torch_dtype"] = torch_dtype;
  return j;
}

int64_t LlamaConfig::parameter_count() const {
  const int64_t q = num_attention_heads * head_dim, kv = num_key_value_heads * head_dim;
  const int64_t attn = hidden_size * q * 2 + hidden_size * kv * 2;
  const int64_t mlp = 3 * hidden_size * intermediate_size;
  const int64_t layer = attn + mlp + 2 * hidden_size;
  int64_t total = num_hidden_layers * layer + vocab_size * hidden_size + hidden_size;
  if (!tie_word_embeddings) total += vocab_size * hidden_size;
  return total;
}

}  // namespace linearize
