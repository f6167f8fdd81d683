// The HTTP server in a build without cpp-httplib: every use says how to get it (see http_server.h).
#include "io/error.h"
#include "serve/http_server.h"

namespace linearize {

bool http_server_available() { return false; }

struct HttpServer::Impl {};

namespace {
[[noreturn]] void unavailable() {
  throw Error("this build has no HTTP server: install libcpp-httplib-dev (Debian) and build again");
}
}  // namespace

HttpServer::HttpServer(Engine&, const Tokenizer&, const LlamaConfig&, const ServerOptions&) { unavailable(); }
HttpServer::~HttpServer() = default;
int HttpServer::bind() { unavailable(); }
void HttpServer::run() { unavailable(); }
void HttpServer::stop() {}

}  // namespace linearize
