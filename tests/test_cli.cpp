// The command-line tool end to end: runs build/linearize as a user would and checks its output and
// exit codes (help for every command, one clear error line for bad input).
#include <sys/stat.h>

#include <array>
#include <cmath>
#include <set>
#include <sstream>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "distill/sft.h"
#include "distill/stages.h"
#include "io/atomic_file.h"
#include "io/token_shards.h"
#include "model/mixers/mixer_config.h"
#include "train/pretrain.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

linearize::test::ToolRun run(const std::string& args) { return linearize::test::run_tool(args); }

std::string tmp(const std::string& name) {
  auto d = fs::temp_directory_path() / ("linearize_cli_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return (d / name).string();
}

}  // namespace

TEST(Cli, HelpForEveryCommand) {
  auto r = run("--help");
  EXPECT_EQ(r.code, 0);
  for (const char* c : {"info", "tokenize", "generate", "eval", "demo"}) {
    EXPECT_NE(r.out.find(c), std::string::npos) << c;
    auto h = run(std::string(c) + " --help");
    EXPECT_EQ(h.code, 0) << c;
    EXPECT_NE(h.out.find("usage: linearize " + std::string(c)), std::string::npos) << h.out;
  }
  auto p = run("eval ppl --help");
  EXPECT_EQ(p.code, 0);
  EXPECT_NE(p.out.find("--seq-len N"), std::string::npos) << p.out;
}

// The help shows the defaults the code uses, not a copy of them: each line below is built from the options
// structs, so a default changed in one place only fails here.
TEST(Cli, HelpDefaultsAreTheCodes) {
  auto shown = [](double v) {
    std::ostringstream o;
    o << v;
    return "(default: " + o.str() + ")";
  };
  const linearize::DistillOptions d;
  const auto distill = run("distill --help");
  ASSERT_EQ(distill.code, 0);
  for (int s = 0; s < 3; ++s) {
    const auto line = distill.out.substr(distill.out.find("--lr" + std::to_string(s + 1)));
    EXPECT_NE(line.substr(0, line.find('\n')).find(shown(d.stage[s].lr)), std::string::npos) << line;
  }
  EXPECT_NE(distill.out.find("(default: " + linearize::to_string(d.stage[2].schedule) + ")"), std::string::npos);
  EXPECT_NE(distill.out.find("(default: " + std::to_string(d.seq_len) + ")"), std::string::npos);
  for (const auto& m : linearize::mixer_kinds()) EXPECT_NE(distill.out.find(" " + m), std::string::npos) << m;
  const linearize::PretrainOptions p;
  const auto pretrain = run("pretrain --help");
  ASSERT_EQ(pretrain.code, 0);
  const auto lr_line = pretrain.out.substr(pretrain.out.find("--lr X"));
  EXPECT_NE(lr_line.substr(0, lr_line.find('\n')).find(shown(p.loop.schedule.lr)), std::string::npos) << lr_line;
  EXPECT_NE(pretrain.out.find("(default: " + linearize::to_string(p.loop.schedule.kind) + ")"), std::string::npos);
  const linearize::SftOptions sft;
  const auto sft_help = run("sft --help");
  ASSERT_EQ(sft_help.code, 0);
  const auto seq_line = sft_help.out.substr(sft_help.out.find("--seq-len N"));
  EXPECT_NE(seq_line.substr(0, seq_line.find('\n')).find("(default: " + std::to_string(sft.seq_len) + ")"),
            std::string::npos) << seq_line;
}

TEST(Cli, ErrorsAreOneClearLine) {
  auto r = run("frobnicate");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("unknown command \"frobnicate\""), std::string::npos) << r.out;
  r = run("generate --model /nonexistent/model");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_NE(r.out.find("/nonexistent/model"), std::string::npos) << r.out;
  r = run("generate --modle x");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("unknown option --modle"), std::string::npos) << r.out;
  r = run("eval ppl --model x --data y --seq-len abc");
  EXPECT_NE(r.out.find("--seq-len expects an integer, got \"abc\""), std::string::npos) << r.out;
}

