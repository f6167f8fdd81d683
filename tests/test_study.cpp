// `linearize study` on a tiny grid, end to end on the CPU: two teachers the study trains x two mixers x two
// budgets (one a WSD branch of the other): the result files, recovery matched to each student's own
// teacher, the report's tables; a study stopped by its time limit and run again finishes with the results
// of an uninterrupted one; bad study files fail at once with one clear line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "io/atomic_file.h"
#include "io/error.h"
#include "study/study.h"
#include "test_util.h"

using namespace linearize;
namespace fs = std::filesystem;

namespace {

nlohmann::json tiny_study() {
  auto teacher = [](const std::string& name, int64_t hidden) {
    return nlohmann::json{{"name", name},
                          {"pretrain",
                           {{"hidden", hidden}, {"layers", 1}, {"heads", 2}, {"kv_heads", 1}, {"seq_len", 64},
                            {"batch", 4}, {"steps", 30}, {"lr", 3e-3}}}};
  };
  return {{"name", "tiny"},
          {"tokenizer", {{"train", {{"sample", {{"documents", 30}, {"episodes", 100}}}, {"vocab", 400}, {"isolate_digits", false}}}}},
          {"data", {{"sources", {{{"generator", "retrieval_episodes"}, {"weight", 0.5}, {"max_chars", 200}},
                                 {{"generator", "english_like"}, {"weight", 0.5}}}}}},
          {"teachers", {teacher("small", 32), teacher("large", 48)}},
          {"mixers", {"gla", "gated_deltanet"}},
          {"budgets", {4 * 64 * 12, 4 * 64 * 40}},
          {"distill", {{"seq_len", 64}, {"batch", 4}, {"lr", {3e-3, 2e-3, 1e-3}}}},
          {"eval",
           {{"ppl", {{"data", {{"generator", "english_like"}, {"documents", 4}}}, {"seq_len", 64}}},
            {"niah", {{"tasks", {"s_niah_1"}}, {"lengths", {220}}, {"samples", 2}, {"max_new_tokens", 4}}}}}};
}

std::map<std::string, nlohmann::json> results_in(const std::string& out) {
  std::map<std::string, nlohmann::json> r;
  for (const auto& e : fs::directory_iterator(fs::path(out) / "results"))
    r[e.path().filename().string()] = nlohmann::json::parse(read_file(e.path().string()));
  return r;
}

}  // namespace

TEST(Study, TinyGridEndToEnd) {
  const std::string out = test::fresh_dir("study", "grid");
  const auto spec = parse_study(tiny_study(), "tiny.json", out);
  StudyOptions o;
  o.out = out;
  testing::internal::CaptureStderr();
  const auto outcome = run_study(spec, o);
  const std::string log = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(outcome.finished);
  EXPECT_EQ(outcome.expected, 8);
  // Progress: each cell says what is left of the grid, timed by the cells of the same teacher so far.
  for (const char* line : {"cell 1/4 small__gla__default__s0: distilling 10240 tokens (1 budget branches off) [",
                           "cell 2/4 small__gated_deltanet__default__s0:", "cell 3/4 large__gla__default__s0:",
                           "cell 4/4 large__gated_deltanet__default__s0:"})
    EXPECT_NE(log.find(line), std::string::npos) << line << "\n" << log;
  auto eta_of = [&](int n) {
    const size_t at = log.find("cell " + std::to_string(n) + "/4 ");
    return at == std::string::npos ? std::string() : log.substr(log.find(" so far", at), log.find(']', at) - log.find(" so far", at));
  };
  EXPECT_EQ(eta_of(1), " so far; 4 cells left");
  EXPECT_EQ(eta_of(2).rfind(" so far; 3 cells left, about ", 0), 0u) << eta_of(2);
  EXPECT_NE(eta_of(2).find(" min for 1 of them"), std::string::npos) << eta_of(2);  // the other two: large's
  EXPECT_EQ(eta_of(3), " so far; 2 cells left");  // the first cell of a teacher not timed yet
  EXPECT_EQ(eta_of(4).rfind(" so far; 1 cell left, about ", 0), 0u) << eta_of(4);
  const auto results = results_in(out);
  ASSERT_EQ(results.size(), 8u);
  for (const auto& [file, r] : results) {
    SCOPED_TRACE(file);
    const std::string teacher = r["teacher_name"];
    EXPECT_EQ(file.rfind(teacher + "__", 0), 0u);
    // Recovery against its own teacher, from that teacher's cached evaluation.
    const auto t = nlohmann::json::parse(read_file(out + "/teachers/" + teacher + ".eval.json"));
    EXPECT_EQ(r["teacher_fingerprint"], t["fingerprint"]);
    EXPECT_EQ(r["scale"], t["parameters"]);
    EXPECT_NEAR(r["ppl_recovery"].get<double>(), 100 * t["ppl"]["ppl"].get<double>() / r["ppl"]["ppl"].get<double>(), 1e-9);
    EXPECT_TRUE(r["niah"].contains("s_niah_1"));
  }
  // The two teachers differ, so recoveries against the wrong one would differ too.
  const auto ts = nlohmann::json::parse(read_file(out + "/teachers/small.eval.json"));
  const auto tl = nlohmann::json::parse(read_file(out + "/teachers/large.eval.json"));
  EXPECT_NE(ts["ppl"]["ppl"], tl["ppl"]["ppl"]);
  EXPECT_LT(ts["parameters"].get<int64_t>(), tl["parameters"].get<int64_t>());
  // The smaller budget is a branch of the larger run: its own folder, trained from the snapshot taken
  // where its decay starts (3072 tokens: 11 stage-3 steps of 4 x 64, decaying over the last 2).
  EXPECT_TRUE(fs::exists(out + "/runs/small__gla__default__s0/budget-3072/config.json"));
  EXPECT_TRUE(fs::exists(out + "/runs/small__gla__default__s0/checkpoint-stage3-step9"));
  const std::string md = read_file(out + "/report/report.md");
  for (const char* s : {"small", "large", "gla", "gated_deltanet", "Perplexity recovery", "Perplexity gap", "s_niah_1",
                        "Spearman"})
    EXPECT_NE(md.find(s), std::string::npos) << s;
  EXPECT_TRUE(fs::exists(out + "/report/results.json"));
  EXPECT_TRUE(fs::exists(out + "/report/niah_s_niah_1_large_default.svg"));
  EXPECT_TRUE(fs::exists(out + "/report/budget_small_default.svg"));
  // --report-only writes the same report again from the results alone, and needs no device: a GPU study's
  // report is rewritten on a machine without one.
  fs::remove(out + "/report/report.md");
  auto on_gpu = tiny_study();
  on_gpu["device"] = "cuda";
  o.report_only = true;
  const auto again = run_study(parse_study(on_gpu, "tiny.json", out), o);
  EXPECT_TRUE(again.finished);
  EXPECT_EQ(read_file(out + "/report/report.md"), md);
}

