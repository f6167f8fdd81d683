// GPU benchmarks of issue 7, each a ratio against a baseline measured in the same run, printed as
// Markdown tables (stdout) with progress on stderr:
//
//   ops     chunked forward+backward of every op family (bf16 inputs, fp32 gates and state, forward
//           under bf16 autocast as in training) against causal softmax attention through
//           scaled_dot_product_attention (flash on CUDA); B=8, H=32, D=128, T = 1k..16k. Each cell is
//           the median of at least 3 runs, of more when they are short (about 0.1 s of runs).
//   train   stage-3 distillation steps per mixer (teacher bf16 forward + student forward/backward under
//           bf16 autocast + clipped AdamW step on fp32 weights, as the trainer does) against training the
//           teacher itself at the same batch; tokens/s, model FLOPs utilisation (6 N per token for the
//           trained model + 2 N for the teacher's forward, against the H200's 989 TFLOP/s dense bf16),
//           peak memory. SmolLM2-135M and -1.7B shapes, sequence 512, random weights. With --cuda-graph each
//           configuration also runs as the trainer's --cuda-graph runs it: the whole step replayed from
//           one captured CUDA graph (train/graphed_train_step.h).
//   decode  one greedy decode step of the whole model (bf16) at batch 1 and 64 after contexts of 1k..32k:
//           the teacher's KV cache holds `context` entries; a student's fixed-size state is built by a
//           64-token prefill (its size and its step cost do not depend on the context; the table shows
//           that). tokens/s and state bytes per sequence. SmolLM2-135M shape. On a GPU also the kernels,
//           copies and fills one step issues (captured, not run). Models are packed for inference as
//           load_model packs them; --unpacked adds each model with its input projections one by one.
//
//   linearize_gpu_bench <ops|train|decode|all> [--quick] [--device cuda|cpu] [--shapes 135m,1.7b]
//                       [--head-dim D] [--only linear_attention,retnet+,...]  (ops: name+ adds its libtorch-chunks row)
//                       [--lengths 1024,16384]  (ops: the sequence lengths; decode: the contexts)  [--batch B]  (train: sequences a step)
//                       [--unpacked]  (decode: also the models unpacked)  [--cuda-graph]  (train: also graphed)
//
// --quick runs the smallest sizes only (a check that everything runs). On CPU the sizes are cut down.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cli/host_memory.h"
#include "compat/torch_compat.h"
#include "distill/stages.h"
#include "infer/graphed_step.h"
#include "model/causal_lm.h"
#include "model/mixers/mixer_config.h"
#include "model/student.h"
#include "ops/ops.h"
#include "train/graphed_train_step.h"
#include "train/optimizer_schedule.h"

#ifdef LINEARIZE_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#endif

