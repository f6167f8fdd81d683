// Byte-level BPE: tokenizer.json / vocab.json+merges.txt loading, pre-tokenisation with PCRE2,
// merge-by-rank, added-token matching and byte-level decoding. See tokenizer_bpe.h for the pipeline
// and what is deliberately unsupported.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "io/tokenizer_bpe.h"

#include <pcre2.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>

#include "io/atomic_file.h"
#include "io/error.h"
#include "io/utf8.h"

namespace linearize {

using json = nlohmann::json;

// The GPT-2 pre-tokenisation pattern, used by ByteLevel(use_regex=true).
static const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// ---------------------------------------------------------------------------------------------
// PCRE2 wrapper

class BpeRegex {
 public:
  BpeRegex(const std::string& pattern, bool literal, const std::string& where) {
    int err = 0;
    PCRE2_SIZE err_offset = 0;
    uint32_t flags = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK | (literal ? PCRE2_LITERAL : 0u);
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), flags, &err,
                          &err_offset, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      throw Error(where + ": expected a regex PCRE2 can compile, found \"" + pattern + "\" (" +
                  reinterpret_cast<char*>(msg) + " at offset " + std::to_string(err_offset) + ")");
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is absent
  }
  ~BpeRegex() { pcre2_code_free(code_); }
  BpeRegex(const BpeRegex&) = delete;
  BpeRegex& operator=(const BpeRegex&) = delete;

  // Non-empty matches of the pattern in `s` (valid UTF-8), as [begin, end) byte ranges.
  std::vector<std::pair<size_t, size_t>> find_all(const std::string& s) const {
    std::vector<std::pair<size_t, size_t>> out;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    size_t pos = 0;
    while (pos < s.size()) {
      int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos,
                           PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc < 0) break;  // PCRE2_ERROR_NOMATCH (or a match-limit error: treat the rest as a gap)
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      size_t b = ov[0], e = ov[1];
      if (e > b) {
        out.emplace_back(b, e);
        pos = e;
      } else {  // empty match: step over one character
        size_t n = utf8::sequence_length(s, b);
        pos = b + (n ? n : 1);
      }
    }
    pcre2_match_data_free(md);
    return out;
  }

 private:
  pcre2_code* code_ = nullptr;
};

namespace {

// ---------------------------------------------------------------------------------------------
// GPT-2 byte <-> unicode map: printable bytes map to themselves, the other 68 to U+0100 + n in
// increasing byte order (space -> U+0120 'Ġ', '\n' -> U+010A 'Ċ').

struct ByteMap {
  std::array<std::string, 256> symbol;  // byte -> UTF-8 of its character
  std::array<int16_t, 512> byte_of;     // codepoint -> byte, -1 when not in the map
};

const ByteMap& byte_map() {
  static const ByteMap map = [] {
    ByteMap m;
    m.byte_of.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      uint32_t cp = printable ? static_cast<uint32_t>(b) : 256u + static_cast<uint32_t>(extra++);
      utf8::append_codepoint(m.symbol[b], cp);
      m.byte_of[cp] = static_cast<int16_t>(b);
    }
    return m;
  }();
  return map;
}

std::string byte_encode(const std::string& piece) {
  std::string out;
  out.reserve(piece.size() * 2);
  for (unsigned char c : piece) out += byte_map().symbol[c];
  return out;
}