// Stopped by its time limit (inside a teacher's or a student's training) and run again, a study ends with
// the results of a run that was never stopped, to the bit.
TEST(Study, StoppedAndRerunMatchesAnUninterruptedRun) {
  auto j = tiny_study();
  j["teachers"] = nlohmann::json::array({j["teachers"][0]});
  j["mixers"] = nlohmann::json::array({"gated_deltanet"});
  const std::string whole = test::fresh_dir("study", "whole"), parts = test::fresh_dir("study", "parts");
  StudyOptions o;
  o.out = whole;
  run_study(parse_study(j, "tiny.json", whole), o);
  o.out = parts;
  o.max_minutes = 0.002;  // about a tenth of a second: stops inside some training, several times over
  int calls = 0;
  while (!run_study(parse_study(j, "tiny.json", parts), o).finished) ASSERT_LT(++calls, 200);
  EXPECT_GT(calls, 1) << "never stopped: the test did not test a resume";
  const auto a = results_in(whole), b = results_in(parts);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [file, r] : a) {
    SCOPED_TRACE(file);
    ASSERT_TRUE(b.count(file));
    EXPECT_EQ(r["ppl"]["nll"], b.at(file)["ppl"]["nll"]);
    EXPECT_EQ(r["niah"], b.at(file)["niah"]);
  }
}

// Results kept, weights lost (a GPU machine given back between runs): the teacher is trained again and the
// study goes on only if it is the same teacher bit for bit; a different one is refused before any student
// trains on it.
TEST(Study, ATeacherTrainedAgainMustBeTheSameTeacher) {
  auto j = tiny_study();
  j["teachers"] = nlohmann::json::array({j["teachers"][0]});
  const std::string out = test::fresh_dir("study", "again");
  StudyOptions o;
  o.out = out;
  o.only = {"gla"};
  ASSERT_TRUE(run_study(parse_study(j, "tiny.json", out), o).finished);
  // Only results and the teacher's evaluation survive.
  remove_tree(out + "/teachers/small");
  remove_tree(out + "/runs");
  o.only = {};
  testing::internal::CaptureStderr();
  const auto outcome = run_study(parse_study(j, "tiny.json", out), o);
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(outcome.finished);
  EXPECT_NE(log.find("teacher small: trained again, the same teacher bit for bit"), std::string::npos) << log;
  // A teacher that differs from the one the results were made with.
  const std::string eval = out + "/teachers/small.eval.json";
  auto e = nlohmann::json::parse(read_file(eval));
  e["fingerprint"] = "0123456789abcdef";
  write_file_atomic(eval, [&](std::ostream& f) { f << e.dump(); });
  remove_tree(out + "/teachers/small");
  remove_tree(out + "/runs");
  remove_tree(out + "/results/small__gated_deltanet__default__s0__10240.json");
  try {
    run_study(parse_study(j, "tiny.json", out), o);
    ADD_FAILURE() << "a different teacher was accepted";
  } catch (const Error& x) {
    EXPECT_NE(std::string(x.what()).find("teacher small was trained again and is not the teacher of the results"),
              std::string::npos) << x.what();
  }
  EXPECT_FALSE(fs::exists(out + "/results/small__gated_deltanet__default__s0__10240.json"));
}

