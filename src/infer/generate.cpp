#include "infer/generate.h"

#include <algorithm>

#include "infer/graphed_step.h"
#include "io/error.h"

namespace linearize {

std::vector<int32_t> prompt_prefix(const LlamaConfig& config, const Tokenizer& tokenizer, bool prompt_empty) {
  const bool want_bos = tokenizer.kind() == "sentencepiece" || prompt_empty;
  if (!want_bos) return {};
  if (config.bos_token_id) return {static_cast<int32_t>(*config.bos_token_id)};
  if (!config.eos_token_ids.empty()) return {static_cast<int32_t>(config.eos_token_ids[0])};
  throw Error("the prompt is empty and the model config has neither bos_token_id nor eos_token_id");
}

std::vector<int32_t> generate(CausalLM& model, const std::vector<int32_t>& prompt, const GenerateOptions& options,
                              const std::function<void(int32_t)>& on_token, ModelState* state) {
  torch::NoGradGuard ng;
  ModelState local = model->new_state();
  ModelState& st = state ? *state : local;
  if (prompt.empty() && (st.empty() || st[0].position == 0))
    throw Error("generate: the prompt is empty (give at least one token, e.g. BOS)");
  const auto device = model->lm_head_weight().device();
  Sampler sampler(options.sampling);
  std::vector<int32_t> out;
  torch::Tensor logits;
  if (!prompt.empty()) {
    auto ids = torch::tensor(std::vector<int64_t>(prompt.begin(), prompt.end()), torch::kLong).to(device).unsqueeze(0);
    logits = model->forward(ids, &st).select(1, -1).squeeze(0);  // [V]
  }
  // On CUDA the steps replay a captured graph (one launch per token) where they can; softmax layers then keep
  // a KV cache of room for every token asked for.
  std::unique_ptr<GraphedDecodeStep> graph;
  const int64_t capacity = (st.empty() ? 0 : st[0].position) + options.max_new_tokens;
  if (options.cuda_graph && options.max_new_tokens >= 8 &&
      GraphedDecodeStep::usable(model, st, nullptr, GraphedDecodeStep::Replay::cuda_graph, capacity)) {
    try {
      graph = std::make_unique<GraphedDecodeStep>(model, st, 1, GraphedDecodeStep::Replay::cuda_graph, capacity);
    } catch (const Error&) {
      graph.reset();  // the eager step below is always correct
    }
  }
  for (int64_t i = 0; i < options.max_new_tokens; ++i) {
    if (!logits.defined()) throw Error("generate: nothing to continue from");
    const int32_t next = static_cast<int32_t>(sampler.next(logits));
    out.push_back(next);
    if (on_token) on_token(next);
    if (std::find(options.stop_ids.begin(), options.stop_ids.end(), next) != options.stop_ids.end()) break;
    if (i + 1 == options.max_new_tokens) break;
    auto ids = torch::full({1, 1}, static_cast<int64_t>(next), torch::TensorOptions().dtype(torch::kLong).device(device));
    logits = graph ? graph->step(ids).select(1, -1).squeeze(0).clone() : model->forward(ids, &st).select(1, -1).squeeze(0);
  }
  if (graph) st = graph->state();
  return out;
}

}  // namespace linearize
