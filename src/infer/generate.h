// Autoregressive generation for any CausalLM: the prompt is encoded in one forward pass that fills the
// per-layer state (KV cache for softmax attention, conv buffers + matrix state for linear mixers),
// then one token at a time is decoded through that state.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <vector>

#include "infer/sampler.h"
#include "io/tokenizer.h"
#include "model/causal_lm.h"

namespace linearize {

struct GenerateOptions {
  int64_t max_new_tokens = 128;
  SamplingOptions sampling;
  std::vector<int64_t> stop_ids;  // generation ends after emitting one of these
  bool cuda_graph = true;         // on CUDA: decode through a captured graph (infer/graphed_step.h)
};

// Token ids a prompt starts with: BOS for SentencePiece (Llama-2 style) tokenizers or when the prompt
// is empty, nothing otherwise (GPT-2/SmolLM2 byte-level BPE adds no BOS).
std::vector<int32_t> prompt_prefix(const LlamaConfig& config, const Tokenizer& tokenizer, bool prompt_empty);

// Returns the new tokens (the stop token included when one ended generation). on_token is called as
// each token is chosen. With `state`, generation continues from it and leaves it after the last token
// fed (the last generated token itself is not fed).
std::vector<int32_t> generate(CausalLM& model, const std::vector<int32_t>& prompt, const GenerateOptions& options,
                              const std::function<void(int32_t)>& on_token = nullptr, ModelState* state = nullptr);

}  // namespace linearize