// --only runs the selected cells and trains only the teachers they need.
TEST(Study, OnlyTrainsTheTeachersOfTheSelectedCells) {
  auto j = tiny_study();
  j["mixers"] = nlohmann::json::array({"gla"});
  const std::string out = test::fresh_dir("study", "only");
  StudyOptions o;
  o.out = out;
  o.only = {"small__"};
  const auto outcome = run_study(parse_study(j, "tiny.json", out), o);
  EXPECT_TRUE(outcome.finished);
  EXPECT_EQ(outcome.expected, 2);  // one teacher x one mixer x two budgets
  EXPECT_EQ(results_in(out).size(), 2u);
  EXPECT_TRUE(fs::exists(fs::path(out) / "teachers" / "small" / "model.safetensors"));
  EXPECT_FALSE(fs::exists(fs::path(out) / "teachers" / "large"));
  // The report's tables cover the teacher that ran, not the one that has no result yet.
  const auto report = read_file((fs::path(out) / "report" / "report.md").string());
  EXPECT_NE(report.find("teacher small"), std::string::npos) << report;
  EXPECT_EQ(report.find("teacher large"), std::string::npos) << report;
  EXPECT_EQ(report.find("| large |"), std::string::npos) << report;
}

TEST(Study, BadStudyFilesFailAtOnce) {
  const std::string dir = test::fresh_dir("study", "bad");
  auto error_of = [&](const std::function<void(nlohmann::json&)>& edit) {
    auto j = tiny_study();
    edit(j);
    const std::string path = dir + "/s.json";
    std::ofstream(path) << j.dump();
    try {
      read_study(path);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  auto msg = error_of([](auto& j) { j["budgtes"] = nlohmann::json::array({1}); });
  EXPECT_NE(msg.find("s.json: unknown key \"budgtes\""), std::string::npos) << msg;
  msg = error_of([](auto& j) { j["mixers"] = nlohmann::json::array({"mamba"}); });
  EXPECT_NE(msg.find("unknown mixer \"mamba\""), std::string::npos) << msg;
  msg = error_of([](auto& j) { j["teachers"] = {{{"name", "x"}, {"path", "/nonexistent/teacher"}}}; });
  EXPECT_NE(msg.find("/nonexistent/teacher is not a model folder"), std::string::npos) << msg;
  msg = error_of([](auto& j) { j["budgets"] = nlohmann::json::array({0}); });
  EXPECT_NE(msg.find("budgets must be positive"), std::string::npos) << msg;
  msg = error_of([](auto& j) { j["teachers"][0]["pretrain"]["hidden"] = 31; });
  EXPECT_NE(msg.find("hidden must divide by heads"), std::string::npos) << msg;
  msg = error_of([](auto& j) { j["teachers"][0]["pretrain"]["deterministic"] = "yes"; });
  EXPECT_NE(msg.find("\"deterministic\" has the wrong type"), std::string::npos) << msg;
  msg = error_of([](auto& j) { j["eval"]["niah"]["lenghts"] = nlohmann::json::array({1}); });
  EXPECT_NE(msg.find("unknown key \"lenghts\""), std::string::npos) << msg;
  EXPECT_TRUE(fs::is_empty(dir) || fs::directory_iterator(dir)->path().filename() == "s.json");
}

// eval.ppl.data.held_out: each text file of the mixture is cut after a line; the tail is the perplexity
// text, and the teacher, the students and the tokenizer read the head only.
TEST(Study, HeldOutTailsOfTheTextFilesAreThePerplexityText) {
  const std::string out = test::fresh_dir("study", "held_out");
  const std::string text_path = out + "_prose.txt";
  std::string text;
  for (int i = 0; i < 200; ++i) text += "Line " + std::to_string(i) + " of the prose: the cat sat on the mat.\n";
  std::ofstream(text_path) << text;
  auto j = tiny_study();
  j["mixers"] = nlohmann::json::array({"gla"});
  j["budgets"] = nlohmann::json::array({4 * 64 * 12});
  j["data"]["sources"] = {{{"generator", "retrieval_episodes"}, {"weight", 0.5}, {"max_chars", 200}},
                          {{"path", text_path}, {"weight", 0.5}}};
  j["tokenizer"]["train"]["inputs"] = nlohmann::json::array({text_path});
  j["eval"]["ppl"] = {{"data", {{"held_out", 0.25}}}, {"seq_len", 64}};
  // --out relative to the working directory, as `--out runs/NAME` is used.
  StudyOptions o;
  o.out = fs::path(out).filename().string();
  o.only = {"small__"};
  const auto cwd = fs::current_path();
  fs::current_path(fs::path(out).parent_path());
  const auto outcome = run_study(parse_study(j, "tiny.json", out), o);
  const auto eval = nlohmann::json::parse(read_file(out + "/teachers/small.eval.json"));
  EXPECT_TRUE(fs::equivalent(eval["ppl"]["data"].get<std::string>(), out + "/data/heldout.txt"));
  fs::current_path(cwd);
  EXPECT_TRUE(outcome.finished);
  const auto head = read_file(out + "/data/train/" + fs::path(text_path).filename().string());
  const auto tail = read_file(out + "/data/heldout.txt");
  EXPECT_EQ(head + tail, text);  // cut after a line, nothing lost or repeated
  EXPECT_NEAR(static_cast<double>(tail.size()) / static_cast<double>(text.size()), 0.25, 0.01);
  EXPECT_EQ(tail.substr(0, 5), "Line ");
  const auto mixture = nlohmann::json::parse(read_file(out + "/data/mixture.json"));
  EXPECT_EQ(mixture["sources"][1]["path"], out + "/data/train/" + fs::path(text_path).filename().string());
  EXPECT_GT(eval["ppl"]["tokens"].get<int64_t>(), 100);
  // A study whose mixture has no text file cannot hold any out.
  auto bad = tiny_study();
  bad["eval"]["ppl"] = {{"data", {{"held_out", 0.25}}}};
  try {
    parse_study(bad, "tiny.json", out);
    FAIL() << "held_out without a text file was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("held_out needs an inline \"data\" mixture"), std::string::npos) << e.what();
  }
}

