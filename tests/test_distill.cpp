// Students and the three-stage pipeline on CPU, end to end: a tiny teacher is pretrained here (on
// ../shared/data/corpus text with the golden 4k BPE tokenizer, or on a generated corpus when ../shared
// is absent) and distilled into each of the seven mixers for a few dozen steps per stage.
//   - stage-1 loss falls by at least half for every mixer;
//   - every student's held-out perplexity after stage 3 is within 2x of the teacher's;
//   - the student folder reloads (config "linearize" section, reference parameter names) and
//     generates through its recurrent state.
// Also: bad input is refused before training starts, and a killed distillation resumes exactly.
#include <functional>
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
#include "model/mixers/factory.h"
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
  p.loop.schedule.kind = ScheduleKind::cosine;
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
  o.mixer = parse_mixer_kind(mixer);
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
  auto spec = StudentSpec::make(MixerKind::gated_deltanet, "default", {1}, teacher->config);  // hybrid: layer 1 only
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
  try {  // mixer names are checked where they come in (--mixer, study files)
    parse_mixer_kind("mamba", "--mixer");
    ADD_FAILURE() << "no error for mixer mamba";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown --mixer 'mamba'"), std::string::npos) << e.what();
  }
  auto o = tiny_distill("gla", tmpdir("bad2"));
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
  expect_error(o, "unsupported model");
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
  // Resuming with other settings would not continue the same run: refused, naming what differs.
  for (auto change : std::vector<std::function<void(DistillOptions&)>>{
           [](DistillOptions& d) { d.loop.seed += 1; }, [](DistillOptions& d) { d.loop.batch *= 2; },
           [](DistillOptions& d) { d.stage[2].lr *= 3; }}) {
    auto other = killed;
    change(other);
    try {
      distill(other);
      ADD_FAILURE() << "a resume with changed settings was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--resume with settings other than the run that wrote it"), std::string::npos)
          << e.what();
    }
  }
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
    for (const auto reduction : {KlReduction::token_mean, KlReduction::batchmean})
      for (const double temp : {1.0, 2.0}) {
        DistillOptions o;
        o.kl_reduction = reduction, o.kl_temperature = temp, o.ce_weight = 0.7, o.kl_weight = 1.3;
        auto s64 = s.to(torch::kDouble).requires_grad_(true);
        auto lp_s = torch::log_softmax(s64 / temp, -1), lp_t = torch::log_softmax(t.to(torch::kDouble) / temp, -1);
        auto kl_sum = (lp_t.exp() * (lp_t - lp_s)).sum();
        auto kl = reduction == KlReduction::batchmean ? kl_sum / static_cast<double>(B) : kl_sum / (B * T) * temp * temp;
        auto want = 0.7 * torch::nn::functional::cross_entropy(s64.view({-1, V}), y.view({-1})) + 1.3 * kl;
        want.backward();
        test::EmulationScope scope(emulate);
        auto sv = s.clone().requires_grad_(true);
        auto got = stage3_loss(o, sv, t, y);
        got.backward();
        SCOPED_TRACE(to_string(reduction) + " T=" + std::to_string(temp) + (emulate ? " (emulated kernels)" : ""));
        EXPECT_LT(std::abs(got.item<double>() - want.item<double>()), 1e-5 * std::abs(want.item<double>()));
        EXPECT_LT(test::rel_err(sv.grad(), s64.grad()), 1e-5);
      }
}

// ---- the paper preset and the study's defects --------------------------------------------------------

