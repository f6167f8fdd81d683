// linearize info MODEL_DIR: architecture, parameter count, dtype and tokenizer of a model folder.
#include <filesystem>
#include <iostream>

#include "cli/commands.h"
#include "cli/common.h"
#include "io/safetensors.h"

namespace linearize::cli {

int cmd_info(const std::vector<std::string>& argv) {
  CommandSpec spec{"info", "Print a model folder's architecture, parameter count, dtype and tokenizer.",
                   "MODEL_DIR", "", {{"json", "", "print the summary as JSON"}}, 1, 1};
  Args args(spec, argv);
  if (args.help_requested()) return std::cout << help_text(spec), 0;
  const std::string folder = args.positional()[0];
  auto config = LlamaConfig::load(folder);
  WeightStore store(folder);
  int64_t params = 0;
  std::map<std::string, int64_t> dtypes;
  for (const auto& name : store.names()) {
    const auto& t = store.info(name);
    int64_t n = 1;
    for (auto d : t.shape) n *= d;
    params += n;
    dtypes[t.dtype] += n;
  }
  std::string tok_desc = "none found";
  try {
    auto tok = model_tokenizer(folder);
    tok_desc = tok->kind() + " (" + std::to_string(tok->vocab_size()) + " tokens, " + tok->source() + ")";
  } catch (const std::exception& e) {
    tok_desc = std::string("unavailable: ") + e.what();
  }
  const bool student = config.raw.contains("linearize");
  nlohmann::json j = {
      {"folder", folder},
      {"kind", student ? "student" : "llama teacher"},
      {"vocab_size", config.vocab_size},
      {"hidden_size", config.hidden_size},
      {"layers", config.num_hidden_layers},
      {"heads", config.num_attention_heads},
      {"kv_heads", config.num_key_value_heads},
      {"head_dim", config.head_dim},
      {"intermediate_size", config.intermediate_size},
      {"rope_theta", config.rope_theta},
      {"rope_scaling", config.rope_scaling.type},
      {"tie_word_embeddings", config.tie_word_embeddings},
      {"parameters", params},
      {"dtypes", dtypes},
      {"tokenizer", tok_desc},
  };
  if (student) j["linearize"] = config.raw["linearize"];
  if (args.flag("json")) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << "model       " << folder << " (" << j["kind"].get<std::string>() << ")\n"
            << "shape       " << config.num_hidden_layers << " layers, hidden " << config.hidden_size << ", "
            << config.num_attention_heads << " heads x " << config.head_dim << " (" << config.num_key_value_heads
            << " kv heads), mlp " << config.intermediate_size << ", vocab " << config.vocab_size << "\n"
            << "rope        theta " << config.rope_theta << ", scaling " << config.rope_scaling.type << "\n"
            << "parameters  " << params << " (" << std::fixed << std::setprecision(2) << params / 1e6 << "M)"
            << (config.tie_word_embeddings ? ", embeddings tied" : "") << "\n"
            << "dtype       ";
  bool first = true;
  for (const auto& [d, n] : dtypes) std::cout << (first ? "" : ", ") << d << " " << n, first = false;
  std::cout << "\ntokenizer   " << tok_desc << "\n";
  if (student) std::cout << "linearize   " << config.raw["linearize"].dump() << "\n";
  return 0;
}

}  // namespace linearize::cli
