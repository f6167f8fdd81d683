// Tokenizer interface shared by the byte-level BPE (Hugging Face tokenizer.json) and SentencePiece
// (tokenizer.model) implementations, plus a streaming decoder that never splits a UTF-8 character.
//
// Ids are int32 everywhere (token shards store them as little-endian uint32).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace linearize {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Text -> ids. No BOS/EOS is added. With parse_special, added/special tokens written in the text
  // (e.g. "<|im_start|>") become their ids; without, they are tokenized as plain text.
  virtual std::vector<int32_t> encode(const std::string& text, bool parse_special = true) const = 0;

  // Ids -> text, as the reference library decodes (special tokens included as their text).
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;

  // The raw bytes one token stands for, in a sequence that starts at `position` (SentencePiece drops
  // the leading space of the first piece). Concatenating token_bytes over a sequence gives decode().
  virtual std::string token_bytes(int32_t id, int64_t position) const = 0;

  virtual int64_t vocab_size() const = 0;

  // Id of a token given by its vocabulary string (e.g. "<|endoftext|>", "<s>"), if present.
  virtual std::optional<int32_t> token_to_id(const std::string& token) const = 0;

  // Whether encoding a text in pieces cut after "c\n" (c and the next character printable ASCII, not
  // spaces) gives the ids of encoding it whole (data/text_stream.h splits large files there).
  virtual bool safe_to_split_at_newlines() const { return false; }

  // "bpe" or "sentencepiece", and the file it was loaded from.
  virtual std::string kind() const = 0;
  virtual std::string source() const = 0;
};

// Loads a tokenizer from a model folder (tokenizer.json, else tokenizer.model) or from a file path.
// Throws linearize::Error naming the path when none is found or the file is malformed.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& folder_or_file);

// Streaming decode: feed ids one at a time; each call returns the text that is complete so far
// (bytes of a UTF-8 character split across tokens are held back until the character is whole).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  std::string push(int32_t id);
  std::string flush();  // whatever is left (invalid trailing bytes are returned as they are)

 private:
  const Tokenizer& tokenizer_;
  std::string pending_;
  int64_t position_ = 0;
};

}  // namespace linearize