// Decodes the code point at s[i] (valid UTF-8) and advances i.
uint32_t next_codepoint(const std::string& s, size_t& i) {
  const unsigned char b = static_cast<unsigned char>(s[i]);
  size_t n = utf8::sequence_length(s, i);
  if (n == 0) {
    ++i;
    return 0xFFFD;
  }
  uint32_t cp = (n == 1) ? b : (n == 2) ? (b & 0x1F) : (n == 3) ? (b & 0x0F) : (b & 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

// A token string back to bytes, as the ByteLevel decoder does: every character through the map, or
// the token's own text when some character is not in the map.
std::string byte_decode(const std::string& token) {
  std::string out;
  for (size_t i = 0; i < token.size();) {
    uint32_t cp = next_codepoint(token, i);
    if (cp >= byte_map().byte_of.size() || byte_map().byte_of[cp] < 0) return token;
    out += static_cast<char>(byte_map().byte_of[cp]);
  }
  return out;
}

// Unicode White_Space (what Rust's char::is_whitespace tests), for lstrip/rstrip.
bool is_whitespace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

// Start of the character that ends just before byte `end` of s.
size_t prev_char_start(const std::string& s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

// Word characters (letters, numbers, underscore) for single_word added tokens.
bool is_word_char_at(const std::string& s, size_t i) {
  static const BpeRegex word("^\\w", false, "single_word check");
  size_t n = utf8::sequence_length(s, i);
  if (n == 0) return false;
  return !word.find_all(s.substr(i, n)).empty();
}

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// Splits `piece` into the regex matches and the gaps between them, dropping empty pieces.
void split_isolated(const std::string& piece, const BpeRegex& re, std::vector<std::string>& out) {
  size_t last = 0;
  for (const auto& m : re.find_all(piece)) {
    if (m.first > last) out.push_back(piece.substr(last, m.first - last));
    out.push_back(piece.substr(m.first, m.second - m.first));
    last = m.second;
  }
  if (last < piece.size()) out.push_back(piece.substr(last));
}

// ---------------------------------------------------------------------------------------------
// tokenizer.json helpers

json read_json_file(const std::string& path) {
  require_regular_file(path);
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot open file");
  try {
    return json::parse(f);
  } catch (const json::exception& e) {
    throw Error(path + ": expected valid JSON, found a parse error: " + e.what());
  }
}

std::string type_of(const json& j) {
  if (j.is_object() && j.contains("type") && j["type"].is_string()) return j["type"].get<std::string>();
  return j.dump().substr(0, 80);
}

bool get_bool(const json& j, const char* key, bool dflt) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  return j[key].get<bool>();
}

std::shared_ptr<const BpeRegex> make_regex(const std::string& pattern, bool literal,
                                           const std::string& where) {
  return std::make_shared<const BpeRegex>(pattern, literal, where);
}

// Appends the steps of one pre_tokenizer entry (recursing into Sequence).
void parse_pre_tokenizer(const json& j, const std::string& path, std::vector<BpePreStep>& steps) {
  const std::string where = path + ": pre_tokenizer";
  const std::string type = type_of(j);
  if (type == "Sequence") {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array())
      throw Error(where + ": expected Sequence.pretokenizers to be an array, found " + j.dump().substr(0, 80));
    for (const auto& sub : j["pretokenizers"]) parse_pre_tokenizer(sub, path, steps);
  } else if (type == "Digits") {
    BpePreStep s;
    bool individual = get_bool(j, "individual_digits", false);
    s.regex = make_regex(individual ? "\\p{N}" : "\\p{N}+", false, where);
    s.describe = individual ? "Digits(individual)" : "Digits(contiguous)";
    steps.push_back(s);
  } else if (type == "Split") {
    const std::string behavior = j.value("behavior", std::string());
    if (behavior != "Isolated")
      throw Error(where + ": expected Split.behavior \"Isolated\", found \"" + behavior + "\"");
    if (get_bool(j, "invert", false))
      throw Error(where + ": expected Split.invert false, found true (not supported)");
    const json& p = j.at("pattern");
    BpePreStep s;
    if (p.contains("Regex")) {
      s.regex = make_regex(p["Regex"].get<std::string>(), false, where);
      s.describe = "Split(Regex)";
    } else if (p.contains("String")) {
      s.regex = make_regex(p["String"].get<std::string>(), true, where);
      s.describe = "Split(String)";
    } else {
      throw Error(where + ": expected Split.pattern {\"Regex\"|\"String\": ...}, found " + p.dump());
    }
    steps.push_back(s);
  } else if (type == "ByteLevel") {
    BpePreStep s;
    s.kind = BpePreStep::Kind::kByteLevel;
    s.add_prefix_space = get_bool(j, "add_prefix_space", false);
    if (get_bool(j, "use_regex", true)) s.regex = make_regex(kGpt2Pattern, false, where);
    s.describe = "ByteLevel";
    steps.push_back(s);
  } else {
    throw Error(where + ": expected ByteLevel, Sequence, Digits or Split(Isolated), found type \"" +
                type + "\" (not supported)");
  }
}

void check_model_fields(const json& model, const std::string& path) {
  const std::string where = path + ": model";
  const std::string type = model.value("type", std::string("BPE"));
  if (type != "BPE") throw Error(where + ".type: expected \"BPE\", found \"" + type + "\"");
  if (get_bool(model, "byte_fallback", false))
    throw Error(where + ".byte_fallback: expected false, found true (byte fallback is not supported)");
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"].get<double>() > 0)
    throw Error(where + ".dropout: expected null, found " + model["dropout"].dump());
  if (model.contains("unk_token") && !model["unk_token"].is_null())
    throw Error(where + ".unk_token: expected null (absent bytes are dropped), found " +
                model["unk_token"].dump());
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model[key].is_null() && !model[key].get<std::string>().empty())
      throw Error(where + "." + key + ": expected null or \"\", found " + model[key].dump());
  }
  if (!model.contains("vocab") || !model["vocab"].is_object())
    throw Error(where + ".vocab: expected an object {token: id}, found " +
                (model.contains("vocab") ? model["vocab"].dump().substr(0, 80) : "nothing"));
  if (!model.contains("merges") || !model["merges"].is_array())
    throw Error(where + ".merges: expected an array, found " +
                (model.contains("merges") ? model["merges"].dump().substr(0, 80) : "nothing"));
}

