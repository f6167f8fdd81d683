// Byte-level BPE training: streaming pre-token counting, then merges with incremental pair counts.
// See bpe_trainer.h for the layout produced, the tie-break order and what is deliberately left out.
//
// Data structures (all keyed by symbol ids, which are the final token ids):
//   words[w]      distinct pre-token as a symbol sequence, with its corpus frequency freq[w];
//   pair_count    (left, right) -> sum over words of freq * occurrences (kept exact);
//   where         (left, right) -> words that may contain the pair (append-only, may be stale);
//   heap          (count, pair) entries; an entry whose count differs from pair_count is stale and is
//                 re-pushed with the current count when it reaches the top (lazy invalidation).
// Counts only fall after a pair is first pushed, except in the merge that creates the pair, which
// pushes a fresh entry; so the first valid top is the true best pair.
#include "io/bpe_trainer.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>

#include "io/atomic_file.h"
#include "io/error.h"
#include "io/jsonl.h"
#include "io/tokenizer_bpe.h"

namespace linearize {

namespace {

constexpr int64_t kNumBytes = 256;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Thrown inside the readers once --max-bytes is reached; caught by the counter.
struct StopReading {};

// Pre-token frequencies over a stream of texts, with the byte budget.
class WordCounter {
 public:
  WordCounter(int64_t max_bytes, bool isolate_digits, const std::function<void(const std::string&)>& progress)
      : max_bytes_(max_bytes), isolate_digits_(isolate_digits), progress_(progress) {}

  // Counts the pre-tokens of one sequence; throws StopReading when the budget is used up.
  void add(std::string text) {
    bool last = false;
    if (max_bytes_ >= 0 && bytes_ + static_cast<int64_t>(text.size()) >= max_bytes_) {
      size_t keep = static_cast<size_t>(max_bytes_ - bytes_);
      if (keep < text.size()) {
        // Cut at a character boundary so the budget never creates a U+FFFD.
        while (keep > 0 && (static_cast<unsigned char>(text[keep]) & 0xC0) == 0x80) --keep;
        text.resize(keep);
      }
      last = true;
    }
    bytes_ += static_cast<int64_t>(text.size());
    for (std::string& piece : isolate_digits_ ? pretokenize_smollm2(text) : pretokenize_gpt2(text)) {
      ++counts_[std::move(piece)];
      ++total_;
    }
    if (progress_ && bytes_ >= next_report_) {
      progress_("counted " + std::to_string(total_) + " words (" + std::to_string(counts_.size()) +
                " distinct) in " + std::to_string(bytes_ >> 20) + " MiB");
      next_report_ = bytes_ + (64 << 20);
    }
    if (last) throw StopReading{};
  }

  int64_t bytes() const { return bytes_; }
  int64_t total() const { return total_; }
  const std::unordered_map<std::string, int64_t>& counts() const { return counts_; }

