// Data-parallel training through `linearize launch` on CPU (Gloo): N processes on one global batch
// must follow the single process that accumulates the same N micro-batches, step by step, within
// fp32 round-off (the gradient is summed in another order: (g1 + g2) / 2 against g1 / 2 + g2 / 2);
// a run killed under one world size resumes under another; bad launches fail with a clear line.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "io/error.h"
#include "io/jsonl.h"
#include "io/safetensors.h"
#include "io/token_shards.h"
#include "io/tokenizer.h"
#include "test_util.h"
#include "train/data_parallel.h"
#include "train_fixtures.h"

namespace linearize {
namespace {

namespace fs = std::filesystem;

// Relative agreement we require between world sizes: fp32 round-off of a different summation
// order, compounded over a few AdamW steps (measured: about 1e-7).
constexpr double kLossTol = 2e-6;
constexpr double kWeightTol = 1e-4;

std::string tmpdir(const std::string& name) { return test::fresh_dir("dp", name); }

// Tokenizer folder and a .u32 shard of the synthetic corpus.
std::pair<std::string, std::string> data() {
  static std::pair<std::string, std::string> cached;
  if (!cached.first.empty()) return cached;
  const std::string dir = tmpdir("data");
  test::write_byte_tokenizer(dir);
  auto tok = load_tokenizer(dir);
  write_token_shard(dir + "/train.u32", tok->encode(test::synthetic_corpus(2000, 3), false));
  cached = {dir, dir + "/train.u32"};
  return cached;
}

std::string pretrain_args(const std::string& out) {
  auto [tok, shard] = data();
  return "pretrain --tokenizer " + tok + " --data " + shard + " --out " + out +
         " --hidden 32 --layers 2 --heads 4 --kv-heads 2 --seq-len 32 --batch 8 --steps 6 --lr 3e-3"
         " --checkpoint-every 2 --log-every 1";
}

// (stage, step) -> loss from a run folder's metrics.jsonl.
std::map<std::pair<std::string, int64_t>, double> losses(const std::string& dir) {
  std::map<std::pair<std::string, int64_t>, double> out;
  for (const auto& j : read_jsonl(dir + "/metrics.jsonl"))
    out[{j["stage"].get<std::string>(), j["step"].get<int64_t>()}] = j["loss"].get<double>();
  return out;
}

void expect_same_losses(const std::string& a, const std::string& b, size_t expected_steps) {
  auto la = losses(a), lb = losses(b);
  ASSERT_EQ(la.size(), expected_steps) << a;
  ASSERT_EQ(lb.size(), expected_steps) << b;
  for (const auto& [key, loss] : la) {
    ASSERT_TRUE(lb.count(key)) << key.first << " step " << key.second;
    EXPECT_NEAR(lb[key], loss, kLossTol * std::abs(loss)) << key.first << " step " << key.second;
  }
}

void expect_same_weights(const std::string& a, const std::string& b) {
  WeightStore wa(a), wb(b);
  ASSERT_FALSE(wa.names().empty());
  for (const auto& n : wa.names()) EXPECT_LT(test::rel_err(wb.get(n), wa.get(n)), kWeightTol) << n;
}

TEST(DataParallel, TwoGlooProcessesMatchOneProcessWithAccumulation) {
  const std::string one = tmpdir("one"), two = tmpdir("two");
  auto r1 = test::run_tool(pretrain_args(one) + " --grad-accum 2");
  ASSERT_EQ(r1.code, 0) << r1.out;
  auto r2 = test::run_tool("launch --nproc-per-node 2 -- " + pretrain_args(two));
  ASSERT_EQ(r2.code, 0) << r2.out;
  EXPECT_NE(r2.out.find("data parallel over 2 processes: 4 sequences each"), std::string::npos) << r2.out;
  expect_same_losses(one, two, 6);
  expect_same_weights(one, two);
  // The losses moved (the comparison is not between two untrained models).
  auto l = losses(one);
  const double first = l[{"pretrain", 1}], last = l[{"pretrain", 6}];
  EXPECT_LT(last, first - 0.1);
}

TEST(DataParallel, DistillStagesMatchAcrossWorldSizes) {
  // A teacher, then stages 1 (only mixers and input norms train) and 3 (everything) of a gated
  // DeltaNet student, by one process with accumulation and by two processes.
  const std::string teacher = tmpdir("teacher");
  auto t = test::run_tool(pretrain_args(teacher) + " --quiet");
  ASSERT_EQ(t.code, 0) << t.out;
  auto [tok, shard] = data();
  const std::string args = "distill --teacher " + teacher + " --mixer gated_deltanet --data " + shard +
                           " --seq-len 32 --tokens 3072 --splits '0.5|0.25|0.25' --stages 1,3 --batch 8 --quiet";
  const std::string one = tmpdir("s_one"), two = tmpdir("s_two");
  auto r1 = test::run_tool(args + " --grad-accum 2 --out " + one);
  ASSERT_EQ(r1.code, 0) << r1.out;
  auto r2 = test::run_tool("launch --nproc-per-node 2 -- " + args + " --out " + two);
  ASSERT_EQ(r2.code, 0) << r2.out;
  expect_same_losses(one, two, 6 + 3);
  expect_same_weights(one, two);
}

TEST(DataParallel, ResumeUnderAnotherWorldSize) {
  const std::string full = tmpdir("full"), a = tmpdir("two_then_one"), b = tmpdir("one_then_two");
  ASSERT_EQ(test::run_tool(pretrain_args(full)).code, 0);
  // Killed after step 3 (the checkpoint holds step 2) with two processes, finished by one.
  auto k = test::run_tool("launch --nproc-per-node 2 -- " + pretrain_args(a) + " --stop-after 3");
  ASSERT_EQ(k.code, 0) << k.out;
  EXPECT_FALSE(fs::exists(a + "/model.safetensors"));
  auto r = test::run_tool(pretrain_args(a) + " --resume");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("resumed from"), std::string::npos) << r.out;
  expect_same_losses(full, a, 6);
  expect_same_weights(full, a);
  // And the other way round.
  ASSERT_EQ(test::run_tool(pretrain_args(b) + " --stop-after 3").code, 0);
  auto r2 = test::run_tool("launch --nproc-per-node 2 -- " + pretrain_args(b) + " --resume");
  ASSERT_EQ(r2.code, 0) << r2.out;
  expect_same_losses(full, b, 6);
  expect_same_weights(full, b);
}

TEST(DataParallel, BadLaunchesFailWithOneClearLine) {
  auto r = test::run_tool("launch --nproc-per-node 2");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("give the command after `--`"), std::string::npos) << r.out;
  r = test::run_tool("launch --nproc-per-node 2 -- eval ppl");
  EXPECT_NE(r.out.find("\"eval\" is not a training command"), std::string::npos) << r.out;
  r = test::run_tool("launch --nproc-per-node 2 --nnodes 2 --node-rank 2 -- pretrain");
  EXPECT_NE(r.out.find("--node-rank 2 is not in 0 .. 1"), std::string::npos) << r.out;
  // A global batch that two processes cannot share: every rank says so, launch returns the failure.
  r = test::run_tool("launch --nproc-per-node 2 -- " + pretrain_args(tmpdir("odd")) + " --batch 3");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("error (rank 0): pretrain: batch 3 is not divisible by grad_accum 1 x 2 processes"),
            std::string::npos)
      << r.out;
}

