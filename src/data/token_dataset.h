// Token data on disk, read without loading it: one token stream over the shards of a dataset folder
// (written by `linearize tokenize --output DIR`), or over one .u32 shard, memory-mapped so that RAM stays
// constant in the corpus size and each process touches only the pages of the windows it reads.
//
// A dataset folder holds numbered shards shard-00000.u32, shard-00001.u32, ... (little-endian uint32
// ids, documents separated by the EOS id, a document may continue into the next shard) and index.json:
//   {"format": "linearize-tokens", "version": 1, "tokens": N, "documents": D, "eos": id,
//    "tokenizer": {"source": "...", "vocab_size": V, "hash": "fnv1a64:..."},
//    "shards": [{"file": "shard-00000.u32", "tokens": n, "documents": d}, ...],
//    "sources": [{"path": "...", "bytes": b, "documents": d}, ...]}
// index.json is written last, so a folder without one is an unfinished run and is refused; every shard's
// size is checked against the index when the folder is opened.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace linearize {

class Tokenizer;

// A fingerprint of a tokenizer's vocabulary (FNV-1a 64 over the bytes of ids [0, vocab)), recorded in a
// dataset's index and compared with the model's tokenizer before training on it.
std::string tokenizer_fingerprint(const Tokenizer& tokenizer, int64_t vocab);

class TokenDataset {
 public:
  // A dataset folder (with index.json), a .u32 shard, or a .txt/.jsonl file tokenized in memory with
  // `tokenizer` (EOS after each document). Errors name the file and what is wrong.
  static TokenDataset open(const std::string& path, const Tokenizer* tokenizer, int64_t eos_id);
  // In-memory tokens (tests, small generated data).
  static TokenDataset from_tokens(std::vector<int32_t> tokens, std::string name = "tokens");

  int64_t size() const { return total_; }
  // Copies tokens [begin, begin + n) into out; throws when the range is outside the stream.
  void read(int64_t begin, int64_t n, int32_t* out) const;
  std::vector<int32_t> slice(int64_t begin, int64_t n) const;
  // Throws naming the dataset when an id in [begin, begin + n) is >= vocab (checked as windows are read).
  void check_ids(const int32_t* ids, int64_t n, int64_t vocab, int64_t begin) const;

  const std::string& name() const { return name_; }
  const nlohmann::json& index() const { return index_; }  // empty object for a bare shard or text
  // Refuses a dataset whose index records another tokenizer than `tokenizer` (vocabulary fingerprint).
  void check_tokenizer(const Tokenizer& tokenizer, const std::string& model) const;

  struct Piece;  // a mapped shard or an owned vector (token_dataset.cpp)

 private:
  std::vector<std::shared_ptr<const Piece>> pieces_;
  std::vector<int64_t> starts_;  // stream offset of each piece
  int64_t total_ = 0;
  std::string name_;
  nlohmann::json index_ = nlohmann::json::object();
};

}  // namespace linearize
