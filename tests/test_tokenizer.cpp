// Tokenizer tests: every ../shared/golden/tok-*/reference.json case (ids and decoded text from
// Hugging Face tokenizers 0.23) must match exactly; GPT-2 vocab.json + merges.txt against
// ../shared/data/tokenizers/gpt2_cases.jsonl; special tokens, absent byte symbols, invalid UTF-8,
// streaming decode of split characters, malformed files, and SentencePiece on stories260K.
//
// Deliberately not here: speed (bench/), training a BPE.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/error.h"
#include "io/tokenizer.h"
#include "io/tokenizer_bpe.h"
#include "io/tokenizer_sentencepiece.h"
#include "io/utf8.h"
#include "test_util.h"

namespace linearize {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::string smollm2_path() { return test::data_dir() + "/tokenizers/smollm2-tokenizer.json"; }
std::string stories_model_path() { return test::data_dir() + "/models/stories260K/tokenizer.model"; }

const BpeTokenizer& smollm2() {
  static std::unique_ptr<BpeTokenizer> t = BpeTokenizer::from_tokenizer_json(smollm2_path());
  return *t;
}

std::vector<int32_t> ids_of(const json& j) { return j.get<std::vector<int32_t>>(); }

// Streams `ids` through a StreamDecoder; returns each push's output, then flush's.
std::vector<std::string> stream(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  StreamDecoder dec(tok);
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(dec.push(id));
  out.push_back(dec.flush());
  return out;
}

std::string joined(const std::vector<std::string>& parts) {
  std::string s;
  for (const auto& p : parts) s += p;
  return s;
}

// Writes `text` to a fresh temporary file and returns its path.
std::string write_temp(const std::string& name, const std::string& text) {
  const fs::path dir = fs::temp_directory_path() / "linearize_test_tokenizer";
  fs::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// The message of the Error thrown by loading `path` as tokenizer.json ("" when none is thrown).
std::string load_error(const std::string& path) {
  try {
    BpeTokenizer::from_tokenizer_json(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A minimal valid tokenizer.json: bytes 'a','b','c' and 'Ġ', merges "a b" and "ab c".
json tiny_tokenizer_json() {
  return json::parse(R"({
    "version": "1.0", "added_tokens": [], "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "post_processor": {"type": "TemplateProcessing", "single": [], "pair": [], "special_tokens": {}},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "dropout": null, "unk_token": null, "byte_fallback": false,
              "vocab": {"a": 0, "b": 1, "c": 2, "Ġ": 3, "ab": 4, "abc": 5},
              "merges": ["a b", ["ab", "c"]]}})");
}

// ---------------------------------------------------------------------------------------------

TEST(TokenizerGolden, EveryTokFolderMatchesReference) {
  LINEARIZE_REQUIRE_PATH(test::golden_dir());
  int folders = 0;
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(test::golden_dir()))
    if (e.is_directory() && e.path().filename().string().rfind("tok-", 0) == 0) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  for (const fs::path& dir : dirs) {
    SCOPED_TRACE(dir.string());
    std::unique_ptr<Tokenizer> tok = load_tokenizer(dir.string());
    ASSERT_EQ(tok->kind(), "bpe");
    std::ifstream f(dir / "reference.json");
    const json ref = json::parse(f);
    int matched = 0, n = 0;
    for (const auto& c : ref.at("cases")) {
      const std::string text = c.at("text");
      SCOPED_TRACE("text: " + text);
      const std::vector<int32_t> expected = ids_of(c.at("ids"));
      const std::vector<int32_t> got = tok->encode(text);
      EXPECT_EQ(got, expected);
      EXPECT_EQ(tok->decode(expected), c.at("decoded").get<std::string>());
      matched += got == expected;
      ++n;
    }
    std::printf("[ golden ] %s: %d/%d cases match\n", dir.filename().string().c_str(), matched, n);
    EXPECT_EQ(matched, n);
    EXPECT_GE(n, 20);
    ++folders;
  }
  EXPECT_GE(folders, 2) << "expected tok-smollm2 and tok-bpe4k under " << test::golden_dir();
}

TEST(TokenizerGpt2, VocabMergesMatchCases) {
  const std::string dir = test::data_dir() + "/tokenizers";
  LINEARIZE_REQUIRE_PATH(dir + "/gpt2_cases.jsonl");
  auto tok = BpeTokenizer::from_vocab_merges(dir + "/gpt2_vocab.json", dir + "/gpt2_merges.txt");
  EXPECT_EQ(tok->vocab_size(), 50257);
  EXPECT_EQ(tok->num_merges(), 50000);
  EXPECT_EQ(tok->token_to_id("<|endoftext|>"), std::optional<int32_t>(50256));
  std::ifstream f(dir + "/gpt2_cases.jsonl");
  std::string line;
  int matched = 0, n = 0, line_no = 0;
  while (std::getline(f, line)) {
    ++line_no;
    if (line.empty()) continue;
    const json c = json::parse(line);
    const std::string text = c.at("text");
    SCOPED_TRACE("gpt2_cases.jsonl:" + std::to_string(line_no) + " text: " + text);
    const std::vector<int32_t> expected = ids_of(c.at("ids"));
    const std::vector<int32_t> got = tok->encode(text);
    EXPECT_EQ(got, expected);
    EXPECT_EQ(tok->decode(expected), text);
    matched += got == expected;
    ++n;
  }
  std::printf("[ golden ] gpt2_cases.jsonl: %d/%d cases match\n", matched, n);
  EXPECT_EQ(matched, n);
  EXPECT_GE(n, 40);
}

TEST(TokenizerSmolLM2, LoadsWithSpecialTokens) {
  LINEARIZE_REQUIRE_PATH(smollm2_path());
  const BpeTokenizer& tok = smollm2();
  EXPECT_EQ(tok.vocab_size(), 49152);
  EXPECT_EQ(tok.num_merges(), 48900);
  EXPECT_EQ(tok.added_tokens().size(), 17u);
  EXPECT_EQ(tok.token_to_id("<|endoftext|>"), std::optional<int32_t>(0));
  EXPECT_EQ(tok.token_to_id("<|im_start|>"), std::optional<int32_t>(1));
  EXPECT_EQ(tok.token_to_id("<|im_end|>"), std::optional<int32_t>(2));
  EXPECT_EQ(tok.token_to_id("no such token"), std::nullopt);
  EXPECT_EQ(tok.encode("<|im_start|>"), (std::vector<int32_t>{1}));
  EXPECT_EQ(tok.encode("<|im_start|><|im_end|>"), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(tok.decode({1, 2}), "<|im_start|><|im_end|>");
}

TEST(TokenizerSmolLM2, ParseSpecialFalseTokenizesAsText) {
  LINEARIZE_REQUIRE_PATH(smollm2_path());
  const BpeTokenizer& tok = smollm2();
  const std::string text = "<|im_start|>user";
  const std::vector<int32_t> with = tok.encode(text, true);
  const std::vector<int32_t> without = tok.encode(text, false);
  ASSERT_GE(with.size(), 2u);
  EXPECT_EQ(with[0], 1);
  EXPECT_GT(without.size(), with.size());
  for (int32_t id : without) EXPECT_GT(id, 16) << "no added token may appear";
  EXPECT_EQ(tok.decode(without), text);
  // Plain text before the special token is the same either way.
  EXPECT_EQ(tok.encode("user", false), std::vector<int32_t>(with.begin() + 1, with.end()));
}

TEST(TokenizerSmolLM2, DigitsAreIsolatedBeforeByteLevel) {
  LINEARIZE_REQUIRE_PATH(smollm2_path());
  const BpeTokenizer& tok = smollm2();
  // "a 12" -> "a", "Ġ", "1", "2": the space before a digit is its own token.
  EXPECT_EQ(tok.encode("a 12"), (std::vector<int32_t>{81, 216, 33, 34}));
}

TEST(TokenizerSmolLM2, AbsentByteSymbolsAreDropped) {
  LINEARIZE_REQUIRE_PATH(smollm2_path());
  const BpeTokenizer& tok = smollm2();
  // 0x04 is one of the 21 bytes SmolLM2's restricted alphabet lacks.
  EXPECT_EQ(tok.token_to_id("\xC4\x84"), std::nullopt);  // U+0104, byte 0x04's symbol
  EXPECT_TRUE(tok.encode("\x04").empty());
  EXPECT_EQ(tok.encode("a\x04"), tok.encode("a"));
}

TEST(TokenizerSmolLM2, InvalidUtf8BecomesReplacementCharacter) {
  LINEARIZE_REQUIRE_PATH(smollm2_path());
  const BpeTokenizer& tok = smollm2();
  EXPECT_EQ(tok.encode("a\xFF b"), tok.encode("a\xEF\xBF\xBD b"));
  EXPECT_EQ(tok.encode("x\xF0\x9F\x98"), tok.encode("x\xEF\xBF\xBD"));  // truncated emoji: one U+FFFD
}

TEST(TokenizerUtf8, SanitizeReplacesMaximalSubparts) {
  EXPECT_EQ(utf8::sanitize("abc"), "abc");
  EXPECT_EQ(utf8::sanitize("a\xFF"), "a\xEF\xBF\xBD");
  EXPECT_EQ(utf8::sanitize("\xF0\x9F\x98"), "\xEF\xBF\xBD");                  // one subpart
  EXPECT_EQ(utf8::sanitize("\xE0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");          // E0 needs A0..BF
  EXPECT_EQ(utf8::sanitize("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(utf8::complete_prefix_length("ab\xF0\x9F"), 2u);
  EXPECT_EQ(utf8::complete_prefix_length("ab\xF0\x9F\x98\x80"), 6u);
  EXPECT_EQ(utf8::complete_prefix_length("ab\xFF"), 3u);  // invalid, not incomplete
}

TEST(TokenizerStream, Gpt2EmojiSplitAcrossByteTokens) {
  const std::string dir = test::data_dir() + "/tokenizers";
  LINEARIZE_REQUIRE_PATH(dir + "/gpt2_vocab.json");
  auto tok = BpeTokenizer::from_vocab_merges(dir + "/gpt2_vocab.json", dir + "/gpt2_merges.txt");
  // " this is 🦙.cpp": 🦙 (F0 9F A6 99) arrives as " \xF0\x9F" + "\xA6" + "\x99".
  const std::vector<int32_t> ids = {428, 318, 12520, 99, 247, 13, 20322};
  const std::vector<std::string> parts = stream(*tok, ids);
  const std::vector<std::string> expected = {" this", " is", " ", "", "\xF0\x9F\xA6\x99", ".", "cpp", ""};
  EXPECT_EQ(parts, expected);
  EXPECT_EQ(joined(parts), " this is \xF0\x9F\xA6\x99.cpp");
}

TEST(TokenizerStream, NeverEmitsPartialCharacters) {
  LINEARIZE_REQUIRE_PATH(smollm2_path());
  const BpeTokenizer& tok = smollm2();
  const std::string text = "emoji \xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7 and \xF0\x9F\xA4\x96!! "
                           "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xE4\xB8\xAD\xE6\x96\x87";  // 👩‍👧 🤖 日本語 中文
  const std::vector<int32_t> ids = tok.encode(text);
  const std::vector<std::string> parts = stream(tok, ids);
  int held_back = 0;
  for (const auto& p : parts) {
    EXPECT_TRUE(utf8::is_valid(p)) << "partial UTF-8 emitted";
    held_back += p.empty();
  }
  EXPECT_GE(held_back, 1) << "expected at least one character split across tokens";
  EXPECT_EQ(parts.back(), "");  // nothing left for flush
  EXPECT_EQ(joined(parts), text);
}

TEST(TokenizerStream, FlushReturnsIncompleteTail) {
  LINEARIZE_REQUIRE_PATH(smollm2_path());
  const BpeTokenizer& tok = smollm2();
  // "🤖" alone; drop its last byte token so the character never completes.
  std::vector<int32_t> ids = tok.encode("\xF0\x9F\xA4\x96");
  ASSERT_GE(ids.size(), 2u);
  ids.pop_back();
  StreamDecoder dec(tok);
  std::string pushed;
  for (int32_t id : ids) pushed += dec.push(id);
  EXPECT_EQ(pushed, "");
  const std::string rest = dec.flush();
  EXPECT_GE(rest.size(), 1u);
  EXPECT_LE(rest.size(), 3u);
  EXPECT_EQ(rest, std::string("\xF0\x9F\xA4\x96").substr(0, rest.size()));
}

TEST(TokenizerBpe, InMemoryMergesByRankThenLeftmost) {
  std::unordered_map<std::string, int32_t> vocab = {{"a", 0}, {"b", 1}, {"aa", 2}, {"ab", 3}, {"aab", 4},
                                                    {"Ġ", 5}, {"1", 6}, {"<sep>", 7}};
  std::vector<std::pair<std::string, std::string>> merges = {{"a", "b"}, {"a", "a"}, {"a", "ab"}};
  BpeTokenizer tok(vocab, merges, {AddedToken{"<sep>", 7, true}}, true);
  EXPECT_EQ(tok.vocab_size(), 8);
  EXPECT_EQ(tok.encode("aaa"), (std::vector<int32_t>{2, 0}));   // "a a" ties: leftmost first
  EXPECT_EQ(tok.encode("aab"), (std::vector<int32_t>{4}));      // "a b" (rank 0), then "a ab"
  EXPECT_EQ(tok.encode("aaab"), (std::vector<int32_t>{2, 3}));  // "ab" then "aa"; "aa ab" unknown
  EXPECT_EQ(tok.encode("a11"), (std::vector<int32_t>{0, 6, 6}));
  EXPECT_EQ(tok.encode("a<sep>b"), (std::vector<int32_t>{0, 7, 1}));
  EXPECT_EQ(tok.encode("a<sep>b", false), (std::vector<int32_t>{0, 1}));  // '<', 's', ... not in vocab
  EXPECT_EQ(tok.decode({2, 7, 5, 3}), "aa<sep> ab");
}

TEST(TokenizerBpe, AddedTokenLstripRstrip) {
  std::unordered_map<std::string, int32_t> vocab = {{"a", 0}, {"Ġ", 1}, {"Ġa", 2}};
  BpeTokenizer tok(vocab, {{"Ġ", "a"}},
                   {AddedToken{"<m>", 3, true, /*lstrip=*/true, /*rstrip=*/true}}, false);
  EXPECT_EQ(tok.encode("a <m> a"), (std::vector<int32_t>{0, 3, 0}));
  EXPECT_EQ(tok.encode(" a<m>a"), (std::vector<int32_t>{2, 3, 0}));
}

TEST(TokenizerBpe, TinyTokenizerJsonBothMergeSpellings) {
  const std::string path = write_temp("tiny.json", tiny_tokenizer_json().dump());
  auto tok = BpeTokenizer::from_tokenizer_json(path);
  EXPECT_EQ(tok->num_merges(), 2);
  EXPECT_EQ(tok->encode("abc ab"), (std::vector<int32_t>{5, 3, 4}));
  EXPECT_EQ(tok->decode({5, 3, 4}), "abc ab");
}

TEST(TokenizerBpe, MalformedTokenizerJsonNamesTheFile) {
  json no_model = tiny_tokenizer_json();
  no_model.erase("model");
  std::string path = write_temp("no_model.json", no_model.dump());
  std::string msg = load_error(path);
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"model\""), std::string::npos) << msg;

  json empty_merges = tiny_tokenizer_json();
  empty_merges["model"]["merges"] = json::array();
  path = write_temp("empty_merges.json", empty_merges.dump());
  msg = load_error(path);
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("0 merges"), std::string::npos) << msg;

  json nfkc = tiny_tokenizer_json();  // NFC is read; other normalizers are refused by name
  nfkc["normalizer"] = {{"type", "NFKC"}};
  path = write_temp("normalizer.json", nfkc.dump());
  msg = load_error(path);
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("normalizer"), std::string::npos) << msg;
  EXPECT_NE(msg.find("NFKC"), std::string::npos) << msg;

  json fallback = tiny_tokenizer_json();
  fallback["model"]["byte_fallback"] = true;
  path = write_temp("byte_fallback.json", fallback.dump());
  msg = load_error(path);
  EXPECT_NE(msg.find("byte_fallback"), std::string::npos) << msg;

  json metaspace = tiny_tokenizer_json();
  metaspace["pre_tokenizer"] = {{"type", "Metaspace"}};
  path = write_temp("metaspace.json", metaspace.dump());
  msg = load_error(path);
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("Metaspace"), std::string::npos) << msg;

  json bad_merge = tiny_tokenizer_json();
  bad_merge["model"]["merges"] = {"a x"};
  path = write_temp("bad_merge.json", bad_merge.dump());
  msg = load_error(path);
  EXPECT_NE(msg.find("\"x\""), std::string::npos) << msg;

  path = write_temp("not_json.json", "{ this is not json");
  msg = load_error(path);
  EXPECT_NE(msg.find(path), std::string::npos) << msg;

  EXPECT_THROW(load_tokenizer("/nonexistent/tokenizer.json"), Error);
}

TEST(TokenizerSentencePiece, Stories260K) {
  LINEARIZE_REQUIRE_SENTENCEPIECE();
  LINEARIZE_REQUIRE_PATH(stories_model_path());
  SentencePieceTokenizer tok(stories_model_path());
  EXPECT_EQ(tok.kind(), "sentencepiece");
  EXPECT_EQ(tok.vocab_size(), 512);
  EXPECT_EQ(tok.token_to_id("<unk>"), std::optional<int32_t>(0));
  EXPECT_EQ(tok.token_to_id("<s>"), std::optional<int32_t>(1));
  EXPECT_EQ(tok.token_to_id("</s>"), std::optional<int32_t>(2));
  EXPECT_EQ(tok.token_to_id("no such piece"), std::nullopt);

  const std::string text = "Once upon a time, there was a little girl named Lily.";
  const std::vector<int32_t> ids = tok.encode(text);
  // ▁Once ▁upon ▁a ▁time , ▁there ▁was ▁a ▁little ▁g ir l ▁named ▁Lily .
  EXPECT_EQ(ids, (std::vector<int32_t>{403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426}));
  // golden.json's sentence is 35 tokens with BOS (llama2.c's count).
  EXPECT_EQ(tok.encode("One day, a clever fox found a shiny key under the old oak tree.").size(), 34u);
  EXPECT_EQ(tok.decode(ids), text);
  // Streaming (leading space dropped on the first piece) gives the same text.
  EXPECT_EQ(joined(stream(tok, ids)), text);
  std::vector<int32_t> with_bos = ids;
  with_bos.insert(with_bos.begin(), 1);
  EXPECT_EQ(tok.decode(with_bos), text);
  EXPECT_EQ(joined(stream(tok, with_bos)), text);

  EXPECT_EQ(tok.token_bytes(1, 0), "");
  EXPECT_EQ(tok.token_bytes(2, 5), "");
  EXPECT_EQ(tok.token_bytes(ids[0], 0), "Once");
  EXPECT_EQ(tok.token_bytes(ids[0], 1).substr(0, 2), " O");
  // Byte pieces: <0x0A> is '\n'.
  const std::optional<int32_t> newline = tok.token_to_id("<0x0A>");
  ASSERT_TRUE(newline.has_value());
  EXPECT_EQ(tok.token_bytes(*newline, 3), "\n");
  // parse_special: "<s>" in text is BOS; otherwise it is text.
  const std::vector<int32_t> special = tok.encode("<s>Once", true);
  EXPECT_EQ(special[0], 1);
  EXPECT_NE(tok.encode("<s>Once", false)[0], 1);
  EXPECT_THROW(tok.token_bytes(512, 0), Error);
  // remove_extra_whitespaces (the model's default) and byte fallback for characters not in the vocab.
  const std::vector<int32_t> cjk = tok.encode("  two  spaces \xE6\x97\xA5");  // 日
  EXPECT_EQ(cjk, (std::vector<int32_t>{259, 424, 414, 262, 427, 412, 331, 419, 410, 233, 154, 168}));
  EXPECT_EQ(tok.decode(cjk), "two spaces \xE6\x97\xA5");
  EXPECT_EQ(joined(stream(tok, cjk)), "two spaces \xE6\x97\xA5");
}

TEST(TokenizerLoad, PicksImplementationFromFolder) {
  LINEARIZE_REQUIRE_SENTENCEPIECE();
  LINEARIZE_REQUIRE_PATH(stories_model_path());
  LINEARIZE_REQUIRE_PATH(test::golden_dir() + "/tok-smollm2");
  EXPECT_EQ(load_tokenizer(test::data_dir() + "/models/stories260K")->kind(), "sentencepiece");
  EXPECT_EQ(load_tokenizer(stories_model_path())->kind(), "sentencepiece");
  auto bpe = load_tokenizer(test::golden_dir() + "/tok-smollm2");
  EXPECT_EQ(bpe->kind(), "bpe");
  EXPECT_EQ(bpe->source(), test::golden_dir() + "/tok-smollm2/tokenizer.json");
  try {
    load_tokenizer(test::shared_dir() + "/spec");
    FAIL() << "expected an Error for a folder without tokenizer files";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace linearize

namespace linearize {

// Qwen's form of tokenizer.json: an NFC normalizer and a Split pre-tokenizer with the file's own regex
// (single digits, contractions case-insensitive) before a ByteLevel step without its GPT-2 regex.
TEST(BpeTokenizer, NfcNormalizerAndTheFilesSplitRegex) {
  using json = nlohmann::json;
  const std::string dir = test::fresh_dir("tokenizer", "qwen_form");
  std::vector<std::string> vocab = {"<|endoftext|>"};
  for (int b = 0; b < 256; ++b) vocab.push_back(byte_level_encode(std::string(1, static_cast<char>(b))));
  vocab.push_back("12");
  const std::string smollm_form = dir + "/smollm.json";
  write_tokenizer_json(smollm_form, vocab, {{"1", "2"}}, {{"<|endoftext|>", 0, true, false, false, false}}, false);
  json j = json::parse(std::ifstream(smollm_form));
  j["normalizer"] = {{"type", "NFC"}};
  j["pre_tokenizer"] = json::parse(R"({"type": "Sequence", "pretokenizers": [
      {"type": "Split", "behavior": "Isolated", "invert": false, "pattern": {"Regex":
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
      {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]})");
  const std::string qwen_form = dir + "/qwen.json";
  std::ofstream(qwen_form) << j.dump();
  auto qwen = BpeTokenizer::from_tokenizer_json(qwen_form);
  auto smollm = BpeTokenizer::from_tokenizer_json(smollm_form);
  const std::string decomposed = "caf" "e\xCC\x81", composed = "caf\xC3\xA9";  // e + U+0301 / U+00E9
  EXPECT_EQ(qwen->encode(decomposed), qwen->encode(composed));
  EXPECT_EQ(qwen->decode(qwen->encode(decomposed)), composed);
  EXPECT_NE(smollm->encode(decomposed), smollm->encode(composed));  // no normalizer: the bytes as given
  EXPECT_EQ(utf8::nfc(decomposed), composed);
  // GPT-2's regex keeps "12" one piece (merged to one token); Qwen's splits digits one by one.
  EXPECT_EQ(smollm->encode("12").size(), 1u);
  EXPECT_EQ(qwen->encode("12").size(), 2u);
  EXPECT_EQ(qwen->decode(qwen->encode("We'LL pay 12 now.\n\n  ok")), "We'LL pay 12 now.\n\n  ok");
  // Other normalizers are refused by name.
  j["normalizer"] = {{"type", "Lowercase"}};
  std::ofstream(qwen_form) << j.dump();
  try {
    BpeTokenizer::from_tokenizer_json(qwen_form);
    ADD_FAILURE() << "a Lowercase normalizer was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Lowercase"), std::string::npos) << e.what();
  }
}

// Qwen's form of tokenizer.json on SmolLM2's vocabulary and merges, made the way
// tests/golden/make_tokenizer_golden.py makes it, against Hugging Face tokenizers' ids for the same file
// (tests/golden/qwen-form-tokenizer/cases.jsonl): NFC, Qwen's Split regex, ByteLevel, special tokens.
TEST(BpeTokenizer, QwenFormMatchesHuggingFaceTokenizers) {
  using json = nlohmann::json;
  const std::string cases = test::source_dir() + "/tests/golden/qwen-form-tokenizer/cases.jsonl";
  LINEARIZE_REQUIRE_PATH(smollm2_path());
  ASSERT_TRUE(std::filesystem::exists(cases)) << cases;
  json j = json::parse(std::ifstream(smollm2_path()));
  j["normalizer"] = {{"type", "NFC"}};
  j["pre_tokenizer"] = json::parse(R"({"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex":
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
       "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]})");
  j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  j["post_processor"] = nullptr;
  const std::string file = test::fresh_dir("tokenizer", "qwen_form_hf") + "/tokenizer.json";
  std::ofstream(file) << j.dump();
  auto tok = BpeTokenizer::from_tokenizer_json(file);
  std::ifstream f(cases);
  int matched = 0, n = 0, line_no = 0;
  for (std::string line; std::getline(f, line);) {
    ++line_no;
    if (line.empty()) continue;
    const json c = json::parse(line);
    const std::string text = c.at("text");
    SCOPED_TRACE("cases.jsonl:" + std::to_string(line_no) + " text: " + text);
    const std::vector<int32_t> expected = ids_of(c.at("ids")), got = tok->encode(text);
    EXPECT_EQ(got, expected);
    EXPECT_EQ(tok->decode(expected), utf8::nfc(text));  // the normalizer composes; decoding gives that back
    matched += got == expected;
    ++n;
  }
  std::printf("[ golden ] qwen-form-tokenizer/cases.jsonl: %d/%d cases match\n", matched, n);
  EXPECT_EQ(matched, n);
  EXPECT_GE(n, 30);
}

}  // namespace linearize
