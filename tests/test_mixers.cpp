// Tests of the seven mixer layers (src/model/mixers):
//  (a) every fla layer file in ../shared/golden/layers: build the layer from the file's `config`
//      metadata, load param.* by name (1:1, both ways), run in.x, compare out.y (rel <= 2e-3);
//  (b) every mixer on a small random config (with GQA where native, short convs, gate variants):
//      token-by-token decode, prefill + decode, and a snapshot taken mid-way all equal the whole-sequence
//      forward (fp32, rel <= 1e-4);
//  (c) init from a GQA teacher (6 heads, 2 KV heads, head_dim 8): q/o copied exactly, k/v rows repeated
//      per KV head for mixers without native GQA, copied as is for those with it; identity convs;
//  (d) fla's options against their formulas: GVA value heads, DPFP, the normalised linear attention,
//      KDA's bounded gate, and config overrides;
//  (e) config errors: unknown key, unknown kind, unknown preset; JSON round trip.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "io/error.h"
#include "io/safetensors.h"
#include "model/mixers/factory.h"
#include "model/mixers/linear_attention.h"
#include "model/mixers/mixer_config.h"
#include "model/mixers/mlstm.h"
#include "ops/ops.h"
#include "test_util.h"

namespace linearize {
namespace {

using test::rel_err;

// ---- (a) golden fla layers -------------------------------------------------------------------------

// fla layer class + its constructor settings -> MixerConfig. Settings we do not implement must be at
// their fla default; anything else fails the test with the key's name.
MixerConfig config_from_fla(const std::string& cls, const nlohmann::json& j, const SafetensorsFile& f) {
  const std::map<std::string, std::string> kinds = {
      {"LinearAttention", "linear_attention"}, {"MultiScaleRetention", "retnet"},
      {"GatedLinearAttention", "gla"},         {"DeltaNet", "deltanet"},
      {"GatedDeltaNet", "gated_deltanet"},     {"KimiDeltaAttention", "kda"}};
  auto it = kinds.find(cls);
  if (it == kinds.end()) throw Error("golden layer: unknown fla class '" + cls + "'");
  MixerConfig c = MixerConfig::defaults_for(parse_mixer_kind(it->second));
  auto get_or = [&](const char* key, auto fallback) {
    return j.contains(key) && !j[key].is_null() ? j[key].get<decltype(fallback)>() : fallback;
  };
  c.hidden_size = j.at("hidden_size").get<int64_t>();
  c.num_heads = j.at("num_heads").get<int64_t>();
  c.num_kv_heads = get_or("num_kv_heads", c.num_heads);
  c.head_k_dim = j.at("head_k_dim").get<int64_t>();
  c.head_v_dim = j.at("head_v_dim").get<int64_t>();
  c.use_short_conv = get_or("use_short_conv", c.use_short_conv);
  c.conv_size = get_or("conv_size", c.conv_size);
  c.conv_bias = get_or("conv_bias", c.conv_bias);
  c.use_output_gate = get_or("use_output_gate", get_or("use_gate", c.use_output_gate));
  c.allow_neg_eigval = get_or("allow_neg_eigval", c.allow_neg_eigval);
  c.use_beta = get_or("use_beta", c.use_beta);
  c.gate_logit_normalizer = get_or("gate_logit_normalizer", c.gate_logit_normalizer);
  if (c.kind == MixerKind::gla) c.gate_low_rank_dim = f.info("param.gk_proj.0.weight").shape[0];
  if (c.kind == MixerKind::linear_attention) {
    c.feature_map = "elementwise_product";          // golden/README.md: built with this map
    c.use_output_norm = f.contains("param.norm.weight");  // and without the output norm
  }
  if (c.kind == MixerKind::kda) c.use_output_gate = true, c.kda_gate_mode = "multiply";
  c.rope_theta = 10000.0;  // fla's RetNet default, as the golden file was built
  auto require = [&](const char* key, const nlohmann::json& expected) {
    if (j.contains(key) && j[key] != expected)
      throw Error(std::string("golden layer: unsupported fla setting ") + key + "=" + j[key].dump());
  };
  require("clamp_min", nullptr);
  require("feature_map_fn", nullptr);
  require("qk_activation", "silu");
  require("qk_norm", "l2");
  require("lower_bound", nullptr);
  require("do_feature_map_norm", false);
  require("norm_q", false);
  require("norm_k", false);
  if (j.contains("num_v_heads")) require("num_v_heads", c.num_heads);
  return c.resolve();
}

TEST(MixerGolden, EveryFlaLayerFile) {
  const std::string dir = test::golden_dir() + "/layers";
  LINEARIZE_REQUIRE_PATH(dir);
  const auto files = test::files_in(dir, ".safetensors");
  ASSERT_FALSE(files.empty()) << "no .safetensors in " << dir;
  for (const auto& path : files) {
    SCOPED_TRACE(path);
    SafetensorsFile f(path);
    const auto& md = f.metadata();
    ASSERT_TRUE(md.count("config") && md.count("class")) << path << ": metadata needs `config` and `class`";
    auto cfg = config_from_fla(md.at("class"), nlohmann::json::parse(md.at("config")), f);
    auto mixer = make_mixer(cfg);
    auto params = mixer->named_parameters();
    int64_t loaded = 0;
    {
      torch::NoGradGuard no_grad;
      for (const auto& name : f.names()) {
        if (name.rfind("param.", 0) != 0) continue;
        auto* p = params.find(name.substr(6));
        ASSERT_NE(p, nullptr) << path << ": the " << to_string(cfg.kind) << " mixer has no parameter " << name.substr(6);
        auto src = f.get(name);
        ASSERT_EQ(p->sizes(), src.sizes()) << path << ": " << name;
        p->copy_(src);
        ++loaded;
      }
    }
    EXPECT_EQ(loaded, static_cast<int64_t>(params.size())) << path << ": parameters left unloaded";
    torch::NoGradGuard no_grad;
    auto y = mixer->forward(f.get("in.x"), nullptr);
    const double e = rel_err(y, f.get("out.y"));
    std::printf("[golden] %-18s max rel err %.2e\n", to_string(cfg.kind).c_str(), e);
    EXPECT_LE(e, 2e-3) << path;
  }
}

// ---- (b) decode, prefill + decode, snapshots ---------------------------------------------------------

MixerConfig small_config(const std::string& kind) {
  MixerConfig c = MixerConfig::defaults_for(parse_mixer_kind(kind));
  c.hidden_size = 32;
  c.num_heads = 4;
  c.chunk_size = 16;
  return c;
}

std::vector<std::pair<std::string, MixerConfig>> small_cases() {
  std::vector<std::pair<std::string, MixerConfig>> out;
  for (const auto& kind : mixer_kinds()) out.push_back({kind, small_config(kind)});
  auto add = [&](const std::string& name, const std::string& kind, auto edit) {
    auto c = small_config(kind);
    edit(c);
    out.push_back({name, c});
  };
  add("linear_attention_gqa", "linear_attention", [](MixerConfig& c) { c.num_kv_heads = 2; });
  add("linear_attention_hedgehog", "linear_attention", [](MixerConfig& c) { c.feature_map = "hedgehog"; });
  add("retnet_gqa_conv", "retnet", [](MixerConfig& c) { c.num_kv_heads = 2, c.use_short_conv = true; });
  add("gla_gqa", "gla", [](MixerConfig& c) { c.num_kv_heads = 2; });
  add("gla_conv", "gla", [](MixerConfig& c) { c.use_short_conv = true; });
  add("deltanet_gate", "deltanet", [](MixerConfig& c) { c.use_output_gate = true; });
  add("kda_add_in_norm", "kda", [](MixerConfig& c) { c.kda_gate_mode = "add_in_norm"; });
  // Options of fla's layers and of the study's students.
  add("linear_attention_conv_no_norm", "linear_attention", [](MixerConfig& c) { c.use_short_conv = true, c.use_output_norm = false; });
  add("linear_attention_dpfp_sum_norms", "linear_attention", [](MixerConfig& c) {
    c.feature_map = "dpfp", c.norm_q = true, c.norm_k = true;
  });
  add("linear_attention_feature_map_norm_gqa", "linear_attention", [](MixerConfig& c) {
    c.feature_map = "elu", c.feature_map_norm = true, c.num_kv_heads = 2;
  });
  add("gated_deltanet_gva", "gated_deltanet", [](MixerConfig& c) { c.num_heads = 2, c.num_v_heads = 4, c.head_k_dim = c.head_v_dim = 8; });
  add("kda_gva_full_rank_gate", "kda", [](MixerConfig& c) {
    c.num_heads = 2, c.num_v_heads = 4, c.head_k_dim = c.head_v_dim = 8, c.kda_gate_low_rank = false;
  });
  add("kda_lower_bound", "kda", [](MixerConfig& c) { c.lower_bound = -3; });
  add("kda_safe_gate", "kda", [](MixerConfig& c) { c.lower_bound = -5, c.safe_gate = true, c.dt_bias_init = "zeros"; });
  return out;
}

// Random, not-small parameters so gates, convs and feature maps all matter.
void perturb(TokenMixer& m) {
  torch::NoGradGuard no_grad;
  for (auto& p : m.parameters()) p.add_(torch::randn_like(p) * 0.2);
}

TEST(MixerState, DecodePrefillSnapshotMatchFullForward) {
  torch::manual_seed(0);
  const int64_t B = 2, T = 45, T1 = 21;
  for (const auto& [name, cfg] : small_cases()) {
    SCOPED_TRACE(name);
    auto m = make_mixer(cfg);
    perturb(*m);
    torch::NoGradGuard no_grad;
    auto x = torch::randn({B, T, cfg.hidden_size});
    auto full = m->forward(x, nullptr);  // [B,T,hidden]
    ASSERT_EQ(full.sizes(), x.sizes());

    LayerState s;  // one token at a time
    std::vector<torch::Tensor> ys;
    for (int64_t t = 0; t < T; ++t) ys.push_back(m->forward(x.narrow(1, t, 1), &s));
    const double e_decode = rel_err(torch::cat(ys, 1), full);
    EXPECT_LE(e_decode, 1e-4) << name << ": token-by-token";
    EXPECT_EQ(s.position, T);

    LayerState p;  // prefill T1 (chunked from empty), a snapshot, then decode the rest
    auto y1 = m->forward(x.narrow(1, 0, T1), &p);
    LayerState snap = p;
    std::vector<torch::Tensor> rest;
    for (int64_t t = T1; t < T; ++t) rest.push_back(m->forward(x.narrow(1, t, 1), &p));
    const double e_prefill = rel_err(torch::cat({y1, torch::cat(rest, 1)}, 1), full);
    EXPECT_LE(e_prefill, 1e-4) << name << ": prefill + decode";

    // The snapshot is untouched by the decode above: resuming from it, now by a chunked prefill of the
    // remaining tokens (state + T > 1), gives the same outputs and the same final state.
    auto y2 = m->forward(x.narrow(1, T1, T - T1), &snap);
    const double e_snap = rel_err(y2, full.narrow(1, T1, T - T1));
    EXPECT_LE(e_snap, 1e-4) << name << ": resumed from snapshot";
    EXPECT_EQ(snap.position, T);
    for (const auto& [key, t] : p.tensors) {
      ASSERT_TRUE(snap.has(key)) << name << ": " << key;
      EXPECT_LE(rel_err(snap.get(key), t), 1e-4) << name << ": final state " << key;
    }
    std::printf("[state]  %-26s decode %.1e  prefill+decode %.1e  snapshot %.1e\n", name.c_str(), e_decode,
                e_prefill, e_snap);
  }
}

// Packed input projections (model/packed_projections.h) give the outputs of the layers run one by one,
// whole sequence and decode, and step aside for training: gradients still reach every weight.
TEST(MixerState, PackedProjectionsMatchTheLayersOneByOne) {
  torch::manual_seed(2);
  const int64_t B = 2, T = 19;
  for (const auto& [name, cfg] : small_cases()) {
    SCOPED_TRACE(name);
    auto m = make_mixer(cfg);
    perturb(*m);
    const auto x = torch::randn({B, T, cfg.hidden_size});
    auto run = [&] {  // the whole sequence, then a prefill of T - 1 tokens and one decode step
      torch::NoGradGuard no_grad;
      LayerState s;
      auto prefix = m->forward(x.narrow(1, 0, T - 1), &s);
      return std::make_pair(m->forward(x, nullptr), torch::cat({prefix, m->forward(x.narrow(1, T - 1, 1), &s)}, 1));
    };
    const auto [full, stepped] = run();
    const auto weights_before = torch::cat([&] {
      std::vector<torch::Tensor> flat;
      for (const auto& p : m->parameters()) flat.push_back(p.detach().flatten().clone());
      return flat;
    }());
    ASSERT_FALSE(m->projections_packed());
    m->pack_projections();
    ASSERT_TRUE(m->projections_packed());
    const auto [packed_full, packed_stepped] = run();
    EXPECT_LE(rel_err(packed_full, full), 1e-5) << name << ": whole sequence";
    EXPECT_LE(rel_err(packed_stepped, stepped), 1e-5) << name << ": prefill + decode";
    std::vector<torch::Tensor> flat;
    for (const auto& p : m->parameters()) flat.push_back(p.detach().flatten());
    EXPECT_TRUE(torch::equal(torch::cat(flat), weights_before)) << name << ": packing changed a weight";

    auto y = m->forward(x, nullptr);
    EXPECT_LE(rel_err(y.detach(), full), 1e-5) << name << ": with gradients";
    y.pow(2).sum().backward();
    for (const auto& item : m->named_parameters())
      EXPECT_TRUE(item.value().grad().defined()) << name << ": no gradient for " << item.key();
  }
}

// Decoding into a state that allows it (LayerState::update_in_place, a CUDA graph's buffers) writes the new
// matrix state and conv caches over the old ones: the same outputs and states as replacing them, in the
// same buffers. Through libtorch and, where the CPU build has the emulator, through the fused kernels.
TEST(MixerState, InPlaceDecodeStepsMatchAndKeepTheirBuffers) {
  torch::manual_seed(4);
  const int64_t B = 2, T = 9, steps = 3;
  std::vector<bool> kernel_modes = {false};
  if (ops::kernel_emulation_available()) kernel_modes.push_back(true);
  for (const bool kernels : kernel_modes) {
    const test::EmulationScope emulation(kernels);
    for (const auto& [name, cfg] : small_cases()) {
      SCOPED_TRACE(name + (kernels ? " (kernels)" : " (libtorch)"));
      auto m = make_mixer(cfg);
      perturb(*m);
      torch::NoGradGuard no_grad;
      const auto x = torch::randn({B, T + steps, cfg.hidden_size});
      LayerState replaced;
      m->forward(x.narrow(1, 0, T), &replaced);
      LayerState in_place = replaced, snapshot = replaced, snapshot_values = replaced;
      for (auto& [key, t] : in_place.tensors) t = t.clone();
      for (auto& [key, t] : snapshot_values.tensors) t = t.clone();
      in_place.update_in_place = true;
      std::map<std::string, const void*> where;
      for (const auto& [key, t] : in_place.tensors) where[key] = t.data_ptr();
      for (int64_t i = 0; i < steps; ++i) {
        const auto xi = x.narrow(1, T + i, 1);
        const auto a = m->forward(xi, &replaced), b = m->forward(xi, &in_place);
        EXPECT_LE(rel_err(b, a), 1e-6) << name << ": step " << i;
      }
      int kept = 0;
      for (const auto& [key, t] : replaced.tensors) {
        ASSERT_TRUE(in_place.has(key)) << key;
        EXPECT_LE(rel_err(in_place.get(key), t), 1e-6) << name << ": state " << key;
        kept += in_place.get(key).data_ptr() == where[key];
      }
      // The matrix state and every conv cache stay where they were (the mLSTM's states, linear attention's
      // normaliser and RetNet's positions are still replaced).
      const int expected = (cfg.kind == MixerKind::mlstm ? 0 : 1) + (cfg.use_short_conv ? 3 : 0);
      EXPECT_GE(kept, expected) << name;
      // A snapshot taken before the steps, sharing the replacing path's tensors, is untouched by them.
      for (const auto& [key, t] : snapshot.tensors) EXPECT_TRUE(torch::equal(t, snapshot_values.get(key))) << key;
    }
  }
}

TEST(MixerState, BackwardReachesEveryParameter) {
  torch::manual_seed(1);
  for (const auto& [name, cfg] : small_cases()) {
    SCOPED_TRACE(name);
    auto m = make_mixer(cfg);
    perturb(*m);
    auto y = m->forward(torch::randn({2, 20, cfg.hidden_size}), nullptr);
    y.pow(2).sum().backward();
    for (const auto& item : m->named_parameters()) {
      ASSERT_TRUE(item.value().grad().defined()) << name << ": no gradient for " << item.key();
      EXPECT_TRUE(torch::isfinite(item.value().grad()).all().item<bool>()) << name << ": " << item.key();
    }
  }
}

// The mLSTM's per-head LayerNorm (a group norm over the heads) against its formula in fp64, value and
// gradients: mean and biased variance over each head's D channels, then the flat weight.
TEST(MixerBlocks, MultiHeadLayerNormMatchesPerHeadFormula) {
  torch::manual_seed(3);
  const int64_t B = 2, T = 7, H = 3, D = 16;
  const double eps = 1e-6;
  for (const auto dt : {torch::kFloat, torch::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dt));
    MultiHeadLayerNorm norm(H, D, eps);
    {
      torch::NoGradGuard no_grad;
      norm->weight.copy_(torch::randn({H * D}));
    }
    auto x = (torch::randn({B, T, H, D}) * 3 + 1).to(dt).requires_grad_(true);
    auto dy = torch::randn({B, T, H * D});
    auto y = norm(x);
    (y.to(torch::kFloat) * dy).sum().backward();

    auto x64 = x.detach().to(torch::kDouble).requires_grad_(true);
    auto w64 = norm->weight.detach().to(torch::kDouble).requires_grad_(true);
    auto mean = x64.mean(-1, true), var = (x64 - mean).pow(2).mean(-1, true);
    auto want = ((x64 - mean) / (var + eps).sqrt()).flatten(2) * w64;
    (want * dy.to(torch::kDouble)).sum().backward();

    const double tol = dt == torch::kFloat ? 1e-5 : 1e-2;  // bf16: one rounding
    EXPECT_EQ(y.scalar_type(), dt);
    EXPECT_LE(rel_err(y, want), tol);
    EXPECT_LE(rel_err(x.grad(), x64.grad()), tol);
    EXPECT_LE(rel_err(norm->weight.grad(), w64.grad()), tol);  // bf16: from the rounded gradient of y
    std::printf("[mh-layernorm] %s: y %.1e  dx %.1e  dw %.1e\n", c10::toString(dt), rel_err(y, want),
                rel_err(x.grad(), x64.grad()), rel_err(norm->weight.grad(), w64.grad()));
  }
}

// ---- (c) init from a GQA teacher -------------------------------------------------------------------

LlamaConfig gqa_teacher_config() {
  LlamaConfig c;
  c.vocab_size = 64;
  c.hidden_size = 48;
  c.intermediate_size = 96;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 6;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.rope_theta = 1e5;
  return c;
}

TEST(MixerInit, FromGqaTeacher) {
  torch::manual_seed(2);
  const auto tc = gqa_teacher_config();
  LlamaAttention teacher(tc);
  const int64_t d = tc.head_dim, G = tc.num_attention_heads / tc.num_key_value_heads;
  for (const auto& kind : mixer_kinds()) {
    SCOPED_TRACE(kind);
    auto cfg = mixer_preset(parse_mixer_kind(kind), "default", tc);
    auto m = make_mixer(cfg);
    auto notes = init_mixer_from_teacher(*m, teacher, cfg);
    for (const auto& n : notes) EXPECT_EQ(n.rfind("left fresh", 0), std::string::npos) << kind << ": " << n;
    auto P = m->named_parameters();
    const bool xlstm = kind == "mlstm";
    auto param = [&](const std::string& hf) {
      static const std::map<std::string, std::string> x = {{"q_proj", "q"}, {"k_proj", "k"}, {"v_proj", "v"}, {"o_proj", "out_proj"}};
      return P[(xlstm ? x.at(hf) : hf) + ".weight"];
    };
    EXPECT_TRUE(torch::equal(param("q_proj"), teacher.q_proj->weight)) << kind << ": q";
    EXPECT_TRUE(torch::equal(param("o_proj"), teacher.o_proj->weight)) << kind << ": o";
    const bool native = kind == "linear_attention" || kind == "retnet" || kind == "gla";
    for (const auto* proj : {"k_proj", "v_proj"}) {
      auto student = param(proj);
      auto tw = std::string(proj) == "k_proj" ? teacher.k_proj->weight : teacher.v_proj->weight;
      if (native) {
        EXPECT_TRUE(torch::equal(student, tw)) << kind << ": " << proj << " as is";
        continue;
      }
      ASSERT_EQ(student.size(0), tc.num_attention_heads * d) << kind << ": " << proj;
      for (int64_t h = 0; h < tc.num_attention_heads; ++h)
        EXPECT_TRUE(torch::equal(student.narrow(0, h * d, d), tw.narrow(0, (h / G) * d, d)))
            << kind << ": " << proj << " head " << h << " should be teacher KV head " << h / G;
    }
    for (const auto& item : P)
      if (item.key().find("conv1d.weight") != std::string::npos) {
        auto w = item.value();
        EXPECT_TRUE(torch::equal(w.select(2, w.size(2) - 1), torch::ones_like(w.select(2, 0)))) << item.key();
        EXPECT_EQ(w.narrow(2, 0, w.size(2) - 1).abs().sum().item<double>(), 0.0) << item.key();
      }
  }
}

TEST(MixerInit, PaperPresetRepeatsKvIntoFlaHeadCounts) {
  torch::manual_seed(3);
  const auto tc = gqa_teacher_config();
  LlamaAttention teacher(tc);
  const std::map<std::string, int64_t> heads = {{"gla", 4}, {"retnet", 8}, {"deltanet", 4}};
  for (const auto& [kind, h] : heads) {
    auto cfg = mixer_preset(parse_mixer_kind(kind), "paper", tc);
    EXPECT_EQ(cfg.num_heads, h) << kind;
    EXPECT_EQ(cfg.kv_heads(), h) << kind;
    auto m = make_mixer(cfg);
    init_mixer_from_teacher(*m, teacher, cfg);
    auto k = m->named_parameters()["k_proj.weight"];
    auto expanded = teacher.k_proj->weight.view({2, 1, 8, 48}).expand({2, 3, 8, 48}).reshape({48, 48});
    EXPECT_TRUE(torch::equal(k, expanded)) << kind;
  }
  // The study's students (paper), its defects left out: KDA's gate multiplies, full rank with bias, dt_bias 0;
  // RetNet's rotary at fla's base; linear attention with short convs and no output norm.
  const auto kda = mixer_preset(MixerKind::kda, "paper", tc);
  EXPECT_EQ(kda.kda_gate_mode, "multiply");
  EXPECT_FALSE(kda.kda_gate_low_rank);
  auto kda_params = make_mixer(kda)->named_parameters();
  ASSERT_NE(kda_params.find("g_proj.weight"), nullptr);
  EXPECT_EQ(kda_params["g_proj.weight"].sizes(), (std::vector<int64_t>{kda.value_dim(), kda.hidden_size}));
  EXPECT_NE(kda_params.find("g_proj.bias"), nullptr);
  EXPECT_EQ(kda_params["dt_bias"].abs().sum().item<double>(), 0.0);
  EXPECT_EQ(mixer_preset(MixerKind::kda, "default", tc).kda_gate_mode, "multiply");
  EXPECT_NE(make_mixer(mixer_preset(MixerKind::kda, "default", tc))->named_parameters().find("g_proj.0.weight"), nullptr);
  EXPECT_EQ(mixer_preset(MixerKind::retnet, "default", tc).rope_theta, 1e5);
  EXPECT_EQ(mixer_preset(MixerKind::retnet, "paper", tc).rope_theta, 1e4);
  const auto la = mixer_preset(MixerKind::linear_attention, "paper", tc);
  EXPECT_TRUE(la.use_short_conv);
  EXPECT_FALSE(la.use_output_norm);
  EXPECT_FALSE(mixer_preset(MixerKind::linear_attention, "default", tc).use_short_conv);
  EXPECT_EQ(mixer_preset(MixerKind::gla, "default", tc).kv_heads(), 2);
  EXPECT_EQ(mixer_preset(MixerKind::deltanet, "default", tc).kv_heads(), 6);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// ---- (d) fla's options against their formulas ------------------------------------------------------------

// GVA: value head i reads q/k head i / (HV / H). The same layer with H = HV heads whose q/k projections
// and convolutions repeat each of the H heads HV / H times in a row gives the same output.
TEST(MixerOptions, ValueHeadsShareKeyHeadsInGroups) {
  torch::manual_seed(4);
  for (const std::string kind : {"gated_deltanet", "kda"}) {
    SCOPED_TRACE(kind);
    auto gva = small_config(kind);
    gva.num_heads = 2, gva.num_v_heads = 4, gva.head_k_dim = gva.head_v_dim = 8;
    auto full = gva;
    full.num_heads = 4, full.num_v_heads = 4;
    auto a = make_mixer(gva), b = make_mixer(full);
    perturb(*a);
    torch::NoGradGuard no_grad;
    auto pb = b->named_parameters();
    for (const auto& item : a->named_parameters()) {
      auto& dst = pb[item.key()];
      const auto& src = item.value();
      const bool qk = item.key().rfind("q_", 0) == 0 || item.key().rfind("k_", 0) == 0;
      if (qk && dst.size(0) != src.size(0)) dst.copy_(repeat_kv_rows(src.flatten(1), 2, 2).view(dst.sizes()));
      else dst.copy_(src);
    }
    auto x = torch::randn({2, 21, gva.hidden_size});
    EXPECT_LE(rel_err(a->forward(x, nullptr), b->forward(x, nullptr)), 1e-5);
  }
  // Value heads must be a multiple of the key heads, and only these two mixers have them.
  auto bad = small_config("gated_deltanet");
  bad.num_v_heads = 6;
  EXPECT_THROW(bad.resolved(), Error);
  auto gla = small_config("gla");
  gla.num_v_heads = 8;
  EXPECT_THROW(gla.resolved(), Error);
}

// fla's DPFPFeatureMap (nu = 4): x' = [relu x, -relu x], features x'_i x'_{(i - j) mod 2D} for j = 1..4.
TEST(MixerOptions, DpfpFeatureMapByItsDefinition) {
  torch::manual_seed(6);
  FeatureMap fm("dpfp", 5);
  auto x = torch::randn({3, 5});
  auto y = fm->forward(x);
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{3, 40}));
  EXPECT_EQ(fm->out_dim(), 40);
  for (int64_t r = 0; r < 3; ++r) {
    std::vector<double> xp(10);
    for (int64_t i = 0; i < 5; ++i) {
      const double v = std::max(0.0f, x[r][i].item<float>());
      xp[i] = v, xp[i + 5] = -v;
    }
    for (int64_t j = 1; j <= 4; ++j)
      for (int64_t i = 0; i < 10; ++i)
        EXPECT_NEAR(y[r][(j - 1) * 10 + i].item<double>(), xp[i] * xp[(i - j + 10) % 10], 1e-6) << r << " " << j << " " << i;
  }
}

