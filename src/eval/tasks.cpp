// Task loading, lm-eval-style tokenization, batched continuation scoring and accuracy metrics.
// See tasks.h for the semantics; this file does not print anything (progress goes to a callback).
#include "eval/tasks.h"

#include <bzlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "io/atomic_file.h"
#include "io/error.h"
#include "io/utf8.h"
#include "io/jsonl.h"

namespace linearize {

namespace {

std::string where(const std::string& path, int64_t line) { return path + ":" + std::to_string(line) + ": "; }

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<std::string> string_list(const nlohmann::json& j, const std::string& field, const std::string& path,
                                     int64_t line) {
  if (!j.is_object() || !j.contains(field) || !j[field].is_array() || j[field].empty())
    throw Error(where(path, line) + "missing non-empty list field \"" + field + "\"");
  std::vector<std::string> out;
  for (const auto& v : j[field]) {
    if (!v.is_string()) throw Error(where(path, line) + "field \"" + field + "\" must hold strings");
    out.push_back(v.get<std::string>());
  }
  return out;
}

int64_t gold_index(const nlohmann::json& j, size_t n_options, const std::string& path, int64_t line) {
  if (!j.is_object() || !j.contains("gold") || !j["gold"].is_number_integer())
    throw Error(where(path, line) + "missing integer field \"gold\"");
  const int64_t g = j["gold"].get<int64_t>();
  if (g < 0 || g >= static_cast<int64_t>(n_options))
    throw Error(where(path, line) + "field \"gold\" = " + std::to_string(g) + " is not an index into " +
                std::to_string(n_options) + " options");
  return g;
}

// lm-eval's context for each llm-foundry query: ARC and PIQA end in "\nAnswer:".
std::string mc_context(const std::string& task, const std::string& query) {
  if (task == "arc_easy" || task == "arc_challenge") return query + "\nAnswer:";
  if (task == "piqa") return ends_with(query, "\n") ? query + "Answer:" : query + "\nAnswer:";
  return query;
}

TaskItem choice_item(const std::string& context, const std::vector<std::string>& choices, int64_t gold) {
  TaskItem item;
  item.gold = gold;
  for (const auto& c : choices) {
    item.options.push_back({context, " " + c});
    item.norm_chars.push_back(static_cast<int64_t>(utf8::codepoint_count(c)));
  }
  return item;
}

bool limit_reached(const TaskData& t, int64_t limit) {
  return limit >= 0 && static_cast<int64_t>(t.items.size()) >= limit;
}

}  // namespace

const std::vector<std::string>& task_names() {
  static const std::vector<std::string> names = {"lambada",   "arc_easy", "arc_challenge", "hellaswag",
                                                 "piqa",      "winogrande", "openbookqa"};
  return names;
}

// ---- loading ----

TaskData load_multiple_choice_jsonl(const std::string& name, const std::string& path, int64_t limit) {
  TaskData t;
  t.name = name;
  t.metric = (name == "arc_easy" || name == "piqa") ? "acc" : "acc_norm";
  for_each_jsonl(path, [&](const nlohmann::json& j, int64_t line) {
    if (limit_reached(t, limit)) return;
    const std::string query = jsonl_string(j, "query", path, line);
    const auto choices = string_list(j, "choices", path, line);
    t.items.push_back(choice_item(mc_context(name, query), choices, gold_index(j, choices.size(), path, line)));
  });
  return t;
}

TaskData load_winogrande_jsonl(const std::string& path, int64_t limit) {
  TaskData t;
  t.name = "winogrande";
  t.metric = "acc";
  for_each_jsonl(path, [&](const nlohmann::json& j, int64_t line) {
    if (limit_reached(t, limit)) return;
    const auto contexts = string_list(j, "context_options", path, line);
    const std::string continuation = jsonl_string(j, "continuation", path, line);
    TaskItem item;
    item.gold = gold_index(j, contexts.size(), path, line);
    for (const auto& c : contexts) {
      item.options.push_back({c, " " + continuation});
      item.norm_chars.push_back(static_cast<int64_t>(utf8::codepoint_count(continuation)));
    }
    t.items.push_back(std::move(item));
  });
  return t;
}

TaskData load_lambada_jsonl(const std::string& path, int64_t limit) {
  TaskData t;
  t.name = "lambada";
  t.metric = "acc";
  t.kind = TaskKind::Lambada;
  for_each_jsonl(path, [&](const nlohmann::json& j, int64_t line) {
    if (limit_reached(t, limit)) return;
    const std::string context = jsonl_string(j, "context", path, line);
    const std::string continuation = jsonl_string(j, "continuation", path, line);
    TaskItem item;
    item.options.push_back({context, " " + continuation});
    item.norm_chars.push_back(static_cast<int64_t>(utf8::codepoint_count(continuation)));
    t.items.push_back(std::move(item));
  });
  return t;
}

std::string read_text_maybe_bz2(const std::string& path) {
  if (!ends_with(path, ".bz2")) return read_file(path);
  require_regular_file(path);
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw Error("cannot open " + path + ": " + std::strerror(errno));
  std::string out;
  int err = BZ_OK;
  // A .bz2 file may hold several concatenated streams: reopen on the unused bytes until EOF.
  std::vector<char> unused;
  while (true) {
    BZFILE* bz = BZ2_bzReadOpen(&err, f, 0, 0, unused.empty() ? nullptr : unused.data(),
                                static_cast<int>(unused.size()));
    if (err != BZ_OK) break;
    char buf[1 << 16];
    while (err == BZ_OK) {
      const int n = BZ2_bzRead(&err, bz, buf, sizeof buf);
      if (n > 0) out.append(buf, n);
    }
    if (err != BZ_STREAM_END) {
      BZ2_bzReadClose(&err, bz);
      std::fclose(f);
      throw Error(path + ": corrupt bzip2 data after " + std::to_string(out.size()) + " decompressed bytes");
    }
    void* rest = nullptr;
    int n_rest = 0;
    BZ2_bzReadGetUnused(&err, bz, &rest, &n_rest);
    unused.assign(static_cast<char*>(rest), static_cast<char*>(rest) + n_rest);
    BZ2_bzReadClose(&err, bz);
    if (unused.empty()) {
      const int c = std::fgetc(f);
      if (c == EOF) break;
      unused.push_back(static_cast<char>(c));
    }
  }
  std::fclose(f);
  return out;
}

std::string hellaswag_preprocess(const std::string& text) {
  const size_t b = text.find_first_not_of(" \t\r\n");
  std::string s = b == std::string::npos ? "" : text.substr(b, text.find_last_not_of(" \t\r\n") - b + 1);
  // " [title]" -> ". "
  for (size_t p = 0; (p = s.find(" [title]", p)) != std::string::npos; p += 2) s.replace(p, 8, ". ");
  // Non-greedy "\[.*?\]": remove each '[' up to the next ']' (a '[' without a ']' stays).
  std::string no_brackets;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '[') {
      const size_t close = s.find(']', i + 1);
      if (close != std::string::npos) {
        i = close;
        continue;
      }
    }
    no_brackets += s[i];
  }
  // "  " -> " ", one non-overlapping left-to-right pass as Python's str.replace.
  std::string out;
  for (size_t i = 0; i < no_brackets.size(); ++i) {
    out += no_brackets[i];
    if (no_brackets[i] == ' ' && i + 1 < no_brackets.size() && no_brackets[i + 1] == ' ') ++i;
  }
  return out;
}

