// OpenAI request parsing and response bodies (see openai_api.h).
#include "serve/openai_api.h"

#include <cmath>

namespace linearize {

using nlohmann::json;

ApiError::ApiError(int status, const std::string& message, const std::string& param)
    : std::runtime_error(message), status(status), param(param) {}

std::string ApiError::type() const {
  if (status == 429) return "rate_limit_error";
  if (status >= 500) return "server_error";
  if (status == 404) return "not_found_error";
  return "invalid_request_error";
}

json ApiError::body() const {
  return {{"error", {{"message", what()}, {"type", type()}, {"param", param.empty() ? json() : json(param)}, {"code", json()}}}};
}

namespace {

std::string type_name(const json& v) { return v.is_number_integer() ? "integer" : v.type_name(); }

[[noreturn]] void bad(const std::string& param, const std::string& what) { throw ApiError(400, what, param); }

std::string text_content(const json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad(where, where + " must be a string or a list of text parts, not " + type_name(content));
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const auto& part = content[i];
    const std::string at = where + "[" + std::to_string(i) + "]";
    if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") || !part["text"].is_string())
      bad(at, at + " must be {\"type\": \"text\", \"text\": \"...\"} (this server reads text only)");
    text += part["text"].get<std::string>();
  }
  return text;
}

}  // namespace

CompletionCall parse_completion_call(const std::string& body, bool chat, const std::string& served_model) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::parse_error& e) {
    throw ApiError(400, std::string("the request body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object, not " + type_name(j));
  CompletionCall c;
  c.chat = chat;

  if (!j.contains("model")) bad("model", "'model' is required (this server serves '" + served_model + "')");
  if (!j["model"].is_string()) bad("model", "'model' must be a string, not " + type_name(j["model"]));
  c.model = j["model"].get<std::string>();
  if (c.model != served_model) bad("model", "unknown model '" + c.model + "': this server serves '" + served_model + "'");

  if (chat) {
    if (!j.contains("messages")) bad("messages", "'messages' is required");
    const auto& m = j["messages"];
    if (!m.is_array() || m.empty()) bad("messages", "'messages' must be a non-empty list of messages");
    for (size_t i = 0; i < m.size(); ++i) {
      const std::string at = "messages[" + std::to_string(i) + "]";
      if (!m[i].is_object()) bad(at, at + " must be an object with 'role' and 'content'");
      const auto role = m[i].value("role", json());
      if (!role.is_string() || (role != "system" && role != "user" && role != "assistant"))
        bad(at + ".role", at + ".role must be \"system\", \"user\" or \"assistant\", not " + role.dump());
      if (!m[i].contains("content")) bad(at + ".content", at + ".content is required");
      c.messages.push_back({role.get<std::string>(), text_content(m[i]["content"], at + ".content")});
    }
  } else {
    if (!j.contains("prompt")) bad("prompt", "'prompt' is required");
    const auto& p = j["prompt"];
    if (p.is_string()) {
      c.prompt = p.get<std::string>();
    } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
      c.prompt = p[0].get<std::string>();
    } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
      for (size_t i = 0; i < p.size(); ++i) {
        if (!p[i].is_number_integer())
          bad("prompt", "'prompt' as token ids must hold integers only; prompt[" + std::to_string(i) + "] is " + type_name(p[i]));
        c.prompt_ids.push_back(p[i].get<int64_t>());
      }
    } else {
      bad("prompt", "'prompt' must be a string, a list of one string or a list of token ids, not " + p.dump().substr(0, 80));
    }
  }

  auto integer = [&](const char* key) -> std::optional<int64_t> {
    if (!j.contains(key) || j[key].is_null()) return std::nullopt;
    if (!j[key].is_number_integer()) bad(key, std::string("'") + key + "' must be an integer, not " + type_name(j[key]));
    return j[key].get<int64_t>();
  };
  auto number = [&](const char* key, double lo, double hi, bool lo_open) -> std::optional<double> {
    if (!j.contains(key) || j[key].is_null()) return std::nullopt;
    if (!j[key].is_number()) bad(key, std::string("'") + key + "' must be a number, not " + type_name(j[key]));
    const double v = j[key].get<double>();
    if (!std::isfinite(v) || v > hi || (lo_open ? v <= lo : v < lo))
      bad(key, std::string("'") + key + "' must be in " + (lo_open ? "(" : "[") + json(lo).dump() + ", " +
                   json(hi).dump() + "], not " + j[key].dump());
    return v;
  };
  auto flag = [&](const char* key) {
    if (!j.contains(key) || j[key].is_null()) return false;
    if (!j[key].is_boolean()) bad(key, std::string("'") + key + "' must be true or false, not " + type_name(j[key]));
    return j[key].get<bool>();
  };

  c.max_tokens = integer("max_tokens");
  if (chat && !c.max_tokens) c.max_tokens = integer("max_completion_tokens");
  const char* max_key = j.contains("max_tokens") || !chat ? "max_tokens" : "max_completion_tokens";
  if (c.max_tokens && *c.max_tokens < 1)
    bad(max_key, std::string("'") + max_key + "' must be at least 1, not " + std::to_string(*c.max_tokens));
  if (auto t = number("temperature", 0, 2, false)) c.temperature = *t;
  if (auto p = number("top_p", 0, 1, true)) c.top_p = *p;
  if (auto s = integer("seed")) c.seed = static_cast<uint64_t>(*s);
  if (auto n = integer("n"); n && *n != 1) bad("n", "'n' must be 1 (this server returns one choice)");
  if (j.contains("stop") && !j["stop"].is_null()) {
    const auto& s = j["stop"];
    if (s.is_string()) c.stop = {s.get<std::string>()};
    else if (s.is_array() && s.size() <= 4) {
      for (const auto& x : s) {
        if (!x.is_string()) bad("stop", "'stop' entries must be strings, not " + type_name(x));
        c.stop.push_back(x.get<std::string>());
      }
    } else {
      bad("stop", "'stop' must be a string or a list of up to 4 strings");
    }
    for (const auto& x : c.stop)
      if (x.empty()) bad("stop", "'stop' strings must not be empty");
  }
  c.stream = flag("stream");
  if (j.contains("stream_options") && !j["stream_options"].is_null()) {
    const auto& o = j["stream_options"];
    if (!o.is_object()) bad("stream_options", "'stream_options' must be an object");
    if (o.contains("include_usage")) {
      if (!o["include_usage"].is_boolean()) bad("stream_options.include_usage", "'include_usage' must be true or false");
      c.include_usage = o["include_usage"].get<bool>();
    }
  }
  if (flag("echo")) bad("echo", "'echo' is not supported");
  if (j.contains("logprobs") && !j["logprobs"].is_null() && j["logprobs"] != false && j["logprobs"] != 0)
    bad("logprobs", "'logprobs' is not supported");
  if (auto b = integer("best_of"); b && *b != 1) bad("best_of", "'best_of' must be 1");
  return c;
}

