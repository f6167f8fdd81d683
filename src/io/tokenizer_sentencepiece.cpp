// SentencePiece wrapper: loads tokenizer.model, encodes without BOS, decodes with SentencePiece and
// maps single pieces to the bytes they print as (see tokenizer_sentencepiece.h).
#include "io/tokenizer_sentencepiece.h"

#include <sentencepiece_processor.h>

#include "io/error.h"

namespace linearize {

namespace {

const char* kSpaceSymbol = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space

// "<0xAB>" -> 0xAB; -1 when the piece is not a byte piece.
int parse_byte_piece(const std::string& piece) {
  if (piece.size() != 6 || piece.compare(0, 3, "<0x") != 0 || piece[5] != '>') return -1;
  try {
    return std::stoi(piece.substr(3, 2), nullptr, 16);
  } catch (...) {
    return -1;
  }
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size()))
    s.replace(pos, from.size(), to);
  return s;
}

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_path)
    : path_(model_path), sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  const auto status = sp_->Load(model_path);
  if (!status.ok())
    throw Error(model_path + ": expected a SentencePiece model (tokenizer.model), found an error: " +
                status.ToString());
  for (int id = 0; id < sp_->GetPieceSize(); ++id) {
    if (sp_->IsControl(id) && !sp_->IdToPiece(id).empty()) {
      control_pieces_.push_back(sp_->IdToPiece(id));
      control_ids_.push_back(id);
    }
  }
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

void SentencePieceTokenizer::encode_plain(const std::string& text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::vector<int> ids;
  const auto status = sp_->Encode(text, &ids);
  if (!status.ok()) throw Error(path_ + ": SentencePiece encode failed: " + status.ToString());
  out.insert(out.end(), ids.begin(), ids.end());
}

std::vector<int32_t> SentencePieceTokenizer::encode(const std::string& text, bool parse_special) const {
  std::vector<int32_t> out;
  if (!parse_special || control_pieces_.empty()) {
    encode_plain(text, out);
    return out;
  }
  size_t start = 0;  // leftmost, then longest control piece
  while (start <= text.size()) {
    size_t best_pos = std::string::npos, best_len = 0;
    int32_t best_id = -1;
    for (size_t k = 0; k < control_pieces_.size(); ++k) {
      size_t pos = text.find(control_pieces_[k], start);
      if (pos == std::string::npos) continue;
      if (pos < best_pos || (pos == best_pos && control_pieces_[k].size() > best_len)) {
        best_pos = pos;
        best_len = control_pieces_[k].size();
        best_id = control_ids_[k];
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

void SentencePieceTokenizer::check_id(int32_t id) const {
  if (id < 0 || id >= sp_->GetPieceSize())
    throw Error(path_ + ": token id " + std::to_string(id) + " out of range [0, " +
                std::to_string(sp_->GetPieceSize()) + ")");
}

std::string SentencePieceTokenizer::decode(const std::vector<int32_t>& ids) const {
  for (int32_t id : ids) check_id(id);
  std::vector<int> v(ids.begin(), ids.end());
  std::string text;
  const auto status = sp_->Decode(v, &text);
  if (!status.ok()) throw Error(path_ + ": SentencePiece decode failed: " + status.ToString());
  return text;
}

std::string SentencePieceTokenizer::token_bytes(int32_t id, int64_t position) const {
  check_id(id);
  if (sp_->IsControl(id) || sp_->IsUnknown(id)) return std::string();
  const std::string& piece = sp_->IdToPiece(id);
  if (sp_->IsByte(id)) {
    const int b = parse_byte_piece(piece);
    if (b < 0) throw Error(path_ + ": byte piece " + std::to_string(id) + ": expected <0xAB>, found " + piece);
    return std::string(1, static_cast<char>(b));
  }
  std::string text = replace_all(piece, kSpaceSymbol, " ");
  if (position == 0 && !text.empty() && text[0] == ' ') text.erase(0, 1);
  return text;
}

int64_t SentencePieceTokenizer::vocab_size() const { return sp_->GetPieceSize(); }

std::optional<int32_t> SentencePieceTokenizer::token_to_id(const std::string& token) const {
  const int id = sp_->PieceToId(token);
  if (id < 0 || id >= sp_->GetPieceSize() || sp_->IdToPiece(id) != token) return std::nullopt;
  return id;
}

}  // namespace linearize
