#include "model/llama.h"

#include <cmath>
#include <vector>

#include "compat/torch_compat.h"
#include "io/error.h"
#include "ops/ops.h"

namespace linearize {

RMSNormImpl::RMSNormImpl(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) { return ops::rms_norm(x, weight, eps); }

Rotary::Rotary(int64_t head_dim, double theta, const RopeScaling& scaling) {
  auto exponents = torch::arange(0, head_dim, 2, torch::kLong).to(torch::kFloat) / static_cast<double>(head_dim);
  inv_freq_ = 1.0 / torch::pow(torch::tensor(theta, torch::kFloat), exponents);  // [D/2]
  if (scaling.type == "linear") {
    inv_freq_ = inv_freq_ / scaling.factor;
  } else if (scaling.type == "llama3") {
    // Low frequencies are divided by `factor`, high ones kept, the band between interpolated.
    const double old_len = static_cast<double>(scaling.original_max_position_embeddings);
    const double low_wavelen = old_len / scaling.low_freq_factor;
    const double high_wavelen = old_len / scaling.high_freq_factor;
    auto wavelen = 2 * M_PI / inv_freq_;
    auto scaled = torch::where(wavelen > low_wavelen, inv_freq_ / scaling.factor, inv_freq_);
    auto smooth = (old_len / wavelen - scaling.low_freq_factor) /
                  (scaling.high_freq_factor - scaling.low_freq_factor);
    auto smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled;
    auto medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
    inv_freq_ = torch::where(medium, smoothed, scaled);
  }
  inv_freq_ = inv_freq_.contiguous();
  freqs_.assign(inv_freq_.data_ptr<float>(), inv_freq_.data_ptr<float>() + inv_freq_.numel());
}

const torch::Tensor& Rotary::signed_inv_freq_on(torch::Device device) const {
  // Kept per device: a host-to-device copy in every layer of every decode step would stall the GPU.
  if (!device_inv_freq_.defined() || device_inv_freq_.device() != device)
    device_inv_freq_ = torch::cat({-inv_freq_, inv_freq_}).to(device);
  return device_inv_freq_;
}

std::pair<torch::Tensor, torch::Tensor> Rotary::tables(int64_t start, int64_t length,
                                                       torch::Device device) const {
  auto pos = torch::arange(start, start + length, torch::TensorOptions().dtype(torch::kFloat).device(device));
  auto angles = torch::outer(pos, signed_inv_freq_on(device));  // [T, D]
  return {angles.cos(), angles.sin()};
}

namespace {
// x * cos + rotate_half(x) * sin in HF's rotate-half layout, with rotate_half(x) = [-x2, x1]: that is
// roll(x) = [x2, x1] times sin with its first half negated (sin_signed), so a product, a roll and one
// multiply-add, three launches where the rotation written out takes five.
torch::Tensor rotate(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin_signed) {
  return torch::addcmul(x * cos, x.roll({x.size(-1) / 2}, {-1}), sin_signed);
}

// The last tables apply made on this thread, for whichever Rotary asked. Every layer of a model rotates q
// and k by the same positions (a decode step by one position, a training step by 0 .. T-1), so the layers
// share one pair instead of each making its own (arange, outer, cos, sin and two casts a layer and step),
// and only one pair is held. Made once and never freed, so that no device tensor outlives its runtime at
// exit.
struct SharedTables {
  std::vector<float> freqs;
  int64_t start = -1, length = -1;
  torch::Tensor cos, sin_signed;  // [T, D] in the dtype asked for; sin_signed: sin with its first half negated
};
SharedTables& shared_tables() {
  thread_local auto* tables = new SharedTables;
  return *tables;
}
}  // namespace

torch::Tensor Rotary::apply(const torch::Tensor& x, int64_t start) const {
  const int64_t length = x.size(2);
  SharedTables& last = shared_tables();
  if (last.start != start || last.length != length || !last.cos.defined() || last.cos.device() != x.device() ||
      last.cos.scalar_type() != x.scalar_type() || last.freqs != freqs_) {
    auto [cos, sin_signed] = tables(start, length, x.device());
    auto cos_x = cos.to(x.scalar_type()), sin_x = sin_signed.to(x.scalar_type());
    last = SharedTables{freqs_, start, length, cos_x, sin_x};
  }
  return rotate(x, last.cos, last.sin_signed);
}

torch::Tensor Rotary::apply_at(const torch::Tensor& x, const torch::Tensor& pos) const {
  auto angles = pos.to(x.device(), torch::kFloat).unsqueeze(-1) * signed_inv_freq_on(x.device());  // [B,T,D]
  angles = angles.unsqueeze(1);                                                                     // [B,1,T,D]
  return rotate(x, angles.cos().to(x.scalar_type()), angles.sin().to(x.scalar_type()));
}

torch::Tensor repeat_kv(const torch::Tensor& x, int64_t groups) {
  if (groups == 1) return x;
  const auto B = x.size(0), Hkv = x.size(1), T = x.size(2), D = x.size(3);
  return x.unsqueeze(2).expand({B, Hkv, groups, T, D}).reshape({B, Hkv * groups, T, D});
}

namespace {

// The KV cache grows in blocks of this many tokens: a copy of the cache every 256 decoding steps, and at most
// 255 slots held unused.
constexpr int64_t kCacheBlock = 256;

// Writes x [B,Hkv,T,D] (this call's keys or values) at entry `start` of the layer's cache `name` and returns
// entries 0 .. start+T. The cache is [B,Hkv,capacity,D] with its first `start` entries valid (llama.h). It is
// written in place unless a snapshot of the state holds it too (layer_state.h promises snapshots stay as they
// were) or autograd records x, and is copied into a larger one when full.
torch::Tensor append_to_cache(LayerState& state, const std::string& name, const torch::Tensor& x, int64_t start) {
  const int64_t T = x.size(2), end = start + T;
  auto& cache = state.tensors[name];
  if (start == 0) cache = torch::Tensor();
  if (cache.defined() && cache.size(2) < start)
    throw Error("KV cache " + name + " holds " + std::to_string(cache.size(2)) +
                                " entries but the state is at position " + std::to_string(start));
  if (torch::GradMode::is_enabled() && x.requires_grad()) {  // keep the graph: no in-place writes
    cache = cache.defined() ? torch::cat({cache.narrow(2, 0, start), x}, 2) : x;
    return cache;
  }
  const bool shared = cache.defined() && (cache.use_count() > 1 || cache.storage().use_count() > 1);
  if (!cache.defined() || shared || cache.size(2) < end || cache.scalar_type() != x.scalar_type()) {
    const int64_t capacity = (end + kCacheBlock - 1) / kCacheBlock * kCacheBlock;
    auto grown = torch::empty({x.size(0), x.size(1), capacity, x.size(3)}, x.options());
    if (start > 0) grown.narrow(2, 0, start).copy_(cache.narrow(2, 0, start));
    cache = grown;
  }
  cache.narrow(2, start, T).copy_(x);
  return cache.narrow(2, 0, end);
}

}  // namespace

LlamaAttention::LlamaAttention(const LlamaConfig& c)
    : num_heads(c.num_attention_heads),
      num_kv_heads(c.num_key_value_heads),
      head_dim(c.head_dim),
      sliding_window(c.sliding_window),
      rotary_(c.head_dim, c.rope_theta, c.rope_scaling) {
  auto lin = [&](int64_t in, int64_t out, bool bias) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
  };
  q_proj = register_module("q_proj", lin(c.hidden_size, num_heads * head_dim, c.qkv_bias));
  k_proj = register_module("k_proj", lin(c.hidden_size, num_kv_heads * head_dim, c.qkv_bias));
  v_proj = register_module("v_proj", lin(c.hidden_size, num_kv_heads * head_dim, c.qkv_bias));
  o_proj = register_module("o_proj", lin(num_heads * head_dim, c.hidden_size, c.o_bias));
  if (c.qk_norm) {
    q_norm = register_module("q_norm", RMSNorm(head_dim, c.rms_norm_eps));
    k_norm = register_module("k_norm", RMSNorm(head_dim, c.rms_norm_eps));
  }
  for (const auto& p : {q_proj, k_proj, v_proj}) inputs.add(p);
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> LlamaAttention::project_qkv(const torch::Tensor& x) {
  const auto B = x.size(0), T = x.size(1);
  const auto in = inputs(x);  // q_proj, k_proj, v_proj: one matrix product once packed
  auto q = in[q_proj].view({B, T, num_heads, head_dim});
  auto k = in[k_proj].view({B, T, num_kv_heads, head_dim});
  auto v = in[v_proj].view({B, T, num_kv_heads, head_dim});
  if (q_norm) q = q_norm(q), k = k_norm(k);  // Qwen3: per head, before RoPE
  return {q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)};  // [B,H,T,D], [B,Hkv,T,D] x2
}

