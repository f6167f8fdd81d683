// `linearize export --format fla`: a student folder as a Hugging Face folder that
// flash-linear-attention's own model classes load (AutoModelForCausalLM after `import fla.models`):
// fla's config.json (its model_type and keys) and its parameter names. The mixers' parameters already
// carry fla's layer names; the rest is renamed from the teacher's (embed_tokens -> embeddings,
// input_layernorm -> attn_norm, post_attention_layernorm -> mlp_norm; GLA's gated output norm is fla's
// g_norm_swish_gate). fla's layout facts were read from its source (fla 0.5.2).
//
// Exported: students of the six mixers fla has (linear attention, RetNet, GLA, DeltaNet, Gated DeltaNet,
// KDA), hybrids included: the softmax layers a hybrid keeps become fla's `attn` spec (its layers, heads, KV
// heads, q/k/v biases, window and RoPE base; self_attn.* -> attn.*), which fla builds with flash-attn.
// Everything fla cannot express is refused with the reason, never changed: mLSTM (fla has no such model),
// softmax layers fla's Attention cannot hold (head_dim other than hidden / heads, q/k norms, an o_proj bias,
// RoPE scaling), biases or q/k norms carried into a mixer from a Qwen teacher, an MLP with
// biases, short convolutions with a bias (or any, for linear attention and RetNet), GLA gates other than
// rank 16 and normalizer 16, beta turned off (Gated DeltaNet, KDA), RetNet's rotary base other than fla's
// 10000, the paper preset's linear attention without output norm, KDA's gate added in the norm or full
// rank, and one RMSNorm eps for the blocks and another for the mixer (fla has one norm_eps).
#pragma once
#include <nlohmann/json.hpp>

#include <string>

namespace linearize {

// The config.json fla's model class reads for the student folder `student_dir`; throws Error saying why
// when the student cannot be expressed.
nlohmann::json fla_config(const std::string& student_dir);

// Writes OUT: config.json, model.safetensors (fla's names, the student's dtype) and the tokenizer files;
// returns the config written.
nlohmann::json export_fla(const std::string& student_dir, const std::string& out);

// The other way (`linearize import --format fla`): an fla folder of one of those six models as a student
// folder (the mixer's settings from fla's config, the teacher-side fields a student folder records set from
// it: heads as the mixer's, RoPE base 10000 unused; a hybrid's from its `attn` spec, as a Llama, Qwen2 (q/k/v
// biases) or Mistral (a window) teacher). Settings fla has and our mixers lack are refused.
void import_fla(const std::string& fla_dir, const std::string& out);

}  // namespace linearize
