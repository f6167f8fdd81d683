// SentencePiece BPE: tokenizer.model parsed from protobuf wire format, identity normalisation,
// score-ordered merging, byte fallback, and SentencePiece-style decoding. See the header for why
// libsentencepiece is not used and what is left out.
#include "io/tokenizer_sentencepiece.h"

#include <cstring>
#include <fstream>
#include <queue>
#include <sstream>

#include "io/error.h"
#include "io/utf8.h"

namespace linearize {

namespace {

const std::string kSpaceSymbol = "\xE2\x96\x81";  // U+2581 '▁', SentencePiece's visible space

// ---------------------------------------------------------------------------------------------
// Protobuf wire format: just enough to walk ModelProto and its sub-messages.

class WireReader {
 public:
  WireReader(const std::string& buf, size_t begin, size_t end, const std::string& where)
      : buf_(buf), pos_(begin), end_(end), where_(where) {}

  bool done() const { return pos_ >= end_; }

  // Reads a field key; returns the field number and sets the wire type.
  uint32_t key(int* wire) {
    uint64_t k = varint();
    *wire = static_cast<int>(k & 7);
    return static_cast<uint32_t>(k >> 3);
  }

  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      need(1);
      const unsigned char b = static_cast<unsigned char>(buf_[pos_++]);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    fail("a varint of at most 10 bytes");
    return 0;
  }

  // A length-delimited field: returns its [begin, end) range and skips it.
  std::pair<size_t, size_t> span() {
    const uint64_t n = varint();
    need(n);
    const size_t b = pos_;
    pos_ += n;
    return {b, pos_};
  }

  std::string bytes() {
    auto s = span();
    return buf_.substr(s.first, s.second - s.first);
  }

  float f32() {
    need(4);
    uint32_t u = 0;
    for (int i = 0; i < 4; ++i) u |= static_cast<uint32_t>(static_cast<unsigned char>(buf_[pos_ + i])) << (8 * i);
    pos_ += 4;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }

  void skip(int wire) {
    if (wire == 0) varint();
    else if (wire == 1) advance(8);
    else if (wire == 2) span();
    else if (wire == 5) advance(4);
    else fail("wire type 0, 1, 2 or 5, found " + std::to_string(wire));
  }

 private:
  void advance(size_t n) { need(n); pos_ += n; }
  void need(uint64_t n) {
    if (n > end_ - pos_) fail(std::to_string(n) + " more bytes at offset " + std::to_string(pos_));
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(where_ + ": expected a SentencePiece ModelProto, found a malformed protobuf (expected " +
                what + ")");
  }

  const std::string& buf_;
  size_t pos_, end_;
  const std::string& where_;
};

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot open file");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// "<0xAB>" -> 0xAB; -1 when the piece is not written that way.
int parse_byte_piece(const std::string& piece) {
  if (piece.size() != 6 || piece.compare(0, 3, "<0x") != 0 || piece[5] != '>') return -1;
  int v = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = piece[i];
    int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'A' && c <= 'F') ? c - 'A' + 10
          : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size()))
    s.replace(pos, from.size(), to);
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Loading

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_path) : path_(model_path) {
  parse_model(read_file(model_path));
  if (pieces_.empty()) throw Error(path_ + ": expected SentencePiece pieces, found none");
  if (model_type_ != 2)
    throw Error(path_ + ": trainer_spec.model_type: expected 2 (BPE), found " + std::to_string(model_type_) +
                " (only BPE SentencePiece models are supported)");
  for (int b = 0; b < 256; ++b) byte_id_[b] = -1;
  bool have_unk = false;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const Piece& p = pieces_[i];
    const int32_t id = static_cast<int32_t>(i);
    id_of_.emplace(p.text, id);
    switch (p.type) {
      case PieceType::kNormal:
      case PieceType::kUnused:
        mergeable_.emplace(p.text, id);
        break;
      case PieceType::kUserDefined:
        mergeable_.emplace(p.text, id);
        user_defined_.push_back(p.text);
        break;
      case PieceType::kControl:
        if (!p.text.empty()) control_ids_.push_back(id);
        break;
      case PieceType::kUnknown:
        if (!have_unk) unk_id_ = id;
        have_unk = true;
        break;
      case PieceType::kByte: {
        const int b = parse_byte_piece(p.text);
        if (b < 0) throw Error(path_ + ": byte piece " + std::to_string(id) + ": expected <0xAB>, found \"" + p.text + "\"");
        byte_id_[b] = id;
        break;
      }
    }
  }
  if (!have_unk) throw Error(path_ + ": expected an <unk> piece (type UNKNOWN), found none");
}