// A merge written "a b" (legacy) or ["a", "b"] (tokenizers >= 0.20).
std::pair<std::string, std::string> parse_merge(const json& m, const std::string& path, size_t index) {
  const std::string where = path + ": model.merges[" + std::to_string(index) + "]";
  if (m.is_string()) {
    const std::string s = m.get<std::string>();
    size_t sp = s.find(' ');
    if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
      throw Error(where + ": expected \"left right\" with one space, found \"" + s + "\"");
    return {s.substr(0, sp), s.substr(sp + 1)};
  }
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())
    return {m[0].get<std::string>(), m[1].get<std::string>()};
  throw Error(where + ": expected \"left right\" or [\"left\", \"right\"], found " + m.dump());
}

std::vector<AddedToken> parse_added_tokens(const json& j, const std::string& path) {
  std::vector<AddedToken> out;
  if (!j.contains("added_tokens") || j["added_tokens"].is_null()) return out;
  size_t index = 0;
  for (const auto& t : j["added_tokens"]) {
    if (!t.contains("id") || !t.contains("content"))
      throw Error(path + ": added_tokens[" + std::to_string(index) +
                  "]: expected \"id\" and \"content\", found " + t.dump());
    AddedToken a;
    a.id = t["id"].get<int32_t>();
    a.content = t["content"].get<std::string>();
    a.special = get_bool(t, "special", false);
    a.lstrip = get_bool(t, "lstrip", false);
    a.rstrip = get_bool(t, "rstrip", false);
    a.single_word = get_bool(t, "single_word", false);
    out.push_back(a);
    ++index;
  }
  return out;
}

