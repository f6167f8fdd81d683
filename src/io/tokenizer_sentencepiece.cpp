#include "io/tokenizer_sentencepiece.h"

#include <dlfcn.h>
#include <unistd.h>

#include <filesystem>
#include <mutex>

#include "io/error.h"
#include "io/sentencepiece_shim/shim.h"

namespace linearize {

namespace {

const char* kSpaceSymbol = "\xE2\x96\x81";  // U+2581 "▁"
constexpr const char* kShimName = "liblinearize_spm.so";
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif

// The shim's functions, resolved once.
struct Shim {
  decltype(&linearize_spm_load) load;
  decltype(&linearize_spm_free) free;
  decltype(&linearize_spm_vocab_size) vocab_size;
  decltype(&linearize_spm_encode) encode;
  decltype(&linearize_spm_decode) decode;
  decltype(&linearize_spm_id_to_piece) id_to_piece;
  decltype(&linearize_spm_is_control) is_control;
  decltype(&linearize_spm_is_unknown) is_unknown;
  decltype(&linearize_spm_is_byte) is_byte;
};

std::vector<std::string> shim_candidates() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("LINEARIZE_SPM_LIB")) out.push_back(env);
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) out.push_back((exe.parent_path() / kShimName).string());
#ifdef LINEARIZE_SPM_BUILD_PATH
  out.push_back(LINEARIZE_SPM_BUILD_PATH);
#endif
  return out;
}

const Shim& shim() {
  static Shim s;
  static std::string failure;
  static std::once_flag once;
  std::call_once(once, [] {
    if (kAddressSanitizer) {
      failure = "SentencePiece tokenizers are not available in an AddressSanitizer build: its runtime refuses "
                "the dlopen flag RTLD_DEEPBIND that keeps sentencepiece's protobuf apart from libtorch's";
      return;
    }
    void* lib = nullptr;
    std::string tried;
    for (const auto& path : shim_candidates()) {
      if (!std::filesystem::exists(path)) {
        tried += " " + path + " (absent)";
        continue;
      }
      lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (lib) break;
      tried += " " + path + " (" + dlerror() + ")";
    }
    if (!lib) {
      failure = "SentencePiece support library " + std::string(kShimName) + " not found; tried:" + tried;
      return;
    }
    auto sym = [&](const char* name) {
      void* p = dlsym(lib, name);
      if (!p) failure = std::string(kShimName) + " lacks " + name;
      return p;
    };
    s.load = reinterpret_cast<decltype(s.load)>(sym("linearize_spm_load"));
    s.free = reinterpret_cast<decltype(s.free)>(sym("linearize_spm_free"));
    s.vocab_size = reinterpret_cast<decltype(s.vocab_size)>(sym("linearize_spm_vocab_size"));
    s.encode = reinterpret_cast<decltype(s.encode)>(sym("linearize_spm_encode"));
    s.decode = reinterpret_cast<decltype(s.decode)>(sym("linearize_spm_decode"));
    s.id_to_piece = reinterpret_cast<decltype(s.id_to_piece)>(sym("linearize_spm_id_to_piece"));
    s.is_control = reinterpret_cast<decltype(s.is_control)>(sym("linearize_spm_is_control"));
    s.is_unknown = reinterpret_cast<decltype(s.is_unknown)>(sym("linearize_spm_is_unknown"));
    s.is_byte = reinterpret_cast<decltype(s.is_byte)>(sym("linearize_spm_is_byte"));
  });
  if (!failure.empty()) throw Error(failure);
  return s;
}

}  // namespace

bool sentencepiece_supported() { return !kAddressSanitizer; }

