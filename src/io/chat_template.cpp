// Conversation records, the ChatML template and its token-level encoding (see chat_template.h).
#include "io/chat_template.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "io/error.h"
#include "io/jsonl.h"

namespace linearize {

namespace {

std::string where(const std::string& path, int64_t line) { return path + ":" + std::to_string(line) + ": "; }

std::string string_field(const nlohmann::json& j, const std::string& field, const std::string& ctx) {
  if (!j.is_object() || !j.contains(field) || !j[field].is_string())
    throw Error(ctx + "expected a string field \"" + field + "\"");
  return j[field].get<std::string>();
}

Conversation instruction_pair(const std::string& instruction, const std::string& input, const std::string& output) {
  std::string user = instruction;
  if (!input.empty()) user += "\n\n" + input;
  return {{"user", user}, {"assistant", output}};
}

}  // namespace

std::vector<ConversationRecord> read_conversations(const std::string& path) {
  std::vector<ConversationRecord> out;
  for_each_jsonl(path, [&](const nlohmann::json& j, int64_t line) {
    const std::string at = where(path, line);
    if (!j.is_object()) throw Error(at + "expected a JSON object per line, found " + std::string(j.type_name()));
    if (j.contains("messages")) {
      const auto& ms = j["messages"];
      if (!ms.is_array() || ms.empty()) throw Error(at + "expected \"messages\" to be a non-empty array");
      Conversation conv;
      bool any_assistant = false;
      for (size_t i = 0; i < ms.size(); ++i) {
        const std::string ctx = at + "messages[" + std::to_string(i) + "]: ";
        ChatMessage m{string_field(ms[i], "role", ctx), string_field(ms[i], "content", ctx)};
        if (m.role != "system" && m.role != "user" && m.role != "assistant")
          throw Error(ctx + "expected role system, user or assistant, found \"" + m.role + "\"");
        any_assistant = any_assistant || m.role == "assistant";
        conv.push_back(m);
      }
      if (!any_assistant) throw Error(at + "expected at least one assistant message (nothing to learn from)");
      out.push_back({conv, line});
    } else if (j.contains("instruction")) {
      const std::string instruction = string_field(j, "instruction", at);
      if (j.contains("instances")) {
        const auto& inst = j["instances"];
        if (!inst.is_array() || inst.empty()) throw Error(at + "expected \"instances\" to be a non-empty array");
        for (size_t i = 0; i < inst.size(); ++i) {
          const std::string ctx = at + "instances[" + std::to_string(i) + "]: ";
          out.push_back({instruction_pair(instruction, string_field(inst[i], "input", ctx),
                                          string_field(inst[i], "output", ctx)),
                         line});
        }
      } else {
        const std::string input = j.contains("input") ? string_field(j, "input", at) : "";
        out.push_back({instruction_pair(instruction, input, string_field(j, "output", at)), line});
      }
    } else {
      throw Error(at + "expected a conversation {\"messages\": [...]} or an instruction record "
                       "{\"instruction\", \"input\", \"output\" | \"instances\"}");
    }
  });
  if (out.empty()) throw Error(path + ": expected at least one conversation, found none");
  return out;
}

std::string chatml_template_jinja() {
  return "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
         "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
}

ChatFormat chat_format_for(const std::string& folder, std::string* note) {
  ChatFormat f;
  const auto cfg = std::filesystem::path(folder) / "tokenizer_config.json";
  std::string tmpl;
  if (std::filesystem::exists(cfg)) {
    try {
      std::ifstream in(cfg);
      auto j = nlohmann::json::parse(in);
      if (j.contains("chat_template") && j["chat_template"].is_string()) tmpl = j["chat_template"].get<std::string>();
    } catch (const nlohmann::json::exception& e) {
      throw Error(cfg.string() + ": malformed JSON: " + e.what());
    }
  }
  if (tmpl.empty()) {
    if (note) *note = "ChatML template (the model folder has no chat_template)";
  } else if (tmpl.find("<|im_start|>") != std::string::npos && tmpl.find("<|im_end|>") != std::string::npos &&
             tmpl.find("message['role']") != std::string::npos) {
    if (note) *note = "ChatML template (from " + cfg.string() + ")";
    // SmolLM2-Instruct's template inserts this system prompt when the conversation has none.
    const std::string marker = "<|im_start|>system\\n";
    auto p = tmpl.find("{{ '" + marker);
    if (p == std::string::npos) p = tmpl.find("{{'" + marker);
    if (p != std::string::npos) {
      const auto b = tmpl.find(marker, p) + marker.size();
      const auto e = tmpl.find("<|im_end|>", b);
      if (e != std::string::npos && tmpl.substr(b, e - b).find_first_of("{}'") == std::string::npos)
        f.default_system = tmpl.substr(b, e - b);
    }
  } else {
    if (note) *note = "ChatML template (the chat_template of " + cfg.string() + " is not ChatML, which is the only one supported)";
  }
  return f;
}

std::string render_chatml(const Conversation& conv, const std::string& system, bool add_generation_prompt) {
  std::string out;
  if (!system.empty() && (conv.empty() || conv[0].role != "system"))
    out += std::string(kImStart) + "system\n" + system + kImEnd + "\n";
  for (const auto& m : conv) out += std::string(kImStart) + m.role + "\n" + m.content + kImEnd + "\n";
  if (add_generation_prompt) out += std::string(kImStart) + "assistant\n";
  return out;
}

Conversation parse_chatml(const std::string& text) {
  Conversation conv;
  const std::string start = kImStart, end = std::string(kImEnd) + "\n";
  size_t p = 0;
  while (p < text.size()) {
    if (text.compare(p, start.size(), start) != 0)
      throw Error("ChatML: expected <|im_start|> at offset " + std::to_string(p));
    const size_t nl = text.find('\n', p + start.size());
    if (nl == std::string::npos) throw Error("ChatML: expected a newline after the role at offset " + std::to_string(p));
    const std::string role = text.substr(p + start.size(), nl - p - start.size());
    if (nl + 1 == text.size() && role == "assistant") break;  // generation prompt
    const size_t e = text.find(end, nl + 1);
    if (e == std::string::npos) throw Error("ChatML: message at offset " + std::to_string(p) + " has no <|im_end|>");
    conv.push_back({role, text.substr(nl + 1, e - nl - 1)});
    p = e + end.size();
  }
  return conv;
}

std::optional<int32_t> find_added_token(const Tokenizer& tok, const std::string& folder, const std::string& content) {
  if (auto id = tok.token_to_id(content)) return id;
  const auto cfg = std::filesystem::path(folder) / "tokenizer_config.json";
  if (folder.empty() || !std::filesystem::exists(cfg)) return std::nullopt;
  std::ifstream in(cfg);
  auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("added_tokens_decoder") || !j["added_tokens_decoder"].is_object()) return std::nullopt;
  for (auto it = j["added_tokens_decoder"].begin(); it != j["added_tokens_decoder"].end(); ++it)
    if (it.value().is_object() && it.value().value("content", "") == content) return std::stoi(it.key());
  return std::nullopt;
}

