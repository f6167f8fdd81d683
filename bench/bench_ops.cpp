// Op benchmarks: chunked forward+backward of each family (GLA with a vector gate, the gated delta rule
// with a vector gate (KDA), mLSTM), one recurrent decode step, and causal softmax attention at the same
// shapes as the baseline. B=1, H=9, K=V=64 (SmolLM2-135M's heads), T in {512, 2048}; fp32 CPU.
// Counters: tokens/s (T per iteration; 1 for a decode step).
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include "compat/torch_compat.h"
#include "ops/ops.h"

namespace {

constexpr int64_t kB = 1, kH = 9, kD = 64;
const double kScale = 0.125;  // 64^-0.5

struct Data {
  torch::Tensor q, k, v, g, beta, ig, fg;
};

Data make_data(int64_t T, bool grad) {
  torch::manual_seed(0);
  Data d;
  d.q = torch::randn({kB, T, kH, kD}) * 0.5;
  d.k = linearize::ops::l2_norm(torch::randn({kB, T, kH, kD}));
  d.v = torch::randn({kB, T, kH, kD});
  d.g = torch::log_sigmoid(torch::randn({kB, T, kH, kD}) + 3) / 4;
  d.beta = torch::sigmoid(torch::randn({kB, T, kH}));
  d.ig = torch::randn({kB, T, kH});
  d.fg = torch::randn({kB, T, kH}) + 3;
  if (grad)
    for (auto* t : {&d.q, &d.k, &d.v, &d.g, &d.beta, &d.ig, &d.fg}) t->requires_grad_(true);
  return d;
}

void set_rate(benchmark::State& state, int64_t tokens) {
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_GlaChunkFwdBwd(benchmark::State& state) {
  const int64_t T = state.range(0);
  auto d = make_data(T, true);
  for (auto _ : state) {
    auto r = linearize::ops::gla_chunk(d.q, d.k, d.v, d.g, {}, kScale);
    r.o.sum().backward();
  }
  set_rate(state, T);
}

void BM_DeltaRuleChunkFwdBwd(benchmark::State& state) {
  const int64_t T = state.range(0);
  auto d = make_data(T, true);
  for (auto _ : state) {
    auto r = linearize::ops::delta_rule_chunk(d.q, d.k, d.v, d.beta, d.g, {}, kScale);
    r.o.sum().backward();
  }
  set_rate(state, T);
}

void BM_MlstmChunkFwdBwd(benchmark::State& state) {
  const int64_t T = state.range(0);
  auto d = make_data(T, true);
  for (auto _ : state) {
    auto r = linearize::ops::mlstm_chunk(d.q, d.k, d.v, d.ig, d.fg, {}, kScale);
    r.h.sum().backward();
  }
  set_rate(state, T);
}

void BM_SoftmaxAttentionFwdBwd(benchmark::State& state) {
  const int64_t T = state.range(0);
  auto d = make_data(T, true);
  for (auto _ : state) {
    auto o = linearize::compat::attention(d.q.transpose(1, 2), d.k.transpose(1, 2), d.v.transpose(1, 2),
                                          /*causal=*/true, kScale);
    o.sum().backward();
  }
  set_rate(state, T);
}

void BM_ChunkForward(benchmark::State& state) {
  const int64_t T = state.range(0), family = state.range(1);
  auto d = make_data(T, false);
  torch::NoGradGuard no_grad;
  for (auto _ : state) {
    if (family == 0) benchmark::DoNotOptimize(linearize::ops::gla_chunk(d.q, d.k, d.v, d.g, {}, kScale).o);
    if (family == 1)
      benchmark::DoNotOptimize(linearize::ops::delta_rule_chunk(d.q, d.k, d.v, d.beta, d.g, {}, kScale).o);
    if (family == 2)
      benchmark::DoNotOptimize(linearize::ops::mlstm_chunk(d.q, d.k, d.v, d.ig, d.fg, {}, kScale).h);
    if (family == 3)
      benchmark::DoNotOptimize(linearize::compat::attention(d.q.transpose(1, 2), d.k.transpose(1, 2),
                                                            d.v.transpose(1, 2), true, kScale));
  }
  set_rate(state, T);
}

// One decode step (T=1) from a carried state; family 3 is softmax attention over a KV cache of 2048.
void BM_DecodeStep(benchmark::State& state) {
  const int64_t family = state.range(0);
  auto d = make_data(1, false);
  torch::NoGradGuard no_grad;
  auto S = torch::randn({kB, kH, kD, kD});
  linearize::ops::MlstmState ms{S, torch::randn({kB, kH, kD}), torch::zeros({kB, kH})};
  auto kc = torch::randn({kB, kH, 2048, kD}), vc = torch::randn({kB, kH, 2048, kD});
  for (auto _ : state) {
    if (family == 0) S = linearize::ops::gla_recurrent(d.q, d.k, d.v, d.g, S, kScale).state;
    if (family == 1) S = linearize::ops::delta_rule_recurrent(d.q, d.k, d.v, d.beta, d.g, S, kScale).state;
    if (family == 2) ms = linearize::ops::mlstm_recurrent(d.q, d.k, d.v, d.ig, d.fg, ms, kScale).state;
    if (family == 3)
      benchmark::DoNotOptimize(linearize::compat::attention(d.q.transpose(1, 2), kc, vc, false, kScale));
  }
  set_rate(state, 1);
}

}  // namespace

BENCHMARK(BM_GlaChunkFwdBwd)->Arg(512)->Arg(2048)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DeltaRuleChunkFwdBwd)->Arg(512)->Arg(2048)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MlstmChunkFwdBwd)->Arg(512)->Arg(2048)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SoftmaxAttentionFwdBwd)->Arg(512)->Arg(2048)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ChunkForward)
    ->ArgsProduct({{512, 2048}, {0, 1, 2, 3}})
    ->ArgNames({"T", "family"})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DecodeStep)->DenseRange(0, 3)->ArgName("family")->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
