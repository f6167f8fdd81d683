// config.json parsing: both RoPE layouts, derived head_dim, scaling types, and errors for missing
// fields and unknown RoPE types.
#include "io/error.h"
#include "io/hf_config.h"
#include "model/llama.h"
#include "test_util.h"

using namespace linearize;
using json = nlohmann::json;

namespace {
json smollm2_135m() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
    "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
    "num_key_value_heads": 3, "rms_norm_eps": 1e-05, "rope_theta": 100000, "rope_scaling": null,
    "max_position_embeddings": 8192, "vocab_size": 49152, "tie_word_embeddings": true,
    "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "silu", "torch_dtype": "bfloat16"})");
}
std::string error_of(const json& j) {
  try {
    LlamaConfig::from_json(j, "cfg.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(HfConfig, SmolLM2Loads) {
  auto c = LlamaConfig::from_json(smollm2_135m(), "cfg.json");
  EXPECT_EQ(c.head_dim, 64);  // derived: 576 / 9
  EXPECT_EQ(c.kv_groups(), 3);
  EXPECT_DOUBLE_EQ(c.rope_theta, 100000.0);
  EXPECT_EQ(c.rope_scaling.type, "default");
  EXPECT_TRUE(c.tie_word_embeddings);
  ASSERT_EQ(c.eos_token_ids.size(), 1u);
  EXPECT_EQ(c.eos_token_ids[0], 0);
  // 134.5M parameters with tied embeddings (SmolLM2-135M).
  EXPECT_NEAR(c.parameter_count() / 1e6, 134.5, 0.1);
}

TEST(HfConfig, RopeParametersLayout) {
  auto j = smollm2_135m();
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_theta", 130000.0}, {"rope_type", "default"}};
  j["eos_token_id"] = json::array({2, 0});
  auto c = LlamaConfig::from_json(j, "cfg.json");
  EXPECT_DOUBLE_EQ(c.rope_theta, 130000.0);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{2, 0}));
  // Round trip through to_json (transformers-4 layout).
  auto c2 = LlamaConfig::from_json(c.to_json(), "cfg2.json");
  EXPECT_DOUBLE_EQ(c2.rope_theta, 130000.0);
}

TEST(HfConfig, GoldenFolderLoads) {
  const std::string dir = test::golden_dir() + "/llama-gqa";
  LINEARIZE_REQUIRE_PATH(dir);
  auto c = LlamaConfig::load(dir);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e5);
}

TEST(HfConfig, MissingFieldNamed) {
  for (const char* field : {"hidden_size", "vocab_size", "num_hidden_layers", "intermediate_size",
                            "num_attention_heads", "rms_norm_eps", "rope_theta"}) {
    auto j = smollm2_135m();
    j.erase(field);
    auto msg = error_of(j);
    EXPECT_NE(msg.find("cfg.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::string("missing config field \"") + field + "\""), std::string::npos) << msg;
  }
}

TEST(HfConfig, BadValuesAndTypes) {
  auto j = smollm2_135m();
  j["hidden_size"] = "big";
  EXPECT_NE(error_of(j).find("\"hidden_size\" must be a positive integer, found \"big\""), std::string::npos);
  j = smollm2_135m();
  j["model_type"] = "gpt2";
  j["architectures"] = {"GPT2LMHeadModel"};
  EXPECT_NE(error_of(j).find("unsupported model"), std::string::npos);
  j = smollm2_135m();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  auto msg = error_of(j);
  EXPECT_NE(msg.find("unsupported rope type \"yarn\""), std::string::npos) << msg;
  j = smollm2_135m();
  j["num_key_value_heads"] = 4;
  EXPECT_NE(error_of(j).find("multiple of num_key_value_heads"), std::string::npos);
}

TEST(HfConfig, RopeScalingFrequencies) {
  auto j = smollm2_135m();
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 4.0}};
  auto c = LlamaConfig::from_json(j, "cfg.json");
  Rotary plain(64, c.rope_theta), linear(64, c.rope_theta, c.rope_scaling);
  EXPECT_LT(test::rel_err(linear.inv_freq() * 4.0, plain.inv_freq()), 1e-6);

  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  c = LlamaConfig::from_json(j, "cfg.json");
  Rotary l3(64, 500000.0, c.rope_scaling), base(64, 500000.0);
  // Highest frequency (wavelength 2*pi < 8192/4) unchanged, lowest (wavelength > 8192) divided by 8.
  EXPECT_FLOAT_EQ(l3.inv_freq()[0].item<float>(), base.inv_freq()[0].item<float>());
  EXPECT_FLOAT_EQ(l3.inv_freq()[31].item<float>(), base.inv_freq()[31].item<float>() / 8.0f);
}