std::string read_text_file(const std::string& path) {
  require_regular_file(path);
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot open file");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Construction

BpeTokenizer::BpeTokenizer(const std::unordered_map<std::string, int32_t>& vocab,
                           const std::vector<std::pair<std::string, std::string>>& merges,
                           const std::vector<AddedToken>& added_tokens, bool isolate_digits,
                           std::string source)
    : source_(std::move(source)) {
  init_vocab(vocab, added_tokens);
  init_merges(merges);
  init_added_trie();
  if (isolate_digits) {
    BpePreStep digits;
    digits.regex = make_regex("\\p{N}", false, source_);
    digits.describe = "Digits(individual)";
    pre_steps_.push_back(digits);
  }
  BpePreStep bl;
  bl.kind = BpePreStep::Kind::kByteLevel;
  bl.regex = make_regex(kGpt2Pattern, false, source_);
  bl.describe = "ByteLevel";
  pre_steps_.push_back(bl);
}

void BpeTokenizer::init_vocab(const std::unordered_map<std::string, int32_t>& vocab,
                              const std::vector<AddedToken>& added_tokens) {
  if (vocab.empty()) throw Error(source_ + ": expected a non-empty vocabulary, found none");
  int32_t max_id = -1;
  for (const auto& kv : vocab) {
    if (kv.second < 0)
      throw Error(source_ + ": vocab entry \"" + kv.first + "\": expected id >= 0, found " +
                  std::to_string(kv.second));
    max_id = std::max(max_id, kv.second);
  }
  for (const auto& a : added_tokens) max_id = std::max(max_id, a.id);
  id_to_token_.assign(static_cast<size_t>(max_id) + 1, std::string());
  for (const auto& kv : vocab) id_to_token_[kv.second] = kv.first;
  token_to_id_ = vocab;

  added_ = added_tokens;
  added_index_of_id_.assign(id_to_token_.size(), -1);
  for (size_t i = 0; i < added_.size(); ++i) {
    const AddedToken& a = added_[i];
    if (a.id < 0 || a.content.empty())
      throw Error(source_ + ": added token \"" + a.content + "\": expected id >= 0 and non-empty content");
    added_index_of_id_[a.id] = static_cast<int32_t>(i);
    token_to_id_.emplace(a.content, a.id);
    if (id_to_token_[a.id].empty()) id_to_token_[a.id] = a.content;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = vocab.find(byte_map().symbol[b]);
    byte_id_[b] = it == vocab.end() ? -1 : it->second;
  }
}

void BpeTokenizer::init_merges(const std::vector<std::pair<std::string, std::string>>& merges) {
  if (merges.empty())
    throw Error(source_ + ": expected a non-empty merges list, found 0 merges "
                          "(a BPE without merges would encode every byte as its own token)");
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& m = merges[rank];
    auto find = [&](const std::string& tok) {
      auto it = token_to_id_.find(tok);
      if (it == token_to_id_.end())
        throw Error(source_ + ": merge " + std::to_string(rank) + " \"" + m.first + " " + m.second +
                    "\": expected \"" + tok + "\" in the vocabulary, found nothing");
      return it->second;
    };
    const int32_t a = find(m.first), b = find(m.second), merged = find(m.first + m.second);
    merge_ranks_[pair_key(a, b)] = MergeInfo{static_cast<int32_t>(rank), merged};
  }
}

void BpeTokenizer::init_added_trie() {
  trie_.assign(1, TrieNode());
  for (size_t i = 0; i < added_.size(); ++i) {
    int32_t node = 0;
    for (unsigned char c : added_[i].content) {
      auto it = trie_[node].next.find(c);
      if (it == trie_[node].next.end()) {
        trie_.push_back(TrieNode());
        int32_t child = static_cast<int32_t>(trie_.size()) - 1;
        trie_[node].next[c] = child;
        node = child;
      } else {
        node = it->second;
      }
    }
    trie_[node].token = static_cast<int32_t>(i);
  }
}

std::unique_ptr<BpeTokenizer> BpeTokenizer::from_tokenizer_json(const std::string& path) {
  const json j = read_json_file(path);
  if (!j.is_object()) throw Error(path + ": expected a JSON object, found " + j.dump().substr(0, 80));
  if (!j.contains("model") || !j["model"].is_object())
    throw Error(path + ": expected a \"model\" object (tokenizer.json), found none");
  // Normalizers: none, or NFC (alone or as the only member of a Sequence), as Qwen's tokenizers have.
  bool nfc = false;
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    const json& n = j["normalizer"];
    const bool sequence_of_nfc = type_of(n) == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array() &&
                                 n["normalizers"].size() == 1 && type_of(n["normalizers"][0]) == "NFC";
    if (type_of(n) != "NFC" && !sequence_of_nfc)
      throw Error(path + ": normalizer: expected null or NFC, found " + n.dump().substr(0, 120) + " (not supported)");
    nfc = true;
  }
  const json& model = j["model"];
  check_model_fields(model, path);

  std::unordered_map<std::string, int32_t> vocab;
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it)
    vocab.emplace(it.key(), it.value().get<int32_t>());
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(model["merges"].size());
  for (size_t i = 0; i < model["merges"].size(); ++i) merges.push_back(parse_merge(model["merges"][i], path, i));

  std::unique_ptr<BpeTokenizer> t(new BpeTokenizer());
  t->source_ = path;
  t->ignore_merges_ = get_bool(model, "ignore_merges", false);
  t->nfc_ = nfc;
  t->init_vocab(vocab, parse_added_tokens(j, path));
  t->init_merges(merges);
  t->init_added_trie();

  if (!j.contains("pre_tokenizer") || j["pre_tokenizer"].is_null())
    throw Error(path + ": pre_tokenizer: expected ByteLevel (byte-level BPE), found null");
  parse_pre_tokenizer(j["pre_tokenizer"], path, t->pre_steps_);
  size_t n_byte_level = 0;
  for (const auto& s : t->pre_steps_) n_byte_level += s.kind == BpePreStep::Kind::kByteLevel;
  if (n_byte_level != 1 || t->pre_steps_.back().kind != BpePreStep::Kind::kByteLevel)
    throw Error(path + ": pre_tokenizer: expected exactly one ByteLevel step, as the last step, found " +
                std::to_string(n_byte_level) + " in " + j["pre_tokenizer"].dump().substr(0, 200));

  const json decoder = j.value("decoder", json());
  if (type_of(decoder) != "ByteLevel")
    throw Error(path + ": decoder: expected type \"ByteLevel\", found " +
                (decoder.is_null() ? std::string("null") : "\"" + type_of(decoder) + "\""));
  // post_processor (null, ByteLevel, TemplateProcessing, ...) only adds specials, which encode()
  // never does; it is accepted whatever it is.
  return t;
}

