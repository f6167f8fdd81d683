// Mixer layer benchmarks at the SmolLM2-135M layer shape (hidden 576, 9 heads of 64; the teacher has
// 3 KV heads), batch 1, fp32 CPU: every mixer built with preset `default` against that teacher, and
// the teacher's LlamaAttention as the baseline, at the same shapes:
//   BM_MixerFwdBwd/<mixer>/T   whole-sequence (chunked) forward + backward, T in {512, 2048}
//   BM_MixerDecode/<mixer>     one decode step (T = 1) from a state after 2048 tokens (the teacher: a
//                              KV cache of 2048); the state is restored every iteration.
// Counter tokens/s over wall time (libtorch runs intra-op threads), T per iteration, 1 for decode.
// Index 7 = teacher attention. Run e.g.
//   build/linearize_bench --benchmark_filter=Mixer
// The suite's main() is in bench_ops.cpp (one executable for all benchmark files).
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include "model/llama.h"
#include "model/mixers/factory.h"

namespace {

using linearize::LayerState;
using linearize::TokenMixer;

linearize::LlamaConfig smollm2_135m_layer() {
  linearize::LlamaConfig c;
  c.vocab_size = 49152;
  c.hidden_size = 576;
  c.intermediate_size = 1536;
  c.num_hidden_layers = 30;
  c.num_attention_heads = 9;
  c.num_key_value_heads = 3;
  c.head_dim = 64;
  c.rope_theta = 1e5;
  return c;
}

// Index 0..6: mixer_kinds(); 7: the teacher's softmax attention.
std::shared_ptr<TokenMixer> make(int64_t index, std::string* name) {
  torch::manual_seed(0);
  const auto teacher = smollm2_135m_layer();
  const auto kinds = linearize::mixer_kinds();
  if (index == static_cast<int64_t>(kinds.size())) {
    *name = "teacher_attention";
    return std::make_shared<linearize::LlamaAttention>(teacher);
  }
  *name = kinds.at(index);
  return linearize::make_mixer(linearize::mixer_preset(linearize::parse_mixer_kind(kinds.at(index)), "default", teacher));
}

void set_rate(benchmark::State& state, int64_t tokens) {
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_MixerFwdBwd(benchmark::State& state) {
  const int64_t T = state.range(1);
  std::string name;
  auto m = make(state.range(0), &name);
  auto x = torch::randn({1, T, 576});
  for (auto _ : state) {
    auto y = m->forward(x, nullptr);
    y.pow(2).mean().backward();
  }
  state.SetLabel(name);
  set_rate(state, T);
}

void BM_MixerDecode(benchmark::State& state) {
  std::string name;
  auto m = make(state.range(0), &name);
  torch::NoGradGuard no_grad;
  LayerState prefix;
  m->forward(torch::randn({1, 2048, 576}), &prefix);
  auto x = torch::randn({1, 1, 576});
  for (auto _ : state) {
    LayerState s = prefix;  // a snapshot: decoding never grows it
    benchmark::DoNotOptimize(m->forward(x, &s));
  }
  state.SetLabel(name);
  set_rate(state, 1);
}

}  // namespace

BENCHMARK(BM_MixerFwdBwd)
    ->ArgsProduct({benchmark::CreateDenseRange(0, 7, 1), {512, 2048}})
    ->ArgNames({"mixer", "T"})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.3)
    ->UseRealTime();
BENCHMARK(BM_MixerDecode)->DenseRange(0, 7)->ArgName("mixer")->Unit(benchmark::kMicrosecond)->MinTime(0.3)->UseRealTime();
