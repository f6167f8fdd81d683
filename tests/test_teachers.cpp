// The Llama family's other members as teachers: Qwen2 (biases on q, k, v), Qwen3 (per-head q/k norms,
// explicit head_dim) and Mistral (sliding-window attention). Their config.json fields; one attention
// layer of each against a plain-torch reference written from the transformers definitions; decoding
// through the KV cache against the full forward (across the window); packed rows; batched decoding of
// rows at different positions; a save/load round trip; and students carrying Qwen2's biases and Qwen3's
// q/k norms.
#include <gtest/gtest.h>

#include <fstream>
#include <limits>

#include "io/error.h"
#include "io/hf_config.h"
#include "model/causal_lm.h"
#include "model/llama.h"
#include "model/model_io.h"
#include "model/mixers/blocks.h"
#include "model/mixers/factory.h"
#include "model/mixers/gla.h"
#include "model/mixers/mlstm.h"
#include "model/student.h"
#include "serve/batched_decode.h"
#include "test_util.h"
#include "train_fixtures.h"

using namespace linearize;
using nlohmann::json;

namespace {

json config_json(const std::string& arch, const std::string& model_type) {
  return {{"architectures", {arch}}, {"model_type", model_type}, {"vocab_size", 97}, {"hidden_size", 48},
          {"intermediate_size", 64}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
          {"num_key_value_heads", 2}, {"rms_norm_eps", 1e-6}, {"rope_theta", 1e4}, {"max_position_embeddings", 256}};
}

LlamaConfig config_of(const std::string& which) {
  json j = which == "qwen2"   ? config_json("Qwen2ForCausalLM", "qwen2")
           : which == "qwen3" ? config_json("Qwen3ForCausalLM", "qwen3")
           : which == "mistral" ? config_json("MistralForCausalLM", "mistral")
                                : config_json("LlamaForCausalLM", "llama");
  if (which == "qwen3") j["head_dim"] = 16;  // 4 x 16 = 64, wider than hidden 48, as Qwen3 allows
  if (which == "mistral") j["sliding_window"] = 5;
  return LlamaConfig::from_json(j, which);
}

CausalLM random_model(const LlamaConfig& c, uint64_t seed) {
  torch::manual_seed(seed);
  CausalLM m(c);
  init_weights_normal(*m, 0.3);
  torch::NoGradGuard ng;
  for (auto& p : m->named_parameters(true))  // norms and biases away from their starting values
    if (p.key().find("norm") != std::string::npos || p.key().find("bias") != std::string::npos)
      p.value().copy_(1.0 + 0.3 * torch::randn_like(p.value()));
  m->eval();
  return m;
}

// One attention layer as transformers writes it: projections (with biases), Qwen3's RMSNorm per head,
// RoPE, scores with a causal (and sliding-window) mask, softmax, values, o_proj.
torch::Tensor reference_attention(const LlamaAttention& a, const LlamaConfig& c, const torch::Tensor& x) {
  const auto B = x.size(0), T = x.size(1), H = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
  auto lin = [](const torch::nn::Linear& l, const torch::Tensor& in) {
    auto y = torch::matmul(in, l->weight.t());
    return l->bias.defined() ? y + l->bias : y;
  };
  auto norm = [&](const torch::Tensor& t, const RMSNorm& n) {
    return t * torch::rsqrt(t.pow(2).mean(-1, true) + c.rms_norm_eps) * n->weight;
  };
  auto q = lin(a.q_proj, x).view({B, T, H, D}), k = lin(a.k_proj, x).view({B, T, Hkv, D});
  auto v = lin(a.v_proj, x).view({B, T, Hkv, D}).transpose(1, 2);
  if (c.qk_norm) q = norm(q, a.q_norm), k = norm(k, a.k_norm);
  const Rotary rope(D, c.rope_theta, c.rope_scaling);
  auto pos = torch::arange(T).unsqueeze(0).expand({B, T});
  q = rope.apply_at(q.transpose(1, 2), pos);
  k = repeat_kv(rope.apply_at(k.transpose(1, 2), pos), H / Hkv);
  v = repeat_kv(v, H / Hkv);
  auto scores = torch::matmul(q, k.transpose(2, 3)) / std::sqrt(static_cast<double>(D));  // [B,H,T,T]
  auto i = torch::arange(T).unsqueeze(1), j = torch::arange(T).unsqueeze(0);
  auto seen = j.le(i);
  if (c.sliding_window > 0) seen = seen.logical_and(i - j < c.sliding_window);
  scores = scores.masked_fill(seen.logical_not(), -std::numeric_limits<float>::infinity());
  auto o = torch::matmul(torch::softmax(scores, -1), v);  // [B,H,T,D]
  return lin(a.o_proj, o.transpose(1, 2).reshape({B, T, H * D}));
}

}  // namespace

