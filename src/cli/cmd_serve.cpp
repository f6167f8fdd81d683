// linearize serve: an OpenAI-compatible HTTP server for a teacher or student (serve/http_server.h).
#include <csignal>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <thread>

#include <unistd.h>

#include <cerrno>

#include "cli/commands.h"
#include "cli/common.h"
#include "io/error.h"
#include "serve/engine.h"
#include "serve/http_server.h"

namespace linearize::cli {

namespace fs = std::filesystem;

namespace {
// SIGINT/SIGTERM write their number into this pipe; a thread of ours reads it and stops the server.
int g_signal_pipe[2] = {-1, -1};
void on_stop_signal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] auto n = write(g_signal_pipe[1], &b, 1);
}
}  // namespace

int cmd_serve(const std::vector<std::string>& argv) {
  const EngineOptions e;
  const ServerOptions s;
  CommandSpec spec{"serve",
                   "Serve a model folder (teacher or student) over OpenAI's HTTP API: POST /v1/completions,\n"
                   "POST /v1/chat/completions (stream: true for server-sent events), GET /v1/models, GET /health.\n"
                   "The sequences in flight advance together, one batched step per token, and new requests join\n"
                   "between steps. A student's state per sequence is fixed in size; a teacher's KV cache grows, and\n"
                   "each sequence's state at its full length (prompt + max_tokens) is reserved against\n"
                   "--max-memory-gib. SIGINT/SIGTERM cancel what is in flight and exit 0.",
                   "",
                   "A request that does not fit waits for room; when --max-queue requests already wait it gets 429.",
                   {{"model", "DIR", "model folder (teacher or student)", "", true},
                    {"host", "ADDR", "address to listen on", s.host},
                    {"port", "N", "port (0: any free port, printed at start)", default_text(static_cast<int64_t>(s.port))},
                    {"model-name", "NAME", "the name clients give as \"model\" (default: the folder's name)"},
                    {"max-sequences", "N", "sequences decoded together at most", default_text(e.max_sequences)},
                    {"max-queue", "N", "requests waiting for room at most; more get 429", default_text(e.max_queue)},
                    {"max-memory-gib", "G", "sequence states held at once at most (0: no limit)", default_text(e.max_memory_gib)},
                    {"max-context", "N", "prompt + max_tokens at most (0: the model's max_position_embeddings)",
                     default_text(e.max_context)},
                    {"max-prefill-tokens", "N",
                     "prompts joining together are prefilled together, their shared batch at most N tokens (1: alone; "
                     "0: 8192 on a GPU, alone on the CPU)",
                     default_text(e.max_prefill_tokens)},
                    {"chat-max-tokens", "N", "max_tokens of a chat request that gives none", default_text(s.chat_max_tokens)},
                    {"eager", "", "decode without CUDA graphs (students on a GPU step through one graph per batch size)"},
                    device_option()},
                   0,
                   0};
  Args args(spec, argv);
  if (args.help_requested()) return std::cout << help_text(spec), 0;
  if (!http_server_available())
    throw Error("this build has no HTTP server: install libcpp-httplib-dev (Debian) and build again");
  const std::string folder = args.str("model");
  EngineOptions eo;
  eo.max_sequences = args.integer("max-sequences");
  eo.max_queue = args.integer("max-queue");
  eo.max_memory_gib = args.number("max-memory-gib");
  eo.max_context = args.integer("max-context");
  eo.max_prefill_tokens = args.integer("max-prefill-tokens");
  if (args.flag("eager")) eo.graphs = DecodeGraphs::off;
  ServerOptions so;
  so.host = args.str("host");
  so.port = static_cast<int>(args.integer("port"));
  if (so.port < 0 || so.port > 65535) throw Error("--port must be 0..65535, got " + args.str("port"));
  so.model_folder = folder;
  so.model_name = args.maybe("model-name").value_or(fs::path(folder).filename().string());
  if (so.model_name.empty()) so.model_name = fs::absolute(folder).parent_path().filename().string();
  so.chat_max_tokens = args.integer("chat-max-tokens");
  if (so.chat_max_tokens < 1) throw Error("--chat-max-tokens must be at least 1");

  if (pipe(g_signal_pipe) != 0) throw Error("serve: cannot make a pipe for the stop signals");
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client that hangs up is an error return, not a signal

  LoadOptions lo;
  lo.device = parse_device(args.str("device"));
  lo.inference = true;
  auto model = load_model(folder, lo);
  std::shared_ptr<const Tokenizer> tok = model_tokenizer(folder);
  Engine engine(model, tok, eo);
  if (lo.device.is_cuda()) std::cerr << "[serve] warmed up in " << std::fixed << std::setprecision(1) << engine.warm_up() << " s\n";
  HttpServer server(engine, *tok, model->config, so);
  const int port = server.bind();
  std::cerr << "[serve] " << so.model_name << " (" << folder << ") on http://" << so.host << ":" << port
            << "  max sequences " << eo.max_sequences << ", context " << engine.max_context() << " tokens, state "
            << engine.state_bytes_for(1) / 1024 << " KiB per sequence at 1 token, "
            << engine.state_bytes_for(engine.max_context()) / 1024 << " KiB at " << engine.max_context() << "\n"
            << std::flush;
  std::thread waiter([&] {
    unsigned char sig = 0;
    while (read(g_signal_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    if (sig == 0) return;  // the server ended by itself
    std::cerr << "[serve] " << (sig == SIGINT ? "SIGINT" : "SIGTERM") << ": cancelling "
              << engine.stats().running + engine.stats().waiting << " requests and stopping\n";
    engine.shutdown();
    server.stop();
  });
  server.run();
  const unsigned char none = 0;
  [[maybe_unused]] auto n = write(g_signal_pipe[1], &none, 1);  // wakes the waiter if no signal came
  waiter.join();
  std::cerr << "[serve] stopped\n";
  return 0;
}

}  // namespace linearize::cli
