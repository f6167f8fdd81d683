// libFuzzer targets for the parsers of untrusted input (SentencePiece's tokenizer.model is parsed by
// libsentencepiece, whose protobuf clashes with libtorch's under the sanitizers' runtime: not fuzzed here). One binary per target (LINEARIZE_FUZZ_TARGET picks
// the body at compile time); scripts/fuzz.sh builds and runs them. Each target writes the input where the
// parser expects a file, calls it, and accepts linearize::Error as the clean refusal it is; anything else
// (a crash, another exception, a sanitizer report, a hang) is a finding.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "data/token_dataset.h"
#include "io/chat_template.h"
#include "io/error.h"
#include "io/hf_config.h"
#include "io/jsonl.h"
#include "io/safetensors.h"
#include "io/tokenizer.h"
#include "study/study_spec.h"

namespace fs = std::filesystem;
using namespace linearize;

namespace {

// A folder of this process's own (parallel fuzzing jobs must not share files).
const fs::path& scratch() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("linearize_fuzz_" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

std::string put(const std::string& name, const uint8_t* data, size_t size) {
  const fs::path p = scratch() / name;
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return p.string();
}

void run_target(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
#if LINEARIZE_FUZZ_TARGET == 1  // safetensors header and tensor table
  SafetensorsFile f(put("model.safetensors", data, size));
  for (const auto& n : f.names()) (void)f.info(n);
#elif LINEARIZE_FUZZ_TARGET == 2  // sharded weights index (model.safetensors.index.json)
  fs::remove(scratch() / "model.safetensors");
  put("model.safetensors.index.json", data, size);
  WeightStore store(scratch().string());
  (void)store.names();
#elif LINEARIZE_FUZZ_TARGET == 3  // config.json
  put("config.json", data, size);
  (void)LlamaConfig::load(scratch().string());
#elif LINEARIZE_FUZZ_TARGET == 4  // tokenizer.json: load, then encode and decode a fixed text and the input
  fs::remove(scratch() / "tokenizer.model");
  put("tokenizer.json", data, size);
  auto tok = load_tokenizer(scratch().string());
  const std::string sample = "Hello world 1234 <|endoftext|> caf\xc3\xa9";
  (void)tok->decode(tok->encode(sample));
  (void)tok->decode(tok->encode(text.substr(0, 256), false));
#elif LINEARIZE_FUZZ_TARGET == 5  // jsonl records and SFT conversations
  const std::string path = put("records.jsonl", data, size);
  for_each_jsonl(path, [](const nlohmann::json& j, int64_t) { (void)j.dump(); });
  for (const auto& r : read_conversations(path)) (void)render_chatml(r.messages, "", true);
#elif LINEARIZE_FUZZ_TARGET == 6  // ChatML text back into a conversation
  (void)render_chatml(parse_chatml(text), "", false);
#elif LINEARIZE_FUZZ_TARGET == 7  // token dataset: the first byte splits the input into index.json and a shard
  const fs::path dir = scratch() / "dataset";
  fs::create_directories(dir);
  const size_t cut = size == 0 ? 0 : std::min<size_t>(size - 1, data[0] * 4);
  std::ofstream(dir / "index.json", std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data + (size ? 1 : 0)), static_cast<std::streamsize>(size ? cut : 0));
  std::ofstream(dir / "shard-00000.u32", std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data + (size ? 1 + cut : 0)),
             static_cast<std::streamsize>(size ? size - 1 - cut : 0));
  auto ds = TokenDataset::open(dir.string(), nullptr, -1);
  (void)ds.size();
#elif LINEARIZE_FUZZ_TARGET == 8  // study file (parsed, checked and expanded into cells; nothing runs)
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    return;
  }
  (void)study_cells(parse_study(j, "study.json", scratch().string()));
#else
#error "LINEARIZE_FUZZ_TARGET must be 1..8"
#endif
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    run_target(data, size);
  } catch (const linearize::Error&) {  // the clean refusal of bad input
  }
  return 0;
}
