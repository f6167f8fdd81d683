// Tokenization throughput: the in-memory path (tokenize_documents: the file read whole, one thread) against
// the streamed path (data/tokenize_stream.h) with 1 and 2 threads, on the World English Bible with the
// SmolLM2 tokenizer (../shared, or LINEARIZE_SHARED). Counters: tokens/s and MB/s of input.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "data/tokenize_stream.h"
#include "io/token_shards.h"
#include "io/tokenizer.h"

namespace {

namespace fs = std::filesystem;

std::string shared_dir() {
  const char* env = std::getenv("LINEARIZE_SHARED");
  return env ? env : std::string(LINEARIZE_SOURCE_DIR) + "/../shared";
}

const std::string& corpus() {
  static const std::string p = shared_dir() + "/data/corpus/web_bible.txt";
  return p;
}

std::string tokenizer_path() { return shared_dir() + "/data/tokenizers/smollm2-tokenizer.json"; }

bool inputs_present() { return fs::exists(tokenizer_path()) && fs::exists(corpus()); }

// A tokenizer loaded afresh, outside the timing: its word cache starts empty, as in a newcomer's run
// (a warm cache would make every iteration after the first several times faster).
std::unique_ptr<linearize::Tokenizer> fresh_tokenizer(benchmark::State& state) {
  state.PauseTiming();
  auto t = linearize::load_tokenizer(tokenizer_path());
  state.ResumeTiming();
  return t;
}

void set_rates(benchmark::State& state, int64_t tokens) {
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["MB/s"] = benchmark::Counter(static_cast<double>(fs::file_size(corpus())) / 1e6,
                                              benchmark::Counter::kIsIterationInvariantRate);
}

void BM_TokenizeInMemory(benchmark::State& state) {
  if (!inputs_present()) return state.SkipWithError("needs ../shared (the corpus and SmolLM2's tokenizer)");
  int64_t tokens = 0;
  for (auto _ : state) {
    auto tok = fresh_tokenizer(state);
    tokens = static_cast<int64_t>(linearize::tokenize_documents(*tok, {corpus()}, 0).size());
  }
  set_rates(state, tokens);
}

void BM_TokenizeStream(benchmark::State& state) {
  if (!inputs_present()) return state.SkipWithError("needs ../shared (the corpus and SmolLM2's tokenizer)");
  const auto out = (fs::temp_directory_path() / "linearize_bench_tokens.u32").string();
  int64_t tokens = 0;
  for (auto _ : state) {
    auto tok = fresh_tokenizer(state);
    linearize::TokenizeOptions o;
    o.inputs = {corpus()};
    o.output = out;
    o.eos_id = 0;
    o.threads = static_cast<int>(state.range(0));
    tokens = linearize::tokenize_to_dataset(*tok, o).tokens;
  }
  fs::remove(out);
  set_rates(state, tokens);
}

}  // namespace

// Wall-clock rates (UseRealTime): the streamed path works on its own threads, so the main thread's CPU
// time says nothing about it.
BENCHMARK(BM_TokenizeInMemory)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();
BENCHMARK(BM_TokenizeStream)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();