// feature_map_norm: o_t = Σ_{u<=t} (q_t . k_u) v_u / Σ_{u<=t} q_t . k_u with φ = elu + 1 (the scale cancels);
// o_proj is the identity and the output norm off, so the layer's output is o itself.
TEST(MixerOptions, FeatureMapNormIsNormalisedAttention) {
  torch::manual_seed(7);
  auto c = small_config("linear_attention");
  c.feature_map = "elu", c.feature_map_norm = true, c.use_output_norm = false;
  auto m = make_mixer(c);
  auto& la = dynamic_cast<LinearAttention&>(*m);
  torch::NoGradGuard no_grad;
  la.o_proj->weight.copy_(torch::eye(c.hidden_size));
  const int64_t T = 19, H = c.num_heads, D = c.hidden_size / H;
  auto x = torch::randn({1, T, c.hidden_size});
  auto y = m->forward(x, nullptr).view({T, H, D});
  auto q = torch::elu(la.q_proj(x)).add(1).view({T, H, D}), k = torch::elu(la.k_proj(x)).add(1).view({T, H, D});
  auto v = la.v_proj(x).view({T, H, D});
  for (int64_t h = 0; h < H; ++h) {
    auto a = torch::mm(q.select(1, h), k.select(1, h).t()).tril();  // [T, T]
    auto want = torch::mm(a, v.select(1, h)) / a.sum(1, true);
    EXPECT_LE(rel_err(y.select(1, h), want), 1e-5) << "head " << h;
  }
}

