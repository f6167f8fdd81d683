// `linearize export --format fla`: the folder written for flash-linear-attention's model classes holds
// exactly the parameter names and shapes fla's models of the six mixers it has create from the
// written config.json (fla 0.5.2's formulas, restated here), and what fla cannot express is refused.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "io/atomic_file.h"
#include "io/error.h"
#include "io/safetensors.h"
#include "model/fla_export.h"
#include "model/model_io.h"
#include "model/student.h"
#include "test_util.h"
#include "train_fixtures.h"

using namespace linearize;
using nlohmann::json;
using Shapes = std::map<std::string, std::vector<int64_t>>;

namespace {

LlamaConfig teacher_config(bool qwen2 = false, double rope_theta = 1e4) {
  auto c = test::small_llama(97, 64, 2, 4, 2, 128);
  c.rope_theta = rope_theta;
  c.eos_token_ids = {0};
  c.rms_norm_eps = 1e-5;
  if (qwen2) c.architecture = Architecture::qwen2, c.qkv_bias = true;
  return c;
}

std::string student_folder(const std::string& name, MixerKind kind, std::vector<int64_t> layers = {}, bool qwen2 = false,
                           double rope_theta = 1e4, const std::string& preset = "default") {
  torch::manual_seed(4);
  CausalLM teacher(teacher_config(qwen2, rope_theta));
  init_weights_normal(*teacher, 0.1);
  auto spec = StudentSpec::make(kind, preset, layers, teacher->config);
  auto student = build_student(teacher, spec);
  const std::string dir = test::fresh_dir("fla_export", name);
  save_student(student, spec, dir, "");
  return dir;
}

// What fla's model builds from config.json (fla/models/<name>/modeling_*.py and fla/layers/*.py).
Shapes fla_shapes(const json& j) {
  const int64_t H = j["hidden_size"], L = j["num_hidden_layers"], I = j["intermediate_size"], V = j["vocab_size"];
  const int64_t heads = j["num_heads"], K = j.value("conv_size", int64_t{4});
  Shapes s = {{"model.embeddings.weight", {V, H}}, {"model.norm.weight", {H}}};
  if (!j["tie_word_embeddings"].get<bool>()) s["lm_head.weight"] = {V, H};
  for (int64_t i = 0; i < L; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    s[p + "attn_norm.weight"] = {H};
    s[p + "mlp_norm.weight"] = {H};
    s[p + "mlp.gate_proj.weight"] = {I, H};
    s[p + "mlp.up_proj.weight"] = {I, H};
    s[p + "mlp.down_proj.weight"] = {H, I};
    const std::string a = p + "attn.";
    const json& spec = j["attn"];
    if (!spec.is_null() && std::count(spec["layers"].begin(), spec["layers"].end(), json(i))) {
      // fla/layers/attn.py Attention: head_dim = hidden / num_heads; biases on q, k, v when qkv_bias.
      const int64_t nh = spec["num_heads"], kv = spec["num_kv_heads"].get<int64_t>() * (H / nh);
      s[a + "q_proj.weight"] = {H, H};
      s[a + "k_proj.weight"] = {kv, H};
      s[a + "v_proj.weight"] = {kv, H};
      s[a + "o_proj.weight"] = {H, H};
      if (spec["qkv_bias"].get<bool>()) s[a + "q_proj.bias"] = {H}, s[a + "k_proj.bias"] = {kv}, s[a + "v_proj.bias"] = {kv};
      continue;
    }
    auto convs = [&](int64_t q, int64_t k, int64_t v) {  // depthwise, [C, 1, K], no bias
      s[a + "q_conv1d.weight"] = {q, 1, K};
      s[a + "k_conv1d.weight"] = {k, 1, K};
      s[a + "v_conv1d.weight"] = {v, 1, K};
    };
    if (j["model_type"] == "kda") {
      const int64_t dk = j["head_dim"], dv = static_cast<int64_t>(dk * j["expand_v"].get<double>());
      const int64_t hv = j["num_v_heads"], key = heads * dk, value = hv * dv, gate = hv * dk;
      s[a + "q_proj.weight"] = {key, H};
      s[a + "k_proj.weight"] = {key, H};
      s[a + "v_proj.weight"] = {value, H};
      if (j["use_short_conv"].get<bool>()) convs(key, key, value);
      s[a + "f_proj.0.weight"] = {dv, H};
      s[a + "f_proj.1.weight"] = {gate, dv};
      s[a + "b_proj.weight"] = {hv, H};
      s[a + "A_log"] = {hv};
      s[a + "dt_bias"] = {gate};
      s[a + "g_proj.0.weight"] = {dv, H};
      s[a + "g_proj.1.weight"] = {value, dv};
      s[a + "g_proj.1.bias"] = {value};
      s[a + "o_norm.weight"] = {dv};
      s[a + "o_proj.weight"] = {H, value};
    } else if (j["model_type"] == "linear_attn") {
      const int64_t key = static_cast<int64_t>(H * j["expand_k"].get<double>());
      const int64_t value = static_cast<int64_t>(H * j["expand_v"].get<double>());
      const int64_t groups = heads / j["num_kv_heads"].get<int64_t>(), dk = key / heads, dv = value / heads;
      s[a + "q_proj.weight"] = {key, H};
      s[a + "k_proj.weight"] = {key / groups, H};
      s[a + "v_proj.weight"] = {value / groups, H};
      for (const char* f : {"feature_map_q", "feature_map_k"})  // elementwise_product: two dk x dk layers
        for (const char* l : {"layer1", "layer2"}) {
          s[a + f + "." + l + ".weight"] = {dk, dk};
          s[a + f + "." + l + ".bias"] = {dk};
        }
      s[a + "norm.weight"] = {dv};
      s[a + "o_proj.weight"] = {H, value};
    } else if (j["model_type"] == "gated_deltanet") {
      const int64_t dk = j["head_dim"], dv = static_cast<int64_t>(dk * j["expand_v"].get<double>());
      const int64_t hv = j["num_v_heads"], key = heads * dk, value = hv * dv;
      s[a + "q_proj.weight"] = {key, H};
      s[a + "k_proj.weight"] = {key, H};
      s[a + "v_proj.weight"] = {value, H};
      s[a + "a_proj.weight"] = {hv, H};
      s[a + "b_proj.weight"] = {hv, H};
      s[a + "A_log"] = {hv};
      s[a + "dt_bias"] = {hv};
      if (j["use_short_conv"].get<bool>()) convs(key, key, value);
      if (j["use_gate"].get<bool>()) s[a + "g_proj.weight"] = {value, H};
      s[a + "o_norm.weight"] = {dv};
      s[a + "o_proj.weight"] = {H, value};
    } else if (j["model_type"] == "delta_net") {
      const int64_t key = static_cast<int64_t>(H * j["expand_k"].get<double>());
      const int64_t value = static_cast<int64_t>(H * j["expand_v"].get<double>()), dv = value / heads;
      s[a + "q_proj.weight"] = {key, H};
      s[a + "k_proj.weight"] = {key, H};
      s[a + "v_proj.weight"] = {value, H};
      if (j["use_beta"].get<bool>()) s[a + "b_proj.weight"] = {heads, H};
      if (j["use_short_conv"].get<bool>()) convs(key, key, value);
      if (j["use_gate"].get<bool>()) s[a + "g_proj.weight"] = {value, H};
      s[a + "o_norm.weight"] = {dv};
      s[a + "o_proj.weight"] = {H, value};
    } else {  // gla, retnet
      const bool gla = j["model_type"] == "gla";
      const int64_t key = static_cast<int64_t>(H * j["expand_k"].get<double>());
      const int64_t value = static_cast<int64_t>(H * j["expand_v"].get<double>());
      const int64_t groups = heads / j["num_kv_heads"].get<int64_t>();
      const int64_t key_g = key / groups, value_g = value / groups, dv = value / heads;
      s[a + "q_proj.weight"] = {key, H};
      s[a + "k_proj.weight"] = {key_g, H};
      s[a + "v_proj.weight"] = {value_g, H};
      if (gla && j["use_short_conv"].get<bool>()) convs(key, key_g, value_g);  // RetNet's model never builds them
      if (gla) {
        s[a + "gk_proj.0.weight"] = {16, H};
        s[a + "gk_proj.1.weight"] = {key_g, 16};
        s[a + "gk_proj.1.bias"] = {key_g};
      }
      const bool gate = j["use_output_gate"].get<bool>();
      if (gate) s[a + "g_proj.weight"] = {value, H};
      s[a + (gate ? "g_norm_swish_gate.weight" : "g_norm.weight")] = {dv};
      s[a + "o_proj.weight"] = {H, value};
    }
  }
  return s;
}

// The names and shapes an exported folder holds.
Shapes shapes_in(const WeightStore& store) {
  Shapes got;
  for (const auto& n : store.names()) got[n] = store.info(n).shape;
  return got;
}

// Why a student cannot be exported ("(exported)" when it can).
std::string refusal_of(const std::string& dir) {
  try {
    fla_config(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "(exported)";
}

}  // namespace

TEST(FlaExport, NamesAndShapesAreWhatFlaBuildsFromTheConfig) {
  for (MixerKind kind : {MixerKind::gated_deltanet, MixerKind::gla, MixerKind::deltanet, MixerKind::retnet,
                         MixerKind::kda, MixerKind::linear_attention}) {
    SCOPED_TRACE(to_string(kind));
    const std::string dir = student_folder(to_string(kind), kind);
    const std::string out = test::fresh_dir("fla_export", to_string(kind) + "_fla");
    export_fla(dir, out);
    const auto j = json::parse(std::ifstream(out + "/config.json"));
    const std::map<MixerKind, std::string> type = {{MixerKind::gated_deltanet, "gated_deltanet"}, {MixerKind::gla, "gla"},
                                                   {MixerKind::deltanet, "delta_net"}, {MixerKind::retnet, "retnet"},
                                                   {MixerKind::kda, "kda"}, {MixerKind::linear_attention, "linear_attn"}};
    EXPECT_EQ(j["model_type"], type.at(kind));
    EXPECT_EQ(j["hidden_act"], "swish");
    EXPECT_EQ(j["norm_eps"], 1e-5);
    WeightStore store(out);
    EXPECT_EQ(shapes_in(store), fla_shapes(j));
    // The tensors themselves: the teacher's embedding under fla's name, the mixer's own as they were.
    WeightStore ours(dir);
    EXPECT_TRUE(torch::equal(store.get("model.embeddings.weight"), ours.get("model.embed_tokens.weight")));
    EXPECT_TRUE(torch::equal(store.get("model.layers.1.attn.q_proj.weight"), ours.get("model.layers.1.attn.q_proj.weight")));
    EXPECT_TRUE(torch::equal(store.get("model.layers.0.mlp_norm.weight"),
                             ours.get("model.layers.0.post_attention_layernorm.weight")));
  }
}

TEST(FlaExport, WhatFlaCannotExpressIsRefused) {
  EXPECT_NE(refusal_of(student_folder("mlstm", MixerKind::mlstm)).find("fla has no mLSTM"), std::string::npos);

  EXPECT_NE(refusal_of(student_folder("retnet_base", MixerKind::retnet, {}, false, 5e5)).find("base 10000"), std::string::npos);
  // The paper preset's KDA gate is full rank and its linear attention has short convolutions.
  EXPECT_NE(refusal_of(student_folder("kda_paper", MixerKind::kda, {}, false, 1e4, "paper")).find("full rank"),
            std::string::npos);
  EXPECT_NE(refusal_of(student_folder("la_paper", MixerKind::linear_attention, {}, false, 1e4, "paper"))
                .find("short convolutions"),
            std::string::npos);
  EXPECT_NE(refusal_of(student_folder("biased", MixerKind::gated_deltanet, {}, true)).find("biases"), std::string::npos);
  CausalLM teacher(teacher_config());
  const std::string teacher_dir = test::fresh_dir("fla_export", "teacher");
  save_model(teacher, teacher_dir);
  EXPECT_NE(refusal_of(teacher_dir).find("not a linearized student"), std::string::npos);
}

TEST(FlaExport, ImportingAnExportGivesTheSameModel) {
  for (MixerKind kind : all_mixer_kinds()) {
    if (kind == MixerKind::mlstm) continue;
    SCOPED_TRACE(to_string(kind));
    const std::string dir = student_folder(to_string(kind) + "_rt", kind);
    const std::string fla = test::fresh_dir("fla_export", to_string(kind) + "_rt_fla");
    const std::string back = test::fresh_dir("fla_export", to_string(kind) + "_rt_back");
    export_fla(dir, fla);
    import_fla(fla, back);
    auto a = load_model(dir), b = load_model(back);
    auto ours = a->config.raw["linearize"]["mixer_config"], theirs = b->config.raw["linearize"]["mixer_config"];
    ours.erase("qk_norm_eps"), theirs.erase("qk_norm_eps");  // unused without qk_norm (fla has none)
    EXPECT_EQ(theirs, ours);
    torch::NoGradGuard ng;
    auto ids = torch::randint(0, 97, {2, 21}, torch::kLong);
    EXPECT_LT(test::rel_err(b->forward(ids), a->forward(ids)), 1e-6);
  }
}

// `export --reference-logits N`: seeded ids and our logits for them beside the export, for checking the
// load where fla runs (scripts/check_fla_export.py); bad counts are refused before anything is written.
TEST(FlaExport, ReferenceLogitsAreTheStudentsOwn) {
  const std::string dir = student_folder("ref_logits", MixerKind::gated_deltanet);
  const std::string out = test::fresh_dir("fla_export", "ref_logits_out");
  remove_tree(out);
  auto r = test::run_tool("export --format fla --reference-logits 17 " + dir + " " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  const WeightStore store(out + "/reference_logits.safetensors");
  const auto ids = store.get("input_ids"), logits = store.get("logits");
  ASSERT_EQ(ids.sizes(), (std::vector<int64_t>{2, 17}));
  auto model = load_model(dir);
  ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{2, 17, model->config.vocab_size}));
  EXPECT_GE(ids.min().item<int64_t>(), 0);
  EXPECT_LT(ids.max().item<int64_t>(), model->config.vocab_size);
  torch::NoGradGuard ng;
  EXPECT_LT(test::rel_err(logits, model->forward(ids)), 1e-6);
  const std::string bad = test::fresh_dir("fla_export", "ref_logits_bad");
  remove_tree(bad);
  r = test::run_tool("export --format fla --reference-logits -3 " + dir + " " + bad);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--reference-logits"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(bad));
}

// Hybrids: the softmax layers a hybrid keeps become fla's `attn` spec and its names; a round trip through
// import gives the same model, for a Llama teacher and a Mistral one with a window; what fla's Attention
// cannot hold is refused.
TEST(FlaExport, HybridsKeepTheirSoftmaxLayersAsFlasAttn) {
  for (const bool mistral : {false, true}) {
    SCOPED_TRACE(mistral ? "mistral" : "llama");
    torch::manual_seed(5);
    auto c = teacher_config(false, 5e5);
    if (mistral) c.architecture = Architecture::mistral, c.sliding_window = 7, c.raw["architectures"] = {"MistralForCausalLM"};
    CausalLM teacher(c);
    init_weights_normal(*teacher, 0.1);
    auto spec = StudentSpec::make(MixerKind::gated_deltanet, "default", {1}, teacher->config);
    auto student = build_student(teacher, spec);
    const std::string dir = test::fresh_dir("fla_export", mistral ? "hybrid_mistral" : "hybrid");
    save_student(student, spec, dir, "");
    const std::string out = dir + "_fla", back = dir + "_back";
    remove_tree(out), remove_tree(back);
    export_fla(dir, out);
    const auto j = json::parse(std::ifstream(out + "/config.json"));
    const json attn = {{"layers", {0}}, {"num_heads", 4}, {"num_kv_heads", 2}, {"qkv_bias", false},
                       {"window_size", mistral ? json(7) : json()}, {"rope_theta", 5e5}};
    EXPECT_EQ(j["attn"], attn);
    WeightStore store(out);
    EXPECT_EQ(shapes_in(store), fla_shapes(j));
    WeightStore ours(dir);
    EXPECT_TRUE(torch::equal(store.get("model.layers.0.attn.k_proj.weight"), ours.get("model.layers.0.self_attn.k_proj.weight")));
    import_fla(out, back);
    auto a = load_model(dir), b = load_model(back);
    EXPECT_EQ(b->config.sliding_window, mistral ? 7 : 0);
    EXPECT_EQ(b->config.rope_theta, 5e5);
    EXPECT_EQ(b->config.raw["linearize"]["layers"], json({1}));
    torch::NoGradGuard ng;
    auto ids = torch::randint(0, 97, {2, 21}, torch::kLong);  // longer than the window
    EXPECT_LT(test::rel_err(b->forward(ids), a->forward(ids)), 1e-6);
  }
  // A head_dim other than hidden / heads (as Qwen3 allows) cannot be fla's Attention.
  auto c = teacher_config(false, 1e4);
  c.head_dim = 32;  // 4 x 32 = 128 != hidden 64
  CausalLM teacher(c);
  auto spec = StudentSpec::make(MixerKind::deltanet, "default", {0}, teacher->config);
  auto student = build_student(teacher, spec);
  const std::string dir = test::fresh_dir("fla_export", "hybrid_wide_heads");
  save_student(student, spec, dir, "");
  const std::string why = refusal_of(dir);  // head_dim 32 x 4 heads over hidden 64
  EXPECT_NE(why.find("head_dim"), std::string::npos) << why;
  EXPECT_NE(why.find("fla's hybrid attention derives head_dim"), std::string::npos) << why;
}
