// Tokenizing corpora of any size into a token dataset (data/token_dataset.h) with bounded memory: the
// inputs are read in pieces (data/text_stream.h), encoded by several threads, and written in their order
// to numbered shards of a chosen size; index.json is written last. A shard is written as
// shard-NNNNN.u32.partial and renamed when complete, and a run that finds a folder without index.json
// (an interrupted run) removes its shards and starts again, so no shard that looks complete is ever
// left from an unfinished run. The ids equal those of tokenize_documents() on the same files.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace linearize {

class Tokenizer;

struct TokenizeProgress {
  int64_t bytes = 0, tokens = 0, documents = 0;
  double seconds = 0;
  bool done = false;
};

struct TokenizeOptions {
  std::vector<std::string> inputs;      // .txt/.jsonl files, each optionally .gz or .zst
  std::string output;                   // a folder (shards + index.json), or FILE.u32 for one shard
  int64_t eos_id = -1;                  // appended after each document (< 0: none)
  std::string field = "text";           // jsonl field
  int64_t shard_tokens = int64_t{1} << 28;  // tokens per shard (1 GiB)
  int threads = 0;                      // encoding threads (0: the machine's cores)
  size_t chunk_bytes = size_t{1} << 20; // .txt pieces
  std::string tokenizer_source;         // recorded in the index
  std::function<void(const TokenizeProgress&)> progress;  // called about once a second and at the end
};

// Expands shell-style globs (* ? [..]) in `patterns`; a pattern that matches nothing is an Error.
std::vector<std::string> expand_inputs(const std::vector<std::string>& patterns);

TokenizeProgress tokenize_to_dataset(const Tokenizer& tokenizer, const TokenizeOptions& options);

}  // namespace linearize