// fla's bounded KDA gate: g = lower_bound * sigmoid(e^{A_log} (f + dt_bias)) in [lower_bound, 0).
TEST(MixerOptions, LowerBoundGate) {
  torch::manual_seed(8);
  auto f = torch::randn({2, 5, 12}) * 4, dt = torch::randn({12}), A_log = torch::randn({3});
  auto g = ops::lower_bound_decay(f, dt, A_log, -2.5);
  auto want = -2.5 * torch::sigmoid(A_log.exp().repeat_interleave(4) * (f + dt));
  EXPECT_LE(rel_err(g, want), 1e-6);
  EXPECT_GE(g.min().item<double>(), -2.5);
  EXPECT_LT(g.max().item<double>(), 0.0);
  auto c = small_config("kda");
  c.safe_gate = true, c.lower_bound = -6;
  EXPECT_THROW(c.resolved(), Error);  // safe_gate asks -5 <= lower_bound < 0
  c.lower_bound = -5;
  EXPECT_EQ(make_mixer(c)->named_parameters()["A_log"].abs().sum().item<double>(), 0.0);
}

// --mixer-config: any field overridden, head sizes re-derived from a new head count, errors named.
TEST(MixerOptions, Overrides) {
  const auto base = mixer_preset(MixerKind::gated_deltanet, "default", gqa_teacher_config());  // 6 heads of 8
  auto c = base.with_overrides({{"num_heads", 4}, {"use_short_conv", false}});
  EXPECT_EQ(c.num_heads, 4);
  EXPECT_EQ(c.head_k_dim, 12);  // 48 / 4
  EXPECT_EQ(c.num_v_heads, 4);
  EXPECT_FALSE(c.use_short_conv);
  EXPECT_EQ(base.with_overrides({{"num_heads", 4}, {"head_k_dim", 16}}).head_k_dim, 16);
  auto msg = error_of([&] { base.with_overrides({{"num_head", 4}}); });
  EXPECT_NE(msg.find("unknown key 'num_head'"), std::string::npos) << msg;
  msg = error_of([&] { base.with_overrides({{"kind", "gla"}}); });
  EXPECT_NE(msg.find("'kind'"), std::string::npos) << msg;
  msg = error_of([&] { base.with_overrides({{"conv_size", "four"}}); });
  EXPECT_NE(msg.find("'conv_size'"), std::string::npos) << msg;
  msg = error_of([&] { base.with_overrides({{"norm_q", true}}); });
  EXPECT_NE(msg.find("only available for linear_attention"), std::string::npos) << msg;
}