// A variant's distillation settings are read before any teacher trains: a bad one stops the study at once,
// naming the variant and the key, with nothing trained.
TEST(Study, BadVariantFailsBeforeAnythingTrains) {
  auto j = tiny_study();
  j["variants"] = {{{"name", "ok"}}, {{"name", "odd"}, {"kl_reduction", "sum"}}};
  const std::string out = test::fresh_dir("study", "bad_variant");
  StudyOptions o;
  o.out = out;
  try {
    run_study(parse_study(j, "tiny.json", out), o);
    FAIL() << "a study with kl_reduction \"sum\" ran";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("variant odd: kl_reduction: unknown KL reduction \"sum\" (expected token_mean or batchmean)"),
              std::string::npos)
        << msg;
  }
  EXPECT_FALSE(fs::exists(fs::path(out) / "teachers"));
  // So does a study for a GPU on a machine or build without one: one line, not libtorch's.
  if (!torch::cuda::is_available()) {
    auto g = tiny_study();
    g["device"] = "cuda";
    try {
      run_study(parse_study(g, "tiny.json", out), o);
      FAIL() << "a cuda study ran without CUDA";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("tiny.json: device \"cuda\": CUDA is not available"), std::string::npos)
          << e.what();
    }
  }
  // And graphed training steps on the CPU.
  StudyOptions graphed = o;
  graphed.cuda_graph = true;
  try {
    run_study(parse_study(tiny_study(), "tiny.json", out), graphed);
    FAIL() << "a CPU study ran with --cuda-graph";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--cuda-graph needs a CUDA device (the study runs on cpu)"),
              std::string::npos)
        << e.what();
  }
}

// Each built-in study is a file the study reader accepts as it stands (the paper preset with three copies of
// the tiny real model as its teachers), and its data mixture's weights add up to one.
TEST(Study, BuiltInPresetsAreValidStudies) {
  const std::string model = test::data_dir() + "/models/stories260K";
  LINEARIZE_REQUIRE_PATH(model);
  for (const auto& name : study_presets()) {
    SCOPED_TRACE(name);
    const auto j = study_preset(name, name == "paper" ? std::vector<std::string>{model, model, model}
                                                      : std::vector<std::string>{});
    const auto spec = parse_study(j, name + ".json", test::data_dir());
    EXPECT_EQ(spec.teachers.size(), 3u);
    EXPECT_EQ(spec.mixers.size(), 7u);
    if (spec.data.is_object()) {
      double total = 0;
      for (const auto& s : spec.data["sources"]) total += s["weight"].get<double>();
      EXPECT_NEAR(total, 1.0, 1e-9);
    }
  }
  EXPECT_THROW(study_preset("paper", {model}), Error);
}