void SentencePieceTokenizer::parse_model(const std::string& buf) {
  WireReader model(buf, 0, buf.size(), path_);
  std::string charsmap, norm_name;
  bool whitespace_suffix = false;
  while (!model.done()) {
    int wire = 0;
    const uint32_t field = model.key(&wire);
    if (field == 1 && wire == 2) {  // repeated SentencePiece pieces
      auto s = model.span();
      WireReader r(buf, s.first, s.second, path_);
      Piece p;
      while (!r.done()) {
        int w = 0;
        const uint32_t f = r.key(&w);
        if (f == 1 && w == 2) p.text = r.bytes();
        else if (f == 2 && w == 5) p.score = r.f32();
        else if (f == 3 && w == 0) p.type = static_cast<PieceType>(r.varint());
        else r.skip(w);
      }
      const int t = static_cast<int>(p.type);
      if (t < 1 || t > 6)
        throw Error(path_ + ": piece " + std::to_string(pieces_.size()) + ": expected type 1..6, found " + std::to_string(t));
      pieces_.push_back(p);
    } else if (field == 2 && wire == 2) {  // TrainerSpec
      auto s = model.span();
      WireReader r(buf, s.first, s.second, path_);
      while (!r.done()) {
        int w = 0;
        const uint32_t f = r.key(&w);
        if (f == 3 && w == 0) model_type_ = static_cast<int>(r.varint());
        else if (f == 24 && w == 0) whitespace_suffix = r.varint() != 0;
        else if (f == 35 && w == 0) byte_fallback_ = r.varint() != 0;
        else if (f == 44 && w == 2) unk_surface_ = r.bytes();
        else r.skip(w);
      }
    } else if (field == 3 && wire == 2) {  // NormalizerSpec
      auto s = model.span();
      WireReader r(buf, s.first, s.second, path_);
      while (!r.done()) {
        int w = 0;
        const uint32_t f = r.key(&w);
        if (f == 1 && w == 2) norm_name = r.bytes();
        else if (f == 2 && w == 2) charsmap = r.bytes();
        else if (f == 3 && w == 0) add_dummy_prefix_ = r.varint() != 0;
        else if (f == 4 && w == 0) remove_extra_whitespaces_ = r.varint() != 0;
        else if (f == 5 && w == 0) escape_whitespaces_ = r.varint() != 0;
        else r.skip(w);
      }
    } else {
      model.skip(wire);
    }
  }
  if (!charsmap.empty())
    throw Error(path_ + ": normalizer_spec: expected the identity normalisation, found rule \"" + norm_name +
                "\" with a precompiled charsmap (not supported)");
  if (whitespace_suffix)
    throw Error(path_ + ": trainer_spec.treat_whitespace_as_suffix: expected false, found true (not supported)");
}

// ---------------------------------------------------------------------------------------------
// Encoding

// Identity normalisation with SentencePiece's whitespace handling: optional removal of leading,
// trailing and repeated spaces, the dummy-prefix "▁", and ' ' -> "▁".
std::string SentencePieceTokenizer::normalize(const std::string& text) const {
  std::string s = text;
  if (remove_extra_whitespaces_) {
    std::string collapsed;
    for (char c : s) {
      if (c == ' ' && (collapsed.empty() || collapsed.back() == ' ')) continue;
      collapsed += c;
    }
    while (!collapsed.empty() && collapsed.back() == ' ') collapsed.pop_back();
    s.swap(collapsed);
  }
  if (s.empty()) return s;
  if (add_dummy_prefix_) s.insert(s.begin(), ' ');
  return escape_whitespaces_ ? replace_all(s, " ", kSpaceSymbol) : s;
}

