// What a training command reads with --data: one token dataset (a folder of shards from `linearize
// tokenize`, a .u32 shard, or a .txt/.jsonl file tokenized on the fly) or a mixture, a JSON file naming
// several sources with weights:
//   {"sources": [
//      {"path": "tokens/prose", "weight": 0.9},
//      {"generator": "retrieval_episodes", "weight": 0.1, "filler": "english_like", "max_needles": 3},
//      {"generator": "english_like", "weight": 0.2}]}
// Paths are relative to the JSON file. Generators make text on the fly, deterministically from the seed,
// and tokenize it with the model's tokenizer:
//   english_like         the demo's English-like documents with planted facts (data/synthetic_text.h);
//                        keys: sentences (40), facts (8)
//   copy_drills          "the codes are A B. again, the codes are A B." (data/synthetic_text.h); keys:
//                        max_values (4), max_filler (English-like sentences between the lists, 0)
//   retrieval_episodes   RULER-form retrieval episodes (data/retrieval_episodes.h); keys: filler
//                        ("english_like", or a text file whose sentences are drawn in runs), min_chars,
//                        max_chars, max_needles, max_questions, paragraph_sentences, uuid_fraction,
//                        noise_fraction
// Each row of a batch comes from one source, drawn by weight with a hash of (seed, row), and each source
// serves its windows in its own shuffled order; the position (rows served, windows taken per source) is
// what a checkpoint stores. The distillation stages split every file source into disjoint parts by
// their fractions; a generator draws from a separate seed stream per part.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/token_dataset.h"
#include "train/batch_source.h"

namespace linearize {

class Tokenizer;

struct DataSourceSpec {
  std::string path;       // a token dataset, or
  std::string generator;  // english_like | retrieval_episodes | copy_drills
  double weight = 1.0;
  nlohmann::json options = nlohmann::json::object();  // the generator's settings
};

// Reads a mixture spec; unknown keys, unknown generators, bad weights and missing files are Errors naming
// the file and the key.
std::vector<DataSourceSpec> read_data_spec(const std::string& path);

class TrainingData {
 public:
  // `tokenizer` (the model's) must outlive the data: text files and generators are tokenized with it, and
  // a dataset index made with another tokenizer is refused. Ids >= vocab are refused as windows are read.
  static TrainingData open(const std::string& data, const Tokenizer& tokenizer, int64_t eos, int64_t vocab,
                           const std::string& model);

  // Rows of seq_len + 1 tokens from part `part` of `splits` (stage splits: fractions or token counts of
  // every file source); `splits` empty = everything.
  std::unique_ptr<BatchSource> loader(const std::vector<double>& splits, size_t part, int64_t seq_len, uint64_t seed,
                                      const std::string& what) const;
  int64_t file_tokens() const;  // tokens of the file sources (generators are unbounded)
  std::string summary() const;  // for the progress line

  struct Source;

 private:
  std::vector<std::shared_ptr<const Source>> sources_;
  std::string name_;
  const Tokenizer* tok_ = nullptr;
  int64_t eos_ = -1, vocab_ = 0;
};

}  // namespace linearize
