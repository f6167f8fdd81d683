// Inputs the fuzzers (fuzz/, scripts/fuzz.sh) found crashing a parser, replayed through the same entry
// points: each must now be refused with linearize::Error, the one clean outcome for bad input (a JSON
// library exception escaping would print its raw message, or terminate a fuzzer).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/token_dataset.h"
#include "io/atomic_file.h"
#include "io/error.h"
#include "io/hf_config.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace linearize;

namespace {

std::vector<std::string> findings(const std::string& target) {
  std::vector<std::string> out;
  const fs::path dir = fs::path(test::source_dir()) / "tests" / "fuzz_regressions" / target;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(read_file(e.path().string()));
  return out;
}

void write(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes; }

}  // namespace

// config.json with a field of the wrong type ("tie_word_embeddings": null).
TEST(FuzzRegressions, ConfigJson) {
  const auto inputs = findings("config");
  ASSERT_FALSE(inputs.empty());
  const fs::path dir = test::fresh_dir("fuzz_regressions", "config");
  for (const auto& bytes : inputs) {
    write(dir / "config.json", bytes);
    try {
      LlamaConfig::load(dir.string());
      ADD_FAILURE() << "accepted: " << bytes;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("config.json"), std::string::npos) << e.what();
    }
  }
}

// A token dataset's index.json with fields of the wrong type ("format": 1); the fuzzer's layout: the first
// byte times 4 is the index's length, the rest the shard.
TEST(FuzzRegressions, TokenDatasetIndex) {
  const auto inputs = findings("token_dataset");
  ASSERT_FALSE(inputs.empty());
  const fs::path dir = test::fresh_dir("fuzz_regressions", "dataset");
  for (const auto& bytes : inputs) {
    ASSERT_FALSE(bytes.empty());
    const size_t cut = std::min<size_t>(bytes.size() - 1, static_cast<unsigned char>(bytes[0]) * 4);
    write(dir / "index.json", bytes.substr(1, cut));
    write(dir / "shard-00000.u32", bytes.substr(1 + cut));
    try {
      TokenDataset::open(dir.string(), nullptr, -1);
      ADD_FAILURE() << "accepted: " << bytes;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("index.json"), std::string::npos) << e.what();
    }
  }
}