// One symbol per UTF-8 character, except that user-defined pieces stay whole (longest first).
std::vector<std::string> SentencePieceTokenizer::initial_symbols(const std::string& s) const {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t len = 0;
    for (const std::string& u : user_defined_)
      if (u.size() > len && s.compare(i, u.size(), u) == 0) len = u.size();
    if (len == 0) {
      len = utf8::sequence_length(s, i);
      if (len == 0) len = 1;
    }
    out.push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

void SentencePieceTokenizer::encode_plain(const std::string& text, std::vector<int32_t>& out) const {
  std::vector<std::string> sym = initial_symbols(normalize(utf8::sanitize(text)));
  const int n = static_cast<int>(sym.size());
  if (n == 0) return;
  std::vector<int> prev(n), next(n);
  std::vector<char> alive(n, 1);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    float score;
    int left, right;
    size_t size;  // bytes of the merged piece, to detect a stale entry
  };
  // Highest score first; the leftmost pair on ties.
  auto worse = [](const Candidate& a, const Candidate& b) {
    return a.score != b.score ? a.score < b.score : a.left > b.left;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(worse)> heap(worse);
  auto push_pair = [&](int left) {
    if (left < 0 || next[left] < 0) return;
    const int right = next[left];
    auto it = mergeable_.find(sym[left] + sym[right]);
    if (it != mergeable_.end())
      heap.push({pieces_[it->second].score, left, right, sym[left].size() + sym[right].size()});
  };
  for (int i = 0; i + 1 < n; ++i) push_pair(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    if (!alive[c.left] || !alive[c.right] || next[c.left] != c.right ||
        sym[c.left].size() + sym[c.right].size() != c.size)
      continue;  // stale: one side merged since
    sym[c.left] += sym[c.right];
    alive[c.right] = 0;
    next[c.left] = next[c.right];
    if (next[c.right] >= 0) prev[next[c.right]] = c.left;
    push_pair(prev[c.left]);
    push_pair(c.left);
  }
  bool last_was_unk = false;
  for (int i = 0; i >= 0; i = next[i]) {
    auto it = mergeable_.find(sym[i]);
    if (it != mergeable_.end()) {
      out.push_back(it->second);
      last_was_unk = false;
    } else if (byte_fallback_) {
      for (unsigned char b : sym[i]) out.push_back(byte_id_[b] >= 0 ? byte_id_[b] : unk_id_);
      last_was_unk = false;
    } else {
      if (!last_was_unk) out.push_back(unk_id_);  // a run of unknown symbols is one <unk>
      last_was_unk = true;
    }
  }
}

std::vector<int32_t> SentencePieceTokenizer::encode(const std::string& text, bool parse_special) const {
  std::vector<int32_t> out;
  if (!parse_special || control_ids_.empty()) {
    encode_plain(text, out);
    return out;
  }
  size_t start = 0;  // leftmost, then longest control piece
  while (start < text.size()) {
    size_t best_pos = std::string::npos, best_len = 0;
    int32_t best_id = -1;
    for (int32_t id : control_ids_) {
      const std::string& p = pieces_[id].text;
      const size_t pos = text.find(p, start);
      if (pos == std::string::npos) continue;
      if (pos < best_pos || (pos == best_pos && p.size() > best_len)) {
        best_pos = pos;
        best_len = p.size();
        best_id = id;
      }
    }
    if (best_id < 0) break;
    encode_plain(text.substr(start, best_pos - start), out);
    out.push_back(best_id);
    start = best_pos + best_len;
  }
  if (start < text.size()) encode_plain(text.substr(start), out);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Decoding

void SentencePieceTokenizer::check_id(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= pieces_.size())
    throw Error(path_ + ": token id " + std::to_string(id) + " out of range [0, " +
                std::to_string(pieces_.size()) + ")");
}

std::string SentencePieceTokenizer::token_bytes(int32_t id, int64_t position) const {
  check_id(id);
  const Piece& p = pieces_[id];
  if (p.type == PieceType::kControl || p.type == PieceType::kUnknown) return std::string();
  if (p.type == PieceType::kByte) return std::string(1, static_cast<char>(parse_byte_piece(p.text)));
  std::string text = replace_all(p.text, kSpaceSymbol, " ");
  if (position == 0 && !text.empty() && text[0] == ' ') text.erase(0, 1);
  return text;
}

std::string SentencePieceTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text, bytes;  // `bytes`: a run of byte pieces, read as UTF-8 when it ends
  auto flush_bytes = [&] {
    text += utf8::sanitize(bytes);
    bytes.clear();
  };
  for (int32_t id : ids) {
    check_id(id);
    const Piece& p = pieces_[id];
    if (p.type == PieceType::kByte) {
      bytes += static_cast<char>(parse_byte_piece(p.text));
      continue;
    }
    flush_bytes();
    if (p.type == PieceType::kControl) continue;
    if (p.type == PieceType::kUnknown) {
      text += unk_surface_;
      continue;
    }
    const bool strip = text.empty() && (add_dummy_prefix_ || remove_extra_whitespaces_);
    text += token_bytes(id, strip ? 0 : 1);
  }
  flush_bytes();
  return text;
}

std::optional<int32_t> SentencePieceTokenizer::token_to_id(const std::string& token) const {
  auto it = id_of_.find(token);
  if (it == id_of_.end()) return std::nullopt;
  return it->second;
}

}  // namespace linearize