namespace {

// "<0xAB>" -> 0xAB.
int byte_of_piece(const std::string& piece) { return std::stoi(piece.substr(3, 2), nullptr, 16); }

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size()))
    s.replace(pos, from.size(), to);
  return s;
}

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_path) : path_(model_path) {
  if (!std::filesystem::exists(model_path)) throw Error(model_path + ": no such file");
  const Shim& s = shim();
  char err[512] = {0};
  handle_ = s.load(model_path.c_str(), err, sizeof(err));
  if (!handle_) throw Error(model_path + ": not a SentencePiece model: " + err);
  const int n = s.vocab_size(handle_);
  for (int id = 0; id < n; ++id) {
    std::string piece(256, '\0');
    int len = s.id_to_piece(handle_, id, piece.data(), static_cast<int>(piece.size()));
    if (len > static_cast<int>(piece.size())) {
      piece.resize(len);
      s.id_to_piece(handle_, id, piece.data(), len);
    }
    piece.resize(len);
    PieceKind kind = PieceKind::kText;
    if (s.is_byte(handle_, id)) kind = PieceKind::kByte;
    else if (s.is_control(handle_, id) || s.is_unknown(handle_, id)) kind = PieceKind::kSilent;
    if (s.is_control(handle_, id) && !piece.empty()) control_ids_.push_back(id);
    id_of_.emplace(piece, id);
    pieces_.push_back(std::move(piece));
    kinds_.push_back(kind);
  }
}

SentencePieceTokenizer::~SentencePieceTokenizer() {
  if (handle_) shim().free(handle_);
}

const std::string& SentencePieceTokenizer::piece(int32_t id) const {
  check_id(id);
  return pieces_[id];
}

void SentencePieceTokenizer::encode_plain(const std::string& text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::vector<int> ids(text.size() + 16);
  int n = shim().encode(handle_, text.data(), text.size(), ids.data(), static_cast<int>(ids.size()));
  if (n > static_cast<int>(ids.size())) {
    ids.resize(n);
    n = shim().encode(handle_, text.data(), text.size(), ids.data(), n);
  }
  if (n < 0) throw Error(path_ + ": SentencePiece failed to encode the text");
  out.insert(out.end(), ids.begin(), ids.begin() + n);
}

std::vector<int32_t> SentencePieceTokenizer::encode(const std::string& text, bool parse_special) const {
  std::vector<int32_t> out;
  if (!parse_special || control_ids_.empty()) {
    encode_plain(text, out);
    return out;
  }
  size_t start = 0;  // leftmost, then longest control piece
  while (start < text.size()) {
    size_t best_pos = std::string::npos, best_len = 0;
    int32_t best_id = -1;
    for (int32_t id : control_ids_) {
      const std::string& p = pieces_[id];
      const size_t pos = text.find(p, start);
      if (pos == std::string::npos) continue;
      if (pos < best_pos || (pos == best_pos && p.size() > best_len)) {
        best_pos = pos;
        best_len = p.size();
        best_id = id;
      }
    }
    if (best_id < 0) break;
    encode_plain(text.substr(start, best_pos - start), out);
    out.push_back(best_id);
    start = best_pos + best_len;
  }
  if (start < text.size()) encode_plain(text.substr(start), out);
  return out;
}

void SentencePieceTokenizer::check_id(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= pieces_.size())
    throw Error(path_ + ": token id " + std::to_string(id) + " out of range [0, " +
                std::to_string(pieces_.size()) + ")");
}

std::string SentencePieceTokenizer::token_bytes(int32_t id, int64_t position) const {
  check_id(id);
  if (kinds_[id] == PieceKind::kSilent) return std::string();
  if (kinds_[id] == PieceKind::kByte) return std::string(1, static_cast<char>(byte_of_piece(pieces_[id])));
  std::string text = replace_all(pieces_[id], kSpaceSymbol, " ");
  if (position == 0 && !text.empty() && text[0] == ' ') text.erase(0, 1);
  return text;
}

std::string SentencePieceTokenizer::decode(const std::vector<int32_t>& ids) const {
  for (int32_t id : ids) check_id(id);
  std::vector<int> v(ids.begin(), ids.end());
  std::string out(ids.size() * 8 + 16, '\0');
  int n = shim().decode(handle_, v.data(), static_cast<int>(v.size()), out.data(), static_cast<int>(out.size()));
  if (n > static_cast<int>(out.size())) {
    out.resize(n);
    n = shim().decode(handle_, v.data(), static_cast<int>(v.size()), out.data(), n);
  }
  if (n < 0) throw Error(path_ + ": SentencePiece failed to decode");
  out.resize(n);
  return out;
}

std::optional<int32_t> SentencePieceTokenizer::token_to_id(const std::string& token) const {
  auto it = id_of_.find(token);
  if (it == id_of_.end()) return std::nullopt;
  return it->second;
}

}  // namespace linearize
