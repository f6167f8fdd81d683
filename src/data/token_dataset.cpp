// Memory-mapped token datasets (see token_dataset.h).
#include "data/token_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "io/atomic_file.h"
#include "io/error.h"
#include "io/token_shards.h"
#include "io/tokenizer.h"

namespace linearize {

namespace fs = std::filesystem;

// A mapped shard (read-only, pages read on demand) or tokens owned in memory.
struct TokenDataset::Piece {
  const int32_t* data = nullptr;
  int64_t size = 0;
  void* map = nullptr;
  size_t map_bytes = 0;
  std::vector<int32_t> owned;

  ~Piece() {
    if (map) munmap(map, map_bytes);
  }
};

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Maps `path` read-only; its size must be `expected_tokens` * 4 when that is >= 0, a multiple of 4 otherwise.
std::shared_ptr<TokenDataset::Piece> map_shard(const std::string& path, int64_t expected_tokens);

}  // namespace

std::string tokenizer_fingerprint(const Tokenizer& tokenizer, int64_t vocab) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a 64
  auto mix = [&](const std::string& s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
    h = (h ^ 0xff) * 1099511628211ULL;  // a separator no token's bytes end the same way with
  };
  for (int64_t id = 0; id < vocab; ++id) mix(tokenizer.token_bytes(static_cast<int32_t>(id), 1));
  char buf[32];
  std::snprintf(buf, sizeof buf, "fnv1a64:%016llx", static_cast<unsigned long long>(h));
  return buf;
}

namespace {

std::shared_ptr<TokenDataset::Piece> map_shard(const std::string& path, int64_t expected_tokens) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) throw Error(path + ": cannot open token shard: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw Error(path + ": expected a token shard file, found something else (a folder?)");
  const auto bytes = static_cast<int64_t>(st.st_size);
  if (expected_tokens >= 0 && bytes != expected_tokens * 4)
    throw Error(path + ": " + std::to_string(bytes) + " bytes, but the index says " + std::to_string(expected_tokens) +
                " tokens (" + std::to_string(expected_tokens * 4) + " bytes): truncated or replaced shard");
  if (bytes % 4 != 0)
    throw Error(path + ": token shard size " + std::to_string(bytes) +
                " bytes is not a multiple of 4 (expected little-endian uint32 ids; truncated file?)");
  auto piece = std::make_shared<TokenDataset::Piece>();
  piece->size = bytes / 4;
  if (bytes == 0) return piece;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot open token shard: " + std::strerror(errno));
  void* m = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (m == MAP_FAILED) throw Error(path + ": cannot map token shard: " + std::strerror(err));
  madvise(m, static_cast<size_t>(bytes), MADV_RANDOM);  // windows are read in a shuffled order
  piece->map = m;
  piece->map_bytes = static_cast<size_t>(bytes);
  piece->data = static_cast<const int32_t*>(m);
  return piece;
}

nlohmann::json read_index(const std::string& dir) {
  const std::string path = (fs::path(dir) / "index.json").string();
  if (!fs::exists(path))
    throw Error(dir + ": no index.json: not a token dataset folder, or its `linearize tokenize` did not finish "
                "(run it again)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": malformed JSON: " + e.what());
  }
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) throw Error(path + ": " + what);
  };
  need(j.is_object() && j.contains("format") && j["format"] == "linearize-tokens",
       "not a token dataset index (expected \"format\": \"linearize-tokens\")");
  need(j.contains("version") && j["version"] == 1,
       "index version " + (j.contains("version") ? j["version"].dump() : std::string("(none)")) + " unknown (expected 1)");
  need(j.contains("shards") && j["shards"].is_array(), "expected a \"shards\" list");
  need(j.contains("tokens") && j["tokens"].is_number_integer(), "expected \"tokens\" (an integer)");
  return j;
}

}  // namespace

TokenDataset TokenDataset::from_tokens(std::vector<int32_t> tokens, std::string name) {
  TokenDataset d;
  auto piece = std::make_shared<Piece>();
  piece->owned = std::move(tokens);
  piece->data = piece->owned.data();
  piece->size = static_cast<int64_t>(piece->owned.size());
  d.pieces_.push_back(piece);
  d.starts_.push_back(0);
  d.total_ = piece->size;
  d.name_ = std::move(name);
  return d;
}