std::string hellaswag_capitalize_tail(const std::string& ctx) {
  const size_t p = ctx.rfind(". ");
  std::string out = ctx;
  if (p != std::string::npos && p + 2 < out.size() && out[p + 2] >= 'a' && out[p + 2] <= 'z')
    out[p + 2] = static_cast<char>(out[p + 2] - 'a' + 'A');
  return out;
}

TaskData load_hellaswag_text(const std::string& path, int64_t limit) {
  TaskData t;
  t.name = "hellaswag";
  t.metric = "acc_norm";
  const std::string text = read_text_maybe_bz2(path);
  std::vector<std::string> lines;
  for (size_t s = 0; s < text.size();) {
    size_t e = text.find('\n', s);
    if (e == std::string::npos) e = text.size();
    std::string line = text.substr(s, e - s);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
    s = e + 1;
  }
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  if (lines.size() % 6 != 0)
    throw Error(path + ": expected 6 lines per item (context, label, 4 endings), found " +
                std::to_string(lines.size()) + " lines (not a multiple of 6)");
  for (size_t i = 0; i < lines.size() && !limit_reached(t, limit); i += 6) {
    const std::string& label = lines[i + 1];
    if (label.size() != 1 || label[0] < '0' || label[0] > '3')
      throw Error(where(path, static_cast<int64_t>(i + 2)) + "expected a label 0-3, found \"" + label + "\"");
    std::vector<std::string> endings;
    for (size_t k = 0; k < 4; ++k) endings.push_back(hellaswag_preprocess(lines[i + 2 + k]));
    const std::string ctx = hellaswag_preprocess(hellaswag_capitalize_tail(lines[i]));
    t.items.push_back(choice_item(ctx, endings, label[0] - '0'));
  }
  return t;
}

