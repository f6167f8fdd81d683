// SentencePiece BPE tokenizer (tokenizer.model of Llama 2 / llama2.c's stories models), read and run
// by our own code.
//
// Why not libsentencepiece: Debian's libsentencepiece.so bundles protobuf-lite 3.14 and exports its
// symbols, while libtorch links the system libprotobuf 3.21. In one process the two collide: the
// program crashes at start-up in protobuf's static initialisers, or, with libprotobuf loaded first,
// sentencepiece aborts with "compiled against version 3.14.0 ... installed version (3.21.12)". So the
// model file (a protobuf ModelProto) is parsed here from its wire format, and encoding follows
// SentencePiece's BPE: the text becomes "▁"-escaped characters (with the dummy prefix), user-defined
// pieces stay whole, then the adjacent pair whose merged piece has the highest score merges first
// (ties to the leftmost); a final symbol not in the vocabulary becomes byte pieces <0xAB> when
// byte_fallback is on, else <unk>.
//
// encode() adds no BOS/EOS. With parse_special, control pieces written in the text ("<s>", "</s>")
// become their ids and each stretch of text between them is encoded on its own (with its own dummy
// prefix, Hugging Face's legacy Llama behaviour); without, they are plain text.
// decode() follows SentencePiece: control pieces vanish, <unk> is the unk surface (" ⁇ "), byte
// pieces become bytes, "▁" becomes space, and the first piece that yields text loses its leading
// space. token_bytes() gives what one piece prints as (<unk> prints nothing, as in llama2.c).
//
// Deliberately not supported (clear Error at load): unigram/word/char models, normalisation rules
// other than identity (a non-empty precompiled_charsmap), treat_whitespace_as_suffix. Not done:
// re-segmenting UNUSED pieces after merging, sampling, n-best.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "io/tokenizer.h"

namespace linearize {

class SentencePieceTokenizer : public Tokenizer {
 public:
  enum class PieceType { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };
  struct Piece {
    std::string text;
    float score = 0.f;
    PieceType type = PieceType::kNormal;
  };

  explicit SentencePieceTokenizer(const std::string& model_path);

  std::vector<int32_t> encode(const std::string& text, bool parse_special = true) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  std::string token_bytes(int32_t id, int64_t position) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(pieces_.size()); }
  std::optional<int32_t> token_to_id(const std::string& token) const override;
  std::string kind() const override { return "sentencepiece"; }
  std::string source() const override { return path_; }

  const Piece& piece(int32_t id) const { return pieces_.at(static_cast<size_t>(id)); }
  int32_t unk_id() const { return unk_id_; }

 private:
  void parse_model(const std::string& bytes);
  std::string normalize(const std::string& text) const;
  void encode_plain(const std::string& text, std::vector<int32_t>& out) const;
  std::vector<std::string> initial_symbols(const std::string& normalized) const;
  void check_id(int32_t id) const;

  std::string path_;
  std::vector<Piece> pieces_;
  std::unordered_map<std::string, int32_t> id_of_;      // every piece -> id
  std::unordered_map<std::string, int32_t> mergeable_;  // normal, user-defined and unused pieces
  std::vector<std::string> user_defined_;               // matched whole in text
  std::vector<int32_t> control_ids_;                    // matched in text with parse_special
  int32_t byte_id_[256];                                // id of <0xAB>, -1 if absent
  int32_t unk_id_ = 0;
  std::string unk_surface_ = " \xE2\x81\x87 ";  // " ⁇ "
  int model_type_ = 1;                          // 1 unigram (proto default), 2 BPE
  bool byte_fallback_ = false;
  bool add_dummy_prefix_ = true;
  bool remove_extra_whitespaces_ = true;
  bool escape_whitespaces_ = true;
};

}  // namespace linearize
