// Token shards: a flat file of little-endian uint32 token ids, documents separated by the EOS id.
// Produced by `linearize tokenize --input ... --output FILE.u32`, read by training and evaluation.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace linearize {

class Tokenizer;

// Reads a whole shard; throws naming the file when its size is not a multiple of 4 or, when
// vocab_size > 0, an id is out of range.
std::vector<int32_t> read_token_shard(const std::string& path, int64_t vocab_size = 0);

// Writes a shard atomically.
void write_token_shard(const std::string& path, const std::vector<int32_t>& ids);

// Tokenizes documents into one stream, appending `eos_id` after each document (when eos_id >= 0).
// .txt: the whole file is one document. .jsonl: one document per line, text from `field`; a malformed
// line is an error naming the file and line number. Special tokens in the text are NOT parsed.
std::vector<int32_t> tokenize_documents(const Tokenizer& tokenizer, const std::vector<std::string>& paths,
                                        int64_t eos_id, const std::string& field = "text");

// Loads token ids from a .u32 shard, or tokenizes a .txt/.jsonl file on the fly.
std::vector<int32_t> load_tokens(const std::string& path, const Tokenizer* tokenizer, int64_t eos_id,
                                 int64_t vocab_size = 0);

}  // namespace linearize