 private:
  int64_t max_bytes_;
  bool isolate_digits_;
  const std::function<void(const std::string&)>& progress_;
  int64_t bytes_ = 0, total_ = 0, next_report_ = 64 << 20;
  std::unordered_map<std::string, int64_t> counts_;
};

// Feeds every line of a text file (with its '\n') to `counter`, reading in blocks.
void count_text_file(const std::string& path, WordCounter& counter) {
  require_regular_file(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open file (" + std::strerror(errno) + ")");
  std::string carry;
  std::vector<char> block(1 << 20);
  while (in) {
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    const std::streamsize n = in.gcount();
    if (n <= 0) break;
    carry.append(block.data(), static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl = carry.find('\n'); nl != std::string::npos; nl = carry.find('\n', start)) {
      counter.add(carry.substr(start, nl + 1 - start));
      start = nl + 1;
    }
    carry.erase(0, start);
  }
  if (in.bad()) throw Error(path + ": read error (" + std::strerror(errno) + ")");
  if (!carry.empty()) counter.add(carry);
}

void count_jsonl_file(const std::string& path, const std::string& field, WordCounter& counter) {
  for_each_jsonl(path, [&](const nlohmann::json& j, int64_t line) {
    counter.add(jsonl_string(j, field, path, line));
  });
}

uint64_t key_of(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}
int32_t left_of(uint64_t k) { return static_cast<int32_t>(k >> 32); }
int32_t right_of(uint64_t k) { return static_cast<int32_t>(k & 0xFFFFFFFFu); }

struct HeapEntry {
  int64_t count;
  uint64_t pair;  // (left << 32 | right): comparing keys compares (left, right)
};
// Max-heap order: higher count first; on equal counts the smaller (left, right) first.
struct HeapLess {
  bool operator()(const HeapEntry& x, const HeapEntry& y) const {
    return x.count != y.count ? x.count < y.count : x.pair > y.pair;
  }
};

void check_options(const BpeTrainOptions& o) {
  const int64_t floor = static_cast<int64_t>(bpe_trainer_special_tokens().size()) + kNumBytes;
  if (o.vocab_size < floor)
    throw Error("BPE training: expected a vocabulary size of at least " + std::to_string(floor) + " (" +
                std::to_string(bpe_trainer_special_tokens().size()) + " special tokens + 256 bytes), found " +
                std::to_string(o.vocab_size));
  if (o.vocab_size > (int64_t{1} << 31) - 1)
    throw Error("BPE training: vocabulary size " + std::to_string(o.vocab_size) + " does not fit int32 ids");
  if (o.min_frequency < 1)
    throw Error("BPE training: expected min frequency >= 1, found " + std::to_string(o.min_frequency));
}

// The merge loop on counted words.
TrainedBpe train_from_counts(const WordCounter& counter, const BpeTrainOptions& options) {
  const auto& report = options.progress;
  TrainedBpe out;
  out.bytes_read = counter.bytes();
  out.words_total = counter.total();
  out.words_distinct = static_cast<int64_t>(counter.counts().size());

  // Ids: special tokens, then the byte symbols in the order of their characters (as HF's trainer
  // sorts its alphabet), then merges.
  std::unordered_map<std::string, int32_t> id_of;
  for (const std::string& s : bpe_trainer_special_tokens()) {
    id_of.emplace(s, static_cast<int32_t>(out.vocab.size()));
    out.vocab.push_back(s);
  }
  out.num_special = static_cast<int64_t>(out.vocab.size());
  out.isolate_digits = options.isolate_digits;
  std::vector<int> bytes(kNumBytes);
  for (int b = 0; b < kNumBytes; ++b) bytes[b] = b;
  std::sort(bytes.begin(), bytes.end(), [](int x, int y) {
    return byte_level_symbol(static_cast<uint8_t>(x)) < byte_level_symbol(static_cast<uint8_t>(y));
  });
  int32_t byte_id[kNumBytes];
  for (int b : bytes) {
    byte_id[b] = static_cast<int32_t>(out.vocab.size());
    id_of.emplace(byte_level_symbol(static_cast<uint8_t>(b)), byte_id[b]);
    out.vocab.push_back(byte_level_symbol(static_cast<uint8_t>(b)));
  }

  // Distinct words in sorted order (the result does not depend on it; logs and memory layout do).
  std::vector<const std::pair<const std::string, int64_t>*> sorted;
  sorted.reserve(counter.counts().size());
  for (const auto& kv : counter.counts()) sorted.push_back(&kv);
  std::sort(sorted.begin(), sorted.end(), [](auto* x, auto* y) { return x->first < y->first; });
  std::vector<std::vector<int32_t>> words;
  std::vector<int64_t> freq;
  words.reserve(sorted.size());
  freq.reserve(sorted.size());
  for (const auto* kv : sorted) {
    if (kv->first.size() < 2) continue;  // a single byte holds no pair
    std::vector<int32_t> syms(kv->first.size());
    for (size_t i = 0; i < syms.size(); ++i) syms[i] = byte_id[static_cast<unsigned char>(kv->first[i])];
    words.push_back(std::move(syms));
    freq.push_back(kv->second);
  }

  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::vector<int32_t>> where;
  for (size_t w = 0; w < words.size(); ++w) {
    const auto& s = words[w];
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const uint64_t k = key_of(s[i], s[i + 1]);
      pair_count[k] += freq[w];
      auto& list = where[k];
      if (list.empty() || list.back() != static_cast<int32_t>(w)) list.push_back(static_cast<int32_t>(w));
    }
  }
  std::priority_queue<HeapEntry, std::vector<HeapEntry>, HeapLess> heap;
  {
    std::vector<HeapEntry> init;
    init.reserve(pair_count.size());
    for (const auto& kv : pair_count) init.push_back({kv.second, kv.first});
    heap = decltype(heap)(HeapLess(), std::move(init));
  }
  if (report)
    report("counted " + std::to_string(out.words_total) + " words (" + std::to_string(out.words_distinct) +
           " distinct) in " + std::to_string(out.bytes_read) + " bytes; " + std::to_string(pair_count.size()) +
           " distinct pairs");

  std::vector<int64_t> stamp(words.size(), -1);
  std::vector<uint64_t> touched;
  const int64_t target_merges = options.vocab_size - static_cast<int64_t>(out.vocab.size());
  int64_t step = 0;
  while (static_cast<int64_t>(out.vocab.size()) < options.vocab_size) {
    // The best pair: pop until an entry's count is current.
    HeapEntry top{0, 0};
    bool found = false;
    while (!heap.empty()) {
      HeapEntry e = heap.top();
      heap.pop();
      auto it = pair_count.find(e.pair);
      const int64_t current = it == pair_count.end() ? 0 : it->second;
      if (current == e.count) {
        top = e;
        found = true;
        break;
      }
      if (current > 0) heap.push({current, e.pair});
    }
    if (!found || top.count < options.min_frequency) break;

    const int32_t a = left_of(top.pair), b = right_of(top.pair);
    std::string merged = out.vocab[a] + out.vocab[b];
    out.merges.emplace_back(out.vocab[a], out.vocab[b]);
    int32_t n;
    auto existing = id_of.find(merged);
    if (existing != id_of.end()) {
      n = existing->second;  // the same string made by another pair earlier: reuse its id (as HF does)
    } else {
      n = static_cast<int32_t>(out.vocab.size());
      id_of.emplace(merged, n);
      out.vocab.push_back(std::move(merged));
    }

    // Merge left to right, non-overlapping, in every word that may hold the pair.
    touched.clear();
    auto add = [&](int32_t x, int32_t y, int64_t delta, int32_t w) {
      const uint64_t k = key_of(x, y);
      pair_count[k] += delta;
      if (delta > 0) {
        auto& list = where[k];
        if (list.empty() || list.back() != w) list.push_back(w);
        touched.push_back(k);
      }
    };
    std::vector<int32_t> holders;
    if (auto it = where.find(top.pair); it != where.end()) holders.swap(it->second);
    where.erase(top.pair);
    std::vector<int32_t> merged_syms;
    for (int32_t w : holders) {
      if (stamp[w] == step) continue;
      stamp[w] = step;
      auto& s = words[w];
      const int64_t f = freq[w];
      merged_syms.clear();
      bool any = false;
      for (size_t i = 0; i < s.size();) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          if (!merged_syms.empty()) {
            add(merged_syms.back(), a, -f, w);
            add(merged_syms.back(), n, f, w);
          }
          if (i + 2 < s.size()) {
            add(b, s[i + 2], -f, w);
            add(n, s[i + 2], f, w);
          }
          merged_syms.push_back(n);
          i += 2;
          any = true;
        } else {
          merged_syms.push_back(s[i]);
          ++i;
        }
      }
      if (any) s.assign(merged_syms.begin(), merged_syms.end());
    }
    pair_count.erase(top.pair);  // every occurrence is merged now
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (uint64_t k : touched) {
      const int64_t c = pair_count[k];
      if (c > 0) heap.push({c, k});
    }
    ++step;
    if (report && (step % 1000 == 0 || static_cast<int64_t>(out.vocab.size()) == options.vocab_size))
      report("merges " + std::to_string(step) + "/" + std::to_string(target_merges) + " (last \"" +
             out.merges.back().first + "\" + \"" + out.merges.back().second + "\", count " +
             std::to_string(top.count) + ")");
  }
  if (out.merges.empty())
    throw Error("BPE training: no pair of adjacent bytes occurs at least " + std::to_string(options.min_frequency) +
                " times in the " + std::to_string(out.bytes_read) + " bytes read; nothing to merge");
  if (report && static_cast<int64_t>(out.vocab.size()) < options.vocab_size)
    report("stopped after " + std::to_string(out.merges.size()) + " merges: no pair occurs " +
           std::to_string(options.min_frequency) + " times or more (vocabulary " +
           std::to_string(out.vocab.size()) + " < " + std::to_string(options.vocab_size) + ")");
  return out;
}

}  // namespace