namespace linearize {
namespace {

constexpr double kPeakBf16Flops = 989e12;  // H200 dense bf16 (SXM)
constexpr double kMinOpsTime = 0.1;        // ops: seconds of timed runs per cell at the least

struct Settings {
  torch::Device device = torch::kCUDA;
  bool quick = false;
  std::vector<std::string> shapes = {"135m", "1.7b"};
  bool shapes_given = false;
  int64_t head_dim = 0;            // ops: 0 = the default (128 on CUDA)
  std::vector<std::string> only;   // ops: run only these kinds; train, decode: only these mixers (empty: all)
  std::vector<int64_t> lengths;    // ops: the sequence lengths (empty: the defaults)
  int64_t batch = 0;               // train: sequences a step (0: 16 at 135M, 8 at 1.7B; 2 on a CPU)
  bool unpacked = false;           // decode: also each model with its projections run one by one
  bool cuda_graph = false;         // train: also each step replayed from a captured CUDA graph
};

void sync(const torch::Device& d) {
  if (d.is_cuda()) torch::cuda::synchronize();
}

void reset_peak(const torch::Device& d) {
#ifdef LINEARIZE_WITH_CUDA
  if (d.is_cuda()) {
    c10::cuda::CUDACachingAllocator::emptyCache();
    c10::cuda::CUDACachingAllocator::resetPeakStats(d.index() < 0 ? 0 : d.index());
  }
#endif
}

double peak_gib(const torch::Device& d) {
#ifdef LINEARIZE_WITH_CUDA
  if (d.is_cuda()) {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(d.index() < 0 ? 0 : d.index());
    return static_cast<double>(stats.allocated_bytes[0].peak) / (1 << 30);
  }
#endif
  return 0;
}

// The GPU operations (kernels, copies, fills) one call of fn issues, counted by capturing the call into a
// CUDA graph on a side stream, which is never run; -1 where capture fails or there is no GPU. fn must
// have run before (so the memory it needs is already cached) and must not wait for the GPU.
int64_t launches_of(const torch::Device& d, const std::function<void()>& fn) {
#ifdef LINEARIZE_WITH_CUDA
  if (!d.is_cuda()) return -1;
  sync(d);
  auto side = c10::cuda::getStreamFromPool(false, d.index() < 0 ? 0 : d.index());
  const c10::cuda::CUDAStreamGuard guard(side);
  cudaGraph_t graph = nullptr;
  if (cudaStreamBeginCapture(side.stream(), cudaStreamCaptureModeRelaxed) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  bool ok = true;
  try {
    fn();
  } catch (const std::exception&) {
    ok = false;
  }
  ok = cudaStreamEndCapture(side.stream(), &graph) == cudaSuccess && ok;
  size_t n = 0;
  if (ok) ok = cudaGraphGetNodes(graph, nullptr, &n) == cudaSuccess;
  if (graph) cudaGraphDestroy(graph);
  cudaGetLastError();  // clear what a failed capture left
  sync(d);
  return ok ? static_cast<int64_t>(n) : -1;
#else
  (void)d, (void)fn;
  return -1;
#endif
}

// Median seconds of `reps` runs of fn after `warmup` runs; NaN when it runs out of memory. With
// min_total > 0, short runs are repeated more (up to 200 times), until the timed runs take about
// min_total seconds in all: a 1 ms op timed 3 times moves with the GPU's clocks from run to run.
double time_it(const torch::Device& d, int warmup, int reps, const std::function<void()>& fn,
               double min_total = 0.0) {
  try {
    for (int i = 0; i < warmup; ++i) fn();
    sync(d);
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
      if (i == 1 && min_total > 0.0 && t[0] > 0.0)
        reps = std::max(reps, std::min(200, static_cast<int>(std::ceil(min_total / t[0]))));
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      sync(d);
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    if (what.find("out of memory") == std::string::npos) throw;
    std::cerr << "  (out of memory)\n";
    reset_peak(d);
    return std::nan("");
  }
}

std::string fmt(double v, const char* f = "%.2f") {
  if (std::isnan(v)) return "OOM";
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// ---- ops ------------------------------------------------------------------------------------------

struct OpKind {
  std::string name;
  int family;  // 0 gla, 1 delta rule, 2 mlstm
  int gate;    // 0 none, 1 fixed, 2 scalar, 3 vector
  bool fused = true;  // false: the libtorch chunked form (the fused kernels' own baseline)
};

// Drops the gradients the leaves hold, so that each timed backward writes them afresh: in a model q, k
// and v are not leaves, and nothing sums their gradients into an earlier iteration's.
void clear_grads(std::initializer_list<torch::Tensor*> leaves) {
  for (auto* t : leaves)
    if (t->defined() && t->grad().defined()) t->mutable_grad() = torch::Tensor();
}

void bench_ops(const Settings& s) {
  const bool gpu = s.device.is_cuda();
  const int64_t B = gpu ? 8 : 1, H = gpu ? 32 : 4, D = s.head_dim > 0 ? s.head_dim : gpu ? 128 : 64;
  std::vector<int64_t> Ts = gpu ? std::vector<int64_t>{1024, 2048, 4096, 8192, 16384} : std::vector<int64_t>{512, 1024};
  if (!s.lengths.empty()) Ts = s.lengths;
  else if (s.quick) Ts.resize(1);
  const std::vector<OpKind> all_kinds = {{"linear_attention", 0, 0}, {"retnet", 0, 1},         {"gla", 0, 3},
                                     {"deltanet", 1, 0},         {"gated_deltanet", 1, 2}, {"kda", 1, 3},
                                     {"mlstm", 2, 0},
                                     {"linear_attention (libtorch chunks)", 0, 0, false},
                                     {"retnet (libtorch chunks)", 0, 1, false},
                                     {"gla (libtorch chunks)", 0, 3, false},
                                     {"deltanet (libtorch chunks)", 1, 0, false},
                                     {"gated_deltanet (libtorch chunks)", 1, 2, false},
                                     {"kda (libtorch chunks)", 1, 3, false},
                                     {"mlstm (libtorch chunks)", 2, 0, false}};
  std::vector<OpKind> kinds;
  for (const auto& kind : all_kinds)
    // "name" picks that row; "name+" also the op's libtorch-chunks row ("retnet+": both RetNet rows).
    if (s.only.empty() || std::find(s.only.begin(), s.only.end(), kind.name) != s.only.end() ||
        std::find(s.only.begin(), s.only.end(), kind.name.substr(0, kind.name.find(' ')) + "+") != s.only.end())
      kinds.push_back(kind);
  const auto dt = gpu ? torch::kBFloat16 : torch::kFloat;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  auto opts = torch::TensorOptions().device(s.device);

  std::map<std::string, std::vector<double>> ms;  // name -> per T
  std::vector<double> base;
  for (int64_t T : Ts) {
    std::cerr << "[ops] T=" << T << "\n";
    torch::manual_seed(0);
    auto q = (torch::randn({B, T, H, D}, opts) * 0.5).to(dt).requires_grad_(true);
    auto k = torch::randn({B, T, H, D}, opts).to(dt).requires_grad_(true);
    auto v = torch::randn({B, T, H, D}, opts).to(dt).requires_grad_(true);
    {
      // baseline: causal softmax attention, [B,H,T,D]
      auto qh = q.detach().transpose(1, 2).contiguous().requires_grad_(true);
      auto kh = k.detach().transpose(1, 2).contiguous().requires_grad_(true);
      auto vh = v.detach().transpose(1, 2).contiguous().requires_grad_(true);
      base.push_back(time_it(
          s.device, 1, 3,
          [&] {
            clear_grads({&qh, &kh, &vh});
            compat::attention(qh, kh, vh, /*causal=*/true, scale).sum().backward();
          },
          kMinOpsTime));
      std::cerr << "  softmax attention " << fmt(base.back() * 1e3, "%.1f") << " ms\n";
    }
    for (const auto& kind : kinds) {
      reset_peak(s.device);
      auto f32 = opts.dtype(torch::kFloat);
      torch::Tensor g;
      if (kind.gate == 1) g = torch::log_sigmoid(torch::randn({H}, f32) + 3);
      if (kind.gate == 2) g = torch::log_sigmoid(torch::randn({B, T, H}, f32) + 3).requires_grad_(true);
      if (kind.gate == 3) g = (torch::log_sigmoid(torch::randn({B, T, H, D}, f32) + 3) / 4).requires_grad_(true);
      auto beta = torch::sigmoid(torch::randn({B, T, H}, f32)).requires_grad_(true);
      auto ig = torch::randn({B, T, H}, f32).requires_grad_(true), fg = (torch::randn({B, T, H}, f32) + 3).requires_grad_(true);
      auto kn = kind.family == 1 ? ops::l2_norm(k.detach()).requires_grad_(true) : k;
      const double t = time_it(s.device, 1, 3, [&] {
        clear_grads({&q, &kn, &v, &g, &beta, &ig, &fg});
        torch::Tensor o;
        {
          // As the trainer calls them: forward under bf16 autocast on CUDA (products in bf16, gates and
          // state fp32); the backward follows the recorded dtypes.
          compat::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16, gpu);
          ops::set_fused_kernels(kind.fused);
          if (kind.family == 0) o = ops::gla_chunk(q, kn, v, g, {}, scale).o;
          else if (kind.family == 1) o = ops::delta_rule_chunk(q, kn, v, beta, g, {}, scale).o;
          else o = ops::mlstm_chunk(q, kn, v, ig, fg, {}, scale).h;
        }
        o.sum().backward();
        ops::set_fused_kernels(true);
      }, kMinOpsTime);
      ms[kind.name].push_back(t);
      std::cerr << "  " << kind.name << " " << fmt(t * 1e3, "%.1f") << " ms (peak " << fmt(peak_gib(s.device), "%.1f")
                << " GiB)\n";
    }
  }
  std::cout << "\n### Op forward+backward, B=" << B << " H=" << H << " D=" << D << ", "
            << (gpu ? "bf16 inputs, bf16 autocast" : "fp32") << ": speed-up over causal softmax attention (SDPA)\n\n"
            << "Each cell: time in ms (ratio = attention time / op time; > 1 is faster).\n\n| op |";
  for (int64_t T : Ts) std::cout << " T=" << T << " |";
  std::cout << "\n|---|";
  for (size_t i = 0; i < Ts.size(); ++i) std::cout << "---|";
  std::cout << "\n| softmax attention (SDPA) |";
  for (double b : base) std::cout << " " << fmt(b * 1e3, "%.1f") << " |";
  std::cout << "\n";
  for (const auto& kind : kinds) {
    std::cout << "| " << kind.name << " |";
    for (size_t i = 0; i < Ts.size(); ++i)
      std::cout << " " << fmt(ms[kind.name][i] * 1e3, "%.1f") << " (" << fmt(base[i] / ms[kind.name][i]) << "x) |";
    std::cout << "\n";
  }
}

// ---- model shapes ---------------------------------------------------------------------------------

LlamaConfig shape(const std::string& name) {
  LlamaConfig c;
  c.vocab_size = 49152;
  c.rope_theta = 10000;
  c.tie_word_embeddings = true;
  c.max_position_embeddings = 65536;
  c.raw = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}};
  if (name == "135m") {
    c.hidden_size = 576, c.num_hidden_layers = 30, c.num_attention_heads = 9, c.num_key_value_heads = 3;
    c.intermediate_size = 1536;
  } else if (name == "1.7b") {
    c.hidden_size = 2048, c.num_hidden_layers = 24, c.num_attention_heads = 32, c.num_key_value_heads = 32;
    c.intermediate_size = 8192;
  } else if (name == "tiny") {
    c.vocab_size = 512, c.hidden_size = 64, c.num_hidden_layers = 2, c.num_attention_heads = 4,
    c.num_key_value_heads = 2, c.intermediate_size = 128;
  } else {
    throw std::runtime_error("unknown shape " + name + " (expected 135m, 1.7b or tiny)");
  }
  c.head_dim = c.hidden_size / c.num_attention_heads;
  return c;
}

int64_t count_params(torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

// ---- train ----------------------------------------------------------------------------------------

void bench_train(const Settings& s) {
  const bool gpu = s.device.is_cuda();
  std::vector<std::string> shapes = gpu ? s.shapes : std::vector<std::string>{"tiny"};
  std::vector<std::string> mixers = mixer_kinds();
  if (s.quick) mixers = {"gated_deltanet"};
  if (!s.only.empty()) mixers = s.only;
  const int64_t T = gpu ? 512 : 64;
  for (const auto& shape_name : shapes) {
    const auto c = shape(shape_name);
    const int64_t B = s.batch > 0 ? s.batch : !gpu ? 2 : shape_name == "135m" ? 16 : 8;
    const int warmup = 2, reps = s.quick ? 2 : 5;
    torch::manual_seed(0);
    CausalLM teacher(c);
    init_weights_normal(*teacher, 0.02);
    teacher->to(s.device);  // fp32 master weights when it trains itself (the baseline)
    auto batch = torch::randint(0, c.vocab_size, {B, T + 1}, torch::TensorOptions().dtype(torch::kLong)).to(s.device);
    const double tokens = static_cast<double>(B * T);

    struct Row {
      std::string name;
      double sec, gib;
      int64_t params;
    };
    std::vector<Row> rows;
    // One training configuration; when it runs out of memory, again with activation recomputation.
    // loss_fn(rows [B, T + 1]) -> the step's loss, as the trainer's step function takes its rows.
    using LossFn = std::function<torch::Tensor(const torch::Tensor&)>;
    auto run = [&](const std::string& name, CausalLM& trained, const LossFn& loss_fn) {
      for (bool recompute : {false, true}) {
        trained->recompute = recompute;
        std::vector<std::pair<std::string, torch::Tensor>> params;
        for (auto& p : trained->named_parameters()) params.emplace_back(p.key(), p.value());
        auto opt = make_adamw(params, OptimizerOptions{}, 1e-4);
        reset_peak(s.device);
        const double sec = time_it(s.device, warmup, reps, [&] {
          opt->zero_grad();
          torch::Tensor loss;
          {
            compat::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16, gpu);
            loss = loss_fn(batch).to(torch::kFloat);
          }
          loss.backward();
          adamw_step(*opt, 1.0);  // clipped as the trainer clips
        });
        if (std::isnan(sec) && !recompute) {
          trained->recompute = false;
          for (auto& p : params) p.second.mutable_grad() = torch::Tensor();
          continue;
        }
        const std::string row = name + (recompute ? " (recompute)" : "");
        rows.push_back({row, sec, peak_gib(s.device), count_params(*trained)});
        std::cerr << "  " << row << ": " << fmt(tokens / sec, "%.0f") << " tok/s, peak "
                  << fmt(rows.back().gib, "%.1f") << " GiB\n";
        // The same step replayed from one graph (after the eager steps above made the gradients and moments).
        if (s.cuda_graph && gpu && !std::isnan(sec)) {
          try {
            GraphedTrainStep graphed(loss_fn, *opt, batch.sizes().vec(), 1, 1.0, true);
            const double gsec = time_it(s.device, warmup, reps, [&] { graphed.step(batch, 1e-4); });
            rows.push_back({row + ", CUDA graph", gsec, peak_gib(s.device), count_params(*trained)});
            std::cerr << "  " << rows.back().name << ": " << fmt(tokens / gsec, "%.0f") << " tok/s\n";
          } catch (const std::exception& e) {
            std::cerr << "  " << row << ", CUDA graph: failed: " << e.what() << "\n";
          }
        }
        trained->recompute = false;
        for (auto& p : params) p.second.mutable_grad() = torch::Tensor();
        return;
      }
    };

    std::cerr << "[train] " << shape_name << " shape, batch " << B << " x " << T << "\n";
    teacher->train();
    run("teacher (softmax attention), CE", teacher, [&](const torch::Tensor& rows) {
      auto x = rows.narrow(1, 0, T), y = rows.narrow(1, 1, T);
      auto logits = teacher->forward(x);
      return ops::cross_entropy_terms(logits.reshape({-1, c.vocab_size}), y.reshape({-1})).mean();
    });
    // Distillation: the teacher frozen in bf16, each student from it with fp32 weights.
    teacher->to(gpu ? torch::kBFloat16 : torch::kFloat);
    teacher->eval();
    for (auto& p : teacher->parameters()) p.set_requires_grad(false);
    DistillOptions d;
    for (const auto& mixer : mixers) {
      torch::manual_seed(1);
      auto student = build_student(teacher, StudentSpec::make(parse_mixer_kind(mixer), "default", {}, c));
      student->to(torch::kFloat);
      student->train();
      run(mixer + ", stage 3", student, [&](const torch::Tensor& rows) {
        auto x = rows.narrow(1, 0, T), y = rows.narrow(1, 1, T);
        torch::Tensor t_logits;
        {
          torch::NoGradGuard no_grad;
          t_logits = teacher->forward(x);
        }
        return stage3_loss(d, student->forward(x), t_logits, y);
      });
    }
    const double n_teacher = static_cast<double>(count_params(*teacher));
    std::cout << "\n### Training step, SmolLM2-" << shape_name << " shape, batch " << B << " x " << T
              << (gpu ? ", bf16 autocast, fp32 weights" : ", fp32 CPU") << "\n\n"
              << "| what | params | tokens/s | ratio to teacher training | MFU | peak memory |\n|---|---|---|---|---|---|\n";
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      const bool distills = r.name.rfind("teacher", 0) != 0;  // a student's step runs the teacher's forward too
      const double flops = (6.0 * static_cast<double>(r.params) + (distills ? 2.0 * n_teacher : 0.0)) * tokens / r.sec;
      std::cout << "| " << r.name << " | " << fmt(static_cast<double>(r.params) / 1e6, "%.0fM") << " | "
                << fmt(tokens / r.sec, "%.0f") << " | " << fmt(rows[0].sec / r.sec) << " | "
                << (gpu ? fmt(100 * flops / kPeakBf16Flops, "%.1f%%") : "-") << " | "
                << (gpu ? fmt(r.gib, "%.1f GiB") : "-") << " |\n";
    }
  }
}

