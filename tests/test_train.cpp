// Training infrastructure: schedules, stream splits, the window loader, pretraining that learns,
// atomic checkpoints and exact resume (a run stopped after step N and resumed gives bit-identical
// losses to an uninterrupted run).
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "compat/cpu_threads.h"
#include "compat/torch_compat.h"
#include "io/atomic_file.h"
#include "io/error.h"
#include "io/jsonl.h"
#include "io/safetensors.h"
#include "io/token_shards.h"
#include "io/tokenizer.h"
#include "model/causal_lm.h"
#include "ops/ops.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/data_loader.h"
#include "train/optimizer_schedule.h"
#include "train/pretrain.h"
#include "train/trainer.h"
#include "train_fixtures.h"

using namespace linearize;
namespace fs = std::filesystem;

namespace {

std::string tmpdir(const std::string& name) { return test::fresh_dir("train", name); }

// Tokenizer folder + shard of the synthetic corpus.
std::pair<std::string, std::string> tiny_data() {
  static std::pair<std::string, std::string> cached;
  if (!cached.first.empty()) return cached;
  const std::string dir = tmpdir("data");
  test::write_byte_tokenizer(dir);
  auto tok = load_tokenizer(dir);
  auto ids = tok->encode(test::synthetic_corpus(3000, 1), false);
  write_token_shard(dir + "/train.u32", ids);
  cached = {dir, dir + "/train.u32"};
  return cached;
}

PretrainOptions tiny_pretrain(const std::string& out) {
  auto [tok, data] = tiny_data();
  PretrainOptions o;
  o.tokenizer = tok;
  o.data = data;
  o.out = out;
  o.hidden = 32;
  o.layers = 2;
  o.heads = 4;
  o.kv_heads = 2;
  o.seq_len = 32;
  o.loop.batch = 4;
  o.loop.steps = 6;
  o.loop.schedule.lr = 3e-3;
  o.loop.schedule.kind = ScheduleKind::cosine;
  o.loop.quiet = true;
  o.loop.run_dir = out;
  return o;
}

std::vector<double> losses(const std::string& run_dir) {
  std::map<int64_t, double> by_step;
  for (const auto& j : read_jsonl(run_dir + "/metrics.jsonl")) by_step[j["step"].get<int64_t>()] = j["loss"].get<double>();
  std::vector<double> out;
  for (auto& [s, l] : by_step) out.push_back(l);
  return out;
}

}  // namespace

// The demo trains on one thread: the scope sets libtorch's thread count and puts the previous one back.
TEST(CpuThreads, ScopeSetsAndRestores) {
  const int before = cpu_threads();
  {
    CpuThreadsScope one(1);
    EXPECT_EQ(cpu_threads(), 1);
    {
      CpuThreadsScope two(2);
      EXPECT_EQ(cpu_threads(), 2);
    }
    EXPECT_EQ(cpu_threads(), 1);
  }
  EXPECT_EQ(cpu_threads(), before);
}

TEST(Schedule, Shapes) {
  Schedule s;
  s.lr = 1.0;
  s.total_steps = 100;
  s.warmup_frac = 0.1;
  s.kind = ScheduleKind::wsd;
  s.decay_frac = 0.2;
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);   // warmup: (0+1)/10
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
  EXPECT_DOUBLE_EQ(s.at(50), 1.0);  // stable
  EXPECT_DOUBLE_EQ(s.at(79), 1.0);
  EXPECT_NEAR(s.at(89), 0.5, 1e-12);  // halfway through the decay (steps 80..99)
  EXPECT_NEAR(s.at(99), 0.0, 1e-12);
  s.kind = ScheduleKind::linear;
  EXPECT_NEAR(s.at(99), 0.0, 1e-12);
  EXPECT_NEAR(s.at(54), 0.5, 1e-12);  // (54-10+1)/90
  s.kind = ScheduleKind::cosine;
  s.min_lr_frac = 0.1;
  EXPECT_NEAR(s.at(99), 0.1, 1e-12);
  EXPECT_NEAR(s.at(54), 0.1 + 0.45 * (1 + std::cos(M_PI * 0.5)), 1e-12);
  s.kind = ScheduleKind::constant;
  EXPECT_DOUBLE_EQ(s.at(99), 1.0);
  EXPECT_THROW(parse_schedule_kind("step", "--schedule"), Error);
}

