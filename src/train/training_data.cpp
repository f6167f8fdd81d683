// Training data: one dataset or a weighted mixture of datasets and generators (see training_data.h).
#include "train/training_data.h"

#include <algorithm>
#include <filesystem>
#include <random>

#include "data/niah_text.h"
#include "data/retrieval_episodes.h"
#include "data/synthetic_text.h"
#include "io/atomic_file.h"
#include "io/error.h"
#include "io/tokenizer.h"
#include "train/data_loader.h"

namespace linearize {

namespace fs = std::filesystem;

namespace {

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

const std::vector<std::string> kGenerators = {"english_like", "retrieval_episodes", "copy_drills"};

// The keys each kind of source takes.
const std::vector<std::string>& keys_of(const std::string& generator) {
  static const std::vector<std::string> path = {"path", "weight"};
  static const std::vector<std::string> english = {"generator", "weight", "sentences", "facts"};
  static const std::vector<std::string> drills = {"generator", "weight", "max_values", "max_filler"};
  static const std::vector<std::string> episodes = {"generator", "weight", "filler", "min_chars", "max_chars",
                                                    "max_needles", "max_questions", "paragraph_sentences",
                                                    "uuid_fraction", "noise_fraction"};
  if (generator.empty()) return path;
  if (generator == "copy_drills") return drills;
  return generator == "english_like" ? english : episodes;
}

}  // namespace

// A source of windows: a range of a token dataset (in a shuffled order per epoch), or a generator.
struct TrainingData::Source {
  std::string name;
  double weight = 1;
  std::shared_ptr<const TokenDataset> data;  // file sources
  DataSourceSpec spec;                       // generators
  std::vector<std::string> filler;           // retrieval_episodes with a text file: its sentences
};

std::vector<DataSourceSpec> read_data_spec(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": malformed JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("sources") || !j["sources"].is_array() || j["sources"].empty())
    throw Error(path + ": a data mixture is a JSON object {\"sources\": [{\"path\" or \"generator\", \"weight\"}, ...]}");
  for (const auto& [k, v] : j.items())
    if (k != "sources") throw Error(path + ": unknown key \"" + k + "\" (expected \"sources\")");
  std::vector<DataSourceSpec> out;
  const auto base = fs::path(path).parent_path();
  for (size_t i = 0; i < j["sources"].size(); ++i) {
    const auto& s = j["sources"][i];
    const std::string where = path + ": sources[" + std::to_string(i) + "]";
    if (!s.is_object()) throw Error(where + ": expected an object");
    DataSourceSpec d;
    if (s.contains("generator")) {
      if (!s["generator"].is_string() ||
          std::find(kGenerators.begin(), kGenerators.end(), s["generator"].get<std::string>()) == kGenerators.end())
        throw Error(where + ": unknown generator " + s["generator"].dump() +
                    " (known: english_like, retrieval_episodes, copy_drills)");
      d.generator = s["generator"].get<std::string>();
    } else if (s.contains("path") && s["path"].is_string()) {
      const fs::path p = s["path"].get<std::string>();
      d.path = (p.is_absolute() ? p : base / p).string();
    } else {
      throw Error(where + ": give \"path\" (a token dataset) or \"generator\"");
    }
    for (const auto& [k, v] : s.items()) {
      const auto& known = keys_of(d.generator);
      if (std::find(known.begin(), known.end(), k) == known.end()) {
        std::string list;
        for (const auto& x : known) list += (list.empty() ? "" : ", ") + x;
        throw Error(where + ": unknown key \"" + k + "\" (expected " + list + ")");
      }
      if (k != "path" && k != "generator" && k != "weight") d.options[k] = v;
    }
    if (s.contains("weight")) {
      if (!s["weight"].is_number() || !(s["weight"].get<double>() > 0))
        throw Error(where + ": \"weight\" must be a positive number, found " + s["weight"].dump());
      d.weight = s["weight"].get<double>();
    }
    if (d.generator == "retrieval_episodes" && d.options.contains("filler")) {
      const auto& f = d.options["filler"];
      if (!f.is_string()) throw Error(where + ": \"filler\" must be \"english_like\" or a text file");
      if (f != "english_like") {
        const fs::path p = f.get<std::string>();
        d.options["filler"] = (p.is_absolute() ? p : base / p).string();
      }
    }
    out.push_back(d);
  }
  return out;
}

namespace {

RetrievalEpisodeOptions episode_options(const nlohmann::json& o, const std::string& where) {
  RetrievalEpisodeOptions e;
  try {
    e.min_chars = o.value("min_chars", e.min_chars);
    e.max_chars = o.value("max_chars", e.max_chars);
    e.max_needles = o.value("max_needles", e.max_needles);
    e.max_questions = o.value("max_questions", e.max_questions);
    e.paragraph_sentences = o.value("paragraph_sentences", e.paragraph_sentences);
    e.uuid_fraction = o.value("uuid_fraction", e.uuid_fraction);
    e.noise_fraction = o.value("noise_fraction", e.noise_fraction);
  } catch (const nlohmann::json::exception& x) {
    throw Error(where + ": wrong type in " + o.dump() + ": " + x.what());
  }
  e.key_adjectives = training_key_adjectives();
  e.key_nouns = training_key_nouns();
  return e;
}

// One window of a generator: its texts, each followed by EOS, until seq_len + 1 tokens; deterministic in
// (seed, part, index).
std::vector<int32_t> generated_window(const TrainingData::Source& s, const Tokenizer& tok, int64_t eos,
                                      int64_t length, uint64_t seed, size_t part, int64_t index) {
  std::mt19937_64 rng(mix64(mix64(seed * 131 + part) ^ static_cast<uint64_t>(index)));
  std::vector<int32_t> out;
  const auto& o = s.spec.options;
  while (static_cast<int64_t>(out.size()) < length) {
    std::string text;
    if (s.spec.generator == "copy_drills") {
      text = copy_drill(rng, o.value("max_values", int64_t{4}), o.value("max_filler", int64_t{0}));
    } else if (s.spec.generator == "english_like") {
      const int64_t n = o.value("sentences", int64_t{40});
      text = english_like_document(rng, n / 2 + static_cast<int64_t>(rng() % static_cast<uint64_t>(n + 1)),
                                   o.value("facts", int64_t{8}));
    } else {
      SentenceSource filler = english_like_sentence;
      if (!s.filler.empty())
        filler = [&](std::mt19937_64& r) { return s.filler[r() % s.filler.size()] + " "; };
      text = retrieval_episode(rng, filler, episode_options(o, s.name));
    }
    auto ids = tok.encode(text, /*parse_special=*/false);
    out.insert(out.end(), ids.begin(), ids.end());
    if (eos >= 0) out.push_back(static_cast<int32_t>(eos));
  }
  out.resize(static_cast<size_t>(length));
  return out;
}

// Rows from several sources, each row's source drawn by weight from a hash of (seed, row).
class MixtureLoader : public BatchSource {
 public:
  struct Member {
    std::shared_ptr<const TrainingData::Source> source;
    std::unique_ptr<WindowLoader> windows;  // file sources
  };
  MixtureLoader(std::vector<Member> members, const Tokenizer& tok, int64_t eos, int64_t seq_len, uint64_t seed,
                size_t part)
      : members_(std::move(members)), tok_(tok), eos_(eos), seq_len_(seq_len), seed_(seed), part_(part),
        taken_(members_.size(), 0) {
    double sum = 0;
    for (const auto& m : members_) sum += m.source->weight;
    for (const auto& m : members_) cumulative_.push_back((cumulative_.empty() ? 0 : cumulative_.back()) + m.source->weight / sum);
  }

