// The OpenAI HTTP API's request and response bodies, as `linearize serve` speaks them: parsing and
// checking a /v1/completions or /v1/chat/completions request, and writing responses, stream chunks and
// errors. No HTTP here (serve/http_server.h), so that every rule is testable on its own.
//
// Requests: model (must be the served name), prompt (a string, a list of one, or a list of token ids) or messages ([{role:
// system|user|assistant, content: a string or a list of text parts}]), max_tokens (chat also
// max_completion_tokens), temperature (0..2; 0 = greedy), top_p (0 < p <= 1), seed, stop (a string or up
// to 4), stream, stream_options.include_usage, n (1 only). Other fields are ignored, as OpenAI's own
// server ignores fields it does not know; a known field with a wrong type or value is a 400 naming it.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/chat_template.h"

namespace linearize {

// An error response: HTTP status and OpenAI's {"error": {"message", "type", "param", "code"}}.
struct ApiError : std::runtime_error {
  ApiError(int status, const std::string& message, const std::string& param = "");
  int status;
  std::string param;
  std::string type() const;  // invalid_request_error, rate_limit_error, server_error, ...
  nlohmann::json body() const;
};

struct CompletionCall {
  bool chat = false;
  std::string model;
  std::string prompt;     // completions: text, or
  std::vector<int64_t> prompt_ids;  // token ids (prompt given as a list of integers)
  Conversation messages;  // chat
  std::optional<int64_t> max_tokens;
  double temperature = 1.0, top_p = 1.0;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool stream = false, include_usage = false;
};

// Parses a request body; throws ApiError (400) naming the field that is wrong.
CompletionCall parse_completion_call(const std::string& body, bool chat, const std::string& served_model);

struct CompletionResult {
  std::string id, model, text, finish_reason;
  int64_t created = 0, prompt_tokens = 0, completion_tokens = 0;
};
nlohmann::json completion_response(const CompletionResult& r, bool chat);
// One server-sent event's data for a streamed response: a piece of text (with the assistant role on a
// chat stream's first chunk), or the end (finish_reason set), or the usage chunk (choices empty).
nlohmann::json completion_chunk(const CompletionResult& r, bool chat, const std::string& text, bool first,
                                const std::string& finish_reason);
nlohmann::json usage_chunk(const CompletionResult& r, bool chat);

}  // namespace linearize
