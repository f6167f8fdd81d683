// Conversations and the ChatML template, for SFT, chat and instruction evaluation.
//
// Reading (read_conversations): one jsonl record per line, in either form
//   {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}   (smoltalk)
//   {"instruction": "...", "input": "...", "output": "..."}                         (alpaca-like)
//   {"instruction": "...", "instances": [{"input": "...", "output": "..."}, ...]}   (self-instruct)
// An instruction record becomes user = instruction (+ "\n\n" + input when the input is not empty),
// assistant = output; each self-instruct instance is a conversation of its own. A malformed record
// is an Error "FILE:LINE: what was expected".
//
// ChatML, as SmolLM2 and Qwen write it:
//   <|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n
//   <|im_start|>assistant\n{reply}<|im_end|>\n ... and, to ask for a reply, <|im_start|>assistant\n
// encode_chat builds the ids piece by piece: the two markers are always their own ids (never parsed
// from message text, so a message cannot forge a turn), the text between them goes through
// tokenizer.encode(.., parse_special = false). The loss mask is 1 on the ids of every assistant reply
// and on the <|im_end|> that closes it (the model must learn to stop), 0 elsewhere.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "io/tokenizer.h"

namespace linearize {

struct ChatMessage {
  std::string role;  // system | user | assistant
  std::string content;
};
using Conversation = std::vector<ChatMessage>;

struct ConversationRecord {
  Conversation messages;
  int64_t line = 0;  // line of the jsonl file it came from
};

std::vector<ConversationRecord> read_conversations(const std::string& path);

inline const char* kImStart = "<|im_start|>";
inline const char* kImEnd = "<|im_end|>";

// The ChatML template string Hugging Face tokenizer configs carry (as SmolLM2's, without its default
// system prompt); written to tokenizer_config.json by sft.
std::string chatml_template_jinja();

// Which template a model folder asks for: its tokenizer_config.json "chat_template" when it is one
// we support (ChatML, recognised by its <|im_start|>role\n ... <|im_end|> layout), else ChatML as
// the default. *note says which, for the user.
struct ChatFormat {
  std::string name = "chatml";
  std::string default_system;  // used when a conversation has no system message ("" = none)
};
ChatFormat chat_format_for(const std::string& model_folder, std::string* note);

// The text of a conversation in ChatML; with add_generation_prompt, ends with "<|im_start|>assistant\n".
std::string render_chatml(const Conversation& conv, const std::string& system, bool add_generation_prompt);
// The inverse for text render_chatml wrote (a trailing generation prompt is dropped). Throws on text
// that is not ChatML.
Conversation parse_chatml(const std::string& text);

// Ids of the two markers: the tokenizer's own, or extra ids a model folder records in
// tokenizer_config.json "added_tokens_decoder" (how sft adds them to a SentencePiece model).
struct ChatTokens {
  int32_t im_start = -1, im_end = -1;
  std::vector<int32_t> prefix;  // ids every sequence starts with (BOS for SentencePiece models)
};
std::optional<int32_t> find_added_token(const Tokenizer& tok, const std::string& model_folder,
                                        const std::string& content);

struct EncodedChat {
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;  // 1 = an assistant token the loss is taken on
};
// A conversation (after the default system prompt when it has none) as ids + loss mask.
EncodedChat encode_chat(const Conversation& conv, const std::string& system, const Tokenizer& tok,
                        const ChatTokens& marks, bool add_generation_prompt);
// One message block: <|im_start|>role\ncontent<|im_end|>\n, appended to *out (mask when given).
void encode_message(const ChatMessage& m, const Tokenizer& tok, const ChatTokens& marks, std::vector<int32_t>* out,
                    std::vector<uint8_t>* mask = nullptr);
// <|im_start|>assistant\n
std::vector<int32_t> encode_generation_prompt(const Tokenizer& tok, const ChatTokens& marks);

}  // namespace linearize