// ---- (e) config errors -----------------------------------------------------------------------------

TEST(MixerConfigErrors, UnknownKeyKindPreset) {
  nlohmann::json j = {{"kind", "gla"}, {"hidden_size", 32}, {"num_heads", 4}, {"gate_lowrank_dim", 8}};
  auto msg = error_of([&] { MixerConfig::from_json(j); });
  EXPECT_NE(msg.find("unknown key 'gate_lowrank_dim'"), std::string::npos) << msg;

  msg = error_of([&] { MixerConfig::from_json({{"kind", "mamba"}, {"hidden_size", 32}}); });
  EXPECT_NE(msg.find("'mamba'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("gated_deltanet"), std::string::npos) << msg;

  msg = error_of([&] { mixer_preset(MixerKind::gla, "fast", gqa_teacher_config()); });
  EXPECT_NE(msg.find("default, paper"), std::string::npos) << msg;
  msg = error_of([&] { parse_mixer_kind("s4", "--mixer"); });
  EXPECT_NE(msg.find("--mixer 's4'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("linear_attention, retnet, gla, deltanet, gated_deltanet, kda, mlstm"), std::string::npos) << msg;

  msg = error_of([&] { MixerConfig::from_json({{"kind", "deltanet"}, {"hidden_size", 32}, {"num_heads", 4}, {"num_kv_heads", 2}}); });
  EXPECT_NE(msg.find("num_kv_heads"), std::string::npos) << msg;
  msg = error_of([&] { MixerConfig::from_json({{"kind", "gla"}, {"hidden_size", "32"}}); });
  EXPECT_NE(msg.find("'hidden_size'"), std::string::npos) << msg;
}

TEST(MixerConfigErrors, JsonRoundTrip) {
  for (const auto& kind : mixer_kinds()) {
    auto c = mixer_preset(parse_mixer_kind(kind), "paper", gqa_teacher_config());
    auto back = MixerConfig::from_json(c.to_json());
    EXPECT_EQ(back.to_json(), c.to_json()) << kind;
  }
}

}  // namespace
}  // namespace linearize