void encode_message(const ChatMessage& m, const Tokenizer& tok, const ChatTokens& marks, std::vector<int32_t>* out,
                    std::vector<uint8_t>* mask) {
  auto put = [&](const std::vector<int32_t>& ids, uint8_t learn) {
    out->insert(out->end(), ids.begin(), ids.end());
    if (mask) mask->insert(mask->end(), ids.size(), learn);
  };
  const uint8_t learn = m.role == "assistant" ? 1 : 0;
  put({marks.im_start}, 0);
  put(tok.encode(m.role + "\n", false), 0);
  put(tok.encode(m.content, false), learn);
  put({marks.im_end}, learn);
  put(tok.encode("\n", false), 0);
}

std::vector<int32_t> encode_generation_prompt(const Tokenizer& tok, const ChatTokens& marks) {
  std::vector<int32_t> out = {marks.im_start};
  auto r = tok.encode("assistant\n", false);
  out.insert(out.end(), r.begin(), r.end());
  return out;
}

EncodedChat encode_chat(const Conversation& conv, const std::string& system, const Tokenizer& tok,
                        const ChatTokens& marks, bool add_generation_prompt) {
  EncodedChat e;
  e.ids = marks.prefix;
  e.mask.assign(e.ids.size(), 0);
  if (!system.empty() && (conv.empty() || conv[0].role != "system"))
    encode_message({"system", system}, tok, marks, &e.ids, &e.mask);
  for (const auto& m : conv) encode_message(m, tok, marks, &e.ids, &e.mask);
  if (add_generation_prompt) {
    auto g = encode_generation_prompt(tok, marks);
    e.ids.insert(e.ids.end(), g.begin(), g.end());
    e.mask.insert(e.mask.end(), g.size(), 0);
  }
  return e;
}

}  // namespace linearize