TEST(DataLoader, SplitsAndWindows) {
  auto r = split_stream(1000, {0.026, 0.053, 0.92});
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].begin, 0);
  EXPECT_EQ(r[0].end, 26);
  EXPECT_EQ(r[1].begin, 26);
  EXPECT_EQ(r[1].end, 79);
  EXPECT_EQ(r[2].end, 79 + 920);
  auto c = split_stream(1000, {100, 200, 300});
  EXPECT_EQ(c[2].begin, 300);
  EXPECT_EQ(c[2].end, 600);
  EXPECT_THROW(split_stream(100, {60, 60}), Error);

  std::vector<int32_t> toks(1000);
  for (int i = 0; i < 1000; ++i) toks[i] = i;
  WindowLoader a(toks, {100, 500}, 16, 7), b(toks, {100, 500}, 16, 7);
  EXPECT_EQ(a.num_windows(), (400 - 1) / 16);
  std::set<int64_t> starts;
  for (int e = 0; e < a.num_windows(); ++e) {
    auto x = a.next(1), y = b.next(1);
    EXPECT_TRUE(torch::equal(x, y));  // deterministic for a seed
    const int64_t s = x[0][0].item<int64_t>();
    EXPECT_GE(s, 100);
    EXPECT_LE(x[0][16].item<int64_t>(), 499);  // inside the slice
    EXPECT_EQ(x[0][16].item<int64_t>() - s, 16);
    starts.insert(s);
  }
  EXPECT_EQ(static_cast<int64_t>(starts.size()), a.num_windows());  // an epoch visits each window once
  // Restoring a position replays the same windows.
  auto pos = a.position();
  auto next1 = a.next(3);
  a.set_position(pos);
  EXPECT_TRUE(torch::equal(a.next(3), next1));
  try {
    WindowLoader tooshort(toks, {0, 10}, 16, 0, "shard.u32");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shard.u32: 10 tokens are fewer than one window of 17"), std::string::npos)
        << e.what();
  }
}

TEST(Pretrain, LossFallsAndModelLoads) {
  auto o = tiny_pretrain(tmpdir("pretrain"));
  o.loop.steps = 150;
  o.loop.schedule.lr = 1e-2;
  pretrain(o);
  auto l = losses(o.out);
  ASSERT_EQ(l.size(), 150u);
  EXPECT_GT(l.front(), 5.0);      // ~ln(263) at random init
  EXPECT_LT(l.back(), l.front() * 0.5) << "first " << l.front() << " last " << l.back();
  EXPECT_TRUE(fs::exists(o.out + "/tokenizer.json"));
  auto cfg = LlamaConfig::load(o.out);
  EXPECT_EQ(cfg.hidden_size, 32);
  EXPECT_EQ(cfg.num_key_value_heads, 2);
}

TEST(Checkpoint, ResumeIsBitIdentical) {
  auto full = tiny_pretrain(tmpdir("full"));
  full.loop.checkpoint_every = 2;
  pretrain(full);
  auto killed = tiny_pretrain(tmpdir("killed"));
  killed.loop.checkpoint_every = 2;
  killed.loop.stop_after = 3;  // killed after step 3: the last checkpoint is step 2
  pretrain(killed);
  EXPECT_FALSE(fs::exists(killed.out + "/model.safetensors"));
  EXPECT_EQ(read_checkpoint_state(killed.out + "/checkpoint-pretrain")["step"], 2);
  killed.loop.stop_after = -1;
  killed.loop.resume = true;
  pretrain(killed);
  auto a = losses(full.out), b = losses(killed.out);
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1;  // bit-identical
  // Final weights identical too.
  WeightStore wa(full.out), wb(killed.out);
  for (const auto& n : wa.names()) EXPECT_TRUE(torch::equal(wa.get(n), wb.get(n))) << n;
}

