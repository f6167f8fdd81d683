#include "io/token_shards.h"

#include <cstring>
#include <filesystem>

#include "io/atomic_file.h"
#include "io/error.h"
#include "io/jsonl.h"
#include "io/tokenizer.h"

namespace linearize {

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

std::vector<int32_t> read_token_shard(const std::string& path, int64_t vocab_size) {
  const std::string bytes = read_file(path);
  if (bytes.size() % 4 != 0)
    throw Error(path + ": token shard size " + std::to_string(bytes.size()) +
                " bytes is not a multiple of 4 (expected little-endian uint32 ids; truncated file?)");
  std::vector<int32_t> ids(bytes.size() / 4);
  std::memcpy(ids.data(), bytes.data(), bytes.size());
  if (vocab_size > 0) {
    for (size_t i = 0; i < ids.size(); ++i) {
      if (static_cast<uint32_t>(ids[i]) >= static_cast<uint64_t>(vocab_size))
        throw Error(path + ": token " + std::to_string(static_cast<uint32_t>(ids[i])) + " at position " +
                    std::to_string(i) + " is outside the vocabulary (size " + std::to_string(vocab_size) +
                    "): shard made with another tokenizer?");
    }
  }
  return ids;
}

void write_token_shard(const std::string& path, const std::vector<int32_t>& ids) {
  write_file_atomic(path, [&](std::ostream& out) {
    out.write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(ids.size() * 4));
  });
}

std::vector<int32_t> tokenize_documents(const Tokenizer& tokenizer, const std::vector<std::string>& paths,
                                        int64_t eos_id, const std::string& field) {
  std::vector<int32_t> out;
  auto add = [&](const std::string& text) {
    auto ids = tokenizer.encode(text, /*parse_special=*/false);
    out.insert(out.end(), ids.begin(), ids.end());
    if (eos_id >= 0) out.push_back(static_cast<int32_t>(eos_id));
  };
  for (const auto& path : paths) {
    if (ends_with(path, ".jsonl")) {
      for_each_jsonl(path, [&](const nlohmann::json& j, int64_t line) { add(jsonl_string(j, field, path, line)); });
    } else {
      add(read_file(path));
    }
  }
  return out;
}

std::vector<int32_t> load_tokens(const std::string& path, const Tokenizer* tokenizer, int64_t eos_id,
                                 int64_t vocab_size) {
  if (!std::filesystem::exists(path)) throw Error(path + ": no such file");
  if (ends_with(path, ".u32") || ends_with(path, ".bin")) return read_token_shard(path, vocab_size);
  if (!tokenizer) throw Error(path + ": a tokenizer is needed to read text files");
  return tokenize_documents(*tokenizer, {path}, eos_id);
}

}  // namespace linearize
