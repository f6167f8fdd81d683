// Serving under load (docs/benchmarks.md, "Serving"): a teacher and its seven students of the same shape,
// random weights, each served in process by `linearize serve`'s engine and HTTP server on a loopback
// port; C clients (threads) each send R completion requests of P prompt tokens and N new tokens (token
// ids, no end-of-sequence token, so every request runs to N). Per model and client count: generated
// tokens/s over the round and the p50/p99 request latency. Then the state a sequence holds at several
// context lengths and how many sequences fit in a memory budget.
//
//   linearize_serve_bench [--shape small|135m] [--clients 1,4,16,64] [--device cuda] ...   (--help: every option)
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <mutex>
#include <thread>

#include "cli/args.h"
#include "cli/host_memory.h"
#include "io/atomic_file.h"
#include "compat/device.h"
#include "io/tokenizer.h"
#include "io/tokenizer_bpe.h"
#include "model/model_io.h"
#include "model/student.h"
#include "serve/engine.h"
#include "serve/http_server.h"

using namespace linearize;
using nlohmann::json;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

struct Settings {
  std::string shape = "small";
  std::vector<std::string> models;  // empty: teacher and the seven mixers
  std::vector<int64_t> clients = {1, 4, 16, 64};
  std::vector<int64_t> contexts = {1024, 4096, 16384, 65536};
  int64_t prompt_tokens = 128, max_tokens = 32, requests = 2;
  double memory_gib = 8;
  std::string device = "cpu";
  int64_t max_prefill_tokens = EngineOptions().max_prefill_tokens;
  bool eager = false;
};

// The options, their defaults taken from Settings so that --help cannot drift from them.
cli::CommandSpec command_spec() {
  const Settings d;
  cli::CommandSpec spec{"",
          "a teacher and its seven students (random weights) served in process under loopback clients",
          "",
          "C clients each send R requests of P prompt tokens and N new tokens. Prints tokens/s and p50/p99\n"
          "latency per model and client count, then each model's state per sequence and how many sequences\n"
          "fit in --memory-gib.",
          {{"shape", "NAME", "model shape: small (hidden 256, 4 layers) or 135m (SmolLM2-135M)", d.shape},
           {"models", "LIST", "teacher and/or mixer names (default: teacher and the seven mixers)"},
           {"clients", "LIST", "concurrent clients, one round each", cli::default_text(d.clients, ',')},
           {"prompt-tokens", "N", "prompt tokens per request", cli::default_text(d.prompt_tokens)},
           {"max-tokens", "N", "new tokens per request", cli::default_text(d.max_tokens)},
           {"requests", "N", "requests per client", cli::default_text(d.requests)},
           {"device", "DEV", "cpu, cuda or cuda:N (bf16 on a GPU)", d.device},
           {"memory-gib", "X", "memory budget of the sequences-that-fit table", cli::default_text(d.memory_gib)},
           {"contexts", "LIST", "context lengths of that table", cli::default_text(d.contexts, ',')},
           {"max-prefill-tokens", "N", "as `linearize serve` (0: 8192 on a GPU, prompts alone on the CPU)",
            cli::default_text(d.max_prefill_tokens)},
           {"eager", "", "as `linearize serve`: decode without CUDA graphs"}},
          0,
          0};
  spec.program = "linearize_serve_bench";
  return spec;
}

Settings parse(int argc, char** argv) {
  const cli::CommandSpec spec = command_spec();
  const cli::Args args(spec, std::vector<std::string>(argv + 1, argv + argc));
  if (args.help_requested()) {
    std::cout << cli::help_text(spec);
    std::exit(0);
  }
  Settings s;
  s.shape = args.str("shape");
  if (args.has("models")) s.models = args.str_list("models");
  s.clients = args.int_list("clients");
  s.contexts = args.int_list("contexts");
  s.prompt_tokens = args.integer("prompt-tokens");
  s.max_tokens = args.integer("max-tokens");
  s.requests = args.integer("requests");
  s.device = args.str("device");
  s.memory_gib = args.number("memory-gib");
  s.max_prefill_tokens = args.integer("max-prefill-tokens");
  s.eager = args.flag("eager");
  for (const auto& list : {s.clients, s.contexts})  // the single numbers' ranges are the parser's (cli/args.cpp)
    for (int64_t v : list)
      if (v < 1) throw std::runtime_error("--clients and --contexts take numbers of at least 1");
  if (s.models.empty()) {
    s.models = {"teacher"};
    for (const auto& k : mixer_kinds()) s.models.push_back(k);
  }
  return s;
}

