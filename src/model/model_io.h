// Loading and saving model folders in the Hugging Face layout: config.json, model.safetensors
// (or shards with model.safetensors.index.json) and the tokenizer files. Weight names are checked
// one by one: a missing tensor or a wrong shape is an error naming the file and the tensor.
#pragma once
#include <torch/torch.h>

#include <string>

#include "io/hf_config.h"
#include "io/safetensors.h"
#include "io/tokenizer.h"
#include "model/causal_lm.h"

namespace linearize {

struct LoadOptions {
  torch::Device device = torch::kCPU;
  torch::ScalarType dtype = torch::kFloat;
  // For inference only (no training of this copy): pack the projections that read one input into one
  // matrix product each (CausalLM::pack_projections).
  bool inference = false;
};

// Builds the model a folder describes (a Llama teacher, or a student when config.json has a
// "linearize" section) and loads its weights.
CausalLM load_model(const std::string& folder, const LoadOptions& options = {});

// The folder's tokenizer, refused when it has more tokens than the model's vocabulary (an id past the
// embedding would fail deep inside libtorch, or silently read another row on some devices).
std::unique_ptr<Tokenizer> load_model_tokenizer(const std::string& folder, const LlamaConfig& config);

// Copies every parameter of `model` from `store` by name, converting dtype; throws on a missing
// tensor or a shape mismatch. Tensors in the store that the model does not use are ignored.
void load_weights(CausalLM& model, const WeightStore& store);

// Writes config.json (model->config plus `extra_config` fields merged at top level), model.safetensors
// and copies the tokenizer files found in `tokenizer_from` (a folder or file; empty: none).
void save_model(CausalLM& model, const std::string& folder, const std::string& tokenizer_from = "",
                const nlohmann::json& extra_config = nlohmann::json::object());

// Copies tokenizer.json / tokenizer.model / tokenizer_config.json / special_tokens_map.json /
// vocab.json / merges.txt from a folder (or the given tokenizer file) into `folder`.
void copy_tokenizer_files(const std::string& from, const std::string& folder);

}  // namespace linearize