TEST(Teachers, ConfigFieldsOfEachArchitecture) {
  auto qwen2 = config_of("qwen2"), qwen3 = config_of("qwen3"), mistral = config_of("mistral"), llama = config_of("llama");
  EXPECT_EQ(qwen2.architecture, Architecture::qwen2);
  EXPECT_TRUE(qwen2.qkv_bias);
  EXPECT_FALSE(qwen2.o_bias || qwen2.qk_norm || qwen2.sliding_window);
  EXPECT_TRUE(qwen3.qk_norm);
  EXPECT_EQ(qwen3.head_dim, 16);
  EXPECT_FALSE(qwen3.qkv_bias || qwen3.o_bias);
  EXPECT_EQ(mistral.sliding_window, 5);
  EXPECT_FALSE(llama.qkv_bias || llama.qk_norm || llama.sliding_window);
  auto j = config_json("LlamaForCausalLM", "llama");
  j["attention_bias"] = true;
  auto biased = LlamaConfig::from_json(j, "x");
  EXPECT_TRUE(biased.qkv_bias && biased.o_bias);
  j = config_json("MistralForCausalLM", "mistral");
  j["sliding_window"] = nullptr;
  EXPECT_EQ(LlamaConfig::from_json(j, "x").sliding_window, 0);
  // to_json and back keeps the member and its fields.
  for (const auto& c : {qwen2, qwen3, mistral, llama}) {
    auto back = LlamaConfig::from_json(c.to_json(), "round trip");
    EXPECT_EQ(back.architecture, c.architecture);
    EXPECT_EQ(back.qkv_bias, c.qkv_bias);
    EXPECT_EQ(back.o_bias, c.o_bias);
    EXPECT_EQ(back.qk_norm, c.qk_norm);
    EXPECT_EQ(back.sliding_window, c.sliding_window);
    EXPECT_EQ(back.head_dim, c.head_dim);
  }
  // Refusals name what was found and what is supported.
  auto error_of = [](const json& j) {
    try {
      LlamaConfig::from_json(j, "cfg.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  auto msg = error_of(config_json("GPT2LMHeadModel", "gpt2"));
  EXPECT_NE(msg.find("GPT2LMHeadModel"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Qwen3ForCausalLM"), std::string::npos) << msg;
  j = config_json("Qwen2ForCausalLM", "qwen2");
  j["use_sliding_window"] = true;
  EXPECT_NE(error_of(j).find("use_sliding_window"), std::string::npos);
}

TEST(Teachers, AttentionMatchesTheTransformersDefinition) {
  for (const std::string which : {"qwen2", "qwen3", "mistral"}) {
    SCOPED_TRACE(which);
    const auto c = config_of(which);
    auto model = random_model(c, 3);
    auto* attn = dynamic_cast<LlamaAttention*>(model->layer(0)->mixer.get());
    ASSERT_NE(attn, nullptr);
    EXPECT_EQ(attn->q_proj->bias.defined(), c.qkv_bias);
    EXPECT_EQ(attn->o_proj->bias.defined(), c.o_bias);
    EXPECT_EQ(static_cast<bool>(attn->q_norm), c.qk_norm);
    torch::NoGradGuard ng;
    auto x = torch::randn({2, 11, c.hidden_size});
    EXPECT_LT(test::rel_err(attn->forward(x, nullptr), reference_attention(*attn, c, x)), 1e-5);
  }
  // Qwen2 with its biases at zero is the Llama model with the same weights.
  auto qwen2 = random_model(config_of("qwen2"), 4);
  auto llama = random_model(config_of("llama"), 5);
  torch::NoGradGuard ng;
  auto theirs = llama->named_parameters(true);
  for (auto& p : qwen2->named_parameters(true)) {
    if (p.key().find("bias") != std::string::npos) p.value().zero_();
    else p.value().copy_(*theirs.find(p.key()));
  }
  auto ids = torch::randint(0, 97, {2, 9}, torch::kLong);
  EXPECT_LT(test::rel_err(qwen2->forward(ids), llama->forward(ids)), 1e-6);
}

TEST(Teachers, DecodingPackingAndBatchingAgreeWithTheFullForward) {
  for (const std::string which : {"qwen2", "qwen3", "mistral"}) {
    SCOPED_TRACE(which);
    auto model = random_model(config_of(which), 6);
    torch::NoGradGuard ng;
    auto ids = torch::randint(0, 97, {2, 14}, torch::kLong);  // longer than Mistral's window of 5
    auto full = model->forward(ids);
    ModelState st = model->new_state();
    std::vector<torch::Tensor> parts = {model->forward(ids.narrow(1, 0, 3), &st)};
    for (int64_t t = 3; t < 14; ++t) parts.push_back(model->forward(ids.narrow(1, t, 1), &st));
    EXPECT_LT(test::rel_err(torch::cat(parts, 1), full), 1e-5) << "decode";
    // Two documents in one row give what each gives alone.
    auto row = torch::cat({ids[0].narrow(0, 0, 8), ids[1].narrow(0, 0, 6)}).unsqueeze(0);
    PackedRows rows{{{0, 8}}};
    auto packed = torch::matmul(model->hidden_states_packed(row, rows), model->lm_head_weight().t());
    EXPECT_LT(test::rel_err(packed.narrow(1, 0, 8), model->forward(ids[0].narrow(0, 0, 8).unsqueeze(0))), 1e-5);
    EXPECT_LT(test::rel_err(packed.narrow(1, 8, 6), model->forward(ids[1].narrow(0, 0, 6).unsqueeze(0))), 1e-5);
    // Rows at different positions decoded in one batch (serve): each as it is alone.
    std::vector<ModelState> together, alone;
    for (int64_t len : {9, 2}) {
      together.push_back(model->new_state());
      model->forward(ids[0].narrow(0, 0, len).unsqueeze(0), &together.back());
      alone.push_back(together.back());
    }
    auto batched = decode_rows(model, {{&together[0], 7}, {&together[1], 8}});
    auto a = model->forward(torch::full({1, 1}, 7, torch::kLong), &alone[0]).select(1, -1)[0];
    auto b = model->forward(torch::full({1, 1}, 8, torch::kLong), &alone[1]).select(1, -1)[0];
    EXPECT_LT(test::rel_err(batched[0], a), 1e-5);
    EXPECT_LT(test::rel_err(batched[1], b), 1e-5);
  }
}

TEST(Teachers, SavedFoldersLoadBackAndStudentsCarryBiasesAndNorms) {
  for (const std::string which : {"qwen2", "qwen3", "mistral"}) {
    SCOPED_TRACE(which);
    auto model = random_model(config_of(which), 8);
    const std::string dir = test::fresh_dir("teachers", which);
    save_model(model, dir);
    auto back = load_model(dir);
    EXPECT_EQ(back->config.architecture, model->config.architecture);
    auto written = json::parse(std::ifstream(dir + "/config.json"));
    EXPECT_EQ(written["model_type"], model_type_of(model->config.architecture));
    torch::NoGradGuard ng;
    auto ids = torch::randint(0, 97, {1, 12}, torch::kLong);
    EXPECT_LT(test::rel_err(back->forward(ids), model->forward(ids)), 1e-6);
    if (which == "mistral") {
      auto student = build_student(model, StudentSpec::make(MixerKind::gla, "default", {}, model->config));
      EXPECT_EQ(student->forward(ids).size(2), 97);
    } else if (which == "qwen3") {
      // Every mixer takes the per-head q/k norms: its normed q projection is the teacher's, and a saved
      // student loads back to the same logits.
      auto* teacher_attn = dynamic_cast<LlamaAttention*>(model->layer(0)->mixer.get());
      auto x = torch::randn({1, 5, model->config.hidden_size});
      const auto H = model->config.num_attention_heads, D = model->config.head_dim;
      auto teacher_q = teacher_attn->q_norm(teacher_attn->q_proj(x).view({1, 5, H, D})).view({1, 5, H * D});
      for (MixerKind kind : all_mixer_kinds()) {
        SCOPED_TRACE(to_string(kind));
        auto spec = StudentSpec::make(kind, "default", {}, model->config);
        EXPECT_TRUE(spec.mixer_config.qk_norm);
        EXPECT_EQ(spec.mixer_config.qk_norm_eps, model->config.rms_norm_eps);
        std::vector<std::string> notes;
        auto student = build_student(model, spec, &notes);
        auto params = student->named_parameters(true);
        const auto* qn = params.find("model.layers.0.attn.q_norm.weight");
        const auto* kn = params.find("model.layers.0.attn.k_norm.weight");
        ASSERT_TRUE(qn && kn);
        EXPECT_TRUE(torch::equal(*qn, teacher_attn->q_norm->weight));
        EXPECT_TRUE(torch::equal(*kn, teacher_attn->k_norm->weight));
        auto* mixer = student->layer(0)->mixer.get();
        torch::nn::Linear proj = kind == MixerKind::mlstm ? dynamic_cast<MLSTM*>(mixer)->q
                                 : kind == MixerKind::gla ? dynamic_cast<GLA*>(mixer)->q_proj
                                                          : torch::nn::Linear(nullptr);
        RMSNorm norm = kind == MixerKind::mlstm ? dynamic_cast<MLSTM*>(mixer)->q_norm
                       : kind == MixerKind::gla ? dynamic_cast<GLA*>(mixer)->q_norm
                                                : RMSNorm(nullptr);
        if (proj) {
          EXPECT_LT(test::rel_err(mixers::head_norm(norm, proj(x)), teacher_q), 1e-6);
        }
        const std::string sdir = test::fresh_dir("teachers", "qwen3_" + to_string(kind));
        save_student(student, spec, sdir, "");
        EXPECT_LT(test::rel_err(load_model(sdir)->forward(ids), student->forward(ids)), 1e-6);
      }
    } else if (which == "qwen2") {
      // Every mixer takes the q, k, v biases with the weights (k, v repeated over the KV groups where the
      // mixer has no grouped heads), and a saved student loads back to the same logits.
      const auto* teacher_attn = dynamic_cast<const LlamaAttention*>(model->layer(0)->mixer.get());
      for (MixerKind kind : all_mixer_kinds()) {
        SCOPED_TRACE(to_string(kind));
        auto spec = StudentSpec::make(kind, "default", {}, model->config);
        EXPECT_TRUE(spec.mixer_config.qkv_bias);
        EXPECT_FALSE(spec.mixer_config.o_bias);
        auto student = build_student(model, spec);
        auto params = student->named_parameters(true);
        const std::string q = kind == MixerKind::mlstm ? "q" : "q_proj", k = kind == MixerKind::mlstm ? "k" : "k_proj";
        const auto* qb = params.find("model.layers.0.attn." + q + ".bias");
        const auto* kb = params.find("model.layers.0.attn." + k + ".bias");
        ASSERT_TRUE(qb && kb);
        EXPECT_TRUE(torch::equal(*qb, teacher_attn->q_proj->bias));
        const auto groups = kb->size(0) / teacher_attn->k_proj->bias.size(0);
        EXPECT_TRUE(torch::equal(*kb, repeat_kv_rows(teacher_attn->k_proj->bias.unsqueeze(1), 2, groups).squeeze(1)));
        const std::string sdir = test::fresh_dir("teachers", "qwen2_" + to_string(kind));
        save_student(student, spec, sdir, "");
        EXPECT_LT(test::rel_err(load_model(sdir)->forward(ids), student->forward(ids)), 1e-6);
      }
    }
  }
}
