// SentencePiece tokenizer (tokenizer.model, e.g. Llama 2 / llama2.c's stories models) over
// libsentencepiece.
//
// encode() adds no BOS/EOS. With parse_special, control pieces written in the text ("<s>", "</s>")
// become their ids and the text between them is encoded piece by piece, each part getting its own
// dummy-prefix space (Hugging Face's legacy Llama behaviour); without, they are plain text.
// decode() is SentencePiece's own. token_bytes() gives what a piece prints as: U+2581 -> space,
// byte pieces <0xAB> -> that byte, control and unknown pieces -> nothing (llama2.c prints no "<unk>";
// this is the one place where concatenated token_bytes differ from decode(), which writes " ⁇ "),
// and the leading space dropped at position 0.
//
// Deliberately not supported: sampling / n-best encodings, extra encode/decode options.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "io/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace linearize {

class SentencePieceTokenizer : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& model_path);
  ~SentencePieceTokenizer() override;

  std::vector<int32_t> encode(const std::string& text, bool parse_special = true) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  std::string token_bytes(int32_t id, int64_t position) const override;
  int64_t vocab_size() const override;
  std::optional<int32_t> token_to_id(const std::string& token) const override;
  std::string kind() const override { return "sentencepiece"; }
  std::string source() const override { return path_; }

 private:
  void encode_plain(const std::string& text, std::vector<int32_t>& out) const;
  void check_id(int32_t id) const;

  std::string path_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::vector<std::string> control_pieces_;  // "<s>", "</s>", ... matched in text with parse_special
  std::vector<int32_t> control_ids_;
};

}  // namespace linearize