torch::Tensor LlamaAttention::forward(const torch::Tensor& x, LayerState* state) {
  if (state && state->has("slot")) return forward_fixed_cache(x, *state);
  const auto B = x.size(0), T = x.size(1);
  const int64_t start = state ? state->position : 0;
  auto [q, k, v] = project_qkv(x);  // [B,H,T,D], [B,Hkv,T,D] x2
  // Rows of different lengths decoded together (serve/batched_decode.h): each row's cache is left-padded
  // to `start` entries and "row_start" [B] holds its first real one, so row b is at position start - row_start[b].
  const torch::Tensor row_start = state ? state->get("row_start") : torch::Tensor();
  torch::Tensor query_slot;  // [T]: the cache slots of this call's tokens
  if (row_start.defined()) {
    query_slot = torch::arange(start, start + T, torch::TensorOptions().dtype(torch::kLong).device(x.device()));
    const auto pos = query_slot.unsqueeze(0) - row_start.unsqueeze(1);  // [B,T]
    q = rotary_.apply_at(q, pos);
    k = rotary_.apply_at(k, pos);
  } else {
    q = rotary_.apply(q, start);
    k = rotary_.apply(k, start);
  }
  if (state) {
    k = append_to_cache(*state, "k", k, start);  // [B,Hkv,start+T,D]
    v = append_to_cache(*state, "v", v, start);
    state->position = start + T;
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  torch::Tensor o;  // [B,H,T,D]
  const bool windowed = sliding_window > 0 && start + T > sliding_window;
  if (row_start.defined() || windowed) {
    if (!query_slot.defined())
      query_slot = torch::arange(start, start + T, torch::TensorOptions().dtype(torch::kLong).device(x.device()));
    const auto key_slot = torch::arange(start + T, query_slot.options()).view({1, 1, -1});  // [1,1,S]
    auto mask = key_slot.le(query_slot.view({1, -1, 1}));                                   // causal [1,T,S]
    if (row_start.defined()) mask = mask.logical_and(key_slot.ge(row_start.view({-1, 1, 1})));
    if (windowed) mask = mask.logical_and(key_slot.gt(query_slot.view({1, -1, 1}) - sliding_window));
    o = compat::attention(q, k, v, mask.unsqueeze(1), scale);  // mask [B or 1,1,T,S]
  } else {
    o = compat::attention(q, k, v, /*causal=*/true, scale);
  }
  return o_proj(o.transpose(1, 2).reshape({B, T, num_heads * head_dim}));
}

// The state holds "k", "v" [B,Hkv,C,D] of a fixed capacity C and "slot" [1] (int64), the entry this token
// goes to; everything the step reads is on the device, not the host's position, so a captured graph replays
// it step after step. The keys past the slot are masked out. Rows of a batch at different positions
// ("row_start", as in forward) are rotated and masked by their own.
torch::Tensor LlamaAttention::forward_fixed_cache(const torch::Tensor& x, LayerState& state) {
  const auto B = x.size(0);
  if (x.size(1) != 1)
    throw Error("attention: a fixed-capacity KV cache takes one token a step, got " + std::to_string(x.size(1)));
  const auto slot = state.get("slot"), kc = state.get("k"), vc = state.get("v");  // [1], [B,Hkv,C,D] x2
  auto [q, k, v] = project_qkv(x);                                                // [B,H,1,D], [B,Hkv,1,D] x2
  const auto row_start = state.get("row_start");                                 // [B] or undefined
  const auto pos = row_start.defined() ? (slot - row_start).view({B, 1}) : slot.view({1, 1}).expand({B, 1});
  q = rotary_.apply_at(q, pos);
  k = rotary_.apply_at(k, pos);
  kc.index_copy_(2, slot, k.to(kc.scalar_type()));
  vc.index_copy_(2, slot, v.to(vc.scalar_type()));
  const auto key_slot = torch::arange(kc.size(2), slot.options()).view({1, 1, 1, -1});  // [1,1,1,C]
  const auto now = slot.view({1, 1, 1, 1});
  auto mask = key_slot.le(now);
  if (row_start.defined()) mask = mask.logical_and(key_slot.ge(row_start.view({-1, 1, 1, 1})));
  if (sliding_window > 0) mask = mask.logical_and(key_slot.gt(now - sliding_window));
  auto o = compat::attention(q, kc, vc, mask, 1.0 / std::sqrt(static_cast<double>(head_dim)));  // [B,H,1,D]
  slot.add_(1);
  state.position += 1;
  return o_proj(o.transpose(1, 2).reshape({B, 1, num_heads * head_dim}));
}

torch::Tensor LlamaAttention::forward_packed(const torch::Tensor& x, const PackedRows& rows) {
  const auto B = x.size(0), T = x.size(1);
  // Per token: its document number within the row and its position inside that document.
  std::vector<int64_t> doc(B * T), pos(B * T);
  for (int64_t b = 0; b < B; ++b) {
    const auto& s = rows.starts.at(b);
    int64_t d = -1;
    for (int64_t t = 0, begin = 0; t < T; ++t) {
      if (d + 1 < static_cast<int64_t>(s.size()) && s[d + 1] == t) ++d, begin = t;
      doc[b * T + t] = d;
      pos[b * T + t] = t - begin;
    }
  }
  auto doc_t = torch::tensor(doc, torch::kLong).view({B, T}).to(x.device());
  auto pos_t = torch::tensor(pos, torch::kLong).view({B, T}).to(x.device());
  auto [q, k, v] = project_qkv(x);  // [B,H,T,D], [B,Hkv,T,D] x2
  q = rotary_.apply_at(q, pos_t);
  k = rotary_.apply_at(k, pos_t);
  auto causal = torch::ones({T, T}, doc_t.options().dtype(torch::kBool)).tril();          // [T,T]
  if (sliding_window > 0) causal = causal.triu(1 - sliding_window);                      // i - j < window
  auto mask = doc_t.unsqueeze(2).eq(doc_t.unsqueeze(1)).logical_and(causal).unsqueeze(1);  // [B,1,T,T]
  auto o = compat::attention(q, k, v, mask, 1.0 / std::sqrt(static_cast<double>(head_dim)));  // [B,H,T,D]
  return o_proj(o.transpose(1, 2).reshape({B, T, num_heads * head_dim}));
}

LlamaMLPImpl::LlamaMLPImpl(int64_t hidden, int64_t intermediate, bool bias) {
  gate_proj = register_module("gate_proj", torch::nn::Linear(torch::nn::LinearOptions(hidden, intermediate).bias(bias)));
  up_proj = register_module("up_proj", torch::nn::Linear(torch::nn::LinearOptions(hidden, intermediate).bias(bias)));
  down_proj = register_module("down_proj", torch::nn::Linear(torch::nn::LinearOptions(intermediate, hidden).bias(bias)));
  gate_up.add(gate_proj);
  gate_up.add(up_proj);
}

torch::Tensor LlamaMLPImpl::forward(const torch::Tensor& x) {
  const auto in = gate_up(x);
  return down_proj(ops::swiglu(in[gate_proj], in[up_proj]));
}

}  // namespace linearize
