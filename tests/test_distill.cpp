// Students and the three-stage pipeline on CPU, end to end: a tiny teacher is pretrained here (on
// ../shared/data/corpus text with the golden 4k BPE tokenizer, or on a generated corpus when ../shared
// is absent) and distilled into each of the seven mixers for a few dozen steps per stage.
//   - stage-1 loss falls by at least half for every mixer;
//   - every student's held-out perplexity after stage 3 is within 2x of the teacher's;
//   - the student folder reloads (config "linearize" section, reference parameter names) and
//     generates through its recurrent state.
// Also: bad input is refused before training starts, and a killed distillation resumes exactly.
#include <filesystem>
#include <fstream>

#include "distill/stages.h"
#include "eval/perplexity.h"
#include "infer/generate.h"
#include "io/atomic_file.h"
#include "io/error.h"
#include "io/jsonl.h"
#include "io/token_shards.h"
#include "io/tokenizer.h"
#include "model/mixers/mixer_config.h"
#include "model/model_io.h"
#include "model/student.h"
#include "test_util.h"
#include "train/pretrain.h"
#include "train_fixtures.h"

using namespace linearize;
namespace fs = std::filesystem;

namespace {

struct Fixture {
  std::string dir, tokenizer, train, heldout, teacher;
};

std::string tmpdir(const std::string& name) { return test::fresh_dir("distill", name); }

// Built once per test binary run: data shards and a pretrained tiny teacher.
const Fixture& fixture() {
  static Fixture f;
  if (!f.dir.empty()) return f;
  f.dir = tmpdir("fixture");
  std::string text;
  const std::string corpus = test::data_dir() + "/corpus/austen_persuasion.txt";
  const std::string golden_tok = test::golden_dir() + "/tok-bpe4k";
  if (fs::exists(corpus) && fs::exists(golden_tok)) {
    text = read_file(corpus);
    f.tokenizer = golden_tok;
  } else {
    text = test::synthetic_corpus(20000, 3);
    f.tokenizer = test::write_byte_tokenizer(f.dir + "/tok");
  }
  auto tok = load_tokenizer(f.tokenizer);
  auto ids = tok->encode(text, false);
  const size_t cut = ids.size() * 9 / 10;
  write_token_shard(f.dir + "/train.u32", std::vector<int32_t>(ids.begin(), ids.begin() + cut));
  write_token_shard(f.dir + "/heldout.u32", std::vector<int32_t>(ids.begin() + cut, ids.end()));
  f.train = f.dir + "/train.u32";
  f.heldout = f.dir + "/heldout.u32";
  PretrainOptions p;
  p.tokenizer = f.tokenizer;
  p.data = f.train;
  p.out = f.dir + "/teacher";
  p.hidden = 64;
  p.layers = 2;
  p.heads = 4;
  p.kv_heads = 2;
  p.seq_len = 64;
  p.loop.batch = 16;
  p.loop.steps = 250;
  p.loop.schedule.lr = 3e-3;
  p.loop.schedule.kind = "cosine";
  p.loop.schedule.warmup_frac = 0.05;
  p.loop.quiet = true;
  pretrain(p);
  f.teacher = p.out;
  return f;
}

DistillOptions tiny_distill(const std::string& mixer, const std::string& out) {
  const auto& f = fixture();
  DistillOptions o;
  o.teacher = f.teacher;
  o.data = f.train;
  o.out = out;
  o.mixer = mixer;
  o.seq_len = 64;
  o.splits = {0.2, 0.2, 0.6};
  o.loop.batch = 8;
  o.loop.quiet = true;
  o.stage[0].lr = 3e-3;
  o.stage[1].lr = 2e-3;
  o.stage[2].lr = 2e-3;
  o.tokens = 8 * 64 * 150;  // 30 | 30 | 90 steps
  return o;
}

double heldout_ppl(const std::string& model_dir) {
  auto m = load_model(model_dir);
  auto toks = read_token_shard(fixture().heldout);
  if (toks.size() > 12000) toks.resize(12000);
  return perplexity(m, toks, 64, 16).ppl;
}

std::map<std::string, std::vector<double>> stage_losses(const std::string& run) {
  std::map<std::string, std::vector<double>> out;
  for (const auto& j : read_jsonl(run + "/metrics.jsonl")) out[j["stage"]].push_back(j["loss"].get<double>());
  return out;
}

}  // namespace