// ---- decode ---------------------------------------------------------------------------------------

void bench_decode(const Settings& s) {
  const bool gpu = s.device.is_cuda();
  // The 135M shape on the GPU; on a CPU the tiny one unless --shapes names one (its first).
  const std::string shape_name = gpu ? "135m" : s.shapes_given ? s.shapes.front() : "tiny";
  const auto c = shape(shape_name);
  std::vector<int64_t> contexts = gpu ? std::vector<int64_t>{1024, 4096, 16384, 32768} : std::vector<int64_t>{256, 1024};
  std::vector<int64_t> batches = gpu ? std::vector<int64_t>{1, 64} : std::vector<int64_t>{1, 4};
  std::vector<std::string> models = {"teacher"};
  for (const auto& m : s.only.empty() ? mixer_kinds() : s.only) models.push_back(m);
  if (!s.lengths.empty()) contexts = s.lengths;
  if (s.quick) contexts.resize(1), models.resize(2);
  const auto dt = gpu ? torch::kBFloat16 : torch::kFloat;
  torch::manual_seed(0);
  CausalLM teacher(c);
  init_weights_normal(*teacher, 0.02);
  teacher->to(s.device, dt);
  teacher->eval();
  torch::NoGradGuard no_grad;

  struct Cell {
    double tok_s, bytes_per_seq;
  };
  std::map<std::string, std::map<std::pair<int64_t, int64_t>, Cell>> table;  // row -> (batch, ctx)
  std::vector<std::string> rows;  // table rows in order
  std::map<std::string, std::map<int64_t, int64_t>> launches;  // model -> batch -> GPU operations a step
  std::vector<std::pair<std::string, bool>> runs;  // (model, packed): unpacked first when asked for
  for (const auto& m : models) {
    if (s.unpacked) runs.push_back({m, false});
    runs.push_back({m, true});
  }
  for (const auto& [model_name, packed] : runs) {
    CausalLM model = model_name == "teacher" ? teacher : build_student(teacher, StudentSpec::make(parse_mixer_kind(model_name), "default", {}, c));
    model->eval();
    if (packed) model->pack_projections();  // as load_model packs for inference
    const std::string name = packed ? model_name : model_name + ", unpacked";
    std::cerr << "[decode] " << name << "\n";
    rows.push_back(name);
    for (int64_t B : batches)
      for (int64_t L : contexts) {
        reset_peak(s.device);
        auto opts = torch::TensorOptions().device(s.device);
        ModelState state = model->new_state();
        if (model_name == "teacher") {
          // a KV cache of L entries per layer (random contents: the step's cost depends on its size)
          const int64_t hkv = c.num_key_value_heads, hd = c.head_dim;
          for (auto& ls : state) {
            ls.tensors["k"] = torch::randn({B, hkv, L, hd}, opts.dtype(dt));
            ls.tensors["v"] = torch::randn({B, hkv, L, hd}, opts.dtype(dt));
            ls.position = L;
          }
        } else {
          model->forward(torch::randint(0, c.vocab_size, {B, 64}, opts.dtype(torch::kLong)), &state);
          for (auto& ls : state) ls.position = L;
        }
        auto ids = torch::randint(0, c.vocab_size, {B, 1}, opts.dtype(torch::kLong));
        const double bytes_per_seq = static_cast<double>(state_bytes(state)) / B;
        ModelState work = state;
        const int steps = 8;
        if (model_name == "teacher") state.clear();  // the work copy's cache is its own: steps append in place
        const double sec = time_it(s.device, 1, 3, [&] {
          // Every timed run decodes from the same context length: the teacher's cache rewound to L (its
          // first run grows it by a block), a student's state restored from the snapshot.
          if (model_name == "teacher")
            for (auto& ls : work) ls.position = L;
          else
            work = state;
          auto next = ids;
          for (int i = 0; i < steps; ++i) next = model->forward(next, &work).argmax(-1);
        });
        table[name][{B, L}] = {static_cast<double>(B * steps) / sec, bytes_per_seq};
        if (L == contexts.front())
          launches[name][B] = launches_of(s.device, [&] {
            if (model_name == "teacher")
              for (auto& ls : work) ls.position = L;
            else
              work = state;
            model->forward(ids, &work).argmax(-1);
          });
        std::cerr << "  batch " << B << " context " << L << ": " << fmt(table[name][{B, L}].tok_s, "%.0f") << " tok/s";
        // The teacher's graph keeps a KV cache of fixed capacity: its context and room for the timed steps.
        const ModelState& from = model_name == "teacher" ? work : state;
        const int64_t capacity = model_name == "teacher" ? from[0].position + 8 * steps : 0;
        if (GraphedDecodeStep::usable(model, from, nullptr, GraphedDecodeStep::Replay::cuda_graph, capacity)) {
          const std::string row = name + " (CUDA graph)";
          if (rows.back() != row) rows.push_back(row);
          try {
            GraphedDecodeStep graph(model, from, B, GraphedDecodeStep::Replay::cuda_graph, capacity);
            const double gsec = time_it(s.device, 1, 3, [&] {
              auto next = ids;
              for (int i = 0; i < steps; ++i) next = graph.step(next).argmax(-1);
            });
            table[row][{B, L}] = {static_cast<double>(B * steps) / gsec, table[name][{B, L}].bytes_per_seq};
            std::cerr << ", CUDA graph " << fmt(static_cast<double>(B * steps) / gsec, "%.0f") << " tok/s";
          } catch (const std::exception& e) {
            table[row][{B, L}] = {std::nan(""), table[name][{B, L}].bytes_per_seq};
            std::cerr << " (CUDA graph failed: " << e.what() << ")";
          }
        }
        std::cerr << "\n";
      }
  }
  if (gpu) {
    // What a graph replays: each step's kernels, copies and fills, the LM head and argmax included.
    std::cout << "\n### GPU operations per decode step, SmolLM2-" << shape_name << " shape (context " << contexts.front()
              << ")\n\n| model |";
    for (int64_t B : batches) std::cout << " batch " << B << " |";
    std::cout << "\n|---|";
    for (size_t i = 0; i < batches.size(); ++i) std::cout << "---|";
    std::cout << "\n";
    for (const auto& [name, per_batch] : launches) {
      std::cout << "| " << name << " |";
      for (int64_t B : batches) std::cout << " " << (per_batch.at(B) < 0 ? std::string("n/a") : std::to_string(per_batch.at(B))) << " |";
      std::cout << "\n";
    }
  }
  for (int64_t B : batches) {
    std::cout << "\n### Decoding, SmolLM2-" << shape_name << " shape, " << (gpu ? "bf16" : "fp32")
              << ", batch " << B << ": tokens/s (state MiB per sequence)\n\n| model |";
    for (int64_t L : contexts) std::cout << " context " << L << " |";
    std::cout << "\n|---|";
    for (size_t i = 0; i < contexts.size(); ++i) std::cout << "---|";
    std::cout << "\n";
    for (const auto& name : rows) {
      std::cout << "| " << name << " |";
      for (int64_t L : contexts) {
        const auto& cell = table[name][{B, L}];
        std::cout << " " << fmt(cell.tok_s, "%.0f") << " (" << fmt(cell.bytes_per_seq / (1 << 20), "%.1f") << ") |";
      }
      std::cout << "\n";
    }
  }
}