TEST(DataParallel, LaunchEnvironmentIsValidated) {
  struct Env {
    const char* name;
    const char* value;
  };
  auto with_env = [](std::vector<Env> vars, auto fn) {
    for (const auto& v : vars) ::setenv(v.name, v.value, 1);
    fn();
    for (const auto& v : vars) ::unsetenv(v.name);
  };
  with_env({{"WORLD_SIZE", "4"}, {"RANK", "2"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.0.0.1"},
            {"MASTER_PORT", "1234"}},
           [] {
             auto e = LaunchEnv::from_environment();
             EXPECT_TRUE(e.launched);
             EXPECT_EQ(e.world_size, 4);
             EXPECT_EQ(e.rank, 2);
             EXPECT_EQ(e.master_addr, "10.0.0.1");
             EXPECT_EQ(e.master_port, 1234);
             EXPECT_FALSE(is_main_process());
           });
  with_env({{"WORLD_SIZE", "2"}, {"RANK", "2"}, {"MASTER_ADDR", "x"}}, [] {
    try {
      LaunchEnv::from_environment();
      FAIL();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("RANK=2 is not below WORLD_SIZE=2"), std::string::npos) << e.what();
    }
  });
  with_env({{"WORLD_SIZE", "two"}}, [] {
    try {
      LaunchEnv::from_environment();
      FAIL();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("WORLD_SIZE=\"two\": expected an integer"), std::string::npos) << e.what();
    }
  });
  EXPECT_FALSE(LaunchEnv::from_environment().launched);
  EXPECT_TRUE(is_main_process());
}

}  // namespace
}  // namespace linearize
