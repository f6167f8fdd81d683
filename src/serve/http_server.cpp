// OpenAI endpoints on cpp-httplib (see http_server.h). Compiled only when cpp-httplib is found; otherwise
// serve/no_http_server.cpp answers instead.
#include "serve/http_server.h"

#include <httplib.h>

#include <chrono>
#include <ctime>
#include <random>

#include <sys/socket.h>

#include "infer/chat.h"
#include "infer/generate.h"
#include "io/error.h"
#include "serve/openai_api.h"

namespace linearize {

using nlohmann::json;

bool http_server_available() { return true; }

namespace {
// JSON text of a body; a model can emit bytes that are not UTF-8, which become U+FFFD instead of an error.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }
}  // namespace

struct HttpServer::Impl {
  Engine& engine;
  const Tokenizer& tok;
  const LlamaConfig& config;
  ServerOptions options;
  std::optional<ChatTokens> marks;  // none: the model has no chat tokens
  std::string chat_refusal;
  std::string default_system;
  httplib::Server server;
  std::mt19937_64 rng{std::random_device{}()};
  std::mutex rng_mu;

  Impl(Engine& e, const Tokenizer& t, const LlamaConfig& c, const ServerOptions& o)
      : engine(e), tok(t), config(c), options(o) {
    try {
      marks = chat_tokens(tok, options.model_folder, config);
      std::string note;
      default_system = chat_format_for(options.model_folder, &note).default_system;
    } catch (const Error& err) {
      chat_refusal = err.what();
    }
  }

  uint64_t random() {
    std::lock_guard<std::mutex> lock(rng_mu);
    return rng();
  }

  static void send_json(httplib::Response& res, int status, const json& body) {
    res.status = status;
    res.set_content(dump(body), "application/json");
  }

  static void send_error(httplib::Response& res, const ApiError& e) { send_json(res, e.status, e.body()); }

  GenerationRequest request_of(const CompletionCall& call) {
    GenerationRequest g;
    if (call.chat) {
      if (!marks) throw ApiError(400, "this model cannot chat: " + chat_refusal, "messages");
      g.prompt = encode_chat(call.messages, default_system, tok, *marks, /*add_generation_prompt=*/true).ids;
      g.stop_ids = {marks->im_end, marks->im_start};
    } else if (!call.prompt_ids.empty()) {
      for (size_t i = 0; i < call.prompt_ids.size(); ++i) {
        const int64_t id = call.prompt_ids[i];
        if (id < 0 || id >= config.vocab_size)
          throw ApiError(400, "prompt[" + std::to_string(i) + "] = " + std::to_string(id) + " is not a token id of this model (0.." +
                                  std::to_string(config.vocab_size - 1) + ")", "prompt");
        g.prompt.push_back(static_cast<int32_t>(id));
      }
      g.decode_after = g.prompt;
    } else {
      g.prompt = prompt_prefix(config, tok, call.prompt.empty());
      auto body = tok.encode(call.prompt, /*parse_special=*/true);
      g.prompt.insert(g.prompt.end(), body.begin(), body.end());
      const bool bos_first = config.bos_token_id && g.prompt[0] == *config.bos_token_id;
      g.decode_after.assign(g.prompt.begin() + (bos_first ? 1 : 0), g.prompt.end());
    }
    for (auto id : config.eos_token_ids) g.stop_ids.push_back(static_cast<int32_t>(id));
    const int64_t room = engine.max_context() - static_cast<int64_t>(g.prompt.size());
    if (room < 1)
      throw ApiError(400,
                     "the prompt is " + std::to_string(g.prompt.size()) + " tokens, which leaves no room in this server's " +
                         std::to_string(engine.max_context()) + "-token context",
                     call.chat ? "messages" : "prompt");
    g.max_tokens = call.max_tokens ? *call.max_tokens : call.chat ? std::min(room, options.chat_max_tokens) : 16;
    g.sampling.greedy = call.temperature == 0.0;
    g.sampling.temperature = call.temperature;
    g.sampling.top_p = call.top_p;
    g.sampling.seed = call.seed ? *call.seed : random();
    g.stop = call.stop;
    return g;
  }

