// Supervised fine-tuning (see sft.h).
#include "distill/sft.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "distill/sft_data.h"
#include "io/atomic_file.h"
#include "io/error.h"
#include "model/model_io.h"
#include "model/student.h"
#include "ops/ops.h"
#include "train/data_parallel.h"

namespace linearize {

namespace fs = std::filesystem;

std::vector<int32_t> chat_prefix(const LlamaConfig& config, const Tokenizer& tok) {
  if (tok.kind() != "sentencepiece") return {};
  if (config.bos_token_id) return {static_cast<int32_t>(*config.bos_token_id)};
  if (auto b = tok.token_to_id("<s>")) return {*b};
  return {};
}

TokenLosses sft_token_losses(CausalLM& model, const torch::Tensor& rows, bool packed) {
  const int64_t B = rows.size(0), T = rows.size(2) - 1;
  auto tokens = rows.select(1, 0), learn = rows.select(1, 1), doc = rows.select(1, 2);  // [B, T+1] each
  auto x = tokens.narrow(1, 0, T), y = tokens.narrow(1, 1, T);
  auto doc_in = doc.narrow(1, 0, T), doc_out = doc.narrow(1, 1, T);
  auto mask = learn.narrow(1, 1, T).eq(1).logical_and(doc_in.eq(doc_out)).logical_and(doc_in.ge(0));
  auto h = packed ? model->hidden_states_packed(x, PackedRows::from_doc_ids(doc_in)) : model->hidden_states(x);
  auto logits = model->logits_from_hidden(h);  // [B, T, V]
  auto ce = ops::cross_entropy_terms(logits.reshape({B * T, logits.size(2)}), y.reshape({B * T}));
  return {ce.view({B, T}), mask.to(torch::kFloat), doc_out};
}

CausalLM grow_vocab(CausalLM& model, int64_t vocab_size) {
  LlamaConfig c = model->config;
  const int64_t old = c.vocab_size;
  c.vocab_size = vocab_size;
  MixerFactory factory;
  if (c.raw.contains("linearize"))
    factory = student_factory(c, StudentSpec::from_json(c.raw["linearize"], "the model's config.json"));
  CausalLM grown(c, factory);
  auto w = model->lm_head_weight();
  grown->to(w.device(), w.scalar_type());
  auto from = model->named_parameters(true);
  torch::NoGradGuard ng;
  for (auto& p : grown->named_parameters(true)) {
    const auto* src = from.find(p.key());
    if (!src) throw Error("grow_vocab: parameter " + p.key() + " missing in the source model");
    if (src->sizes() == p.value().sizes()) {
      p.value().copy_(*src);
    } else {  // embed_tokens / lm_head [V, hidden]
      p.value().narrow(0, 0, old).copy_(*src);
      p.value().narrow(0, old, vocab_size - old).copy_(src->mean(0, /*keepdim=*/true).expand({vocab_size - old, src->size(1)}));
    }
  }
  return grown;
}

ChatTokens prepare_chat_tokens(CausalLM& model, const Tokenizer& tok, const std::string& folder,
                               std::vector<std::pair<std::string, int32_t>>* added) {
  ChatTokens marks;
  marks.prefix = chat_prefix(model->config, tok);
  int64_t next = std::max<int64_t>(model->config.vocab_size, tok.vocab_size());
  auto resolve = [&](const char* content) {
    if (auto id = find_added_token(tok, folder, content)) return *id;
    added->push_back({content, static_cast<int32_t>(next)});
    return static_cast<int32_t>(next++);
  };
  marks.im_start = resolve(kImStart);
  marks.im_end = resolve(kImEnd);
  if (next > model->config.vocab_size) model = grow_vocab(model, next);
  return marks;
}

void write_chat_tokenizer_files(const std::string& folder, const std::vector<std::pair<std::string, int32_t>>& added) {
  auto read = [](const fs::path& p) {
    if (!fs::exists(p)) return nlohmann::ordered_json::object();
    std::ifstream in(p);
    return nlohmann::ordered_json::parse(in);
  };
  auto write = [](const fs::path& p, const nlohmann::ordered_json& j) {
    write_file_atomic(p.string(), [&](std::ostream& out) { out << j.dump(2) << "\n"; });
  };
  const fs::path tj = fs::path(folder) / "tokenizer.json", tc = fs::path(folder) / "tokenizer_config.json";
  if (!added.empty() && fs::exists(tj)) {
    auto j = read(tj);
    for (const auto& [content, id] : added)
      j["added_tokens"].push_back({{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false},
                                   {"rstrip", false}, {"normalized", false}, {"special", true}});
    write(tj, j);
  }
  auto c = read(tc);
  for (const auto& [content, id] : added)
    c["added_tokens_decoder"][std::to_string(id)] = {{"content", content}, {"lstrip", false}, {"normalized", false},
                                                     {"rstrip", false}, {"single_word", false}, {"special", true}};
  if (!c.contains("chat_template")) c["chat_template"] = chatml_template_jinja();
  write(tc, c);
}

SftResult run_sft(const SftOptions& o) {
  if (o.seq_len < 2) throw Error("sft: --seq-len must be at least 2");
  if (!(o.epochs > 0)) throw Error("sft: --epochs must be positive");
  refuse_output_inside(o.out, o.model, "the model's folder");
  auto records = read_conversations(o.data);  // malformed input fails before the model loads
  LoadOptions lo;
  lo.device = o.loop.device;
  auto model = load_model(o.model, lo);
  auto tok = load_model_tokenizer(o.model, model->config);
  std::string note;
  auto format = chat_format_for(o.model, &note);
  const std::string system = o.system_given ? o.system : format.default_system;
  std::vector<std::pair<std::string, int32_t>> added;
  auto marks = prepare_chat_tokens(model, *tok, o.model, &added);
  if (!o.loop.quiet) {
    std::cerr << "[sft] " << note << (system.empty() ? ", no system prompt" : ", default system prompt \"" + system + "\"") << "\n";
    for (const auto& [content, id] : added)
      std::cerr << "[sft] the tokenizer has no " << content << ": added it as special token " << id
                << " (embedding" << (model->config.tie_word_embeddings ? "" : " and LM head")
                << " grown, new rows = mean of the old ones)\n";
  }
  std::vector<EncodedChat> chats;
  for (const auto& r : records) chats.push_back(encode_chat(r.messages, system, *tok, marks, false));
  const int32_t pad = model->config.eos_token_ids.empty() ? 0 : static_cast<int32_t>(model->config.eos_token_ids[0]);
  SftSource source(chats, o.seq_len, o.packing, pad, o.loop.seed);

  TrainLoopOptions loop = o.loop;
  loop.name = "sft";
  if (loop.run_dir.empty()) loop.run_dir = o.out;
  const int64_t per_epoch = (source.num_rows() + loop.batch - 1) / loop.batch;
  loop.steps = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(o.epochs * per_epoch)));
  if (o.max_steps > 0) loop.steps = std::min(loop.steps, o.max_steps);
  if (!o.loop.quiet)
    std::cerr << "[sft] " << records.size() << " conversations -> " << source.num_rows() << " rows of "
              << o.seq_len + 1 << " tokens" << (o.packing ? " (packed)" : "") << ", " << source.truncated()
              << " cut to fit; " << loop.steps << " steps of " << loop.batch << " rows, lr " << loop.schedule.lr
              << " (" << to_string(loop.schedule.kind) << ")\n";

  auto probe = source.rows().narrow(0, 0, std::min<int64_t>(16, source.num_rows())).to(loop.device);
  auto mean_loss = [&] {
    torch::NoGradGuard ng;
    model->eval();
    auto t = sft_token_losses(model, probe, o.packing);
    model->train();
    return ((t.loss * t.mask).sum() / t.mask.sum().clamp_min(1)).item<double>();
  };
  SftResult result;
  result.loss_before = mean_loss();
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (auto& p : model->named_parameters()) {
    p.value().set_requires_grad(true);
    params.emplace_back(p.key(), p.value());
  }
  auto step = [&](const torch::Tensor& batch) {
    auto t = sft_token_losses(model, batch, o.packing);
    return (t.loss * t.mask).sum() / t.mask.sum().clamp_min(1);
  };
  model->recompute = loop.recompute;  // unpacked rows only: packed rows take hidden_states_packed
  model->train();
  auto r = run_training(*model, params, source, step, loop);
  result.steps = r.steps_done;
  if (!r.finished) return result;
  result.loss_after = mean_loss();
  model->eval();
  if (is_main_process()) {  // under `launch`, rank 0 writes
    save_model(model, o.out, o.model);
    write_chat_tokenizer_files(o.out, added);
  }
  result.finished = true;
  if (!o.loop.quiet)
    std::cerr << "[sft] assistant-token loss on the first " << probe.size(0) << " rows: " << result.loss_before
              << " -> " << result.loss_after << "; wrote " << o.out << "\n";
  return result;
}

}  // namespace linearize
