// Every mixer on CUDA: its fused chunk kernels under bf16 autocast against the layer in fp32, and token-by-
// token decode against the whole-sequence forward and the CPU's (on the kernel emulator without a GPU); a
// student's stage-3 step under bf16 autocast keeps fp32 weights and gradients and lowers the loss on a fixed
// batch; its decode step captured as a CUDA graph equals the eager step, logits and state. All but
// DecodeMatchesForwardAndCpu need a GPU and skip without one.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "compat/torch_compat.h"
#include "cuda_test_util.h"
#include "distill/stages.h"
#include "infer/graphed_step.h"
#include "io/error.h"
#include "model/causal_lm.h"
#include "model/layer_state.h"
#include "model/mixers/factory.h"
#include "model/mixers/mixer_config.h"
#include "model/student.h"
#include "serve/batched_decode.h"
#include "ops/ops.h"
#include "test_util.h"

namespace linearize {
namespace {

using cuda_test::NoTf32;
using test::rel_err;

// The decode tests' teacher: a small Llama (hidden 64, 2 layers) with random weights, on CUDA.
CausalLM small_cuda_teacher(uint64_t seed) {
  const auto c = test::small_llama(200, 64, 2, 4, 2, 128);
  torch::manual_seed(seed);
  CausalLM teacher(c);
  init_weights_normal(*teacher, 0.1);
  teacher->to(torch::kCUDA);
  return teacher;
}

// ---- mixers on CUDA -------------------------------------------------------------------------------

// Every mixer's layer (head size 64) trained as the trainer runs it, under bf16 autocast, takes the fused
// chunk kernels; its output and every parameter gradient must match the same layer run in fp32 (no
// autocast, libtorch chunked form) within 3e-2, or within 1.5 times the error of the libtorch chunked
// form under the same autocast where that is larger. Where even that form misses a gradient by more
// than 30%, the fp32 gradient is smaller than the 16-bit round-off of the layer (the mLSTM's input gate:
// a shift of all its pre-activations changes nothing once the normaliser dominates, and the head norm
// takes out the scale), and the error is measured against the largest parameter gradient instead.
TEST(CudaMixers, FusedChunkUnderAutocastMatchesLibtorch) {
  REQUIRE_CUDA();
  NoTf32 no_tf32;
  const int64_t B = 2, T = 150;
  for (const std::string kind : {"linear_attention", "retnet", "gla", "deltanet", "gated_deltanet", "kda", "mlstm"}) {
    SCOPED_TRACE(kind);
    torch::manual_seed(5);
    MixerConfig cfg = MixerConfig::defaults_for(parse_mixer_kind(kind));
    cfg.hidden_size = 256;
    cfg.num_heads = 4;
    cfg.chunk_size = 64;
    auto m = make_mixer(cfg);
    m->to(torch::kCUDA);
    auto x = torch::randn({B, T, cfg.hidden_size}, torch::kCUDA);
    auto w = torch::randn({B, T, cfg.hidden_size}, torch::kCUDA);
    auto run = [&](bool fused, bool autocast_on) {
      ops::set_fused_kernels(fused);
      m->zero_grad();
      torch::Tensor y;
      {
        compat::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16, autocast_on);
        y = m->forward(x, nullptr);
      }
      (y.to(torch::kFloat) * w).sum().backward();
      ops::set_fused_kernels(true);
      std::vector<torch::Tensor> out = {y.detach().to(torch::kFloat)};
      for (const auto& p : m->parameters())
        if (p.grad().defined()) out.push_back(p.grad().clone());
      return out;
    };
    auto ref = run(false, false), fused = run(true, true), plain = run(false, true);
    ASSERT_EQ(fused.size(), ref.size());
    ASSERT_EQ(plain.size(), ref.size());
    ASSERT_GT(fused.size(), 2u) << "parameters should receive gradients";
    double largest = 0;
    for (size_t i = 1; i < ref.size(); ++i) largest = std::max(largest, ref[i].norm().item<double>());
    double e_y = rel_err(fused[0], ref[0]), e_grad = 0, e_plain = 0;
    int round_off_bound = 0;
    for (size_t i = 1; i < fused.size(); ++i) {
      const double e = rel_err(fused[i], ref[i]), e_p = rel_err(plain[i], ref[i]);
      if (e_p > 0.3) {
        const double e_abs = (fused[i] - ref[i]).norm().item<double>() / largest;
        EXPECT_LE(e_abs, 3e-2) << "parameter gradient " << i << " against the largest gradient";
        std::printf("[cuda-mixer-fused] %s parameter %zu: libtorch bf16 misses by %.1e, fused by %.1e; against the "
                    "largest gradient %.1e\n", kind.c_str(), i, e_p, e, e_abs);
        ++round_off_bound;
        continue;
      }
      EXPECT_LE(e, std::max(3e-2, 1.5 * e_p)) << "parameter gradient " << i;
      e_grad = std::max(e_grad, e), e_plain = std::max(e_plain, e_p);
    }
    EXPECT_LE(round_off_bound, 2) << "most gradients should be well above round-off";
    EXPECT_LE(e_y, 3e-2);
    // Two different computations: bit-identical outputs would mean the kernels were not taken.
    EXPECT_GT(rel_err(fused[0], plain[0]), 0.0) << "the fused kernels did not run";
    std::printf("[cuda-mixer-fused] %-18s against fp32: output %.1e (libtorch bf16 %.1e)  worst parameter grad %.1e "
                "(libtorch bf16 %.1e; %zu tensors)\n",
                kind.c_str(), e_y, rel_err(plain[0], ref[0]), e_grad, e_plain, fused.size() - 1);
  }
}

TEST(CudaMixers, DecodeMatchesForwardAndCpu) {
  REQUIRE_KERNELS();
  NoTf32 no_tf32;
  at::globalContext().setAllowTF32CuDNN(false);  // short convolutions
  const int64_t B = 2, T = 40;
  for (const auto& kind : mixer_kinds()) {
    SCOPED_TRACE(kind);
    torch::manual_seed(2);
    MixerConfig cfg = MixerConfig::defaults_for(parse_mixer_kind(kind));
    cfg.hidden_size = 64;
    cfg.num_heads = 4;
    cfg.chunk_size = 16;
    auto m = make_mixer(cfg);
    {
      torch::NoGradGuard no_grad;
      for (auto& p : m->parameters()) p.add_(torch::randn_like(p) * 0.2);
    }
    torch::NoGradGuard no_grad;
    auto x = torch::randn({B, T, cfg.hidden_size});
    torch::Tensor full_cpu;
    {
      test::EmulationScope cpu_forms(false);
      full_cpu = m->forward(x, nullptr);
    }
    m->to(dev);
    auto xg = x.to(dev);
    auto full = m->forward(xg, nullptr);
    LayerState s;
    std::vector<torch::Tensor> ys;
    for (int64_t t = 0; t < T; ++t) ys.push_back(m->forward(xg.narrow(1, t, 1), &s));
    const double e_cpu = rel_err(full, full_cpu), e_decode = rel_err(torch::cat(ys, 1), full);
    EXPECT_LE(e_cpu, 1e-4);
    EXPECT_LE(e_decode, 1e-4);
    std::printf("[cuda-mixer] %-18s forward vs CPU %.1e  decode vs forward %.1e\n", kind.c_str(), e_cpu, e_decode);
  }
}

// A whole model's inference forward (no gradient: each residual addition joined to the norm after it,
// ops::add_rms_norm) against its forward with gradients on (layer by layer, each addition then its norm),
// for the teacher and a student of each mixer: bit for bit on the libtorch forms, and within fp32 round-off
// on the kernels (the mixers' kernels differ between the two: decode-only ones run without gradients).
TEST(CudaMixers, InferenceForwardMatchesTrainingForward) {
  REQUIRE_KERNELS();
  NoTf32 no_tf32;
  const auto c = test::small_llama(200, 64, 2, 4, 2, 128);
  torch::manual_seed(3);
  CausalLM teacher(c);
  init_weights_normal(*teacher, 0.1);
  const auto ids = torch::randint(0, 200, {2, 24}, torch::kLong);
  std::vector<std::string> models = {"teacher"};
  for (const auto& k : mixer_kinds()) models.push_back(k);
  for (const auto& name : models) {
    SCOPED_TRACE(name);
    CausalLM model = name == "teacher" ? teacher
                                       : build_student(teacher, StudentSpec::make(parse_mixer_kind(name), "default", {}, c));
    model->to(torch::kCPU);
    torch::Tensor plain_train, plain_infer;
    {
      test::EmulationScope cpu_forms(false);
      plain_train = model->forward(ids);
      torch::NoGradGuard no_grad;
      plain_infer = model->forward(ids);
    }
    EXPECT_TRUE(torch::equal(plain_train, plain_infer)) << "libtorch forms";
    model->to(dev);
    const auto train = model->forward(ids.to(dev));
    torch::Tensor infer;
    {
      torch::NoGradGuard no_grad;
      infer = model->forward(ids.to(dev));
    }
    const double e = rel_err(infer, train);
    EXPECT_LE(e, 1e-5);
    std::printf("[cuda-inference] %-18s no-grad forward vs forward %.1e\n", name.c_str(), e);
  }
}

// ---- bf16 autocast training step ------------------------------------------------------------------

TEST(CudaTrain, Bf16AutocastStage3KeepsFp32WeightsAndLearns) {
  REQUIRE_CUDA();
  const auto c = test::small_llama(300, 128, 2, 4, 2, 256);
  torch::manual_seed(3);
  CausalLM teacher(c);
  init_weights_normal(*teacher, 0.05);
  teacher->to(torch::kCUDA, torch::kBFloat16);
  teacher->eval();
  auto student = build_student(teacher, StudentSpec::make(MixerKind::gated_deltanet, "default", {}, c));
  student->to(torch::kFloat);
  student->train();
  DistillOptions o;
  auto batch = torch::randint(0, c.vocab_size, {4, 65}, torch::TensorOptions().dtype(torch::kLong)).to(torch::kCUDA);
  auto x = batch.narrow(1, 0, 64), y = batch.narrow(1, 1, 64);
  torch::optim::AdamW opt(student->parameters(), torch::optim::AdamWOptions(1e-3));
  std::vector<double> losses;
  for (int step = 0; step < 8; ++step) {
    opt.zero_grad();
    torch::Tensor loss;
    {
      compat::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16);
      torch::Tensor t_logits;
      {
        torch::NoGradGuard no_grad;
        t_logits = teacher->forward(x);
      }
      auto s_logits = student->forward(x);
      if (step == 0) {
        EXPECT_EQ(s_logits.scalar_type(), torch::kBFloat16) << "autocast should run matmuls in bf16";
      }
      loss = stage3_loss(o, s_logits, t_logits, y);
    }
    loss.backward();
    losses.push_back(loss.item<double>());
    ASSERT_TRUE(std::isfinite(losses.back())) << "step " << step;
    opt.step();
  }
  for (auto& p : student->named_parameters()) {
    ASSERT_EQ(p.value().scalar_type(), torch::kFloat) << p.key();
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    ASSERT_EQ(p.value().grad().scalar_type(), torch::kFloat) << p.key();
  }
  std::printf("[cuda-train] stage-3 loss %.4f -> %.4f over 8 steps on one batch\n", losses.front(), losses.back());
  EXPECT_LT(losses.back(), 0.9 * losses.front());
}

