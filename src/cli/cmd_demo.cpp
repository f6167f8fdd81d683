// linearize demo: the README's main job on its built-in default.
//
// For now: loads the real tiny Llama in ../shared/data/models/stories260K when it is there and
// generates a story from it through the KV-cache decode path; otherwise it creates a small teacher of
// its own (random weights, byte-level tokenizer) so that the whole path still runs with nothing
// downloaded. The full study in miniature (own corpus, teacher, seven students) replaces this later.
#include <chrono>
#include <filesystem>
#include <iostream>

#include "cli/commands.h"
#include "cli/common.h"
#include "infer/generate.h"
#include "io/tokenizer_bpe.h"

namespace linearize::cli {

namespace fs = std::filesystem;

namespace {

// ../shared/data/models/stories260K seen from the working folder, $LINEARIZE_SHARED, or the binary.
std::string find_stories260k() {
  std::vector<fs::path> roots;
  if (const char* env = std::getenv("LINEARIZE_SHARED")) roots.emplace_back(env);
  roots.emplace_back("../shared");
  std::error_code ec;
  auto exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) roots.push_back(exe.parent_path() / ".." / ".." / "shared");
  for (const auto& r : roots) {
    auto p = r / "data" / "models" / "stories260K";
    if (fs::exists(p / "config.json")) return fs::weakly_canonical(p).string();
  }
  return "";
}

// A small Llama teacher with random weights and a byte-level tokenizer, written as a model folder.
std::string create_teacher(const std::string& folder) {
  std::vector<std::string> vocab = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  for (int b = 0; b < 256; ++b) vocab.push_back(byte_level_symbol(static_cast<uint8_t>(b)));
  const std::string g = byte_level_symbol(' ');
  vocab.push_back(g + "t");
  vocab.push_back("he");
  std::vector<std::pair<std::string, std::string>> merges = {{g, "t"}, {"h", "e"}};
  std::vector<AddedToken> added;
  for (int i = 0; i < 3; ++i) added.push_back({vocab[i], i, true, false, false, false});
  fs::create_directories(folder);
  write_tokenizer_json(folder + "/tokenizer.json", vocab, merges, added, /*isolate_digits=*/true);

  LlamaConfig c;
  c.vocab_size = static_cast<int64_t>(vocab.size());
  c.hidden_size = 64; c.intermediate_size = 172; c.num_hidden_layers = 4;
  c.num_attention_heads = 4; c.num_key_value_heads = 2; c.head_dim = 16;
  c.max_position_embeddings = 1024; c.rope_theta = 10000; c.tie_word_embeddings = true;
  c.bos_token_id = 0; c.eos_token_ids = {0};
  c.raw = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}};
  torch::manual_seed(0);
  CausalLM model(c);
  init_weights_normal(*model);
  save_model(model, folder);
  return folder;
}

}  // namespace

int cmd_demo(const std::vector<std::string>& argv) {
  CommandSpec spec{"demo",
                   "Run the built-in default job: generate text with the tiny real Llama stories260K from\n"
                   "../shared (greedy, through the KV cache), or, when it is absent, with a small teacher\n"
                   "this command creates (random weights: the text is noise, the pipeline is real).",
                   "",
                   "",
                   {{"model", "DIR", "use this model folder instead"},
                    {"prompt", "TEXT", "prompt (default: none, start from BOS)", ""},
                    {"max-new-tokens", "N", "tokens to generate", "200"},
                    {"own-teacher", "", "create the small random teacher even when stories260K is there"},
                    {"out", "DIR", "where a created teacher is written", "runs/demo-teacher"}},
                   0, 0};
  Args args(spec, argv);
  if (args.help_requested()) return std::cout << help_text(spec), 0;
  std::string folder = args.maybe("model").value_or(args.flag("own-teacher") ? "" : find_stories260k());
  bool created = false;
  if (folder.empty()) {
    std::cout << "creating a small random teacher (stories260K not used) in "
              << args.str("out") << "\n";
    folder = create_teacher(args.str("out"));
    created = true;
  }
  std::cout << "== model " << folder << "\n";
  std::vector<std::string> info_args = {folder};
  cmd_info(info_args);
  std::cout << "== greedy generation (" << args.str("max-new-tokens") << " new tokens)\n";
  std::vector<std::string> gen = {"--model", folder, "--max-new-tokens", args.str("max-new-tokens"), "--stats"};
  const std::string prompt = args.maybe("prompt").value_or("");
  if (!prompt.empty()) gen.insert(gen.end(), {"--prompt", prompt});
  if (created) gen.insert(gen.end(), {"--temperature", "1.0", "--seed", "0"});
  return cmd_generate(gen);
}

}  // namespace linearize::cli
