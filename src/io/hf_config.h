// Hugging Face config.json of a Llama-family decoder, in both layouts that transformers writes:
// `rope_theta` + `rope_scaling` at top level (transformers 4), or `rope_parameters` holding
// `rope_theta` and `rope_type` (transformers 5). rope_theta is never defaulted: a wrong base degrades
// a model silently, so a missing one is an error. The family's variants of the attention layer:
//   LlamaForCausalLM    attention_bias puts a bias on q, k, v and o
//   Qwen2ForCausalLM    biases on q, k and v (not o)
//   Qwen3ForCausalLM    RMSNorm over each query and key head before RoPE (q_norm, k_norm); attention_bias
//                       on all four; an explicit head_dim
//   MistralForCausalLM  sliding_window: a query sees only the last sliding_window positions
// Any other architecture is refused by name.
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

enum class Architecture { llama, qwen2, qwen3, mistral };
std::string to_string(Architecture a);                   // "LlamaForCausalLM", ...
std::string model_type_of(Architecture a);               // "llama", ...

struct LlamaConfig {
  Architecture architecture = Architecture::llama;
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
  bool qkv_bias = false;       // biases on q_proj, k_proj, v_proj
  bool o_bias = false;         // bias on o_proj
  bool qk_norm = false;        // Qwen3: q_norm and k_norm over head_dim, before RoPE
  int64_t sliding_window = 0;  // Mistral: a query sees itself and the sliding_window - 1 positions before (0: all)
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