TEST(Checkpoint, InterruptedSwapLeavesPreviousCheckpoint) {
  const std::string dir = tmpdir("swap") + "/ck";
  torch::nn::Linear lin(3, 2);
  torch::optim::AdamW opt(lin->parameters(), torch::optim::AdamWOptions(1e-3));
  save_checkpoint(dir, *lin, opt, {{"step", 1}});
  // Simulate a crash between the two renames of the next save: only ck.old is left.
  fs::rename(dir, dir + ".old");
  EXPECT_TRUE(checkpoint_exists(dir));
  EXPECT_EQ(read_checkpoint_state(dir)["step"], 1);
  torch::nn::Linear other(3, 2);
  torch::optim::AdamW opt2(other->parameters(), torch::optim::AdamWOptions(1e-3));
  load_checkpoint(dir, *other, opt2);
  EXPECT_TRUE(torch::equal(other->weight, lin->weight));
}

// adamw_step against libtorch's clip_grad_norm_ and AdamW step on the same parameters, gradients and state,
// over three steps of two groups (with and without weight decay, a parameter without a gradient in one step;
// clipped, not clipped, a bound above the norm). Where the update
// runs: libtorch's own ops on the CPU (the same to the bit), the CUDA kernel (ops/cuda/adamw.cu) under the
// emulator or on a GPU (within fp32 round-off). The state stays libtorch's (its keys, steps and moments), so
// checkpoints do not change.
namespace {

enum class AdamwPath { kLibtorchOps, kEmulatedKernel, kGpuKernel };

void expect_adamw_step_matches_libtorch(AdamwPath path) {
  const bool exact = path == AdamwPath::kLibtorchOps;
  const auto device = path == AdamwPath::kGpuKernel ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  torch::manual_seed(3);
  std::vector<std::pair<std::string, torch::Tensor>> a, b;
  for (const auto& [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
           {"w", {7, 5}}, {"norm", {5}}, {"bias", {3}}, {"big", {33, 40}}}) {
    auto t = torch::randn(shape).to(device);
    a.emplace_back(name, t.clone().requires_grad_(true));
    b.emplace_back(name, t.clone().requires_grad_(true));
  }
  OptimizerOptions o;
  auto ref = make_adamw(a, o, 3e-2), got = make_adamw(b, o, 3e-2);
  test::EmulationScope scope(path == AdamwPath::kEmulatedKernel);
  const double clip[3] = {5.0, 0.0, 1e3};  // the gradients' norm is about 38
  for (int step = 0; step < 3; ++step) {
    set_learning_rate(*ref, 3e-2 / (step + 1)), set_learning_rate(*got, 3e-2 / (step + 1));
    std::vector<torch::Tensor> grads(a.size()), ref_params;
    for (size_t i = 0; i < a.size(); ++i) {
      const bool skip = step == 1 && i == 2;  // no gradient this step: the step leaves it alone
      if (!skip) grads[i] = torch::randn(a[i].second.sizes()).to(device);
      a[i].second.mutable_grad() = skip ? torch::Tensor() : grads[i].clone();
      b[i].second.mutable_grad() = skip ? torch::Tensor() : grads[i].clone();
      ref_params.push_back(a[i].second);
    }
    const double ref_norm = clip[step] > 0 ? torch::nn::utils::clip_grad_norm_(ref_params, clip[step]) : 0.0;
    ref->step();
    const double norm = adamw_step(*got, clip[step]);
    if (exact) {
      EXPECT_EQ(norm, ref_norm) << "step " << step;
    } else {
      EXPECT_NEAR(norm, ref_norm, 1e-6 * ref_norm) << "step " << step;
    }
    for (size_t i = 0; i < a.size(); ++i) {
      if (grads[i].defined()) {  // the clipping factor went into the update, not into the gradients
        EXPECT_TRUE(torch::equal(b[i].second.grad(), grads[i])) << a[i].first << " step " << step;
      }
      using State = torch::optim::AdamWParamState;
      const auto& sa = static_cast<State&>(*ref->state().at(compat::optimizer_state_key(a[i].second)));
      const auto& sb = static_cast<State&>(*got->state().at(compat::optimizer_state_key(b[i].second)));
      EXPECT_EQ(sa.step(), sb.step()) << a[i].first;
      if (exact) {
        EXPECT_TRUE(torch::equal(b[i].second, a[i].second)) << a[i].first << " step " << step;
        EXPECT_TRUE(torch::equal(sb.exp_avg(), sa.exp_avg()) && torch::equal(sb.exp_avg_sq(), sa.exp_avg_sq()))
            << a[i].first;
      } else {
        const double err = test::rel_err(b[i].second.detach().cpu(), a[i].second.detach().cpu());
        EXPECT_LT(err, 1e-6) << a[i].first << " step " << step;
        EXPECT_LT(test::rel_err(sb.exp_avg_sq().cpu(), sa.exp_avg_sq().cpu()), 1e-6) << a[i].first;
        if (step == 2) std::printf("[adamw] %s: parameter rel err %.2g after 3 steps\n", a[i].first.c_str(), err);
      }
    }
  }
}

}  // namespace