// Every numeric option is range-checked before any work: one line naming the option and what it expects,
// never a libtorch or STL message, a crash, or a run that trains on garbage.
TEST(Cli, OptionsOutOfRangeAreOneClearLine) {
  const std::string out = " --out " + tmp("never");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"pretrain --tokenizer t --data d --heads 0" + out, "--heads must be at least 1, got 0"},
      {"pretrain --tokenizer t --data d --kv-heads -2" + out, "--kv-heads must be at least 1, got -2"},
      {"pretrain --tokenizer t --data d --hidden 0" + out, "--hidden must be at least 1"},
      {"pretrain --tokenizer t --data d --lr nan" + out, "--lr must be a finite number, got \"nan\""},
      {"pretrain --tokenizer t --data d --lr -1e-3" + out, "--lr must be greater than 0"},
      {"pretrain --tokenizer t --data d --warmup 1.5" + out, "--warmup must be between 0 and 1, got 1.5"},
      {"pretrain --tokenizer t --data d --clip -1" + out, "--clip must be at least 0"},
      {"pretrain --tokenizer t --data d --weight-decay inf" + out, "--weight-decay must be a finite number"},
      {"pretrain --tokenizer t --data d --rope-theta 0" + out, "--rope-theta must be greater than 0"},
      {"distill --teacher t --mixer gla --data d --kl-temperature 0" + out, "--kl-temperature must be greater than 0"},
      {"distill --teacher t --mixer gla --data d --lr2 nan" + out, "--lr2 must be a finite number"},
      {"distill --teacher t --mixer gla --data d --stages 2,1" + out, "stages must be given once each and in order"},
      {"distill --teacher t --mixer gla --data d --stages 1,1" + out, "stages must be given once each and in order"},
      {"distill --teacher t --mixer gla --data d --stages ," + out, "--stages: no stage given"},
      {"sft --model m --data d --epochs -1" + out, "--epochs must be greater than 0"},
      {"pretrain --tokenizer t --data d --cuda-graph" + out, "--cuda-graph needs --device cuda (got cpu)"},
      {"generate --model m --temperature -0.5", "--temperature must be at least 0"},
      {"generate --model m --top-p 1.5", "--top-p must be between 0 (excluded) and 1"},
      {"generate --model m --max-new-tokens 1e30", "--max-new-tokens expects an integer"},
      {"tokenizer train --input x --vocab 259" + out, "--vocab must be at least 260, got 259"},
  };
  for (const auto& [args, expected] : cases) {
    auto r = run(args);
    EXPECT_EQ(r.code, 1) << args << "\n" << r.out;
    EXPECT_NE(r.out.find(expected), std::string::npos) << args << "\n" << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << args << "\n" << r.out;
  }
}

// A FIFO or a folder where a file is expected is refused at once (a FIFO would block the read forever).
TEST(Cli, FifoOrFolderGivenAsFileIsRefused) {
  const std::string fifo = tmp("fifo");
  fs::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string folder = tmp("a_folder");
  fs::create_directories(folder);
  for (const std::string& input : {fifo, folder}) {
    const std::string expected = input == fifo ? "is not a regular file" : "is a folder; expected a file";
    for (const std::string& args : {"tokenizer train --vocab 300 --out " + tmp("tok_never") + " --input " + input,
                                    "report --out " + tmp("report_never") + " " + input}) {
      auto r = run(args);
      EXPECT_EQ(r.code, 1) << args << "\n" << r.out;
      EXPECT_NE(r.out.find(input + " " + expected), std::string::npos) << args << "\n" << r.out;
    }
  }
}

TEST(Cli, TokenizeTextAndShard) {
  const std::string tok = linearize::test::golden_dir() + "/tok-smollm2";
  LINEARIZE_REQUIRE_PATH(tok);
  auto r = run("tokenize --tokenizer " + tok + " --text 'Hello world' --json");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out, "[19556,905]\n");
  const std::string txt = tmp("doc.txt"), jsonl = tmp("docs.jsonl"), shard = tmp("out.u32");
  std::ofstream(txt) << "Hello world";
  std::ofstream(jsonl) << "{\"text\": \"Hello world\"}\n\n{\"text\": \"Hello\"}\n";
  r = run("tokenize --tokenizer " + tok + " --input " + txt + "," + jsonl + " --output " + shard);
  EXPECT_EQ(r.code, 0) << r.out;
  auto ids = linearize::read_token_shard(shard);
  // <|endoftext|> (0) after each document.
  EXPECT_EQ(ids, (std::vector<int32_t>{19556, 905, 0, 19556, 905, 0, 19556, 0}));
  std::ofstream(jsonl) << "{\"text\": \"ok\"}\n{\"text\": oops}\n";
  r = run("tokenize --tokenizer " + tok + " --input " + jsonl + " --output " + shard);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find(jsonl + ":2: malformed JSON line"), std::string::npos) << r.out;
}

