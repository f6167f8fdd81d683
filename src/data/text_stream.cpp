// Plain, gzip and zstd byte streams and the .txt / .jsonl piece reader (see text_stream.h).
#include "data/text_stream.h"

#include <zlib.h>
#include <zstd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/error.h"
#include "io/atomic_file.h"

namespace linearize {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

FILE* open_file(const std::string& path) {
  require_regular_file(path);
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw Error("cannot open " + path + ": " + std::strerror(errno));
  return f;
}

class PlainStream : public ByteStream {
 public:
  explicit PlainStream(const std::string& path) : path_(path), f_(open_file(path)) {}
  ~PlainStream() override { std::fclose(f_); }
  size_t read(char* out, size_t n) override {
    const size_t got = std::fread(out, 1, n, f_);
    if (got < n && std::ferror(f_)) throw Error(path_ + ": read error: " + std::strerror(errno));
    return got;
  }

 private:
  std::string path_;
  FILE* f_;
};

class GzipStream : public ByteStream {
 public:
  explicit GzipStream(const std::string& path) : path_(path), f_(gzopen(path.c_str(), "rb")) {
    if (!f_) throw Error("cannot open " + path + ": " + std::strerror(errno));
    gzbuffer(f_, 1 << 17);
  }
  ~GzipStream() override { gzclose(f_); }
  size_t read(char* out, size_t n) override {
    const int got = gzread(f_, out, static_cast<unsigned>(std::min<size_t>(n, 1u << 30)));
    int err = Z_OK;
    const char* msg = gzerror(f_, &err);
    if (got < 0 || (err != Z_OK && err != Z_STREAM_END))
      throw Error(path_ + ": corrupt or truncated gzip data (" + std::string(msg ? msg : "?") + ")");
    return static_cast<size_t>(got);
  }

 private:
  std::string path_;
  gzFile f_;
};

class ZstdStream : public ByteStream {
 public:
  explicit ZstdStream(const std::string& path)
      : path_(path), f_(open_file(path)), ctx_(ZSTD_createDStream()), in_buf_(ZSTD_DStreamInSize()) {
    if (!ctx_) throw Error(path + ": cannot create a zstd decoder");
    ZSTD_initDStream(ctx_);
  }
  ~ZstdStream() override {
    ZSTD_freeDStream(ctx_);
    std::fclose(f_);
  }
  size_t read(char* out, size_t n) override {
    ZSTD_outBuffer o{out, n, 0};
    while (o.pos == 0) {
      if (in_.pos == in_.size) {
        const size_t got = std::fread(in_buf_.data(), 1, in_buf_.size(), f_);
        if (got == 0) {
          if (std::ferror(f_)) throw Error(path_ + ": read error: " + std::strerror(errno));
          if (!frame_done_) throw Error(path_ + ": truncated zstd data (the last frame does not end)");
          return 0;
        }
        in_ = {in_buf_.data(), got, 0};
      }
      const size_t r = ZSTD_decompressStream(ctx_, &o, &in_);
      if (ZSTD_isError(r)) throw Error(path_ + ": corrupt zstd data (" + ZSTD_getErrorName(r) + ")");
      frame_done_ = r == 0;
    }
    return o.pos;
  }

 private:
  std::string path_;
  FILE* f_;
  ZSTD_DStream* ctx_;
  std::vector<char> in_buf_;
  ZSTD_inBuffer in_{nullptr, 0, 0};
  bool frame_done_ = true;  // an empty file holds no frame
};

// Where a .txt chunk may end: after "c\n" followed by d, c and d printable ASCII that are not spaces.
// Neither the GPT-2 regex nor Digits puts such a newline in one pre-token with its neighbours, and the
// newline alone is its own pre-token whether or not the text ends after it.
bool safe_cut(const std::string& s, size_t i) {
  auto printable = [](char c) { return c > ' ' && c < 0x7f; };
  return i >= 2 && i < s.size() && s[i - 1] == '\n' && printable(s[i - 2]) && printable(s[i]);
}

}  // namespace

std::unique_ptr<ByteStream> ByteStream::open(const std::string& path) {
  if (ends_with(path, ".gz")) return std::make_unique<GzipStream>(path);
  if (ends_with(path, ".zst")) return std::make_unique<ZstdStream>(path);
  return std::make_unique<PlainStream>(path);
}

std::string text_format(const std::string& path) {
  std::string p = path;
  for (const char* z : {".gz", ".zst"})
    if (ends_with(p, z)) p.resize(p.size() - std::strlen(z));
  const auto dot = p.rfind('.');
  const auto slash = p.rfind('/');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return "";
  return p.substr(dot);
}

TextReader::TextReader(const std::string& path, const std::string& jsonl_field, size_t chunk_bytes)
    : in_(ByteStream::open(path)), path_(path), field_(jsonl_field), chunk_bytes_(chunk_bytes),
      jsonl_(text_format(path) == ".jsonl") {}

bool TextReader::fill() {
  if (eof_) return false;
  char buf[1 << 16];
  const size_t got = in_->read(buf, sizeof buf);
  if (got == 0) {
    eof_ = true;
    return false;
  }
  buffer_.append(buf, got);
  bytes_ += static_cast<int64_t>(got);
  return true;
}

bool TextReader::next(TextPiece& piece) {
  if (jsonl_) {
    while (true) {
      size_t nl = buffer_.find('\n');
      while (nl == std::string::npos && fill()) nl = buffer_.find('\n');
      if (buffer_.empty() && eof_) return false;
      std::string line = nl == std::string::npos ? buffer_ : buffer_.substr(0, nl);
      buffer_.erase(0, nl == std::string::npos ? buffer_.size() : nl + 1);
      ++line_;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        throw Error(path_ + ":" + std::to_string(line_) + ": malformed JSON line: " + e.what());
      }
      if (!j.is_object() || !j.contains(field_) || !j[field_].is_string())
        throw Error(path_ + ":" + std::to_string(line_) + ": missing string field \"" + field_ + "\"");
      piece.text = j[field_].get<std::string>();
      piece.document_end = true;
      piece.line = line_;
      return true;
    }
  }
  if (txt_done_) return false;
  // .txt: a chunk ending at a safe cut once it is chunk_bytes long, or the rest of the file.
  while (true) {
    if (chunk_bytes_ > 0 && buffer_.size() > chunk_bytes_) {
      size_t cut = chunk_bytes_;
      while (cut > 0 && !safe_cut(buffer_, cut)) --cut;
      if (cut > 0) {
        piece.text = buffer_.substr(0, cut);
        buffer_.erase(0, cut);
        piece.document_end = false;
        return true;
      }
    }
    const size_t before = buffer_.size();
    if (!fill()) break;
    // A chunk without a cut point keeps growing; look for one in the new bytes next time round.
    if (chunk_bytes_ > 0 && before > chunk_bytes_ && buffer_.size() > before) {
      size_t cut = buffer_.size() - 1;
      while (cut > before - 2 && !safe_cut(buffer_, cut)) --cut;
      if (cut > before - 2) {
        piece.text = buffer_.substr(0, cut);
        buffer_.erase(0, cut);
        piece.document_end = false;
        return true;
      }
    }
  }
  txt_done_ = true;
  piece.text = std::move(buffer_);
  buffer_.clear();
  piece.document_end = true;
  return true;
}

}  // namespace linearize
