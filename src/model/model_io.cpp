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

CausalLM load_model(const std::string& folder, const LoadOptions& options) {
  auto config = LlamaConfig::load(folder);
  MixerFactory factory;
  if (config.raw.contains("linearize"))
    factory = student_factory(config, StudentSpec::from_json(config.raw["linearize"], folder + "/config.json"));
  WeightStore store(folder);
  CausalLM model(config, factory);
  load_weights(model, store);
  model->to(options.device, options.dtype);
  model->eval();
  return model;
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