TEST(Distill, EveryMixerLearnsFromTheTeacher) {
  const auto& f = fixture();
  const double teacher_ppl = heldout_ppl(f.teacher);
  std::cerr << "teacher held-out ppl " << teacher_ppl << "\n";
  for (const auto& mixer : mixer_kinds()) {
    SCOPED_TRACE(mixer);
    const std::string out = tmpdir("student_" + mixer);
    auto r = distill(tiny_distill(mixer, out));
    ASSERT_TRUE(r.finished);
    auto losses = stage_losses(out);
    ASSERT_EQ(losses["stage1"].size(), 30u);
    const double s1_first = losses["stage1"].front(), s1_last = losses["stage1"].back();
    EXPECT_LT(s1_last, 0.5 * s1_first) << "stage 1 " << s1_first << " -> " << s1_last;
    const double ppl = heldout_ppl(out);
    std::cerr << mixer << ": stage1 " << s1_first << " -> " << s1_last << ", stage3 " << losses["stage3"].front()
              << " -> " << losses["stage3"].back() << ", held-out ppl " << ppl << " (teacher " << teacher_ppl << ")\n";
    EXPECT_LT(ppl, 2.0 * teacher_ppl);
    // The folder reloads as a student and generates through the recurrent state.
    auto cfg = LlamaConfig::load(out);
    ASSERT_TRUE(cfg.raw.contains("linearize"));
    EXPECT_EQ(cfg.raw["linearize"]["mixer"], mixer);
    auto student = load_model(out);
    GenerateOptions go;
    go.max_new_tokens = 8;
    ModelState st = student->new_state();
    auto gen = generate(student, {5, 6, 7}, go, nullptr, &st);
    EXPECT_EQ(gen.size(), 8u);
    EXPECT_EQ(st[0].position, 10);
    EXPECT_FALSE(st[0].has("k"));  // no KV cache: the state is the mixer's
  }
}

TEST(Distill, StudentFolderUsesReferenceNames) {
  const auto& f = fixture();
  auto teacher = load_model(f.teacher);
  auto spec = StudentSpec::make("gated_deltanet", "default", {1}, teacher->config);  // hybrid: layer 1 only
  auto student = build_student(teacher, spec);
  const std::string out = tmpdir("hybrid");
  save_student(student, spec, out, f.teacher);
  WeightStore ws(out);
  EXPECT_TRUE(ws.contains("model.layers.1.attn.A_log"));
  EXPECT_TRUE(ws.contains("model.layers.1.attn.q_conv1d.weight"));
  EXPECT_TRUE(ws.contains("model.layers.0.self_attn.q_proj.weight"));  // layer 0 stays softmax
  EXPECT_TRUE(ws.contains("model.layers.1.mlp.up_proj.weight"));
  EXPECT_TRUE(fs::exists(out + "/tokenizer.json") || fs::exists(out + "/tokenizer.model"));
  // Shared parts are the teacher's, exactly.
  EXPECT_TRUE(torch::equal(ws.get("model.layers.1.mlp.up_proj.weight"),
                           WeightStore(f.teacher).get("model.layers.1.mlp.up_proj.weight")));
  auto reloaded = load_model(out);
  auto ids = torch::randint(0, 100, {1, 20}, torch::kLong);
  torch::NoGradGuard ng;
  EXPECT_TRUE(torch::allclose(reloaded->forward(ids), student->forward(ids)));
}

