#include "model/model_io.h"

#include <filesystem>

#include "io/atomic_file.h"
#include "io/error.h"
#include "model/student.h"

namespace linearize {

namespace fs = std::filesystem;

void load_weights(CausalLM& model, const WeightStore& store) {
  torch::NoGradGuard ng;
  for (auto& item : model->named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    auto& p = item.value();
    auto t = store.get(name, p.scalar_type(), p.sizes().vec());
    p.copy_(t);
  }
}

namespace {

// config.json against the weights' own shapes, before anything is allocated: a config that names a huge
// vocabulary or more layers than the file holds is one clear error, not an allocation of its size.
void check_config_matches_weights(const LlamaConfig& c, const WeightStore& store, const std::string& folder) {
  const std::string where = folder + "/config.json";
  auto expect = [&](const std::string& name, const std::vector<int64_t>& shape, const std::string& fields) {
    if (!store.contains(name)) throw Error(store.location() + ": tensor " + name + " is missing (config.json: " + fields + ")");
    const auto& got = store.info(name).shape;
    if (got != shape)
      throw Error(where + ": " + fields + " say " + name + " is " + shape_string(shape) + " but the weights hold " +
                  shape_string(got));
  };
  expect("model.embed_tokens.weight", {c.vocab_size, c.hidden_size}, "vocab_size and hidden_size");
  if (!c.tie_word_embeddings && store.contains("lm_head.weight"))
    expect("lm_head.weight", {c.vocab_size, c.hidden_size}, "vocab_size and hidden_size");
  const std::string last = "model.layers." + std::to_string(c.num_hidden_layers - 1) + ".";
  const std::string beyond = "model.layers." + std::to_string(c.num_hidden_layers) + ".";
  bool has_last = false;
  for (const auto& n : store.names()) {
    if (n.rfind(last, 0) == 0) has_last = true;
    if (n.rfind(beyond, 0) == 0)
      throw Error(where + ": num_hidden_layers is " + std::to_string(c.num_hidden_layers) + " but the weights hold " + n);
  }
  if (!has_last)
    throw Error(where + ": num_hidden_layers is " + std::to_string(c.num_hidden_layers) + " but the weights have no layer " +
                std::to_string(c.num_hidden_layers - 1));
  if (store.contains("model.layers.0.mlp.gate_proj.weight"))
    expect("model.layers.0.mlp.gate_proj.weight", {c.intermediate_size, c.hidden_size}, "intermediate_size and hidden_size");
}

}  // namespace

CausalLM load_model(const std::string& folder, const LoadOptions& options) {
  auto config = LlamaConfig::load(folder);
  MixerFactory factory;
  if (config.raw.contains("linearize"))
    factory = student_factory(config, StudentSpec::from_json(config.raw["linearize"], folder + "/config.json"));
  WeightStore store(folder);
  check_config_matches_weights(config, store, folder);
  CausalLM model(config, factory);
  load_weights(model, store);
  model->to(options.device, options.dtype);
  model->eval();
  if (options.inference) model->pack_projections();
  return model;
}

std::unique_ptr<Tokenizer> load_model_tokenizer(const std::string& folder, const LlamaConfig& config) {
  auto tok = load_tokenizer(folder);
  if (tok->vocab_size() > config.vocab_size)
    throw Error(folder + ": the tokenizer has " + std::to_string(tok->vocab_size()) +
                " tokens but the model's vocabulary (config.json vocab_size) is " + std::to_string(config.vocab_size));
  return tok;
}

void copy_tokenizer_files(const std::string& from, const std::string& folder) {
  if (from.empty()) return;
  fs::create_directories(folder);
  if (!fs::is_directory(from)) {
    fs::copy_file(from, fs::path(folder) / fs::path(from).filename(), fs::copy_options::overwrite_existing);
    return;
  }
  for (const char* name : {"tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                           "special_tokens_map.json", "vocab.json", "merges.txt", "generation_config.json"}) {
    fs::path src = fs::path(from) / name;
    if (fs::exists(src) && fs::absolute(src) != fs::absolute(fs::path(folder) / name))
      fs::copy_file(src, fs::path(folder) / name, fs::copy_options::overwrite_existing);
  }
}

void save_model(CausalLM& model, const std::string& folder, const std::string& tokenizer_from,
                const nlohmann::json& extra_config) {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (auto& item : model->named_parameters(true)) tensors.emplace_back(item.key(), item.value());
  require_finite(tensors, "model " + folder);
  fs::create_directories(folder);
  save_safetensors((fs::path(folder) / "model.safetensors").string(), tensors);
  nlohmann::json j = model->config.to_json();
  for (auto it = extra_config.begin(); it != extra_config.end(); ++it) j[it.key()] = it.value();
  j["torch_dtype"] = "float32";
  if (!tensors.empty() && tensors.front().second.scalar_type() == torch::kBFloat16) j["torch_dtype"] = "bfloat16";
  write_file_atomic((fs::path(folder) / "config.json").string(), [&](std::ostream& out) { out << j.dump(2) << "\n"; });
  copy_tokenizer_files(tokenizer_from, folder);
}

}  // namespace linearize