namespace {

json usage(const CompletionResult& r) {
  return {{"prompt_tokens", r.prompt_tokens},
          {"completion_tokens", r.completion_tokens},
          {"total_tokens", r.prompt_tokens + r.completion_tokens}};
}

json head(const CompletionResult& r, const char* object) {
  return {{"id", r.id}, {"object", object}, {"created", r.created}, {"model", r.model}};
}

}  // namespace

json completion_response(const CompletionResult& r, bool chat) {
  json j = head(r, chat ? "chat.completion" : "text_completion");
  json choice = {{"index", 0}, {"finish_reason", r.finish_reason}, {"logprobs", json()}};
  if (chat) choice["message"] = {{"role", "assistant"}, {"content", r.text}};
  else choice["text"] = r.text;
  j["choices"] = json::array({choice});
  j["usage"] = usage(r);
  return j;
}

json completion_chunk(const CompletionResult& r, bool chat, const std::string& text, bool first,
                      const std::string& finish_reason) {
  json j = head(r, chat ? "chat.completion.chunk" : "text_completion");
  json choice = {{"index", 0}, {"logprobs", json()},
                 {"finish_reason", finish_reason.empty() ? json() : json(finish_reason)}};
  if (chat) {
    choice["delta"] = json::object();
    if (first) choice["delta"]["role"] = "assistant";
    if (!text.empty() || finish_reason.empty()) choice["delta"]["content"] = text;
  } else {
    choice["text"] = text;
  }
  j["choices"] = json::array({choice});
  return j;
}

json usage_chunk(const CompletionResult& r, bool chat) {
  json j = head(r, chat ? "chat.completion.chunk" : "text_completion");
  j["choices"] = json::array();
  j["usage"] = usage(r);
  return j;
}

}  // namespace linearize
