// Reading text corpora of any size in pieces: plain, gzip (.gz) or zstd (.zst) compressed files, as
// .txt (one document per file) or .jsonl (one document per line, text in a field).
//
// A .txt document is handed out in chunks of about `chunk_bytes`, each cut right after a newline that is
// followed by a non-space character when the tokenizer's pre-tokenizer never joins text across such a
// point (byte-level BPE with the GPT-2 regex: a pre-token never holds a newline followed by a letter,
// digit or symbol), so that encoding the chunks one by one gives the ids of encoding the whole file. For
// other tokenizers the file is one chunk.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace linearize {

// Raw bytes of a file, decompressed by its extension (.gz, .zst). Errors name the file.
class ByteStream {
 public:
  virtual ~ByteStream() = default;
  // Reads up to n bytes; 0 at the end of the file.
  virtual size_t read(char* out, size_t n) = 0;
  static std::unique_ptr<ByteStream> open(const std::string& path);
};

// The extension that decides the format, with a compression suffix removed ("a.jsonl.gz" -> ".jsonl").
std::string text_format(const std::string& path);

struct TextPiece {
  std::string text;
  bool document_end = false;  // the last piece of a document
  int64_t line = 0;           // jsonl: the line it came from
};

class TextReader {
 public:
  // `chunk_bytes` 0 keeps a .txt file whole.
  TextReader(const std::string& path, const std::string& jsonl_field, size_t chunk_bytes);
  // The next piece; false at the end of the file. A malformed jsonl line is an Error "FILE:LINE: ...".
  bool next(TextPiece& piece);
  int64_t bytes_read() const { return bytes_; }  // decompressed bytes so far

 private:
  bool fill();
  std::unique_ptr<ByteStream> in_;
  std::string path_, field_, buffer_;
  size_t chunk_bytes_;
  bool jsonl_, eof_ = false, txt_done_ = false;
  int64_t line_ = 0, bytes_ = 0;
};

}  // namespace linearize
