// Building a student mixer from its config, and starting it from a teacher's attention layer.
//
// init_mixer_from_teacher (docs/design.md, "Starting a student from its teacher"):
//   q_proj and o_proj are copied; k_proj and v_proj are copied as they are when the student's shape is
//   the teacher's (native GQA: linear_attention, retnet, gla with num_kv_heads = teacher's), otherwise
//   after repeating each teacher KV head to the query heads that share it: rows of student head h =
//   rows of teacher KV head h / (H / Hkv) (blocks of head_dim rows; HF repeat_kv order). mLSTM names
//   them q, k, v, out_proj. Short convolutions get the identity init (last tap 1), so the teacher's
//   q, k, v pass through them (the silu remains). RoPE is dropped (RetNet keeps its own rotary, base =
//   config.rope_theta). Everything else keeps its fresh init. A projection whose shape matches neither form
//   is left fresh; the returned notes say which, and what was copied.
// Not done here: embeddings, norms and MLP (the model-level conversion copies those).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/llama.h"
#include "model/mixers/mixer_config.h"
#include "model/token_mixer.h"

namespace linearize {

std::shared_ptr<TokenMixer> make_mixer(const MixerConfig& config);

// mixer_kinds() is declared in mixer_config.h.

// Returns one line per projection: "copied q_proj.weight", "copied k_proj.weight (KV heads repeated x3)",
// "left fresh k_proj.weight: student [..] vs teacher [..]". With study_gqa_unroll, K/V rows are repeated
// as the study's code does (the gqa defect): in chunks of 32 rows whatever the teacher's head size, each
// chunk `groups` times in a row.
std::vector<std::string> init_mixer_from_teacher(TokenMixer& mixer, const LlamaAttention& teacher,
                                                 const MixerConfig& config, bool study_gqa_unroll = false);

// [Hkv*d, in] -> [Hkv*G*d, in]: row block of head h = row block of KV head h / G (HF repeat_kv).
torch::Tensor repeat_kv_rows(const torch::Tensor& w, int64_t kv_heads, int64_t groups);
// The study's version: 32-row chunks, each repeated G times in a row (right only when d = 32).
torch::Tensor study_repeat_kv_rows(const torch::Tensor& w, int64_t groups);

}  // namespace linearize