std::unique_ptr<BpeTokenizer> BpeTokenizer::from_vocab_merges(const std::string& vocab_json_path,
                                                              const std::string& merges_txt_path) {
  const json v = read_json_file(vocab_json_path);
  if (!v.is_object())
    throw Error(vocab_json_path + ": expected an object {token: id}, found " + v.dump().substr(0, 80));
  std::unordered_map<std::string, int32_t> vocab;
  for (auto it = v.begin(); it != v.end(); ++it) vocab.emplace(it.key(), it.value().get<int32_t>());

  std::vector<std::pair<std::string, std::string>> merges;
  std::istringstream lines(read_text_file(merges_txt_path));
  std::string line;
  size_t line_no = 0;
  while (std::getline(lines, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    size_t sp = line.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == line.size())
      throw Error(merges_txt_path + ":" + std::to_string(line_no) +
                  ": expected \"left right\", found \"" + line + "\"");
    merges.emplace_back(line.substr(0, sp), line.substr(sp + 1));
  }
  if (merges.empty())
    throw Error(merges_txt_path + ": expected merges (\"left right\" lines), found none");

  std::vector<AddedToken> added;
  auto eot = vocab.find("<|endoftext|>");
  if (eot != vocab.end()) added.push_back(AddedToken{"<|endoftext|>", eot->second, true});
  return std::make_unique<BpeTokenizer>(vocab, merges, added, false, vocab_json_path);
}

// ---------------------------------------------------------------------------------------------
// Encoding

std::vector<std::pair<std::string, int32_t>> BpeTokenizer::split_added(const std::string& text,
                                                                        bool parse_special) const {
  std::vector<std::pair<std::string, int32_t>> out;
  size_t seg_start = 0;  // start of the text not yet emitted
  size_t i = 0;
  while (i < text.size()) {
    // Longest added token starting at i.
    int32_t best = -1;
    size_t best_end = 0;
    int32_t node = 0;
    for (size_t k = i; k < text.size(); ++k) {
      auto it = trie_[node].next.find(static_cast<unsigned char>(text[k]));
      if (it == trie_[node].next.end()) break;
      node = it->second;
      if (trie_[node].token >= 0) {
        best = trie_[node].token;
        best_end = k + 1;
      }
    }
    if (best < 0) {
      ++i;
      continue;
    }
    const AddedToken& a = added_[best];
    bool accept = parse_special || !a.special;
    if (accept && a.single_word) {
      bool word_before = i > 0 && is_word_char_at(text, prev_char_start(text, i));
      bool word_after = best_end < text.size() && is_word_char_at(text, best_end);
      accept = !word_before && !word_after;
    }
    if (!accept) {  // the match stays plain text; matching resumes after it
      i = best_end;
      continue;
    }
    size_t start = i, end = best_end;
    if (a.lstrip) {
      while (start > seg_start) {
        size_t p = prev_char_start(text, start), q = p;
        if (!is_whitespace(next_codepoint(text, q))) break;
        start = p;
      }
    }
    if (a.rstrip) {
      while (end < text.size()) {
        size_t q = end;
        if (!is_whitespace(next_codepoint(text, q))) break;
        end = q;
      }
    }
    if (start > seg_start) out.emplace_back(text.substr(seg_start, start - seg_start), -1);
    out.emplace_back(std::string(), best);
    seg_start = i = end;
  }
  if (seg_start < text.size()) out.emplace_back(text.substr(seg_start), -1);
  return out;
}