LlamaConfig shape(const std::string& name) {
  LlamaConfig c;
  c.rope_theta = 10000;
  c.tie_word_embeddings = true;
  c.max_position_embeddings = 1 << 20;
  c.raw = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}};
  if (name == "small") {  // a size two CPU cores serve at a readable pace
    c.vocab_size = 8192, c.hidden_size = 256, c.num_hidden_layers = 4, c.num_attention_heads = 4;
    c.num_key_value_heads = 2, c.intermediate_size = 704;
  } else if (name == "135m") {  // SmolLM2-135M
    c.vocab_size = 49152, c.hidden_size = 576, c.num_hidden_layers = 30, c.num_attention_heads = 9;
    c.num_key_value_heads = 3, c.intermediate_size = 1536;
  } else {
    throw std::runtime_error("unknown shape " + name + " (small or 135m)");
  }
  c.head_dim = c.hidden_size / c.num_attention_heads;
  return c;
}

// A byte-level tokenizer (ids 0..259); the models' larger vocabularies decode to no text past it.
std::shared_ptr<const Tokenizer> byte_tokenizer() {
  const auto dir = fs::temp_directory_path() / ("linearize_serve_bench_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::vector<std::string> vocab = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  for (int b = 0; b < 256; ++b) vocab.push_back(byte_level_encode(std::string(1, static_cast<char>(b))));
  std::vector<AddedToken> added;
  for (int i = 0; i < 3; ++i) added.push_back({vocab[i], i, true, false, false, false});
  const std::string space = byte_level_encode(" ");
  vocab.push_back(space + "t");  // one merge: the format wants at least one
  write_tokenizer_json((dir / "tokenizer.json").string(), vocab, {{space, "t"}}, added, false);
  auto tok = load_tokenizer(dir.string());
  remove_tree(dir.string());
  return tok;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  cli::keep_freed_memory_for_reuse();  // as `linearize serve` does
  try {
    const Settings s = parse(argc, argv);
    const auto device = parse_device_name(s.device, "--device");
    const auto config = shape(s.shape);
    const auto tok = byte_tokenizer();
    torch::manual_seed(0);
    CausalLM teacher(config);
    init_weights_normal(*teacher, 0.02);
    teacher->eval();
    std::string card = "CPU (" + std::to_string(std::thread::hardware_concurrency()) + " threads)";
    if (device.is_cuda()) card = device.str() + " (the card: see nvidia-smi)";
    std::cout << "### Serving, " << s.shape << " shape, " << card << "\n\n"
              << s.prompt_tokens << " prompt tokens, " << s.max_tokens << " new tokens per request, " << s.requests
              << " requests per client; random weights" << (device.is_cuda() ? ", bf16" : ", fp32")
              << "; --max-prefill-tokens " << s.max_prefill_tokens
              << (s.max_prefill_tokens == 0 ? " (automatic: 8192 on a GPU, prompts alone on the CPU)" : "")
              << (device.is_cuda() ? (s.eager ? "; eager decoding" : "; students but RetNet decode through CUDA graphs") : "") << ".\n\n"
              << "| model | clients | tokens/s | p50 latency s | p99 latency s | steps | tokens per step |\n"
              << "|---|---:|---:|---:|---:|---:|---:|\n";
    std::vector<std::pair<std::string, std::vector<int64_t>>> state_rows;
    for (const auto& name : s.models) {
      torch::manual_seed(1);
      CausalLM model = name == "teacher"
                           ? teacher
                           : build_student(teacher, StudentSpec::make(parse_mixer_kind(name), "default", {}, config));
      model->to(device);
      if (device.is_cuda()) model->to(torch::kBFloat16);
      model->pack_projections();
      model->eval();
      EngineOptions eo;
      eo.max_sequences = 512;
      eo.max_queue = 4096;
      eo.max_prefill_tokens = s.max_prefill_tokens;
      if (s.eager) eo.graphs = DecodeGraphs::off;
      Engine engine(model, tok, eo);
      ServerOptions so;
      so.port = 0;
      so.model_name = name;
      HttpServer server(engine, *tok, model->config, so);
      const int port = server.bind();
      std::thread serving([&] { server.run(); });
      std::vector<int64_t> prompt(static_cast<size_t>(s.prompt_tokens));
      for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = 3 + static_cast<int64_t>((i * 37) % 250);
      const json request = {{"model", name}, {"prompt", prompt}, {"max_tokens", s.max_tokens}, {"temperature", 0}};
      auto send = [&](httplib::Client& c) {
        auto r = c.Post("/v1/completions", request.dump(), "application/json");
        if (!r || r->status != 200)
          throw std::runtime_error(name + ": request failed: " + (r ? r->body : httplib::to_string(r.error())));
        return json::parse(r->body)["usage"]["completion_tokens"].get<int64_t>();
      };
      try {  // the first request pays for the device's start-up work (kernel loading, library handles)
        const auto w0 = Clock::now();
        httplib::Client warm("127.0.0.1", port);
        warm.set_read_timeout(3600);
        send(warm);
        std::cerr << name << ": first request " << std::fixed << std::setprecision(1)
                  << std::chrono::duration<double>(Clock::now() - w0).count() << " s\n";
      } catch (...) {
        server.stop();
        serving.join();
        throw;
      }
      for (int64_t C : s.clients) {
        std::vector<std::vector<double>> latencies(static_cast<size_t>(C));
        std::mutex failure_mu;
        std::string failure;
        std::vector<int64_t> tokens(static_cast<size_t>(C), 0);
        const auto before = engine.stats();
        const auto t0 = Clock::now();
        std::vector<std::thread> clients;
        for (int64_t i = 0; i < C; ++i)
          clients.emplace_back([&, i] {
            try {
              httplib::Client c("127.0.0.1", port);
              c.set_read_timeout(3600);
              for (int64_t r = 0; r < s.requests; ++r) {
                const auto a = Clock::now();
                tokens[i] += send(c);
                latencies[i].push_back(std::chrono::duration<double>(Clock::now() - a).count());
              }
            } catch (const std::exception& e) {
              std::lock_guard<std::mutex> lock(failure_mu);
              failure = e.what();
            }
          });
        for (auto& t : clients) t.join();
        if (!failure.empty()) {
          server.stop();
          serving.join();
          throw std::runtime_error(failure);
        }
        const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
        const auto after = engine.stats();
        std::vector<double> all;
        int64_t total = 0;
        for (int64_t i = 0; i < C; ++i) {
          all.insert(all.end(), latencies[i].begin(), latencies[i].end());
          total += tokens[i];
        }
        const int64_t steps = after.steps - before.steps;
        std::cout << "| " << name << " | " << C << " | " << std::fixed << std::setprecision(0) << total / wall << " | "
                  << std::setprecision(3) << percentile(all, 0.5) << " | " << percentile(all, 0.99) << " | " << steps
                  << " | " << std::setprecision(1) << (steps ? static_cast<double>(after.tokens - before.tokens) / steps : 0.0)
                  << " |\n"
                  << std::flush;
      }
      server.stop();
      serving.join();
      std::vector<int64_t> bytes;
      for (int64_t ctx : s.contexts) bytes.push_back(engine.state_bytes_for(ctx));
      state_rows.emplace_back(name, bytes);
    }
    const double budget = s.memory_gib * 1024.0 * 1024.0 * 1024.0;
    std::cout << "\nState per sequence (MiB) and the sequences that fit in " << s.memory_gib << " GiB, by context length:\n\n| model |";
    for (int64_t ctx : s.contexts) std::cout << " MiB at " << ctx << " |";
    for (int64_t ctx : s.contexts) std::cout << " sequences at " << ctx << " |";
    std::cout << "\n|---|";
    for (size_t i = 0; i < 2 * s.contexts.size(); ++i) std::cout << "---:|";
    std::cout << "\n";
    for (const auto& [name, bytes] : state_rows) {
      std::cout << "| " << name << " |";
      for (auto b : bytes) std::cout << " " << std::fixed << std::setprecision(2) << b / 1048576.0 << " |";
      for (auto b : bytes) std::cout << " " << static_cast<int64_t>(budget / static_cast<double>(b)) << " |";
      std::cout << "\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