// ---- CUDA-graph decode ----------------------------------------------------------------------------

// Every student a graph can serve, and the teacher with a fixed-capacity KV cache, step through a real graph
// as they step eagerly.
TEST(CudaDecode, GraphedStepMatchesEagerStep) {
  REQUIRE_CUDA();
  NoTf32 no_tf32;
  at::globalContext().setAllowTF32CuDNN(false);
  CausalLM teacher = small_cuda_teacher(5);
  const auto& c = teacher->config;
  torch::NoGradGuard no_grad;
  const int64_t B = 3;
  auto prompt = torch::randint(0, c.vocab_size, {B, 10}, torch::TensorOptions().dtype(torch::kLong).device(torch::kCUDA));
  ModelState teacher_state = teacher->new_state();
  teacher->forward(prompt, &teacher_state);
  EXPECT_FALSE(GraphedDecodeStep::usable(teacher, teacher_state)) << "the teacher's KV cache grows";
  {  // the teacher through a KV cache of fixed capacity: the prompt and 6 steps
    ModelState eager = teacher_state;
    GraphedDecodeStep graph(teacher, teacher_state, B, GraphedDecodeStep::Replay::cuda_graph, 16);
    double worst = 0;
    auto ids = prompt.narrow(1, 9, 1);
    for (int step = 0; step < 6; ++step) {
      auto want = teacher->forward(ids, &eager);
      worst = std::max(worst, rel_err(graph.step(ids), want));
      ids = want.argmax(-1);
    }
    EXPECT_LE(worst, 1e-5) << "teacher";
    EXPECT_THROW(graph.step(ids), Error) << "the capacity is reached";
    std::printf("[cuda-graph] %-18s logits %.1e over 6 steps\n", "teacher", worst);
  }
  for (const auto& kind : mixer_kinds()) {
    SCOPED_TRACE(kind);
    auto student = build_student(teacher, StudentSpec::make(parse_mixer_kind(kind), "default", {}, c));
    student->eval();
    ModelState eager = student->new_state();
    student->forward(prompt, &eager);
    std::string why;
    if (!GraphedDecodeStep::usable(student, eager, &why)) {
      EXPECT_EQ(kind, "retnet") << why;
      continue;
    }
    GraphedDecodeStep graph(student, eager, B);
    double worst = 0;
    auto ids = prompt.narrow(1, 9, 1);
    for (int step = 0; step < 6; ++step) {
      auto want = student->forward(ids, &eager);
      auto got = graph.step(ids).clone();
      worst = std::max(worst, rel_err(got, want));
      ids = want.argmax(-1);
    }
    EXPECT_LE(worst, 1e-5);
    const auto final_state = graph.state();
    double worst_state = 0;
    for (size_t l = 0; l < eager.size(); ++l) {
      EXPECT_EQ(final_state[l].position, eager[l].position);
      for (const auto& [name, t] : eager[l].tensors) worst_state = std::max(worst_state, rel_err(final_state[l].get(name), t));
    }
    EXPECT_LE(worst_state, 1e-5);
    std::printf("[cuda-graph] %-18s logits %.1e  state %.1e over 6 steps\n", kind.c_str(), worst, worst_state);
  }
}

