// Byte-level BPE tokenizer in the Hugging Face `tokenizer.json` form used by GPT-2 and SmolLM2.
//
// encode(text):
//   1. invalid UTF-8 is replaced by U+FFFD (as Hugging Face does when it receives bytes);
//   2. added tokens are cut out of the text first (leftmost-longest; lstrip/rstrip/single_word
//      honoured; special ones only when parse_special);
//   3. each remaining segment is pre-tokenised: optional Digits / Split(Regex, Isolated) steps, then
//      ByteLevel (GPT-2 regex through PCRE2 with UTF+UCP);
//   4. each piece's bytes become byte symbols (GPT-2 byte->unicode map); a byte whose symbol is not in
//      the vocabulary is dropped (SmolLM2 was trained on a restricted alphabet, unk_token is null);
//   5. symbols merge by merge rank, lowest rank first, ties to the leftmost pair. Results are cached
//      per piece.
// decode(ids): each token's characters go back through the byte map (a token with a character outside
// the map, e.g. an added token, contributes its raw text), and the bytes are read as UTF-8 with
// invalid sequences replaced by U+FFFD.
//
// Deliberately not supported (each is a clear Error at load time): normalizers, byte_fallback, BPE
// dropout, continuing_subword_prefix / end_of_word_suffix, unk tokens, pre-tokenizers other than
// Digits / Split(Isolated) / ByteLevel, decoders other than ByteLevel. The post_processor is read
// but never applied: encode() adds no BOS/EOS.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "io/tokenizer.h"

namespace linearize {

// A token matched in raw text before pre-tokenisation (tokenizer.json's "added_tokens").
struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = true;       // matched only when encode(..., parse_special=true)
  bool lstrip = false;       // the match swallows whitespace on its left
  bool rstrip = false;       // ... and on its right
  bool single_word = false;  // matched only when not glued to a word character
};

// One regex compiled with PCRE2 (UTF + UCP, JIT when available). Defined in the .cpp.
class BpeRegex;

// A pre-tokenisation step, applied in order to every piece produced by the previous one.
struct BpePreStep {
  enum class Kind { kSplitIsolated, kByteLevel };
  Kind kind = Kind::kSplitIsolated;
  std::shared_ptr<const BpeRegex> regex;  // null for ByteLevel(use_regex=false)
  bool add_prefix_space = false;          // ByteLevel only
  std::string describe;                   // for error messages and debugging
};

// The GPT-2 byte-level symbol (UTF-8) of a byte, e.g. ' ' -> "Ġ", '\n' -> "Ċ"; byte_level_encode maps
// every byte of a string.
const std::string& byte_level_symbol(uint8_t byte);
std::string byte_level_encode(const std::string& bytes);

// SmolLM2's pre-tokenisation of plain text (no added-token matching): invalid UTF-8 -> U+FFFD, then
// Digits(individual_digits) then the ByteLevel GPT-2 regex. Returns the raw-byte pieces (not yet
// byte-level encoded); concatenated they give the sanitised text. Used by the BPE trainer so it splits
// text exactly as BpeTokenizer::encode does for a tokenizer written with isolate_digits.
std::vector<std::string> pretokenize_smollm2(const std::string& text);
// The ByteLevel GPT-2 regex alone (a tokenizer written without isolate_digits: digit runs stay together).
std::vector<std::string> pretokenize_gpt2(const std::string& text);

// Writes a standard tokenizer.json (the layout of SmolLM2's: no normalizer, Digits(individual) when
// isolate_digits, then ByteLevel; BPE model with [a, b] merges; ByteLevel decoder) that both this
// class and Hugging Face tokenizers read. vocab[i] is the byte-level string of id i; added tokens
// carry their own ids (which must also be in vocab). Written atomically.
void write_tokenizer_json(const std::string& path, const std::vector<std::string>& vocab,
                          const std::vector<std::pair<std::string, std::string>>& merges,
                          const std::vector<AddedToken>& added_tokens, bool isolate_digits);

class BpeTokenizer : public Tokenizer {
 public:
  // In-memory construction. `vocab` maps byte-level token strings (e.g. "Ġthe") to ids; `merges` are
  // in rank order; `isolate_digits` puts Digits(individual_digits=true) before the ByteLevel step,
  // as SmolLM2 does. Throws Error when merges is empty or refers to tokens absent from the vocab.
  BpeTokenizer(const std::unordered_map<std::string, int32_t>& vocab,
               const std::vector<std::pair<std::string, std::string>>& merges,
               const std::vector<AddedToken>& added_tokens, bool isolate_digits,
               std::string source = "<memory>");

  // Hugging Face tokenizer.json (model.type BPE, byte-level).
  static std::unique_ptr<BpeTokenizer> from_tokenizer_json(const std::string& path);

  // GPT-2 style vocab.json + merges.txt (ByteLevel pre-tokenizer, no Digits). "<|endoftext|>", when
  // in the vocabulary, becomes a special added token as in GPT-2's tokenizer.json.
  static std::unique_ptr<BpeTokenizer> from_vocab_merges(const std::string& vocab_json_path,
                                                         const std::string& merges_txt_path);

  std::vector<int32_t> encode(const std::string& text, bool parse_special = true) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  std::string token_bytes(int32_t id, int64_t position) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(id_to_token_.size()); }
  std::optional<int32_t> token_to_id(const std::string& token) const override;
  std::string kind() const override { return "bpe"; }
  // True when every pre-tokenization step is Digits or the ByteLevel GPT-2 regex and no normalizer runs.
  bool safe_to_split_at_newlines() const override;
  std::string source() const override { return source_; }

  int64_t num_merges() const { return static_cast<int64_t>(merge_ranks_.size()); }
  const std::vector<AddedToken>& added_tokens() const { return added_; }

 private:
  struct MergeInfo {
    int32_t rank;
    int32_t merged_id;
  };
  struct TrieNode {
    std::unordered_map<unsigned char, int32_t> next;
    int32_t token = -1;  // index into added_ when a token ends here
  };

  BpeTokenizer() = default;
  void init_vocab(const std::unordered_map<std::string, int32_t>& vocab,
                  const std::vector<AddedToken>& added_tokens);
  void init_merges(const std::vector<std::pair<std::string, std::string>>& merges);
  void init_added_trie();

  // Added-token matching: splits `text` into (segment, added index or -1).
  std::vector<std::pair<std::string, int32_t>> split_added(const std::string& text,
                                                            bool parse_special) const;
  std::vector<std::string> pre_tokenize(const std::string& segment) const;
  void encode_piece(const std::string& piece, std::vector<int32_t>& out) const;
  std::vector<int32_t> bpe_merge(std::vector<int32_t> symbols) const;

  std::string source_;
  std::vector<std::string> id_to_token_;  // "" for holes in the id range
  std::unordered_map<std::string, int32_t> token_to_id_;
  std::unordered_map<uint64_t, MergeInfo> merge_ranks_;  // (left id << 32 | right id) -> merge
  int32_t byte_id_[256];                                 // id of each byte's symbol, -1 if absent
  std::vector<AddedToken> added_;
  std::vector<int32_t> added_index_of_id_;  // id -> index into added_, -1 if not added
  std::vector<TrieNode> trie_;
  std::vector<BpePreStep> pre_steps_;
  bool ignore_merges_ = false;  // a piece that is a whole vocab token is kept as one token
  bool nfc_ = false;            // normalizer NFC: text between added tokens is composed first (Qwen)

  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace linearize