  torch::Tensor next(int64_t rows, torch::Device device) override { return next_part(rows, 0, rows).to(device); }

  torch::Tensor next_part(int64_t rows, int64_t begin, int64_t count) override {
    auto out = torch::empty({count, seq_len_ + 1}, torch::kLong);
    auto* dst = out.data_ptr<int64_t>();
    for (int64_t b = 0; b < rows; ++b) {
      const double u = static_cast<double>(mix64(seed_ * 7919 + static_cast<uint64_t>(rows_)) >> 11) * 0x1.0p-53;
      ++rows_;
      size_t k = 0;
      while (k + 1 < cumulative_.size() && u >= cumulative_[k]) ++k;
      const int64_t index = taken_[k]++;
      const bool mine = b >= begin && b < begin + count;
      auto& m = members_[k];
      if (m.windows) {
        auto w = m.windows->next_part(1, 0, mine ? 1 : 0);  // advances its order either way
        if (mine) std::copy(w.data_ptr<int64_t>(), w.data_ptr<int64_t>() + seq_len_ + 1, dst + (b - begin) * (seq_len_ + 1));
      } else if (mine) {
        const auto w = generated_window(*m.source, tok_, eos_, seq_len_ + 1, seed_, part_, index);
        std::copy(w.begin(), w.end(), dst + (b - begin) * (seq_len_ + 1));
      }
    }
    return out;
  }

