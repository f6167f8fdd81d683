#include "train/pretrain.h"

#include <filesystem>
#include <iostream>

#include "io/atomic_file.h"
#include "io/error.h"
#include "io/tokenizer.h"
#include "model/model_io.h"
#include "ops/ops.h"
#include "train/data_parallel.h"
#include "train/training_data.h"

namespace linearize {

namespace {

// <|endoftext|> for byte-level BPE tokenizers, </s> and <s> for SentencePiece ones.
std::pair<int64_t, int64_t> bos_eos(const Tokenizer& tok) {
  if (auto e = tok.token_to_id("<|endoftext|>")) return {*e, *e};
  auto b = tok.token_to_id("<s>"), e = tok.token_to_id("</s>");
  if (b && e) return {*b, *e};
  throw Error(tok.source() + ": no <|endoftext|> or <s>/</s> token to use as BOS/EOS");
}

}  // namespace

double pretrain(const PretrainOptions& o) {
  refuse_output_inside(o.out, o.init_from, "the --init model's folder");
  if (std::filesystem::is_directory(o.tokenizer)) refuse_output_inside(o.out, o.tokenizer, "the tokenizer's folder");
  auto tok = load_tokenizer(o.tokenizer);
  auto [bos, eos] = bos_eos(*tok);
  LlamaConfig c;
  c.vocab_size = tok->vocab_size();
  c.hidden_size = o.hidden;
  c.num_hidden_layers = o.layers;
  c.num_attention_heads = o.heads;
  c.num_key_value_heads = o.kv_heads;
  auto positive = [](int64_t v, const char* what) {
    if (v < 1) throw Error(std::string("pretrain: ") + what + " must be at least 1, got " + std::to_string(v));
  };
  positive(o.hidden, "--hidden"), positive(o.layers, "--layers"), positive(o.heads, "--heads");
  positive(o.kv_heads, "--kv-heads"), positive(o.seq_len, "--seq-len");
  if (o.intermediate < 0) throw Error("pretrain: --intermediate must be positive, got " + std::to_string(o.intermediate));
  if (o.hidden % o.heads != 0) throw Error("pretrain: --hidden must be divisible by --heads");
  if (o.heads % o.kv_heads != 0) throw Error("pretrain: --heads must be divisible by --kv-heads");
  c.head_dim = o.hidden / o.heads;
  c.intermediate_size = o.intermediate > 0 ? o.intermediate : ((o.hidden * 8 / 3 + 31) / 32) * 32;
  c.max_position_embeddings = std::max<int64_t>(2048, o.seq_len);
  c.rope_theta = o.rope_theta;
  c.tie_word_embeddings = true;
  c.bos_token_id = bos;
  c.eos_token_ids = {eos};
  c.raw = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}};

  const auto data = TrainingData::open(o.data, *tok, eos, c.vocab_size, o.tokenizer);
  auto loader = data.loader({}, 0, o.seq_len, o.loop.seed, o.data);
  TrainLoopOptions loop = o.loop;
  loop.name = "pretrain";
  if (o.tokens > 0) loop.steps = std::max<int64_t>(1, o.tokens / (loop.batch * o.seq_len));
  if (loop.run_dir.empty()) loop.run_dir = o.out;

  torch::manual_seed(static_cast<int64_t>(loop.seed));
  CausalLM model(c);
  if (o.init_from.empty()) {
    init_weights_normal(*model, o.init_std);
  } else {
    // Continued training: the folder's shape and weights (the shape options above are ignored).
    model = load_model(o.init_from);
    if (model->config.raw.contains("linearize"))
      throw Error(o.init_from + ": --init takes a Llama model folder, not a linearized student");
    if (model->config.vocab_size != c.vocab_size)
      throw Error(o.init_from + ": its vocabulary (" + std::to_string(model->config.vocab_size) +
                  " tokens) is not the tokenizer's (" + std::to_string(c.vocab_size) + ")");
    c = model->config;
    c.max_position_embeddings = std::max<int64_t>(c.max_position_embeddings, o.seq_len);
    model->config.max_position_embeddings = c.max_position_embeddings;
  }
  model->to(loop.device);
  model->recompute = loop.recompute;
  model->train();
  if (!loop.quiet)
    std::cerr << "[pretrain] " << c.parameter_count() / 1e6 << "M parameters, " << data.summary() << ", "
              << loop.steps << " steps of " << loop.batch << " x " << o.seq_len << " tokens\n";
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (auto& p : model->named_parameters()) params.emplace_back(p.key(), p.value());
  auto step = [&](const torch::Tensor& batch) {
    auto x = batch.narrow(1, 0, o.seq_len), y = batch.narrow(1, 1, o.seq_len);
    auto logits = model->forward(x);
    return ops::cross_entropy_terms(logits.reshape({-1, c.vocab_size}), y.reshape({-1})).mean();
  };
  auto r = run_training(*model, params, *loader, step, loop);
  if (!r.finished) return r.last_loss;  // stopped early (testing aid): the checkpoint holds the state
  model->eval();
  if (is_main_process()) save_model(model, o.out, o.tokenizer);
  if (!loop.quiet) std::cerr << "[pretrain] wrote " << o.out << " (final loss " << r.last_loss << ")\n";
  return r.last_loss;
}

}  // namespace linearize