TaskData load_task(const std::string& name, const std::string& data_dir, int64_t limit) {
  namespace fs = std::filesystem;
  auto file = [&](const std::string& f) {
    const std::string p = (fs::path(data_dir) / f).string();
    if (!fs::exists(p)) throw Error("task " + name + ": data file " + p + " not found (see --data-dir)");
    return p;
  };
  if (name == "arc_easy" || name == "arc_challenge" || name == "piqa")
    return load_multiple_choice_jsonl(name, file(name + ".jsonl"), limit);
  if (name == "openbookqa") return load_multiple_choice_jsonl(name, file("openbook_qa.jsonl"), limit);
  if (name == "winogrande") return load_winogrande_jsonl(file("winogrande.jsonl"), limit);
  if (name == "lambada") return load_lambada_jsonl(file("lambada_openai.jsonl"), limit);
  if (name == "hellaswag") {
    const std::string txt = (fs::path(data_dir) / "hellaswag_val_full.txt").string();
    return load_hellaswag_text(fs::exists(txt) ? txt : file("hellaswag_val_full.txt.bz2"), limit);
  }
  std::string known;
  for (const auto& n : task_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error("unknown task \"" + name + "\" (known: " + known + ")");
}

// ---- tokens ----

std::vector<int32_t> eval_prefix(const LlamaConfig& config, const Tokenizer& tokenizer) {
  if (tokenizer.kind() != "sentencepiece") return {};
  if (config.bos_token_id) return {static_cast<int32_t>(*config.bos_token_id)};
  if (auto id = tokenizer.token_to_id("<s>")) return {*id};
  throw Error("SentencePiece model without bos_token_id in config.json and no <s> token");
}

int32_t empty_context_id(const LlamaConfig& config) {
  if (config.bos_token_id) return static_cast<int32_t>(*config.bos_token_id);
  if (!config.eos_token_ids.empty()) return static_cast<int32_t>(config.eos_token_ids[0]);
  return -1;
}

TokenPair encode_pair(const Tokenizer& tokenizer, const std::vector<int32_t>& prefix, int32_t empty_id,
                      const TextPair& text) {
  std::string context = text.context, continuation = text.continuation;
  const size_t keep = context.find_last_not_of(' ');
  const size_t n_spaces = keep == std::string::npos ? context.size() : context.size() - keep - 1;
  if (n_spaces > 0) {
    continuation = context.substr(context.size() - n_spaces) + continuation;
    context.resize(context.size() - n_spaces);
  }
  TokenPair out;
  out.context = prefix;
  if (context.empty()) {
    out.continuation = tokenizer.encode(continuation, false);
  } else {
    const auto whole = tokenizer.encode(context + continuation, false);
    const auto ctx = tokenizer.encode(context, false);
    out.context.insert(out.context.end(), ctx.begin(), ctx.end());
    if (ctx.size() < whole.size()) out.continuation.assign(whole.begin() + ctx.size(), whole.end());
    else out.continuation = tokenizer.encode(continuation, false);  // the tail vanished in a merge
  }
  if (out.context.empty()) {
    if (empty_id < 0) throw Error("cannot score an empty context: the model has neither BOS nor EOS");
    out.context.push_back(empty_id);
  }
  if (out.continuation.empty()) throw Error("empty continuation after tokenization: \"" + text.continuation + "\"");
  return out;
}

// ---- scoring ----

namespace {

// One sequence to run: input ids and where the continuation's predictions sit.
struct Sequence {
  std::vector<int64_t> input;    // (context + continuation)[:-1], left-truncated to max_length
  std::vector<int64_t> targets;  // continuation tokens
  int64_t first = 0;             // input position whose output predicts targets[0]
};

Sequence make_sequence(const TokenPair& r, int64_t max_length) {
  std::vector<int64_t> all(r.context.begin(), r.context.end());
  all.insert(all.end(), r.continuation.begin(), r.continuation.end());
  const int64_t n_cont = static_cast<int64_t>(r.continuation.size());
  if (static_cast<int64_t>(all.size()) > max_length + 1) all.erase(all.begin(), all.end() - (max_length + 1));
  if (n_cont >= static_cast<int64_t>(all.size()))
    throw Error("continuation of " + std::to_string(n_cont) + " tokens does not fit max_length " +
                std::to_string(max_length));
  Sequence s;
  s.input.assign(all.begin(), all.end() - 1);
  s.targets.assign(r.continuation.begin(), r.continuation.end());
  s.first = static_cast<int64_t>(s.input.size()) - n_cont;
  return s;
}

// Scores sequences[order[begin..end)] in one forward pass.
void score_batch(CausalLM& model, const std::vector<Sequence>& seqs, const std::vector<size_t>& idx,
                 std::vector<ContinuationScore>& out) {
  const auto device = model->lm_head_weight().device();
  int64_t t_max = 0;
  for (size_t i : idx) t_max = std::max<int64_t>(t_max, seqs[i].input.size());
  const int64_t b = static_cast<int64_t>(idx.size());
  std::vector<int64_t> ids(b * t_max, 0), rows, cols, targets;  // right padding with id 0
  for (int64_t r = 0; r < b; ++r) {
    const Sequence& s = seqs[idx[r]];
    std::copy(s.input.begin(), s.input.end(), ids.begin() + r * t_max);
    for (size_t k = 0; k < s.targets.size(); ++k) {
      rows.push_back(r);
      cols.push_back(s.first + static_cast<int64_t>(k));
      targets.push_back(s.targets[k]);
    }
  }
  auto x = torch::tensor(ids, torch::kLong).view({b, t_max}).to(device);
  auto h = model->hidden_states(x);                                        // [b, t_max, hidden]
  auto sel = h.index({torch::tensor(rows, torch::kLong).to(device), torch::tensor(cols, torch::kLong).to(device)});
  auto logp = torch::log_softmax(model->logits_from_hidden(sel).to(torch::kFloat), -1);  // [N, V]
  auto tgt = torch::tensor(targets, torch::kLong).to(device);
  auto lp = logp.gather(1, tgt.unsqueeze(1)).squeeze(1).to(torch::kCPU, torch::kDouble);  // [N]
  auto hit = (logp.argmax(1) == tgt).to(torch::kCPU);                                   // [N]
  auto lp_a = lp.accessor<double, 1>();
  auto hit_a = hit.accessor<bool, 1>();
  int64_t k = 0;
  for (int64_t r = 0; r < b; ++r) {
    ContinuationScore sc;
    sc.greedy = true;
    for (size_t j = 0; j < seqs[idx[r]].targets.size(); ++j, ++k) {
      sc.loglik += lp_a[k];
      sc.greedy = sc.greedy && hit_a[k];
    }
    sc.tokens = static_cast<int64_t>(seqs[idx[r]].targets.size());
    out[idx[r]] = sc;
  }
}

}  // namespace

std::vector<ContinuationScore> score_continuations(CausalLM& model, const std::vector<TokenPair>& requests,
                                                   const ScoreOptions& options) {
  if (options.batch < 1) throw Error("scoring: batch must be at least 1, got " + std::to_string(options.batch));
  torch::NoGradGuard ng;
  const int64_t max_length = options.max_length > 0 ? options.max_length : model->config.max_position_embeddings;
  std::vector<Sequence> seqs;
  seqs.reserve(requests.size());
  for (const auto& r : requests) seqs.push_back(make_sequence(r, max_length));
  // Longest first: similar lengths share a batch, and memory trouble shows on the first batch.
  std::vector<size_t> order(seqs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return seqs[a].input.size() > seqs[b].input.size(); });
  std::vector<ContinuationScore> out(seqs.size());
  for (size_t s = 0; s < order.size(); s += options.batch) {
    const size_t e = std::min(order.size(), s + static_cast<size_t>(options.batch));
    score_batch(model, seqs, std::vector<size_t>(order.begin() + s, order.begin() + e), out);
    if (options.progress) options.progress(static_cast<int64_t>(e), static_cast<int64_t>(order.size()));
  }
  return out;
}

