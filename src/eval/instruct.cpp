// Instruction-following score: greedy answers, ROUGE-L F against references (see instruct.h).
#include "eval/instruct.h"

#include <algorithm>

#include "distill/sft.h"
#include "infer/generate.h"
#include "io/chat_template.h"
#include "io/error.h"

namespace linearize {

std::vector<std::string> rouge_tokens(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  for (unsigned char c : text + " ") {
    const unsigned char l = (c >= 'A' && c <= 'Z') ? c - 'A' + 'a' : c;
    if ((l >= 'a' && l <= 'z') || (l >= '0' && l <= '9')) {
      cur += static_cast<char>(l);
    } else if (!cur.empty()) {
      out.push_back(cur);
      cur.clear();
    }
  }
  return out;
}

double rouge_l_f(const std::string& prediction, const std::string& reference) {
  const auto p = rouge_tokens(prediction), r = rouge_tokens(reference);
  if (p.empty() || r.empty()) return 0.0;
  // LCS by dynamic programming over one row: row[j] = LCS(p[0..i), r[0..j)).
  std::vector<int64_t> row(r.size() + 1, 0);
  for (size_t i = 1; i <= p.size(); ++i) {
    int64_t diag = 0;  // LCS(p[0..i-1), r[0..j-1))
    for (size_t j = 1; j <= r.size(); ++j) {
      const int64_t up = row[j];
      row[j] = p[i - 1] == r[j - 1] ? diag + 1 : std::max(row[j], row[j - 1]);
      diag = up;
    }
  }
  const double lcs = static_cast<double>(row[r.size()]);
  if (lcs == 0) return 0.0;
  const double prec = lcs / p.size(), rec = lcs / r.size();
  return 2 * prec * rec / (prec + rec);
}

nlohmann::json evaluate_instruct(CausalLM& model, const Tokenizer& tok, const std::string& folder,
                                 const InstructOptions& o, const std::function<void(int64_t, int64_t)>& on_item) {
  // Items: user turn(s) and the reference answer. Self-instruct records with several instances give
  // one conversation per instance; only the first of each record is kept (one item per task).
  std::vector<std::pair<Conversation, std::string>> items;
  int64_t last_line = -1;
  for (const auto& rec : read_conversations(o.data)) {
    if (rec.line == last_line) continue;
    last_line = rec.line;
    Conversation conv = rec.messages;
    while (!conv.empty() && conv.back().role != "assistant") conv.pop_back();
    if (conv.empty()) continue;
    const std::string ref = conv.back().content;
    conv.pop_back();
    items.emplace_back(conv, ref);
    if (o.limit > 0 && static_cast<int64_t>(items.size()) >= o.limit) break;
  }
  auto s = find_added_token(tok, folder, kImStart), e = find_added_token(tok, folder, kImEnd);
  if (!s || !e)
    throw Error(folder + ": the tokenizer has no <|im_start|> / <|im_end|> (instruction evaluation needs a chat "
                "model; run `linearize sft` first)");
  ChatTokens marks{*s, *e, chat_prefix(model->config, tok)};
  GenerateOptions go;
  go.max_new_tokens = o.max_new_tokens;
  go.stop_ids = {*e, *s};
  for (auto id : model->config.eos_token_ids) go.stop_ids.push_back(static_cast<int32_t>(id));

  double sum = 0;
  nlohmann::json samples = nlohmann::json::array();
  for (size_t i = 0; i < items.size(); ++i) {
    const auto& [conv, ref] = items[i];
    auto enc = encode_chat(conv, o.system, tok, marks, /*add_generation_prompt=*/true);
    auto out = generate(model, enc.ids, go);
    std::vector<int32_t> answer;
    for (auto id : out)
      if (std::find(go.stop_ids.begin(), go.stop_ids.end(), id) == go.stop_ids.end() && id < tok.vocab_size())
        answer.push_back(id);
    const std::string pred = tok.decode(answer);
    const double f = rouge_l_f(pred, ref);
    sum += f;
    if (samples.size() < 5)
      samples.push_back({{"prompt", conv.back().content}, {"reference", ref}, {"prediction", pred}, {"rouge_l", f}});
    if (on_item) on_item(static_cast<int64_t>(i) + 1, static_cast<int64_t>(items.size()));
  }
  return {{"task", "instruct"},
          {"model", folder},
          {"data", o.data},
          {"items", items.size()},
          {"max_new_tokens", o.max_new_tokens},
          {"rouge_l", items.empty() ? 0.0 : sum / items.size()},
          {"samples", samples}};
}

}  // namespace linearize