  int64_t tokens_per_row() const override { return seq_len_; }

  nlohmann::json position_json() const override {
    nlohmann::json files = nlohmann::json::array();
    for (const auto& m : members_) files.push_back(m.windows ? m.windows->position_json() : nlohmann::json(nullptr));
    return {{"rows", rows_}, {"taken", taken_}, {"files", files}};
  }

  void set_position_json(const nlohmann::json& p) override {
    if (!p.contains("taken") || p["taken"].size() != members_.size())
      throw Error("the checkpoint's data position is for another data mixture (" + p.dump().substr(0, 120) + ")");
    rows_ = p.at("rows").get<int64_t>();
    taken_ = p.at("taken").get<std::vector<int64_t>>();
    for (size_t k = 0; k < members_.size(); ++k)
      if (members_[k].windows) members_[k].windows->set_position_json(p.at("files").at(k));
  }

 private:
  std::vector<Member> members_;
  const Tokenizer& tok_;
  int64_t eos_, seq_len_;
  uint64_t seed_;
  size_t part_;
  std::vector<double> cumulative_;
  int64_t rows_ = 0;
  std::vector<int64_t> taken_;
};

}  // namespace

TrainingData TrainingData::open(const std::string& data, const Tokenizer& tok, int64_t eos, int64_t vocab,
                                const std::string& model) {
  TrainingData t;
  t.name_ = data;
  t.tok_ = &tok;
  t.eos_ = eos;
  t.vocab_ = vocab;
  std::vector<DataSourceSpec> specs;
  if (ends_with(data, ".json")) {
    specs = read_data_spec(data);
  } else {
    DataSourceSpec one;
    one.path = data;
    specs.push_back(one);
  }
  for (const auto& spec : specs) {
    auto s = std::make_shared<Source>();
    s->spec = spec;
    s->weight = spec.weight;
    s->name = spec.path.empty() ? spec.generator : spec.path;
    if (!spec.path.empty()) {
      s->data = std::make_shared<const TokenDataset>(TokenDataset::open(spec.path, &tok, eos));
      s->data->check_tokenizer(tok, model);
    } else if (spec.options.contains("filler") && spec.options["filler"] != "english_like") {
      s->filler = split_sentences(read_file(spec.options["filler"].get<std::string>()));
      if (s->filler.empty()) throw Error(spec.options["filler"].get<std::string>() + ": no sentences for the filler");
    }
    t.sources_.push_back(s);
  }
  return t;
}

std::unique_ptr<BatchSource> TrainingData::loader(const std::vector<double>& splits, size_t part, int64_t seq_len,
                                                  uint64_t seed, const std::string& what) const {
  std::vector<MixtureLoader::Member> members;
  for (const auto& s : sources_) {
    MixtureLoader::Member m{s, nullptr};
    if (s->data) {
      const TokenRange range = splits.empty() ? TokenRange{0, s->data->size()} : split_stream(s->data->size(), splits).at(part);
      m.windows = std::make_unique<WindowLoader>(*s->data, range, seq_len, seed, what + (sources_.size() > 1 ? " (" + s->name + ")" : ""),
                                                 vocab_);
    }
    members.push_back(std::move(m));
  }
  if (members.size() == 1 && members[0].windows) return std::move(members[0].windows);  // a plain dataset
  return std::make_unique<MixtureLoader>(std::move(members), *tok_, eos_, seq_len, seed, part);
}

int64_t TrainingData::file_tokens() const {
  int64_t n = 0;
  for (const auto& s : sources_)
    if (s->data) n += s->data->size();
  return n;
}

std::string TrainingData::summary() const {
  if (sources_.size() == 1 && sources_[0]->data) return std::to_string(file_tokens()) + " tokens";
  std::string out;
  for (const auto& s : sources_)
    out += (out.empty() ? "" : ", ") + s->name + " x" + std::to_string(s->weight).substr(0, 4) +
           (s->data ? " (" + std::to_string(s->data->size()) + " tokens)" : "");
  return "mixture of " + out;
}

}  // namespace linearize