// ---- metrics ----

double binomial_stderr(double p, int64_t n) { return n < 2 ? 0.0 : std::sqrt(p * (1 - p) / (n - 1)); }

int64_t argmax_index(const std::vector<double>& values) {
  if (values.empty()) throw Error("argmax of an empty list");
  return std::max_element(values.begin(), values.end()) - values.begin();
}

TaskResult multiple_choice_metrics(const TaskData& task, const std::vector<std::vector<ContinuationScore>>& scores) {
  TaskResult r;
  r.name = task.name;
  r.metric = task.metric;
  r.n = static_cast<int64_t>(task.items.size());
  int64_t hits = 0, hits_norm = 0;
  for (size_t i = 0; i < task.items.size(); ++i) {
    const TaskItem& item = task.items[i];
    std::vector<double> ll, ll_norm;
    for (size_t j = 0; j < item.options.size(); ++j) {
      ll.push_back(scores[i][j].loglik);
      ll_norm.push_back(scores[i][j].loglik / std::max<int64_t>(1, item.norm_chars[j]));
    }
    hits += argmax_index(ll) == item.gold;
    hits_norm += argmax_index(ll_norm) == item.gold;
  }
  if (r.n > 0) {
    r.acc = static_cast<double>(hits) / r.n;
    r.acc_norm = static_cast<double>(hits_norm) / r.n;
  }
  r.acc_stderr = binomial_stderr(r.acc, r.n);
  r.acc_norm_stderr = binomial_stderr(r.acc_norm, r.n);
  return r;
}