// What each preset and each defect sets, and the learning rate the stage-2 schedule ends on.
TEST(DistillPaper, PresetAndDefectsSetWhatTheySay) {
  auto last_lr = [](const StageSettings& st, int64_t steps) {
    Schedule s;
    s.kind = st.schedule, s.lr = st.lr, s.warmup_frac = st.warmup, s.decay_frac = st.decay;
    s.cosine_decay = st.cosine_decay, s.min_lr_frac = st.min_lr_frac, s.total_steps = steps;
    return s.at(steps - 1);
  };
  DistillOptions o;
  apply_distill_preset(o, "paper");
  EXPECT_EQ(o.stage2_loss, Stage2Loss::l2);
  EXPECT_TRUE(o.stage2_final_norm_target);
  EXPECT_EQ(o.kl_reduction, KlReduction::token_mean);
  EXPECT_DOUBLE_EQ(o.stage[1].warmup, 0.2);
  EXPECT_DOUBLE_EQ(o.stage[0].decay, 0.1);
  EXPECT_TRUE(o.stage[0].cosine_decay);
  EXPECT_NEAR(last_lr(o.stage[1], 1000), 2e-3 * 1e-4, 1e-9);  // decayed to 1e-4 of the peak
  Schedule mid;  // the half-cosine: half way through the decay, half way down
  mid.kind = ScheduleKind::wsd, mid.lr = 1.0, mid.warmup_frac = 0, mid.decay_frac = 0.1, mid.cosine_decay = true, mid.total_steps = 1000;
  EXPECT_NEAR(mid.at(949), 0.5, 1e-9);
  apply_paper_defects(o, {"stage2_lr", "kl_batchmean"});
  EXPECT_EQ(o.stage[1].schedule, ScheduleKind::constant);
  EXPECT_DOUBLE_EQ(last_lr(o.stage[1], 1000), 2e-3);  // never decays
  EXPECT_EQ(o.kl_reduction, KlReduction::batchmean);
  EXPECT_EQ(o.defects, (std::vector<std::string>{"stage2_lr", "kl_batchmean"}));
  DistillOptions d;
  apply_distill_preset(d, "default");
  EXPECT_EQ(d.stage2_loss, Stage2Loss::mse);
  EXPECT_FALSE(d.stage[1].cosine_decay);
  EXPECT_THROW(apply_paper_defects(d, {"gqa", "gqa"}), Error);
  try {
    apply_paper_defects(d, {"stage3_lr"});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gqa, kda_gate, kl_batchmean, stage2_lr, bf16_weights"), std::string::npos)
        << e.what();
  }
}

// Stage 2: `l2` is the mean over tokens of each token's L2 norm (not one norm over the batch), and with
// the final-norm target the last layer is compared with the teacher's final-normed state.
TEST(DistillPaper, StageTwoLossAndTargets) {
  const auto& f = fixture();
  auto teacher = load_model(f.teacher);
  auto spec = StudentSpec::make(MixerKind::gla, "default", {}, teacher->config);
  torch::manual_seed(1);
  auto student = build_student(teacher, spec);
  torch::NoGradGuard ng;
  auto x = torch::randint(0, 200, {2, 24}, torch::kLong);
  Trace trace;
  teacher->hidden_states(x, nullptr, &trace);
  auto diff = [&](int64_t l, const torch::Tensor& target) {
    return student->layer(l)->forward(trace.layer_in[l], nullptr) - target;  // [B,T,hidden]
  };
  DistillOptions o;
  o.stage2_loss = Stage2Loss::l2;
  const auto d0 = diff(0, trace.layer_out[0]), d1 = diff(1, trace.layer_out[1]);
  const double per_token = (d0.norm(2, -1).mean() + d1.norm(2, -1).mean()).item<double>();
  EXPECT_NEAR(stage2_loss(o, student, trace, {0, 1}).item<double>(), per_token, 1e-5 * per_token);
  EXPECT_GT(d0.norm().item<double>() / d0.norm(2, -1).mean().item<double>(), 5.0);  // one norm: ~sqrt(B T) larger
  o.stage2_final_norm_target = true;
  const auto dn = diff(1, trace.final_norm_out);
  const double with_norm = (d0.norm(2, -1).mean() + dn.norm(2, -1).mean()).item<double>();
  EXPECT_NEAR(stage2_loss(o, student, trace, {0, 1}).item<double>(), with_norm, 1e-5 * with_norm);
  EXPECT_GT(std::abs(with_norm - per_token), 1e-3 * per_token);
  o.stage2_loss = Stage2Loss::mse;
  o.stage2_final_norm_target = false;
  const double mse = (d0.pow(2).mean() + d1.pow(2).mean()).item<double>();
  EXPECT_NEAR(stage2_loss(o, student, trace, {0, 1}).item<double>(), mse, 1e-5 * mse);
}