std::vector<std::string> BpeTokenizer::pre_tokenize(const std::string& segment) const {
  std::vector<std::string> pieces{segment};
  for (const BpePreStep& step : pre_steps_) {
    std::vector<std::string> next;
    for (std::string& p : pieces) {
      if (step.kind == BpePreStep::Kind::kByteLevel && step.add_prefix_space && !p.empty() &&
          p[0] != ' ')
        p.insert(p.begin(), ' ');
      if (step.regex)
        split_isolated(p, *step.regex, next);
      else
        next.push_back(std::move(p));
    }
    pieces.swap(next);
  }
  return pieces;
}

std::vector<int32_t> BpeTokenizer::bpe_merge(std::vector<int32_t> ids) const {
  const int n = static_cast<int>(ids.size());
  if (n < 2) return ids;
  std::vector<int> prev(n), next(n);
  std::vector<char> alive(n, 1);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank;
    int left;
    int32_t merged;
  };
  // Min-heap on (rank, left position): lowest rank first, the leftmost pair on ties.
  auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(later)> heap(later);
  auto push_pair = [&](int left) {
    if (left < 0 || next[left] < 0) return;
    auto it = merge_ranks_.find(pair_key(ids[left], ids[next[left]]));
    if (it != merge_ranks_.end()) heap.push({it->second.rank, left, it->second.merged_id});
  };
  for (int i = 0; i + 1 < n; ++i) push_pair(i);

  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const int right = next[c.left];
    if (!alive[c.left] || right < 0) continue;
    auto it = merge_ranks_.find(pair_key(ids[c.left], ids[right]));
    if (it == merge_ranks_.end() || it->second.rank != c.rank) continue;  // stale: a side changed
    ids[c.left] = c.merged;
    alive[right] = 0;
    next[c.left] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.left;
    push_pair(prev[c.left]);
    push_pair(c.left);
  }
  std::vector<int32_t> out;
  for (int i = 0; i >= 0; i = next[i]) out.push_back(ids[i]);
  return out;
}

void BpeTokenizer::encode_piece(const std::string& piece, std::vector<int32_t>& out) const {
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto it = cache_.find(piece);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  if (ignore_merges_) {
    auto whole = token_to_id_.find(byte_encode(piece));
    if (whole != token_to_id_.end()) ids.push_back(whole->second);
  }
  if (ids.empty()) {
    std::vector<int32_t> symbols;
    symbols.reserve(piece.size());
    for (unsigned char c : piece)
      if (byte_id_[c] >= 0) symbols.push_back(byte_id_[c]);  // absent byte symbols are dropped
    ids = bpe_merge(std::move(symbols));
  }
  out.insert(out.end(), ids.begin(), ids.end());
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (cache_.size() > (1u << 20)) cache_.clear();  // bound memory on huge corpora
  cache_.emplace(piece, std::move(ids));
}

std::vector<int32_t> BpeTokenizer::encode(const std::string& text, bool parse_special) const {
  const std::string clean = utf8::sanitize(text);
  std::vector<int32_t> out;
  for (const auto& seg : split_added(clean, parse_special)) {
    if (seg.second >= 0) {
      out.push_back(added_[seg.second].id);
      continue;
    }
    for (const std::string& piece : pre_tokenize(nfc_ ? utf8::nfc(seg.first) : seg.first)) encode_piece(piece, out);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Decoding

std::string BpeTokenizer::token_bytes(int32_t id, int64_t position) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size())
    throw Error(source_ + ": token id " + std::to_string(id) + " out of range [0, " +
                std::to_string(id_to_token_.size()) + ")");
  return byte_decode(id_to_token_[id]);
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string bytes;
  for (int32_t id : ids) bytes += token_bytes(id, 0);
  return utf8::sanitize(bytes);
}