TokenDataset TokenDataset::open(const std::string& path, const Tokenizer* tokenizer, int64_t eos_id) {
  if (!fs::exists(path)) throw Error(path + ": no such file or folder");
  TokenDataset d;
  d.name_ = path;
  auto add = [&](std::shared_ptr<Piece> p) {
    d.starts_.push_back(d.total_);
    d.total_ += p->size;
    d.pieces_.push_back(std::move(p));
  };
  if (fs::is_directory(path)) try {
    d.index_ = read_index(path);
    for (const auto& s : d.index_["shards"]) {
      if (!s.is_object() || !s.contains("file") || !s["file"].is_string() || !s.contains("tokens") ||
          !s["tokens"].is_number_integer())
        throw Error(path + "/index.json: a shard entry needs \"file\" and \"tokens\", found " + s.dump());
      const std::string file = s["file"].get<std::string>();
      if (file.empty() || file.find('/') != std::string::npos || file == "..")
        throw Error(path + "/index.json: shard \"" + file + "\" is not a file name inside the folder");
      add(map_shard((fs::path(path) / file).string(), s["tokens"].get<int64_t>()));
    }
    if (d.total_ != d.index_["tokens"].get<int64_t>())
      throw Error(path + "/index.json: the shards hold " + std::to_string(d.total_) + " tokens but the index says " +
                  std::to_string(d.index_["tokens"].get<int64_t>()));
    return d;
  } catch (const nlohmann::json::exception& e) {  // a field of the wrong type
    throw Error(path + "/index.json: unexpected content: " + e.what());
  }
  if (ends_with(path, ".u32") || ends_with(path, ".bin")) {
    add(map_shard(path, -1));
    return d;
  }
  if (!tokenizer) throw Error(path + ": a tokenizer is needed to read text files");
  return from_tokens(tokenize_documents(*tokenizer, {path}, eos_id), path);
}

void TokenDataset::read(int64_t begin, int64_t n, int32_t* out) const {
  if (begin < 0 || n < 0 || begin + n > total_)
    throw Error(name_ + ": tokens [" + std::to_string(begin) + ", " + std::to_string(begin + n) +
                ") are outside the stream of " + std::to_string(total_));
  auto it = std::upper_bound(starts_.begin(), starts_.end(), begin);
  size_t i = static_cast<size_t>(it - starts_.begin()) - 1;
  while (n > 0) {
    const Piece& p = *pieces_[i];
    const int64_t off = begin - starts_[i], take = std::min(n, p.size - off);
    if (take > 0) std::memcpy(out, p.data + off, static_cast<size_t>(take) * 4);
    out += take, begin += take, n -= take, ++i;
  }
}

std::vector<int32_t> TokenDataset::slice(int64_t begin, int64_t n) const {
  std::vector<int32_t> out(static_cast<size_t>(n));
  read(begin, n, out.data());
  return out;
}

void TokenDataset::check_ids(const int32_t* ids, int64_t n, int64_t vocab, int64_t begin) const {
  for (int64_t i = 0; i < n; ++i)
    if (static_cast<uint32_t>(ids[i]) >= static_cast<uint64_t>(vocab))
      throw Error(name_ + ": token " + std::to_string(static_cast<uint32_t>(ids[i])) + " at position " +
                  std::to_string(begin + i) + " is outside the vocabulary (size " + std::to_string(vocab) +
                  "): data made with another tokenizer?");
}

void TokenDataset::check_tokenizer(const Tokenizer& tokenizer, const std::string& model) const try {
  if (!index_.contains("tokenizer") || !index_["tokenizer"].is_object()) return;
  const auto& t = index_["tokenizer"];
  const int64_t vocab = t.value("vocab_size", int64_t{0});
  const std::string want = t.value("hash", std::string());
  if (vocab <= 0 || want.empty()) return;
  if (vocab > tokenizer.vocab_size() || tokenizer_fingerprint(tokenizer, vocab) != want)
    throw Error(name_ + ": tokenized with another tokenizer (" + t.value("source", std::string("?")) + ", " +
                std::to_string(vocab) + " tokens) than " + model + "'s (" + std::to_string(tokenizer.vocab_size()) +
                " tokens): tokenize the data with the model's tokenizer");
} catch (const nlohmann::json::exception& e) {
  throw Error(name_ + "/index.json: unexpected \"tokenizer\" entry: " + e.what());
}

}  // namespace linearize
