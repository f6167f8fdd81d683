// The RULER single-needle evaluation loop: samples, greedy generation, scoring, the dump (see niah.h).
// This file does not print anything.
#include "eval/niah.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>

#include "distill/sft.h"
#include "infer/generate.h"
#include "io/atomic_file.h"
#include "io/chat_template.h"
#include "io/error.h"

namespace linearize {

namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string strip(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\n\r\f\v");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\n\r\f\v") - b + 1);
}

// Ids whose text holds a newline: generation ends after one of them when stop_at_newline is set.
std::vector<int64_t> newline_ids(const Tokenizer& tok, int64_t vocab) {
  std::vector<int64_t> ids;
  for (int64_t id = 0; id < std::min<int64_t>(vocab, tok.vocab_size()); ++id)
    if (tok.token_bytes(static_cast<int32_t>(id), 1).find('\n') != std::string::npos) ids.push_back(id);
  return ids;
}

// Writes the dump as it goes to FILE.partial and publishes it whole at the end.
class DumpWriter {
 public:
  explicit DumpWriter(const std::string& path) : path_(path) {
    if (path.empty()) return;
    const auto parent = std::filesystem::path(path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    out_.open(path + ".partial", std::ios::binary | std::ios::trunc);
    if (!out_) throw Error("--dump: cannot write " + path + ".partial");
  }
  void write(const nlohmann::json& row) {
    if (out_.is_open()) out_ << row.dump() << "\n";
  }
  void publish() {
    if (!out_.is_open()) return;
    out_.close();
    if (!out_) throw Error("--dump: writing " + path_ + " failed");
    std::filesystem::rename(path_ + ".partial", path_);
  }

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace

bool niah_uses_uuid(const std::string& task) {
  if (task == "s_niah_1" || task == "s_niah_2") return false;
  if (task == "s_niah_3") return true;
  throw Error("unknown NIAH task \"" + task + "\" (known: s_niah_1, s_niah_2, s_niah_3)");
}

Haystack niah_haystack(const std::string& task, const std::string& haystack_file) {
  niah_uses_uuid(task);  // checks the name
  if (task == "s_niah_1") return noise_haystack();
  if (haystack_file.empty()) throw Error("NIAH " + task + " needs a prose file for its haystack (--haystack)");
  return essay_haystack(read_file(haystack_file), haystack_file);
}

std::string niah_postprocess(const std::string& output) {
  std::string s = strip(output);
  for (auto& c : s)
    if (static_cast<unsigned char>(c) < 0x20) c = '\n';
  return strip(s);
}

bool niah_match(const std::string& output, const std::string& value) {
  return !value.empty() && lower(niah_postprocess(output)).find(lower(value)) != std::string::npos;
}

PromptEncoder niah_encoder(CausalLM& model, const Tokenizer& tokenizer, const std::string& model_folder, bool chat) {
  const auto prefix = chat_prefix(model->config, tokenizer);
  if (!chat) return plain_prompt_encoder(tokenizer, prefix);
  auto s = find_added_token(tokenizer, model_folder, kImStart), e = find_added_token(tokenizer, model_folder, kImEnd);
  if (!s || !e)
    throw Error(model_folder + ": --chat needs a chat model, but the tokenizer has no <|im_start|> / <|im_end|> "
                "(run `linearize sft` first, or leave --chat out)");
  const ChatTokens marks{*s, *e, prefix};
  std::string note;
  const std::string system = chat_format_for(model_folder, &note).default_system;
  return [&tokenizer, marks, system](const std::string& question, const std::string& answer) {
    auto ids = encode_chat({{"user", question}}, system, tokenizer, marks, /*add_generation_prompt=*/true).ids;
    const auto a = tokenizer.encode(answer, false);
    ids.insert(ids.end(), a.begin(), a.end());
    return ids;
  };
}

nlohmann::json run_niah(CausalLM& model, const Tokenizer& tokenizer, const NiahOptions& o, const PromptEncoder& encode,
                        const std::function<void(int64_t, int64_t)>& progress) {
  const bool uuid = niah_uses_uuid(o.task);
  if (o.samples < 1) throw Error("--samples must be at least 1, got " + std::to_string(o.samples));
  if (o.max_new_tokens < 1) throw Error("--max-new-tokens must be at least 1, got " + std::to_string(o.max_new_tokens));
  if (o.depth_bins < 1) throw Error("NIAH depth bins must be at least 1, got " + std::to_string(o.depth_bins));
  if (o.lengths.empty()) throw Error("--lengths: give at least one length");
  const Haystack haystack = niah_haystack(o.task, o.haystack_file);

  GenerateOptions gen;
  gen.max_new_tokens = o.max_new_tokens;
  for (auto id : model->config.eos_token_ids) gen.stop_ids.push_back(id);
  if (auto im_end = tokenizer.token_to_id(kImEnd)) gen.stop_ids.push_back(*im_end);
  if (o.stop_at_newline)
    for (auto id : newline_ids(tokenizer, model->config.vocab_size)) gen.stop_ids.push_back(id);

  DumpWriter dump(o.dump);
  const int64_t total = static_cast<int64_t>(o.lengths.size()) * o.samples;
  int64_t done = 0;
  nlohmann::json grid = nlohmann::json::array(), per_length = nlohmann::json::object(), depths = nlohmann::json::array();
  for (int64_t b = 0; b < o.depth_bins; ++b) depths.push_back((b + 0.5) / static_cast<double>(o.depth_bins));
  double sum = 0;
  for (int64_t length : o.lengths) {
    std::vector<int64_t> right(o.depth_bins, 0), count(o.depth_bins, 0);
    int64_t correct = 0;
    for (int64_t k = 0; k < o.samples; ++k) {
      std::seed_seq seq{static_cast<uint64_t>(o.seed), static_cast<uint64_t>(length), static_cast<uint64_t>(k),
                        static_cast<uint64_t>(uuid), static_cast<uint64_t>(haystack.noise)};
      std::mt19937_64 rng(seq);
      const auto s = make_niah_sample(haystack, uuid, length, o.max_new_tokens, encode, rng);
      auto out = generate(model, s.ids, gen);
      if (!out.empty() && std::find(gen.stop_ids.begin(), gen.stop_ids.end(), out.back()) != gen.stop_ids.end() &&
          tokenizer.token_bytes(out.back(), 1).find('\n') == std::string::npos)
        out.pop_back();  // EOS / <|im_end|> is not part of the answer; a newline token's text may be
      std::string text = tokenizer.decode(out);
      if (o.stop_at_newline && text.find('\n') != std::string::npos) text.resize(text.find('\n'));
      const bool hit = niah_match(text, s.value);
      correct += hit;
      const int64_t bin = std::min<int64_t>(o.depth_bins - 1, static_cast<int64_t>(s.depth * o.depth_bins));
      right[bin] += hit;
      count[bin] += 1;
      dump.write({{"task", o.task}, {"length", length}, {"sample", k}, {"prompt_tokens", s.ids.size()},
                  {"haystack_units", s.units}, {"depth", s.depth}, {"key", s.key}, {"reference", s.value},
                  {"input", tokenizer.decode(s.ids)}, {"output", text}, {"correct", hit}});
      if (progress) progress(++done, total);
    }
    nlohmann::json row = nlohmann::json::array();
    for (int64_t b = 0; b < o.depth_bins; ++b)
      row.push_back(count[b] ? nlohmann::json(static_cast<double>(right[b]) / count[b]) : nlohmann::json(nullptr));
    grid.push_back(row);
    const double acc = static_cast<double>(correct) / o.samples;
    per_length[std::to_string(length)] = acc;
    sum += acc;
  }
  dump.publish();
  return {{"task", o.task},
          {"haystack", haystack.name},
          {"lengths", o.lengths},
          {"samples", o.samples},
          {"max_new_tokens", o.max_new_tokens},
          {"stop_at_newline", o.stop_at_newline},
          {"chat", o.chat},
          {"seed", o.seed},
          {"per_length", per_length},
          {"average", sum / static_cast<double>(o.lengths.size())},
          {"depths", depths},
          {"grid", grid}};
}

}  // namespace linearize