TaskResult lambada_metrics(const TaskData& task, const std::vector<std::vector<ContinuationScore>>& scores) {
  TaskResult r;
  r.name = task.name;
  r.metric = task.metric;
  r.n = static_cast<int64_t>(task.items.size());
  int64_t hits = 0;
  double ll_sum = 0;
  for (const auto& s : scores) {
    hits += s.at(0).greedy;
    ll_sum += s.at(0).loglik;
  }
  if (r.n > 0) {
    r.acc = static_cast<double>(hits) / r.n;
    r.ppl = std::exp(-ll_sum / r.n);
  }
  r.acc_norm = r.acc;
  r.acc_stderr = r.acc_norm_stderr = binomial_stderr(r.acc, r.n);
  return r;
}

TaskResult evaluate_task(CausalLM& model, const Tokenizer& tokenizer, const TaskData& task,
                         const ScoreOptions& options) {
  const auto prefix = eval_prefix(model->config, tokenizer);
  const int32_t empty_id = empty_context_id(model->config);
  std::vector<TokenPair> requests;
  for (const auto& item : task.items)
    for (const auto& opt : item.options) requests.push_back(encode_pair(tokenizer, prefix, empty_id, opt));
  const auto flat = score_continuations(model, requests, options);
  std::vector<std::vector<ContinuationScore>> scores;
  size_t k = 0;
  for (const auto& item : task.items) {
    scores.emplace_back(flat.begin() + k, flat.begin() + k + item.options.size());
    k += item.options.size();
  }
  return task.kind == TaskKind::Lambada ? lambada_metrics(task, scores) : multiple_choice_metrics(task, scores);
}

nlohmann::json task_result_json(const TaskResult& r) {
  nlohmann::json j = {{"n", r.n},
                      {"acc", r.acc},
                      {"acc_stderr", r.acc_stderr},
                      {"acc_norm", r.acc_norm},
                      {"acc_norm_stderr", r.acc_norm_stderr},
                      {"metric", r.metric},
                      {"score", r.score()}};
  if (r.name == "lambada") j["ppl"] = r.ppl;
  return j;
}

nlohmann::json results_json(const std::string& model, const std::vector<TaskResult>& results) {
  nlohmann::json tasks = nlohmann::json::object();
  double sum = 0;
  for (const auto& r : results) {
    tasks[r.name] = task_result_json(r);
    sum += r.score();
  }
  return {{"model", model}, {"tasks", tasks}, {"average", results.empty() ? 0.0 : sum / results.size()}};
}

}  // namespace linearize
