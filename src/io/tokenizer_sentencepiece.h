// SentencePiece tokenizer (tokenizer.model of Llama 2 / llama2.c's stories models) through
// libsentencepiece, reached via our small shim library (src/io/sentencepiece_shim/).
//
// Why a shim: Debian's libsentencepiece.so bundles protobuf-lite 3.14 and exports its symbols,
// while libtorch links the system libprotobuf 3.21. Linked into one process the two collide (a crash
// in protobuf's static initialisers). The shim links libsentencepiece and is loaded with
// dlopen(RTLD_LOCAL | RTLD_DEEPBIND), so sentencepiece binds to its own protobuf and nobody else sees
// it. The shim is looked up next to the running executable, then at its build location, then at
// $LINEARIZE_SPM_LIB.
//
// encode() adds no BOS/EOS. With parse_special, control pieces written in the text ("<s>", "</s>")
// become their ids and each stretch of text between them is encoded on its own (Hugging Face's
// legacy Llama behaviour); without, they are plain text. decode() is libsentencepiece's.
// token_bytes() gives what one piece prints as: "▁" -> space, <0xAB> -> that byte, control and
// unknown pieces nothing, and the leading space dropped at position 0 (llama2.c after BOS).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "io/tokenizer.h"

namespace linearize {

// False in AddressSanitizer builds: the sanitizer runtime refuses dlopen with RTLD_DEEPBIND, so there
// SentencePiece files are refused with an error saying so (and the tests that need them skip).
bool sentencepiece_supported();

class SentencePieceTokenizer : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& model_path);
  ~SentencePieceTokenizer() override;

  std::vector<int32_t> encode(const std::string& text, bool parse_special = true) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  std::string token_bytes(int32_t id, int64_t position) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(pieces_.size()); }
  std::optional<int32_t> token_to_id(const std::string& token) const override;
  std::string kind() const override { return "sentencepiece"; }
  std::string source() const override { return path_; }

  const std::string& piece(int32_t id) const;

 private:
  enum class PieceKind { kText, kByte, kSilent };  // silent: control or unknown
  void encode_plain(const std::string& text, std::vector<int32_t>& out) const;
  void check_id(int32_t id) const;

  std::string path_;
  void* handle_ = nullptr;  // SentencePieceProcessor behind the shim
  std::vector<std::string> pieces_;
  std::vector<PieceKind> kinds_;
  std::vector<int32_t> control_ids_;  // matched in text with parse_special
  std::unordered_map<std::string, int32_t> id_of_;
};

}  // namespace linearize
