// Byte-level BPE tokenizer training (our own implementation of the classic algorithm), producing a
// tokenizer in SmolLM2's layout: pre-tokenizer Digits(individual_digits) then ByteLevel (GPT-2
// regex), special tokens <|endoftext|>, <|im_start|>, <|im_end|> at ids 0, 1, 2, then the 256 byte
// symbols (sorted by their GPT-2 byte-level character), then one token per merge.
//
// Input: .txt files are read line by line (each line with its '\n' is pre-tokenised on its own, as
// Hugging Face's `Tokenizer.train(files)` does, so whitespace runs never span a line break); .jsonl
// files give one text per line from a string field, pre-tokenised whole. Reading streams: memory
// grows with the number of distinct pre-tokens, not with the corpus.
// Merging: repeatedly the adjacent pair with the highest (frequency-weighted) count, ties to the
// smallest (left id, right id) — the order Hugging Face's BpeTrainer uses, so with the same ids the
// merges are the same. Pair counts are updated incrementally (pair -> words index, max-heap with
// lazy invalidation). Stops at the vocabulary size or when the best pair is below min_frequency.
// Output is deterministic for the same input and options.
//
// Deliberately not done: special tokens in the training text are not cut out (they are counted as
// plain text, as in Hugging Face's trainer); no normalizer, no BPE dropout, no max token length, no
// alphabet limit, no parallelism; other pre-tokenizers or special-token lists are not offered.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace linearize {

struct BpeTrainOptions {
  int64_t vocab_size = 8192;           // total, special tokens and the 256 bytes included (>= 259)
  int64_t min_frequency = 2;           // a pair counted fewer times than this is never merged
  int64_t max_bytes = -1;              // read at most this many bytes of text in all (-1: everything)
  std::string jsonl_field = "text";    // field holding the text in .jsonl files
  bool isolate_digits = true;          // SmolLM2's Digits(individual) pre-tokenizer; false: digit runs merge
  // Progress lines ("counted ... words", "merges ..."); null = quiet.
  std::function<void(const std::string&)> progress;
};

struct TrainedBpe {
  std::vector<std::string> vocab;                            // byte-level string of each id
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  int64_t num_special = 0;                                   // ids [0, num_special) are special
  bool isolate_digits = true;                                // the pre-tokenizer it was trained with
  int64_t bytes_read = 0, words_total = 0, words_distinct = 0;

  // Writes dir/tokenizer.json (Hugging Face layout, read by BpeTokenizer and HF tokenizers) and
  // dir/tokenizer_config.json (bos/eos/pad tokens); creates dir when needed.
  void save(const std::string& dir) const;
};

// The special tokens every trained tokenizer starts with, ids 0, 1, 2.
const std::vector<std::string>& bpe_trainer_special_tokens();

// Trains on `files` (.txt or .jsonl). Throws linearize::Error for no files, an unreadable file, a
// malformed jsonl line (FILE:LINE), vocab_size < 259 or min_frequency < 1.
TrainedBpe train_bpe(const std::vector<std::string>& files, const BpeTrainOptions& options);

// The same on in-memory texts (each one a sequence pre-tokenised whole); for tests.
TrainedBpe train_bpe_texts(const std::vector<std::string>& texts, const BpeTrainOptions& options);

}  // namespace linearize
