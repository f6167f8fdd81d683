// Rules about the source tree that the compiler cannot check.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "test_util.h"

namespace fs = std::filesystem;

// std::filesystem::remove_all resolved to a broken copy exported by the GPU box's libtorch and crashed
// there (a call through a null pointer): code and tests remove folders with linearize::remove_tree.
TEST(SourceRules, NoStdFilesystemRemoveAll) {
  const std::regex call(R"(\bremove_all\s*\()");
  int files = 0;
  for (const char* dir : {"src", "tests", "bench"}) {
    const fs::path root = fs::path(linearize::test::source_dir()) / dir;
    ASSERT_TRUE(fs::exists(root)) << root;
    for (const auto& e : fs::recursive_directory_iterator(root)) {
      const auto ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".cpp" && ext != ".h" && ext != ".cu" && ext != ".cuh")) continue;
      std::stringstream text;
      text << std::ifstream(e.path()).rdbuf();
      const std::string s = text.str();
      EXPECT_FALSE(std::regex_search(s, call)) << e.path() << " calls remove_all; use linearize::remove_tree";
      ++files;
    }
  }
  EXPECT_GT(files, 100);
}