int usage() {
  std::cerr << "usage: linearize_gpu_bench <ops|train|decode|all> [--quick] [--device cuda|cpu] [--shapes 135m,1.7b]\n"
               "                           [--head-dim D] [--only name,name,...]   (ops: head size, which ops, name+ adds its libtorch-chunks row; train, decode: which mixers)\n"
               "                           [--lengths T,T,...]   (ops: the sequence lengths, default 1k..16k, --quick the first;\n"
               "                                                  decode: the contexts, default 1k..32k)\n"
               "                           [--batch B]   (train: sequences of 512 a step; default 16 at 135M, 8 at 1.7B)\n"
               "                           [--unpacked]  (decode: also each model with its input projections run one by one)\n"
               "                           [--cuda-graph]  (train: also each step replayed from one CUDA graph)\n";
  return 2;
}

}  // namespace
}  // namespace linearize

int main(int argc, char** argv) {
  using namespace linearize;
  cli::keep_freed_memory_for_reuse();
  if (argc < 2) return usage();
  Settings s;
  s.device = torch::cuda::is_available() ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  const std::string what = argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      s.quick = true;
    } else if (a == "--device" && i + 1 < argc) {
      s.device = torch::Device(argv[++i]);
    } else if (a == "--shapes" && i + 1 < argc) {
      s.shapes.clear();
      s.shapes_given = true;
      std::stringstream ss(argv[++i]);
      for (std::string item; std::getline(ss, item, ',');) s.shapes.push_back(item);
    } else if (a == "--only" && i + 1 < argc) {
      std::stringstream ss(argv[++i]);
      for (std::string item; std::getline(ss, item, ',');) s.only.push_back(item);
    } else if (a == "--unpacked") {
      s.unpacked = true;
    } else if (a == "--cuda-graph") {
      s.cuda_graph = true;
    } else if (a == "--head-dim" && i + 1 < argc) {
      s.head_dim = std::stoll(argv[++i]);
    } else if (a == "--batch" && i + 1 < argc) {
      s.batch = std::atoll(argv[++i]);
      if (s.batch <= 0) {
        std::cerr << "--batch: expected a positive number of sequences, got '" << argv[i] << "'\n";
        return 2;
      }
    } else if (a == "--lengths" && i + 1 < argc) {
      std::stringstream ss(argv[++i]);
      for (std::string item; std::getline(ss, item, ',');) {
        const int64_t T = std::atoll(item.c_str());
        if (T <= 0) {
          std::cerr << "--lengths: expected positive sequence lengths, got '" << item << "'\n";
          return 2;
        }
        s.lengths.push_back(T);
      }
    } else {
      return usage();
    }
  }
  if (what != "ops" && what != "train" && what != "decode" && what != "all") return usage();
  try {
    std::cout << "Device: " << (s.device.is_cuda() ? "CUDA" : "CPU") << (s.quick ? " (quick)" : "") << "\n";
    if (what == "ops" || what == "all") bench_ops(s);
    if (what == "train" || what == "all") bench_train(s);
    if (what == "decode" || what == "all") bench_decode(s);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
