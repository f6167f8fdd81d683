// Helpers shared by the tests: where ../shared lives, and skipping with a clear message when it does
// not. Golden tests read LINEARIZE_GOLDEN (default ../shared/golden next to the source tree) and
// check every file they find there.
#pragma once
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "io/atomic_file.h"
#include "io/hf_config.h"
#include "io/tokenizer_sentencepiece.h"
#include "ops/ops.h"

namespace linearize::test {

inline std::string source_dir() {
  const char* env = std::getenv("LINEARIZE_SOURCE_DIR");
  return env ? env : LINEARIZE_SOURCE_DIR;
}

inline std::string shared_dir() {
  const char* env = std::getenv("LINEARIZE_SHARED");
  return env ? std::string(env) : source_dir() + "/../shared";
}

inline std::string golden_dir() {
  const char* env = std::getenv("LINEARIZE_GOLDEN");
  return env ? std::string(env) : shared_dir() + "/golden";
}

inline std::string data_dir() { return shared_dir() + "/data"; }

// Files in `dir` whose name ends with `suffix`, sorted; empty when the folder is absent.
inline std::vector<std::string> files_in(const std::string& dir, const std::string& suffix) {
  std::vector<std::string> out;
  if (!std::filesystem::is_directory(dir)) return out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string p = e.path().string();
    if (p.size() >= suffix.size() && p.compare(p.size() - suffix.size(), suffix.size(), suffix) == 0)
      out.push_back(p);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// max |a - b| / max |b|: the relative error measure of ../shared/golden/README.md.
inline double rel_err(const torch::Tensor& a, const torch::Tensor& b) {
  auto a64 = a.detach().to(torch::kCPU, torch::kDouble);
  auto b64 = b.detach().to(torch::kCPU, torch::kDouble);
  double denom = b64.abs().max().item<double>();
  double num = (a64 - b64).abs().max().item<double>();
  if (denom == 0) return num;
  return num / denom;
}

// An empty folder <tmp>/linearize_<suite>_<pid>/<name> (removed first if a run left it behind).
inline std::string fresh_dir(const std::string& suite, const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / ("linearize_" + suite + "_" + std::to_string(::getpid())) / name;
  linearize::remove_tree(d.string());
  std::filesystem::create_directories(d);
  return d.string();
}

// A small Llama shape for tests: head_dim = hidden / heads, RoPE base 1e4, tied embeddings.
inline LlamaConfig small_llama(int64_t vocab, int64_t hidden, int64_t layers, int64_t heads, int64_t kv_heads,
                               int64_t intermediate) {
  LlamaConfig c;
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = hidden / heads;
  c.intermediate_size = intermediate;
  c.rope_theta = 10000;
  c.tie_word_embeddings = true;
  c.raw = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}};
  return c;
}

// Runs the built `linearize` tool with `args` (a shell command line) and returns its exit code and
// its stdout and stderr together.
struct ToolRun {
  int code;
  std::string out;
};
inline ToolRun run_tool(const std::string& args) {
  const std::string cmd = std::string(LINEARIZE_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int status = pclose(p);
  return {WEXITSTATUS(status), out};
}

// Kernel emulation (ops/cuda/emulation) on or off for a scope, as it was before afterwards: the CPU
// build's kernel tests run the kernels on CPU tensors with it on, their CPU references with it off.
class EmulationScope {
 public:
  explicit EmulationScope(bool on) : was_(ops::kernel_emulation_enabled()) { ops::set_kernel_emulation(on); }
  ~EmulationScope() { ops::set_kernel_emulation(was_); }
  EmulationScope(const EmulationScope&) = delete;
  EmulationScope& operator=(const EmulationScope&) = delete;

 private:
  bool was_;
};

}  // namespace linearize::test

// Skips the current test in a build without SentencePiece support (AddressSanitizer builds).
#define LINEARIZE_REQUIRE_SENTENCEPIECE()                                                                  \
  do {                                                                                                     \
    if (!linearize::sentencepiece_supported())                                                             \
      GTEST_SKIP() << "skipped: SentencePiece tokenizers are not available in this build (AddressSanitizer)"; \
  } while (0)

// Skips the current test when a path from ../shared is missing, saying which.
#define LINEARIZE_REQUIRE_PATH(path)                                                        \
  do {                                                                                      \
    if (!std::filesystem::exists(path))                                                     \
      GTEST_SKIP() << "skipped: " << (path)                                                 \
                   << " not found (needs ../shared; set LINEARIZE_SHARED or LINEARIZE_GOLDEN)"; \
  } while (0)