TEST(Cli, InfoGenerateAndPerplexityOnStories260K) {
  LINEARIZE_REQUIRE_SENTENCEPIECE();
  const std::string model = linearize::test::data_dir() + "/models/stories260K";
  LINEARIZE_REQUIRE_PATH(model);
  auto r = run("info " + model + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["layers"], 5);
  EXPECT_EQ(j["kv_heads"], 4);
  EXPECT_NEAR(j["parameters"].get<double>(), 260e3, 20e3);
  r = run("generate --model " + model + " --prompt 'Once upon a time' --max-new-tokens 12");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.rfind("Once upon a time", 0), 0u) << r.out;
  EXPECT_GT(r.out.size(), std::string("Once upon a time").size() + 20) << r.out;
  // Sampling with a seed is reproducible.
  auto s1 = run("generate --model " + model + " --temperature 0.8 --top-p 0.9 --seed 7 --max-new-tokens 20");
  auto s2 = run("generate --model " + model + " --temperature 0.8 --top-p 0.9 --seed 7 --max-new-tokens 20");
  EXPECT_EQ(s1.out, s2.out);
  const std::string text = tmp("story.txt");
  std::ofstream(text) << "Once upon a time, there was a little girl named Lily. She loved to play outside.";
  r = run("eval ppl --model " + model + " --data " + text + " --seq-len 8 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  auto p = nlohmann::json::parse(r.out);
  EXPECT_GT(p["tokens"].get<int64_t>(), 10);
  EXPECT_NEAR(p["ppl"].get<double>(), std::exp(p["nll"].get<double>()), 1e-9);
  EXPECT_LT(p["ppl"].get<double>(), 30.0);  // a trained model on in-domain text
}

// The README's main job, quick: every mixer appears in the comparison with finite numbers, the teacher
// can retrieve, and the report folder holds the Markdown and the figures.
TEST(Cli, DemoQuickComparesAllSevenMixers) {
  const std::string out = tmp("demo");
  auto r = run("demo --quick --out " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(out + "/report/report.md"));
  EXPECT_TRUE(fs::exists(out + "/report/recall_by_length.svg"));
  auto results = nlohmann::json::parse(linearize::read_file(out + "/report/results.json"));
  std::set<std::string> models;
  for (const auto& row : results) {
    models.insert(row["model"].get<std::string>());
    EXPECT_TRUE(std::isfinite(row["heldout_ppl"].get<double>())) << row.dump();
    EXPECT_GT(row["heldout_ppl"].get<double>(), 1.0) << row.dump();
    EXPECT_TRUE(std::isfinite(row["ppl_recovery"].get<double>())) << row.dump();
    EXPECT_GE(row["recall_mean"].get<double>(), 0.0);
    EXPECT_LE(row["recall_mean"].get<double>(), 1.0);
    EXPECT_EQ(row["recall"].size(), 3u);
  }
  // The teacher retrieves (seed 0): at the shortest length it finds at least 6 needles in 10. A change that
  // breaks its learning to retrieve within the demo's budget fails here.
  ASSERT_FALSE(results.empty());
  EXPECT_EQ(results[0]["model"], "teacher");
  EXPECT_GE(results[0]["recall"]["160"].get<double>(), 0.6) << results[0].dump();
  for (const char* m : {"teacher", "linear_attention", "retnet", "gla", "deltanet", "gated_deltanet", "kda", "mlstm"}) {
    EXPECT_TRUE(models.count(m)) << m;
    EXPECT_NE(r.out.find(std::string("| ") + m + " |"), std::string::npos) << m;  // the printed table
  }
}

// Training commands read every option from --config JSON too; an unknown key is refused before any
// work starts, naming the file and the key.
TEST(Cli, ConfigFileUnknownKeyRefused) {
  const std::string cfg = tmp("distill.json");
  std::ofstream(cfg) << R"({"mixer": "gla", "seq_len": 64, "learning_rate": 0.1})";
  auto r = run("distill --teacher /nonexistent --data x.u32 --out " + tmp("never") + " --config " + cfg);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find(cfg + ": unknown key \"learning_rate\""), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(tmp("never") + "/metrics.jsonl"));
  std::ofstream(cfg) << R"({"mixer": "mamba"})";
  r = run("distill --teacher /nonexistent --data x.u32 --out " + tmp("never") + " --config " + cfg);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("error:"), std::string::npos) << r.out;
}
