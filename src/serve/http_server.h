// The HTTP side of `linearize serve`: OpenAI's endpoints on cpp-httplib, in front of an Engine.
//   POST /v1/completions, POST /v1/chat/completions   (serve/openai_api.h; stream: server-sent events)
//   GET /v1/models, GET /health
// Errors are OpenAI's JSON error bodies: 400 for a bad request (naming the field), 404 for an unknown
// path, 413 for a body over the limit, 429 when the queue is full, 503 while shutting down. A streaming
// client that goes away cancels its sequence at the next token; a waiting one within 50 ms.
#pragma once
#include <memory>
#include <string>

#include "io/hf_config.h"
#include "io/tokenizer.h"
#include "serve/engine.h"

namespace linearize {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                       // 0: any free port (bind() says which)
  std::string model_name;                // the name clients give as "model"
  std::string model_folder;              // its chat tokens and template
  size_t max_body_bytes = 8 << 20;       // larger request bodies get 413
  int64_t chat_max_tokens = 512;         // a chat request's max_tokens when it gives none
  int64_t workers = 0;                   // HTTP worker threads (0: max_sequences + max_queue + 4, at most 1024)
};

// Whether this build has the HTTP server (cpp-httplib was found when it was built).
bool http_server_available();

class HttpServer {
 public:
  HttpServer(Engine& engine, const Tokenizer& tokenizer, const LlamaConfig& config, const ServerOptions& options);
  ~HttpServer();
  int bind();  // listens on host:port; returns the port. Throws Error when it cannot.
  void run();  // serves until stop()
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace linearize