TEST(Optimizer, AdamwStepMatchesLibtorch) {
  {
    SCOPED_TRACE("libtorch ops");
    expect_adamw_step_matches_libtorch(AdamwPath::kLibtorchOps);
  }
  if (ops::kernel_emulation_available()) {
    SCOPED_TRACE("emulated kernel");
    expect_adamw_step_matches_libtorch(AdamwPath::kEmulatedKernel);
  }
}

// The same on a GPU, where the trainer's step runs the kernel (the CUDA suites' label `cuda`).
TEST(CudaTrain, AdamwStepMatchesLibtorch) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "skipped: CUDA not available";
  expect_adamw_step_matches_libtorch(AdamwPath::kGpuKernel);
}

// --deterministic: PyTorch's deterministic algorithms, strict (not warn-only: SDPA's backward would stay
// non-deterministic), while the loop runs (every step sees them on), as they were afterwards; and a run
// trained twice gives the same weights.
TEST(TrainLoop, DeterministicModeHoldsForTheRunOnly) {
  std::vector<int32_t> tokens(2000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7) % 13);
  auto train = [&](bool deterministic, int& on_steps) {
    torch::manual_seed(3);
    torch::nn::Linear lin(8, 4);
    std::vector<std::pair<std::string, torch::Tensor>> params;
    for (auto& p : lin->named_parameters()) params.emplace_back(p.key(), p.value());
    WindowLoader data(tokens, {0, 2000}, 8, 0);
    auto step = [&](const torch::Tensor& rows) {
      on_steps += at::globalContext().deterministicAlgorithms() && !at::globalContext().deterministicAlgorithmsWarnOnly();
      return lin->forward(rows.narrow(1, 0, 8).to(torch::kFloat)).pow(2).mean();
    };
    TrainLoopOptions o;
    o.steps = 5;
    o.batch = 2;
    o.quiet = true;
    o.deterministic = deterministic;
    run_training(*lin, params, data, step, o);
    return lin->weight.detach().clone();
  };
  ASSERT_FALSE(at::globalContext().deterministicAlgorithms());
  int on = 0;
  const auto a = train(true, on);
  EXPECT_EQ(on, 5);
  EXPECT_FALSE(at::globalContext().deterministicAlgorithms());
  int on_again = 0;
  EXPECT_TRUE(torch::equal(train(true, on_again), a));
  int off = 0;
  train(false, off);
  EXPECT_EQ(off, 0);
}

// ---- guards ----

