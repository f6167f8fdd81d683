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

const linearize::Tokenizer* tokenizer() {
  static std::unique_ptr<linearize::Tokenizer> t;
  const std::string path = shared_dir() + "/data/tokenizers/smollm2-tokenizer.json";
  if (!t && fs::exists(path)) t = linearize::load_tokenizer(path);
  return t.get();
}

void set_rates(benchmark::State& state, int64_t tokens) {
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["MB/s"] = benchmark::Counter(static_cast<double>(fs::file_size(corpus())) / 1e6,
                                              benchmark::Counter::kIsIterationInvariantRate);
}

void BM_TokenizeInMemory(benchmark::State& state) {
  if (!tokenizer() || !fs::exists(corpus())) return state.SkipWithError("needs ../shared (the corpus and SmolLM2's tokenizer)");
  int64_t tokens = 0;
  for (auto _ : state) tokens = static_cast<int64_t>(linearize::tokenize_documents(*tokenizer(), {corpus()}, 0).size());
  set_rates(state, tokens);
}

void BM_TokenizeStream(benchmark::State& state) {
  if (!tokenizer() || !fs::exists(corpus())) return state.SkipWithError("needs ../shared (the corpus and SmolLM2's tokenizer)");
  const auto out = (fs::temp_directory_path() / "linearize_bench_tokens.u32").string();
  int64_t tokens = 0;
  for (auto _ : state) {
    linearize::TokenizeOptions o;
    o.inputs = {corpus()};
    o.output = out;
    o.eos_id = 0;
    o.threads = static_cast<int>(state.range(0));
    tokens = linearize::tokenize_to_dataset(*tokenizer(), o).tokens;
  }
  fs::remove(out);
  set_rates(state, tokens);
}

}  // namespace

BENCHMARK(BM_TokenizeInMemory)->Unit(benchmark::kMillisecond)->Iterations(2);
BENCHMARK(BM_TokenizeStream)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->Iterations(2);
