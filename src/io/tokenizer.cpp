// load_tokenizer (picks the implementation from a folder's files or a file's name) and the streaming
// decoder that holds back an incomplete UTF-8 character until its last byte arrives.
//
// Deliberately not here: any tokenization logic (tokenizer_bpe.cpp, tokenizer_sentencepiece.cpp).
#include "io/tokenizer.h"

#include <filesystem>

#include "io/error.h"
#include "io/tokenizer_bpe.h"
#include "io/tokenizer_sentencepiece.h"
#include "io/utf8.h"

namespace linearize {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::unique_ptr<Tokenizer> load_from_folder(const fs::path& dir) {
  const fs::path json = dir / "tokenizer.json", model = dir / "tokenizer.model";
  const fs::path vocab = dir / "vocab.json", merges = dir / "merges.txt";
  if (fs::exists(json)) {
    try {
      return BpeTokenizer::from_tokenizer_json(json.string());
    } catch (const Error&) {
      // Llama-2 folders ship a tokenizer.json we do not support (byte_fallback) next to the
      // tokenizer.model that is the real thing.
      if (!fs::exists(model)) throw;
    }
  }
  if (fs::exists(model)) return std::make_unique<SentencePieceTokenizer>(model.string());
  if (fs::exists(vocab) && fs::exists(merges))
    return BpeTokenizer::from_vocab_merges(vocab.string(), merges.string());
  throw Error(dir.string() + ": expected tokenizer.json, tokenizer.model or vocab.json + merges.txt, found none");
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& folder_or_file) {
  const fs::path p(folder_or_file);
  if (fs::is_directory(p)) return load_from_folder(p);
  if (!fs::exists(p)) throw Error(folder_or_file + ": no such file or folder (expected a tokenizer)");
  const std::string name = p.filename().string();
  if (ends_with(name, ".model")) return std::make_unique<SentencePieceTokenizer>(folder_or_file);
  const fs::path merges = p.parent_path() / "merges.txt";
  if (name == "vocab.json" && fs::exists(merges))
    return BpeTokenizer::from_vocab_merges(folder_or_file, merges.string());
  if (ends_with(name, ".json")) return BpeTokenizer::from_tokenizer_json(folder_or_file);
  throw Error(folder_or_file + ": expected a tokenizer file ending in .json or .model, found \"" + name + "\"");
}

// Position counts the tokens that produced bytes so far, so that SentencePiece drops the leading
// space exactly where its own decoder would: on the first piece that yields text.
std::string StreamDecoder::push(int32_t id) {
  const std::string bytes = tokenizer_.token_bytes(id, position_);
  if (!bytes.empty()) ++position_;
  pending_ += bytes;
  const size_t n = utf8::complete_prefix_length(pending_);
  std::string ready = utf8::sanitize(pending_.substr(0, n));
  pending_.erase(0, n);
  return ready;
}

std::string StreamDecoder::flush() {
  std::string rest;
  rest.swap(pending_);
  return rest;
}

}  // namespace linearize