namespace {

// NaN or inf gradients skip the step (nothing updated, counted, logged); eight in a row stop the run with
// one clear line; a checkpoint or a model with non-finite weights is never written. The same with the steps
// after the first replayed by the graph's stand-in, which decides on the device.
void expect_nonfinite_steps_skipped(TrainLoopOptions::StepGraph graph) {
  torch::nn::Linear lin(4, 4);
  auto w = lin->weight;
  const auto before = w.detach().clone();
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (auto& p : lin->named_parameters()) params.emplace_back(p.key(), p.value());
  std::vector<int32_t> tokens(2000, 1);
  WindowLoader data(tokens, {0, 2000}, 8, 0);
  int calls = 0;
  // sqrt(w - w) is 0 (a finite loss) with an infinite gradient: bad steps 2, 3 and 5, then every step.
  auto step = [&](const torch::Tensor&) {
    ++calls;
    const bool bad = calls == 2 || calls == 3 || calls == 5 || calls >= 7;
    auto loss = (lin->weight * 0.1).pow(2).sum();
    return bad ? loss + torch::sqrt(lin->weight - lin->weight.detach()).sum() : loss;
  };
  TrainLoopOptions o;
  o.steps = 30;
  o.batch = 2;
  o.quiet = true;
  o.run_dir = tmpdir(graph == TrainLoopOptions::StepGraph::off ? "nan" : "nan_graph");
  o.checkpoint_every = 1;
  o.step_graph = graph;
  try {
    run_training(*lin, params, data, step, o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("8 steps in a row"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(torch::isfinite(w).all().item<bool>());
  EXPECT_FALSE(torch::equal(w, before));  // the good steps did update
  int skipped = 0;
  for (const auto& j : read_jsonl(o.run_dir + "/metrics.jsonl")) skipped += j["skipped"].get<bool>();
  EXPECT_EQ(skipped, 3 + 7);  // the eighth bad step in a row stops the run before its row is logged
  // The last checkpoint holds finite weights, and a model or checkpoint of NaN weights is refused.
  const auto ckpt = WeightStore(o.run_dir + "/checkpoint-train").get("weight");
  EXPECT_TRUE(torch::isfinite(ckpt).all().item<bool>());
  {
    torch::NoGradGuard ng;
    w.index_put_({0, 0}, std::nan(""));
  }
  auto opt = make_adamw(params, {}, 1e-3);
  EXPECT_THROW(save_checkpoint(o.run_dir + "/bad", *lin, *opt, {}), Error);
  EXPECT_FALSE(fs::exists(o.run_dir + "/bad"));
}

}  // namespace

TEST(TrainGuards, NonFiniteGradientsSkipThenStop) {
  {
    SCOPED_TRACE("eager steps");
    expect_nonfinite_steps_skipped(TrainLoopOptions::StepGraph::off);
  }
  SCOPED_TRACE("the graph's stand-in");
  expect_nonfinite_steps_skipped(TrainLoopOptions::StepGraph::eager);
}

// Sizes of zero and outputs inside an input folder are refused before anything runs.
TEST(TrainGuards, BadShapesAndOutputsInsideInputs) {
  auto o = tiny_pretrain(tmpdir("zero_heads"));
  o.heads = 0;
  EXPECT_THROW(pretrain(o), Error);  // not SIGFPE
  o = tiny_pretrain(tmpdir("zero_kv"));
  o.kv_heads = 0;
  EXPECT_THROW(pretrain(o), Error);
  const std::string teacher = tmpdir("teacher");
  pretrain(tiny_pretrain(teacher));
  o = tiny_pretrain(teacher + "/inner");
  o.init_from = teacher;
  try {
    pretrain(o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is inside the --init model's folder"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(refuse_output_inside(teacher + "_other", teacher, "x"));
  EXPECT_THROW(refuse_output_inside(teacher + "/./", teacher, "x"), Error);
  EXPECT_THROW(refuse_output_inside(teacher + "/a/../b", teacher, "x"), Error);
}

// ---- steps replayed from a graph ----

// ops::adamw_update with its factors in a device tensor gives what the host vectors give, bit for bit, and a
// non-finite skip_unless_finite leaves parameters and moments as they were: through libtorch's ops and
// through the kernel under the emulator.
TEST(Optimizer, AdamwDeviceFactorsAndSkip) {
  for (const bool emulated : {false, true}) {
    if (emulated && !ops::kernel_emulation_available()) continue;
    SCOPED_TRACE(emulated ? "emulated kernel" : "libtorch ops");
    test::EmulationScope scope(emulated);
    torch::manual_seed(5);
    auto make = [](int64_t n) {
      ops::AdamWUpdate u;
      for (int64_t i = 0; i < n; ++i) {
        u.p.push_back(torch::randn({3 + i, 5})), u.g.push_back(torch::randn({3 + i, 5}));
        u.m.push_back(torch::randn({3 + i, 5}) * 0.1), u.v.push_back(torch::rand({3 + i, 5}));
        u.decay.push_back(1 - 1e-3 * (i % 2)), u.step_size.push_back(1e-2 / (i + 1));
        u.bias2_sqrt.push_back(std::sqrt(1 - std::pow(0.95, i + 2)));
      }
      u.beta2 = 0.95;
      return u;
    };
    auto clone = [](const ops::AdamWUpdate& u) {
      ops::AdamWUpdate c = u;
      for (auto* v : {&c.p, &c.g, &c.m, &c.v})
        for (auto& t : *v) t = t.clone();
      return c;
    };
    const auto ref = make(4);
    auto by_host = clone(ref), by_device = clone(ref), skipped = clone(ref);
    by_host.grad_scale = by_device.grad_scale = torch::full({}, 0.5f);
    ops::adamw_update(by_host);
    by_device.factors = torch::empty({4, 3});
    for (int64_t i = 0; i < 4; ++i) {
      by_device.factors[i][0] = by_device.decay[i], by_device.factors[i][1] = by_device.step_size[i];
      by_device.factors[i][2] = by_device.bias2_sqrt[i];
    }
    by_device.decay.clear(), by_device.step_size.clear(), by_device.bias2_sqrt.clear();
    by_device.skip_unless_finite = torch::full({}, 3.0f);  // finite: updates
    ops::adamw_update(by_device);
    skipped.skip_unless_finite = torch::full({}, std::numeric_limits<float>::quiet_NaN());
    ops::adamw_update(skipped);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_TRUE(torch::equal(by_device.p[i], by_host.p[i])) << i;
      EXPECT_TRUE(torch::equal(by_device.m[i], by_host.m[i]) && torch::equal(by_device.v[i], by_host.v[i])) << i;
      EXPECT_FALSE(torch::equal(by_host.p[i], ref.p[i])) << i;
      EXPECT_TRUE(torch::equal(skipped.p[i], ref.p[i]) && torch::equal(skipped.m[i], ref.m[i]) &&
                  torch::equal(skipped.v[i], ref.v[i]))
          << "a NaN norm updates nothing " << i;
    }
    auto bad = clone(ref);
    bad.factors = torch::empty({3, 3});
    bad.decay.clear(), bad.step_size.clear(), bad.bias2_sqrt.clear();
    EXPECT_THROW(ops::adamw_update(bad), Error) << "factors for 3 tensors of 4";
  }
}

namespace {

// A tiny Llama pretrained for `steps` steps (2 micro-batches a step, clipped) with the given step graph; its
// weights and the per-step loss and gradient norm from metrics.jsonl.
struct GraphRun {
  std::vector<torch::Tensor> weights;
  std::vector<double> losses, norms;
  TrainResult result;
};

GraphRun train_tiny_llama(TrainLoopOptions::StepGraph graph, const torch::Device& device, const std::string& dir,
                          const std::function<void(TrainLoopOptions&)>& adjust = {}) {
  torch::manual_seed(11);
  CausalLM model(test::small_llama(32, 16, 2, 2, 1, 24));
  init_weights_normal(*model, 0.2);
  model->to(device);
  model->train();
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (auto& p : model->named_parameters()) params.emplace_back(p.key(), p.value());
  std::vector<int32_t> tokens(4000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * i + 3 * i) % 31);
  WindowLoader data(tokens, {0, 4000}, 12, 0);
  auto step = [&](const torch::Tensor& rows) {
    auto x = rows.narrow(1, 0, 12).to(device), y = rows.narrow(1, 1, 12).to(device);
    return ops::cross_entropy_terms(model->forward(x).reshape({-1, 32}), y.reshape({-1})).mean();
  };
  TrainLoopOptions o;
  o.steps = 6;
  o.batch = 4;
  o.grad_accum = 2;
  o.clip = 0.5;  // below the norms, so clipping acts
  o.schedule.lr = 1e-2;
  o.device = device;
  o.quiet = true;
  o.run_dir = dir;
  o.step_graph = graph;
  if (adjust) adjust(o);
  GraphRun r;
  r.result = run_training(*model, params, data, step, o);
  for (auto& p : model->parameters()) r.weights.push_back(p.detach().cpu().clone());
  for (const auto& j : read_jsonl(dir + "/metrics.jsonl")) {
    r.losses.push_back(j["loss"].get<double>());
    r.norms.push_back(j["grad_norm"].get<double>());
  }
  return r;
}

}  // namespace

// The graph's stand-in (the step a CUDA graph captures, run without one) against the eager loop: the same
// weights, losses and gradient norms to the bit, every step after the first replayed.
TEST(TrainLoop, GraphedStepsMatchEagerSteps) {
  const auto eager = train_tiny_llama(TrainLoopOptions::StepGraph::off, torch::kCPU, tmpdir("graph_off"));
  const auto graphed = train_tiny_llama(TrainLoopOptions::StepGraph::eager, torch::kCPU, tmpdir("graph_eager"));
  EXPECT_EQ(eager.result.graphed_steps, 0);
  EXPECT_EQ(graphed.result.graphed_steps, 5);
  ASSERT_EQ(graphed.losses.size(), 6u);
  EXPECT_EQ(graphed.losses, eager.losses);
  EXPECT_EQ(graphed.norms, eager.norms);
  EXPECT_GT(eager.norms.back(), 0.5) << "clipping should act";
  ASSERT_EQ(graphed.weights.size(), eager.weights.size());
  for (size_t i = 0; i < eager.weights.size(); ++i) EXPECT_TRUE(torch::equal(graphed.weights[i], eager.weights[i])) << i;
}

// A graphed run killed after a checkpoint and resumed ends with the weights of one that was not (the resumed
// run's first step is eager again, the rest replayed).
TEST(TrainLoop, GraphedRunKilledAndResumedMatches) {
  const auto graph = TrainLoopOptions::StepGraph::eager;
  const auto whole = train_tiny_llama(graph, torch::kCPU, tmpdir("graph_whole"));
  const std::string dir = tmpdir("graph_killed");
  const auto killed = train_tiny_llama(graph, torch::kCPU, dir, [](TrainLoopOptions& o) {
    o.checkpoint_every = 1;
    o.stop_after = 3;
  });
  EXPECT_FALSE(killed.result.finished);
  const auto resumed = train_tiny_llama(graph, torch::kCPU, dir, [](TrainLoopOptions& o) { o.resume = true; });
  EXPECT_TRUE(resumed.result.finished);
  EXPECT_EQ(resumed.result.graphed_steps, 2);  // steps 5 and 6; step 4 ran eagerly
  ASSERT_EQ(resumed.weights.size(), whole.weights.size());
  for (size_t i = 0; i < whole.weights.size(); ++i)
    EXPECT_TRUE(torch::equal(resumed.weights[i], whole.weights[i])) << i;
  EXPECT_EQ(resumed.losses, whole.losses) << "metrics.jsonl: the killed run's steps, then the resumed run's";
}

// On a GPU the steps replay from a captured CUDA graph: within round-off of the eager loop (bf16 autocast
// in both; the same kernels, so usually the same bits).
TEST(CudaTrain, GraphedStepsMatchEagerSteps) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "skipped: CUDA not available";
  const auto eager = train_tiny_llama(TrainLoopOptions::StepGraph::off, torch::kCUDA, tmpdir("cuda_graph_off"));
  const auto graphed = train_tiny_llama(TrainLoopOptions::StepGraph::cuda_graph, torch::kCUDA, tmpdir("cuda_graph_on"));
  EXPECT_EQ(graphed.result.graphed_steps, 5);
  ASSERT_EQ(graphed.losses.size(), eager.losses.size());
  for (size_t i = 0; i < eager.losses.size(); ++i) {
    EXPECT_NEAR(graphed.losses[i], eager.losses[i], 1e-4 * std::abs(eager.losses[i])) << "step " << i;
    EXPECT_NEAR(graphed.norms[i], eager.norms[i], 1e-3 * eager.norms[i]) << "step " << i;
  }
  for (size_t i = 0; i < eager.weights.size(); ++i)
    EXPECT_LT(test::rel_err(graphed.weights[i], eager.weights[i]), 1e-3) << i;
}