// Serving's batches through real graphs: rows joining and leaving (graphs for 4 and 2 rows, the first
// refilled) give the logits of the same batches stepped eagerly, for every student a graph can serve.
TEST(CudaDecode, GraphedBatchesMatchEagerBatches) {
  REQUIRE_CUDA();
  NoTf32 no_tf32;
  CausalLM teacher = small_cuda_teacher(6);
  const auto& c = teacher->config;
  torch::NoGradGuard no_grad;
  for (const auto& kind : mixer_kinds()) {
    if (kind == "retnet") continue;  // position-dependent: never graphed
    SCOPED_TRACE(kind);
    auto student = build_student(teacher, StudentSpec::make(parse_mixer_kind(kind), "default", {}, c));
    student->eval();
    std::vector<ModelState> graphed, eager;
    for (int64_t len : {7, 3, 12}) {
      auto ids = torch::randint(0, c.vocab_size, {1, len}, torch::TensorOptions().dtype(torch::kLong).device(torch::kCUDA));
      graphed.push_back(student->new_state());
      student->forward(ids, &graphed.back());
      eager.push_back(graphed.back());
    }
    DecodeBatch with_graphs(student, DecodeGraphs::on), without(student, DecodeGraphs::off);
    double worst = 0;
    for (int step = 0; step < 6; ++step) {
      const std::vector<size_t> order = step < 3 ? std::vector<size_t>{0, 1, 2} : step < 5 ? std::vector<size_t>{0, 2}
                                                                                           : std::vector<size_t>{1, 0, 2};
      if (step == 3 || step == 5) with_graphs.flush(), without.flush();
      std::vector<DecodeRow> a, b;
      for (size_t i : order) {
        a.push_back({&graphed[i], static_cast<int32_t>(10 + step + 3 * i)});
        b.push_back({&eager[i], static_cast<int32_t>(10 + step + 3 * i)});
      }
      worst = std::max(worst, rel_err(with_graphs.step(a), without.step(b)));
    }
    with_graphs.flush(), without.flush();
    EXPECT_EQ(with_graphs.graphs_captured(), 2);
    EXPECT_LE(worst, 1e-5);
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(graphed[i][0].position, eager[i][0].position);
    std::printf("[cuda-graph] %-18s batches of 3, 2, 3 rows: logits %.1e\n", kind.c_str(), worst);
  }
}

}  // namespace
}  // namespace linearize
