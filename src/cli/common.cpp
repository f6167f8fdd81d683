#include "cli/common.h"

#include "io/error.h"

namespace linearize::cli {

torch::Device parse_device(const std::string& s) {
  if (s == "cpu") return torch::kCPU;
  if (s.rfind("cuda", 0) == 0) {
    if (!torch::cuda::is_available())
      throw Error("--device " + s + ": CUDA is not available in this build or on this machine (use --device cpu)");
    return torch::Device(s);
  }
  throw Error("--device expects cpu, cuda or cuda:N, got \"" + s + "\"");
}

OptionSpec device_option() { return {"device", "DEV", "cpu, cuda or cuda:N", "cpu"}; }

std::unique_ptr<Tokenizer> model_tokenizer(const std::string& folder) { return load_tokenizer(folder); }

std::vector<int32_t> prompt_prefix(const LlamaConfig& config, const Tokenizer& tokenizer, bool prompt_empty) {
  const bool want_bos = tokenizer.kind() == "sentencepiece" || prompt_empty;
  if (!want_bos) return {};
  if (config.bos_token_id) return {static_cast<int32_t>(*config.bos_token_id)};
  if (!config.eos_token_ids.empty()) return {static_cast<int32_t>(config.eos_token_ids[0])};
  throw Error("the prompt is empty and the model config has neither bos_token_id nor eos_token_id");
}

}  // namespace linearize::cli