// The gqa defect: the study's unroll repeats 32-row chunks, so at SmolLM2-135M's shape (head size 64,
// 3 KV heads, G = 3) only student heads 1, 4, 7 get their own KV head; the right unroll gets all nine.
TEST(DistillPaper, GqaDefectUnrollsInChunksOf32) {
  auto w = torch::randn({3 * 64, 10});
  auto right = repeat_kv_rows(w, 3, 3), study = study_repeat_kv_rows(w, 3);
  ASSERT_EQ(study.sizes(), right.sizes());
  for (int64_t h = 0; h < 9; ++h) {
    const bool same = torch::equal(study.narrow(0, h * 64, 64), right.narrow(0, h * 64, 64));
    EXPECT_EQ(same, h % 3 == 1) << "head " << h;
  }
  EXPECT_TRUE(torch::equal(study_repeat_kv_rows(torch::arange(64).view({64, 1}), 2).view({-1}).narrow(0, 0, 64),
                           torch::cat({torch::arange(32), torch::arange(32)})));
  // Through the student: deltanet repeats K/V (no native GQA); the fixture's teacher has 2 KV heads of 16.
  const auto& f = fixture();
  auto teacher = load_model(f.teacher);
  auto spec = StudentSpec::make(MixerKind::deltanet, "default", {}, teacher->config);
  spec.study_gqa_unroll = true;
  auto student = build_student(teacher, spec);
  auto tk = teacher->named_parameters()["model.layers.0.self_attn.k_proj.weight"];
  EXPECT_TRUE(torch::equal(student->named_parameters()["model.layers.0.attn.k_proj.weight"], study_repeat_kv_rows(tk, 2)));
  EXPECT_FALSE(torch::equal(study_repeat_kv_rows(tk, 2), repeat_kv_rows(tk, 2, 2)));
}

// Fresh student weights are drawn in fp32 and kept: building from a bf16 teacher with dtype fp32 gives the
// very weights a build from the fp32 teacher gives, and they are not bf16 values.
TEST(DistillPaper, FreshWeightsAreNotRoundedThroughBf16) {
  const auto& f = fixture();
  auto teacher = load_model(f.teacher);
  LoadOptions lo;
  lo.dtype = torch::kBFloat16;
  auto teacher16 = load_model(f.teacher, lo);
  auto spec = StudentSpec::make(MixerKind::gated_deltanet, "default", {}, teacher->config);
  torch::manual_seed(9);
  auto a = build_student(teacher, spec);
  torch::manual_seed(9);
  auto b = build_student(teacher16, spec, nullptr, torch::kFloat);
  auto pa = a->named_parameters(), pb = b->named_parameters();
  for (const char* fresh : {"model.layers.0.attn.a_proj.weight", "model.layers.0.attn.dt_bias", "model.layers.1.attn.g_proj.weight"}) {
    ASSERT_EQ(pb[fresh].scalar_type(), torch::kFloat) << fresh;
    EXPECT_TRUE(torch::equal(pa[fresh], pb[fresh])) << fresh;
    EXPECT_FALSE(torch::equal(pb[fresh], pb[fresh].to(torch::kBFloat16).to(torch::kFloat))) << fresh << " is bf16-rounded";
  }
}

// kda_gate and bf16_weights through a real (short) distillation: the student's config records the gate
// inside the norm and the defects, and its weights are stored in bf16.
TEST(DistillPaper, KdaGateAndBf16WeightsDefects) {
  auto o = tiny_distill("kda", tmpdir("defects"));
  o.tokens = 8 * 64 * 10;
  apply_paper_defects(o, {"kda_gate", "bf16_weights"});
  o.mixer_overrides = {{"use_short_conv", false}};
  ASSERT_TRUE(distill(o).finished);
  auto cfg = LlamaConfig::load(o.out);
  EXPECT_EQ(cfg.raw["linearize"]["mixer_config"]["kda_gate_mode"], "add_in_norm");
  EXPECT_EQ(cfg.raw["linearize"]["mixer_config"]["use_short_conv"], false);
  EXPECT_EQ(cfg.raw["linearize"]["defects"], nlohmann::json({"kda_gate", "bf16_weights"}));
  WeightStore ws(o.out);
  EXPECT_EQ(ws.get("model.layers.0.attn.A_log").scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::isfinite(ws.get("model.layers.0.attn.q_proj.weight").to(torch::kFloat)).all().item<bool>());
  auto plain = tiny_distill("kda", tmpdir("no_defects"));
  plain.tokens = o.tokens;
  plain.stages = {1};
  ASSERT_TRUE(distill(plain).finished);
  EXPECT_EQ(WeightStore(plain.out).get("model.layers.0.attn.A_log").scalar_type(), torch::kFloat);
  EXPECT_EQ(LlamaConfig::load(plain.out).raw["linearize"]["mixer_config"]["kda_gate_mode"], "multiply");
}