const std::vector<std::string>& bpe_trainer_special_tokens() {
  static const std::vector<std::string> specials = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  return specials;
}

TrainedBpe train_bpe(const std::vector<std::string>& files, const BpeTrainOptions& options) {
  check_options(options);
  if (files.empty()) throw Error("BPE training: expected at least one input file, found none");
  for (const auto& path : files) require_regular_file(path);  // all of them before the long count starts
  WordCounter counter(options.max_bytes, options.isolate_digits, options.progress);
  try {
    for (const auto& path : files) {
      if (ends_with(path, ".jsonl")) count_jsonl_file(path, options.jsonl_field, counter);
      else count_text_file(path, counter);
    }
  } catch (const StopReading&) {
    if (options.progress)
      options.progress("stopped reading at --max-bytes " + std::to_string(options.max_bytes));
  }
  return train_from_counts(counter, options);
}

TrainedBpe train_bpe_texts(const std::vector<std::string>& texts, const BpeTrainOptions& options) {
  check_options(options);
  WordCounter counter(options.max_bytes, options.isolate_digits, options.progress);
  try {
    for (const auto& t : texts) counter.add(t);
  } catch (const StopReading&) {
  }
  return train_from_counts(counter, options);
}

void TrainedBpe::save(const std::string& dir) const {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(dir + ": cannot create folder (" + ec.message() + ")");
  std::vector<AddedToken> added;
  for (int64_t i = 0; i < num_special; ++i) added.push_back(AddedToken{vocab[i], static_cast<int32_t>(i), true});
  write_tokenizer_json(dir + "/tokenizer.json", vocab, merges, added, isolate_digits);

  // tokenizer_config.json as SmolLM2's base model has it: <|endoftext|> is bos, eos, unk and pad.
  nlohmann::ordered_json cfg;
  cfg["add_prefix_space"] = false;
  nlohmann::ordered_json decoder = nlohmann::ordered_json::object();
  for (const auto& a : added)
    decoder[std::to_string(a.id)] = {{"content", a.content}, {"lstrip", false}, {"normalized", false},
                                     {"rstrip", false}, {"single_word", false}, {"special", true}};
  cfg["added_tokens_decoder"] = decoder;
  cfg["additional_special_tokens"] = nlohmann::ordered_json::array();
  for (const auto& a : added) cfg["additional_special_tokens"].push_back(a.content);
  const std::string eot = bpe_trainer_special_tokens()[0];
  cfg["bos_token"] = eot;
  cfg["clean_up_tokenization_spaces"] = false;
  cfg["eos_token"] = eot;
  cfg["model_max_length"] = 8192;
  cfg["pad_token"] = eot;
  cfg["tokenizer_class"] = "GPT2Tokenizer";
  cfg["unk_token"] = eot;
  write_file_atomic(dir + "/tokenizer_config.json", [&](std::ostream& o) { o << cfg.dump(2) << "\n"; });
}

}  // namespace linearize