  void completions(const httplib::Request& req, httplib::Response& res, bool chat) {
    CompletionCall call;
    std::shared_ptr<Generation> gen;
    try {
      call = parse_completion_call(req.body, chat, options.model_name);
      try {
        gen = engine.submit(request_of(call));
      } catch (const RequestRefused& r) {
        throw ApiError(r.status, r.what(), r.param);
      }
    } catch (const ApiError& e) {
      return send_error(res, e);
    }
    auto result = std::make_shared<CompletionResult>();
    char id[32];
    std::snprintf(id, sizeof id, "%s-%016llx", chat ? "chatcmpl" : "cmpl", static_cast<unsigned long long>(random()));
    result->id = id;
    result->model = options.model_name;
    result->created = static_cast<int64_t>(std::time(nullptr));
    const auto tick = std::chrono::milliseconds(50);
    auto on_release = [gen](bool /*success*/) { gen->cancel(); };  // a finished sequence ignores it

    if (call.stream) {
      res.set_header("Cache-Control", "no-cache");
      auto first = std::make_shared<bool>(true);
      const bool usage = call.include_usage;
      res.set_chunked_content_provider(
          "text/event-stream",
          [gen, result, first, chat, usage, tick](size_t, httplib::DataSink& sink) {
            auto event = [&](const json& j) {
              const std::string s = "data: " + dump(j) + "\n\n";
              return sink.write(s.data(), s.size());
            };
            const auto u = gen->wait(tick);
            if (!sink.is_writable()) return gen->cancel(), false;
            result->prompt_tokens = u.prompt_tokens;
            result->completion_tokens = u.completion_tokens;
            if (!u.text.empty() || (*first && u.finish == Finish::running)) {
              if (!u.text.empty() || chat) {
                if (!event(completion_chunk(*result, chat, u.text, *first, ""))) return gen->cancel(), false;
                *first = false;
              }
            }
            if (u.finish == Finish::running) return true;
            if (u.finish == Finish::cancelled) {
              event(ApiError(503, "the request was cancelled: the server is shutting down").body());
            } else {
              event(completion_chunk(*result, chat, "", *first, finish_reason(u.finish)));
              if (usage) event(usage_chunk(*result, chat));
              const std::string done = "data: [DONE]\n\n";
              sink.write(done.data(), done.size());
            }
            sink.done();
            return true;
          },
          on_release);
      return;
    }
    // The whole response at the end; meanwhile the connection is watched so that a client that leaves
    // frees its sequence.
    res.set_chunked_content_provider(
        "application/json",
        [gen, result, chat, tick](size_t, httplib::DataSink& sink) {
          const auto u = gen->wait(tick);
          if (!sink.is_writable()) return gen->cancel(), false;
          result->text += u.text;
          if (u.finish == Finish::running) return true;
          result->prompt_tokens = u.prompt_tokens;
          result->completion_tokens = u.completion_tokens;
          result->finish_reason = finish_reason(u.finish);
          const std::string body =
              u.finish == Finish::cancelled
                  ? dump(ApiError(503, "the request was cancelled: the server is shutting down").body())
                  : dump(completion_response(*result, chat));
          sink.write(body.data(), body.size());
          sink.done();
          return true;
        },
        on_release);
  }

  void routes() {
    server.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      const auto s = engine.stats();
      send_json(res, 200,
                {{"status", "ok"},
                 {"model", options.model_name},
                 {"running", s.running},
                 {"waiting", s.waiting},
                 {"reserved_bytes", s.reserved_bytes},
                 {"budget_bytes", s.budget_bytes},
                 {"steps", s.steps},
                 {"tokens", s.tokens}});
    });
    server.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      send_json(res, 200,
                {{"object", "list"},
                 {"data", json::array({{{"id", options.model_name}, {"object", "model"}, {"created", 0},
                                        {"owned_by", "linearize"}}})}});
    });
    server.Post("/v1/completions",
                [this](const httplib::Request& req, httplib::Response& res) { completions(req, res, false); });
    server.Post("/v1/chat/completions",
                [this](const httplib::Request& req, httplib::Response& res) { completions(req, res, true); });
    // Statuses set by httplib itself (unknown path, body too large) get JSON bodies too.
    server.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      std::string what = res.status == 404   ? "no such endpoint: " + req.method + " " + req.path
                         : res.status == 413 ? "the request body is too large"
                                             : "the request could not be handled";
      send_json(res, res.status, ApiError(res.status, what).body());
    });
    server.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "internal error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what += std::string(": ") + e.what();
      } catch (...) {
      }
      send_json(res, 500, ApiError(500, what).body());
    });
  }
};

HttpServer::HttpServer(Engine& engine, const Tokenizer& tokenizer, const LlamaConfig& config,
                       const ServerOptions& options)
    : impl_(std::make_unique<Impl>(engine, tokenizer, config, options)) {
  // One worker per client that can be decoding or waiting at once, and a few for /health and errors
  // (httplib's default pool would hold only eight streams).
  const auto& e = engine.options();
  // Past 1024, further connections wait for a worker in httplib's own queue.
  const int64_t workers = options.workers > 0 ? options.workers : std::min<int64_t>(1024, e.max_sequences + e.max_queue + 4);
  impl_->server.new_task_queue = [n = static_cast<size_t>(workers)] { return new httplib::ThreadPool(n); };
  impl_->server.set_payload_max_length(options.max_body_bytes);
  // httplib closes a connection whose request has not arrived within the keep-alive timeout; under a
  // heavy load a client can take seconds to send it, so it is longer than httplib's 5 s.
  impl_->server.set_keep_alive_timeout(15);
  impl_->routes();
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  auto& o = impl_->options;
  // httplib listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG in Debian's build of it): a burst of
  // clients overflows it and the kernel drops their connections. The socket is taken here as httplib
  // makes it, and listened on again with the system's largest backlog after the bind.
  int listening = -1;
  impl_->server.set_socket_options([&listening](socket_t sock) {
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);  // not SO_REUSEPORT: a taken port is an error
    listening = sock;
  });
  const int port = o.port == 0 ? impl_->server.bind_to_any_port(o.host) : (impl_->server.bind_to_port(o.host, o.port) ? o.port : -1);
  if (port <= 0) throw Error("serve: cannot listen on " + o.host + ":" + std::to_string(o.port) + " (in use, or not an address of this machine)");
  if (listening >= 0 && ::listen(listening, SOMAXCONN) != 0)
    throw Error("serve: cannot raise the listen backlog on port " + std::to_string(port));
  return port;
}

void HttpServer::run() { impl_->server.listen_after_bind(); }

void HttpServer::stop() { impl_->server.stop(); }

}  // namespace linearize
