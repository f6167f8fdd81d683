// Hugging Face config.json of a LlamaForCausalLM, in both layouts that transformers writes:
// `rope_theta` + `rope_scaling` at top level (transformers 4), or `rope_parameters` holding
// `rope_theta` and `rope_type` (transformers 5). rope_theta is never defaulted: a wrong base degrades
// a model silently, so a missing one is an error.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace linearize {

struct RopeScaling {
  std::string type = "default";  // default | linear | llama3
  double factor = 1.0;
  double low_freq_factor = 1.0;                  // llama3
  double high_freq_factor = 4.0;                 // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3
};

struct LlamaConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // hidden_size / num_attention_heads when absent
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-5;
  double rope_theta = 0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  bool mlp_bias = false;
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;  // eos_token_id may be an int or a list
  std::optional<int64_t> pad_token_id;
  std::string torch_dtype = "float32";

  // The whole file as read: unknown fields are kept and written back by to_json().
  nlohmann::json raw = nlohmann::json::object();

  // Parses and validates; `source` names the file in errors.
  static LlamaConfig from_json(const nlohmann::json& j, const std::string& source);
  // Reads `folder/config.json` or a config file path.
  static LlamaConfig load(const std::string& folder_or_file);
  // raw with our fields written in the transformers-4 layout (rope_theta at top level).
  nlohmann::json to_json() const;

  int64_t kv_groups() const { return num_attention_heads / num_key_value_heads; }
  int64_t parameter_count() const;  // of the Llama teacher with this shape

 private:
  // from_json's work; a field of the wrong type throws nlohmann's error, which from_json turns into ours.
  static LlamaConfig from_json_fields(const nlohmann::json& j, const std::string& source);
};

}  // namespace linearize