std::optional<int32_t> BpeTokenizer::token_to_id(const std::string& token) const {
  auto it = token_to_id_.find(token);
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

// ---------------------------------------------------------------------------------------------
bool BpeTokenizer::safe_to_split_at_newlines() const {
  for (const auto& s : pre_steps_) {
    const bool digits = s.kind == BpePreStep::Kind::kSplitIsolated && s.describe.rfind("Digits", 0) == 0;
    const bool gpt2 = s.kind == BpePreStep::Kind::kByteLevel && s.regex && !s.add_prefix_space;
    if (!digits && !gpt2) return false;
  }
  return !pre_steps_.empty();
}

// Byte-level helpers and the tokenizer.json writer

const std::string& byte_level_symbol(uint8_t byte) { return byte_map().symbol[byte]; }

std::string byte_level_encode(const std::string& bytes) { return byte_encode(bytes); }

std::vector<std::string> pretokenize_smollm2(const std::string& text) {
  // The same two steps BpeTokenizer's constructor builds for isolate_digits=true.
  static const BpeRegex digits("\\p{N}", false, "pretokenize_smollm2");
  static const BpeRegex gpt2(kGpt2Pattern, false, "pretokenize_smollm2");
  std::vector<std::string> split;
  if (utf8::is_valid(text)) split_isolated(text, digits, split);
  else split_isolated(utf8::sanitize(text), digits, split);
  std::vector<std::string> out;
  out.reserve(split.size() * 2);
  for (const std::string& p : split) split_isolated(p, gpt2, out);
  return out;
}

std::vector<std::string> pretokenize_gpt2(const std::string& text) {
  static const BpeRegex gpt2(kGpt2Pattern, false, "pretokenize_gpt2");
  std::vector<std::string> out;
  split_isolated(utf8::is_valid(text) ? text : utf8::sanitize(text), gpt2, out);
  return out;
}

void write_tokenizer_json(const std::string& path, const std::vector<std::string>& vocab,
                          const std::vector<std::pair<std::string, std::string>>& merges,
                          const std::vector<AddedToken>& added_tokens, bool isolate_digits) {
  if (merges.empty()) throw Error(path + ": refusing to write a BPE tokenizer without merges");
  nlohmann::ordered_json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = nlohmann::ordered_json::array();
  for (const auto& a : added_tokens) {
    if (a.id < 0 || a.id >= static_cast<int32_t>(vocab.size()) || vocab[a.id] != a.content)
      throw Error(path + ": added token \"" + a.content + "\" must be in the vocabulary at its id");
    j["added_tokens"].push_back({{"id", a.id}, {"content", a.content}, {"single_word", a.single_word},
                                 {"lstrip", a.lstrip}, {"rstrip", a.rstrip}, {"normalized", false},
                                 {"special", a.special}});
  }
  j["normalizer"] = nullptr;
  nlohmann::ordered_json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false},
                                       {"trim_offsets", true}, {"use_regex", true}};
  if (isolate_digits) {
    j["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level}}};
  } else {
    j["pre_tokenizer"] = byte_level;
  }
  j["post_processor"] = nullptr;
  j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  nlohmann::ordered_json model;
  model["type"] = "BPE";
  model["dropout"] = nullptr;
  model["unk_token"] = nullptr;
  model["continuing_subword_prefix"] = nullptr;
  model["end_of_word_suffix"] = nullptr;
  model["fuse_unk"] = false;
  model["byte_fallback"] = false;
  model["ignore_merges"] = false;
  nlohmann::ordered_json v = nlohmann::ordered_json::object();
  for (size_t i = 0; i < vocab.size(); ++i) {
    if (v.contains(vocab[i])) throw Error(path + ": token \"" + vocab[i] + "\" appears twice in the vocabulary");
    v[vocab[i]] = static_cast<int64_t>(i);
  }
  model["vocab"] = v;
  model["merges"] = nlohmann::ordered_json::array();
  for (const auto& [a, b] : merges) model["merges"].push_back({a, b});
  j["model"] = model;
  write_file_atomic(path, [&](std::ostream& out) { out << j.dump(2) << "\n"; });
}

}  // namespace linearize