TEST(Distill, BadInputRefusedBeforeTraining) {
  const auto& f = fixture();
  auto expect_error = [](DistillOptions o, const std::string& what) {
    try {
      distill(o);
      FAIL() << "expected an error containing: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(o.out + "/metrics.jsonl")) << "training started";
  };
  auto o = tiny_distill("gla", tmpdir("bad1"));
  o.mixer = "mamba";
  expect_error(o, "unknown mixer \"mamba\"");
  o = tiny_distill("gla", tmpdir("bad2"));
  o.teacher = f.dir;  // no config.json
  expect_error(o, "config.json");
  o = tiny_distill("gla", tmpdir("bad3"));
  const std::string small = tmpdir("bad3") + "/small.u32";
  write_token_shard(small, std::vector<int32_t>(100, 5));
  o.data = small;
  expect_error(o, "fewer than one window");
  o = tiny_distill("gla", tmpdir("bad4"));
  o.teacher = tmpdir("notllama");
  std::ofstream(o.teacher + "/config.json") << R"({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})";
  expect_error(o, "not a Llama model");
}

TEST(Distill, KilledRunResumesExactly) {
  auto full = tiny_distill("deltanet", tmpdir("resume_full"));
  full.tokens = 8 * 64 * 20;  // 4 | 4 | 12 steps
  full.loop.checkpoint_every = 3;
  distill(full);
  auto killed = tiny_distill("deltanet", tmpdir("resume_killed"));
  killed.tokens = full.tokens;
  killed.loop.checkpoint_every = 3;
  killed.loop.stop_after = 7;  // inside stage 3 (12 steps), after its checkpoint at step 6
  auto r = distill(killed);
  EXPECT_FALSE(r.finished);
  killed.loop.stop_after = -1;
  killed.loop.resume = true;
  ASSERT_TRUE(distill(killed).finished);
  auto a = stage_losses(full.out), b = stage_losses(killed.out);
  for (const char* s : {"stage1", "stage2", "stage3"}) {
    ASSERT_EQ(a[s].size(), b[s].size()) << s;
    for (size_t i = 0; i < a[s].size(); ++i) EXPECT_EQ(a[s][i], b[s][i]) << s << " step " << i + 1;
  }
  WeightStore wa(full.out), wb(killed.out);
  for (const auto& n : wa.names()) EXPECT_TRUE(torch::equal(wa.get(n), wb.get(n))) << n;
}

// Stage 3's loss and its gradient in the student's logits against the formula in fp64 (cross_entropy, and
// KL(teacher || student) from log_softmax at the temperature), for both reductions and temperatures 1 and 2,
// through the libtorch form and, where the build has the emulator, the CUDA kernels (ops/cuda/distill_loss.cu).
TEST(Distill, Stage3LossMatchesItsFormula) {
  torch::manual_seed(5);
  const int64_t B = 3, T = 7, V = 40;
  auto s = torch::randn({B, T, V}) * 2, t = torch::randn({B, T, V}) * 2 + s;
  auto y = torch::randint(0, V, {B, T}, torch::kLong);
  std::vector<bool> emulated{false};
  if (ops::kernel_emulation_available()) emulated.push_back(true);
  for (const bool emulate : emulated)
    for (const std::string reduction : {"token_mean", "batchmean"})
      for (const double temp : {1.0, 2.0}) {
        DistillOptions o;
        o.kl_reduction = reduction, o.kl_temperature = temp, o.ce_weight = 0.7, o.kl_weight = 1.3;
        auto s64 = s.to(torch::kDouble).requires_grad_(true);
        auto lp_s = torch::log_softmax(s64 / temp, -1), lp_t = torch::log_softmax(t.to(torch::kDouble) / temp, -1);
        auto kl_sum = (lp_t.exp() * (lp_t - lp_s)).sum();
        auto kl = reduction == "batchmean" ? kl_sum / static_cast<double>(B) : kl_sum / (B * T) * temp * temp;
        auto want = 0.7 * torch::nn::functional::cross_entropy(s64.view({-1, V}), y.view({-1})) + 1.3 * kl;
        want.backward();
        test::EmulationScope scope(emulate);
        auto sv = s.clone().requires_grad_(true);
        auto got = stage3_loss(o, sv, t, y);
        got.backward();
        SCOPED_TRACE(reduction + " T=" + std::to_string(temp) + (emulate ? " (emulated kernels)" : ""));
        EXPECT_LT(std::abs(got.item<double>() - want.item<double>()), 1e-5 * std::abs(want.item<double>()));
        EXPECT_LT(test::rel_err(sv.grad(), s64.grad()), 1e-5);
      }
}
