// The byte-level BPE trainer (src/io/bpe_trainer.h): hand-checked merge order on a tiny corpus, the
// incremental pair counts against a brute-force recount, agreement with the Hugging Face-trained
// golden tok-bpe4k, loading/round-tripping of the written tokenizer, determinism, errors and the CLI.
// Not tested here: loading the output with the Python `tokenizers` package (not installed on the
// build machine); the layout is compared field by field with the golden file instead.
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "io/bpe_trainer.h"
#include "io/error.h"
#include "io/tokenizer.h"
#include "io/tokenizer_bpe.h"
#include "test_util.h"

namespace fs = std::filesystem;
using linearize::BpeTrainOptions;
using linearize::TrainedBpe;
using Merges = std::vector<std::pair<std::string, std::string>>;

namespace {

std::string tmp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("linearize_bpetrain_" + std::to_string(::getpid())) / name;
  fs::create_directories(d);
  return d.string();
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void spit(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

std::vector<std::string> austen_files() {
  std::vector<std::string> out;
  for (const auto& f : linearize::test::files_in(linearize::test::data_dir() + "/corpus", ".txt"))
    if (fs::path(f).filename().string().rfind("austen_", 0) == 0) out.push_back(f);
  return out;
}

// The 4k Austen training, done once for the tests that need it.
const TrainedBpe& austen4k(double* seconds = nullptr) {
  static double secs = 0;
  static const TrainedBpe bpe = [] {
    BpeTrainOptions o;
    o.vocab_size = 4096;
    auto t0 = std::chrono::steady_clock::now();
    TrainedBpe b = linearize::train_bpe(austen_files(), o);
    secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return b;
  }();
  if (seconds) *seconds = secs;
  return bpe;
}

// Brute force: recount every pair of every word after each merge; ties to the smallest id pair.
Merges brute_force_merges(const std::vector<std::string>& texts, int64_t vocab_size, int64_t min_frequency) {
  std::map<std::string, int64_t> counts;
  for (const auto& t : texts)
    for (const auto& p : linearize::pretokenize_smollm2(t)) ++counts[p];
  std::map<std::string, int32_t> id_of;
  std::vector<std::string> vocab = linearize::bpe_trainer_special_tokens();
  std::vector<std::string> syms;
  for (int b = 0; b < 256; ++b) syms.push_back(linearize::byte_level_symbol(static_cast<uint8_t>(b)));
  std::sort(syms.begin(), syms.end());
  for (const auto& s : syms) vocab.push_back(s);
  for (size_t i = 0; i < vocab.size(); ++i) id_of[vocab[i]] = static_cast<int32_t>(i);
  std::vector<std::pair<std::vector<int32_t>, int64_t>> words;
  for (const auto& [w, c] : counts) {
    std::vector<int32_t> ids;
    for (unsigned char ch : w) ids.push_back(id_of[linearize::byte_level_symbol(ch)]);
    words.emplace_back(ids, c);
  }
  Merges merges;
  while (static_cast<int64_t>(vocab.size()) < vocab_size) {
    std::map<std::pair<int32_t, int32_t>, int64_t> pc;
    for (const auto& [ids, c] : words)
      for (size_t i = 0; i + 1 < ids.size(); ++i) pc[{ids[i], ids[i + 1]}] += c;
    std::pair<int32_t, int32_t> best{-1, -1};
    int64_t best_count = 0;
    for (const auto& [p, c] : pc)  // map order = ascending ids, so '>' keeps the smallest on ties
      if (c > best_count) best = p, best_count = c;
    if (best_count == 0 || best_count < min_frequency) break;
    const std::string merged = vocab[best.first] + vocab[best.second];
    merges.emplace_back(vocab[best.first], vocab[best.second]);
    if (!id_of.count(merged)) {
      id_of[merged] = static_cast<int32_t>(vocab.size());
      vocab.push_back(merged);
    }
    const int32_t n = id_of[merged];
    for (auto& [ids, c] : words) {
      std::vector<int32_t> out;
      for (size_t i = 0; i < ids.size();) {
        if (i + 1 < ids.size() && ids[i] == best.first && ids[i + 1] == best.second) out.push_back(n), i += 2;
        else out.push_back(ids[i++]);
      }
      ids = out;
    }
  }
  return merges;
}

struct Run {
  int code;
  std::string out;
};

Run run_cli(const std::string& args) {
  const std::string cmd = std::string(LINEARIZE_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  int status = pclose(p);
  return {WEXITSTATUS(status), out};
}

}  // namespace

// (1) Merge order worked out by hand. Words: "aaab", "Ġaab", "Ġab" (one each).
//   pairs: (a,a) 3, (a,b) 3, (Ġ,a) 2 -> tie, (a,a) has the smaller ids -> "aa"
//   then (a,b) 2 (in "aaab" -> [aa,ab] and "Ġab") -> "ab"; every other pair now occurs once.
// With min_frequency 1 the count-1 pairs go by id: Ġ (223) < aa (259) < ab (260) < Ġaa (261), so
// (Ġ,aa), (Ġ,ab), (aa,ab), then (Ġaa,b) — an order that a string tie-break ("aa" < "Ġ") would not give.
TEST(BpeTrainer, HandMadeCorpusMergeOrder) {
  BpeTrainOptions o;
  o.vocab_size = 1000;
  TrainedBpe b = linearize::train_bpe_texts({"aaab aab ab"}, o);
  EXPECT_EQ(b.merges, (Merges{{"a", "a"}, {"a", "b"}}));
  EXPECT_EQ(b.vocab.size(), 261u);
  EXPECT_EQ(b.vocab[259], "aa");
  EXPECT_EQ(b.vocab[260], "ab");

  o.min_frequency = 1;
  b = linearize::train_bpe_texts({"aaab aab ab"}, o);
  EXPECT_EQ(b.merges, (Merges{{"a", "a"}, {"a", "b"}, {"Ġ", "aa"}, {"Ġ", "ab"}, {"aa", "ab"}, {"Ġaa", "b"}}));

  o.vocab_size = 260;  // the vocabulary size caps the merges
  b = linearize::train_bpe_texts({"aaab aab ab"}, o);
  EXPECT_EQ(b.merges, (Merges{{"a", "a"}}));
}

// Runs of one symbol merge left to right without overlap ("aaaaa" -> aa aa a), and word frequencies
// weight the pair counts.
TEST(BpeTrainer, RunsAndFrequencies) {
  BpeTrainOptions o;
  o.vocab_size = 262;
  // words: "aaaaa" x1 -> (a,a) 4; "Ġxy" x3 -> (Ġ,x) 3, (x,y) 3
  TrainedBpe b = linearize::train_bpe_texts({"aaaaa xy xy xy"}, o);
  ASSERT_EQ(b.merges.size(), 3u);
  EXPECT_EQ(b.merges[0], (std::pair<std::string, std::string>{"a", "a"}));
  // after "aa": aaaaa = [aa, aa, a] -> (aa,aa) 1, (aa,a) 1; (Ġ,x) 3 and (x,y) 3 tie: x (id 90) < Ġ (223)
  EXPECT_EQ(b.merges[1], (std::pair<std::string, std::string>{"x", "y"}));
  EXPECT_EQ(b.merges[2], (std::pair<std::string, std::string>{"Ġ", "xy"}));
}

// The incremental bookkeeping against a brute-force recount on random small-alphabet text (many
// ties, long runs, repeated strings that two different pairs can build).
TEST(BpeTrainer, MatchesBruteForceOnRandomText) {
  std::mt19937 rng(1234);
  const std::string alphabet = "aab b  c1\n";
  for (int trial = 0; trial < 4; ++trial) {
    std::vector<std::string> texts;
    for (int t = 0; t < 20; ++t) {
      std::string s;
      const int len = 20 + static_cast<int>(rng() % 60);
      for (int i = 0; i < len; ++i) s += alphabet[rng() % alphabet.size()];
      texts.push_back(s);
    }
    for (int64_t min_freq : {1, 2, 3}) {
      BpeTrainOptions o;
      o.vocab_size = 330;
      o.min_frequency = min_freq;
      Merges expect = brute_force_merges(texts, o.vocab_size, min_freq);
      if (expect.empty()) continue;
      TrainedBpe b = linearize::train_bpe_texts(texts, o);
      EXPECT_EQ(b.merges, expect) << "trial " << trial << " min_frequency " << min_freq;
    }
  }
}

// (2) Against the golden 4k BPE that Hugging Face tokenizers 0.23 trained on the same Austen files.
TEST(BpeTrainerGolden, AustenMatchesHuggingFaceMerges) {
  const std::string golden = linearize::test::golden_dir() + "/tok-bpe4k/tokenizer.json";
  LINEARIZE_REQUIRE_PATH(golden);
  LINEARIZE_REQUIRE_PATH(linearize::test::data_dir() + "/corpus/austen_emma.txt");
  ASSERT_EQ(austen_files().size(), 6u);
  double secs = 0;
  const TrainedBpe& b = austen4k(&secs);
  const auto j = nlohmann::json::parse(slurp(golden));
  Merges ref;
  for (const auto& m : j["model"]["merges"]) ref.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
  std::cout << "[ info ] 4k Austen training: " << secs << " s, " << b.bytes_read << " bytes, "
            << b.words_distinct << " distinct words, " << b.merges.size() << " merges\n";

  size_t first200 = 0, prefix = 0;
  for (size_t i = 0; i < 200 && i < ref.size() && i < b.merges.size(); ++i) first200 += b.merges[i] == ref[i];
  while (prefix < ref.size() && prefix < b.merges.size() && b.merges[prefix] == ref[prefix]) ++prefix;
  std::set<std::pair<std::string, std::string>> ours(b.merges.begin(), b.merges.end());
  size_t common = 0;
  for (const auto& m : ref) common += ours.count(m);
  std::cout << "[ info ] golden merges: first 200 agree " << first200 << "/200, identical prefix " << prefix
            << "/" << ref.size() << ", same merge set " << common << "/" << ref.size() << "\n";
  // Same pre-tokenisation (each line on its own, as HF's train(files) reads files), same ids (bytes
  // sorted by their character) and the same tie-break (smallest id pair): the merges are identical.
  // Had we pre-tokenised whole files instead, "\n\n" runs would have produced ĊĊ merges HF never saw.
  EXPECT_EQ(first200, 200u);
  EXPECT_EQ(b.merges.size(), ref.size());
  EXPECT_EQ(prefix, ref.size());

  // Vocabulary: same ids for every token.
  size_t same_ids = 0;
  for (auto it = j["model"]["vocab"].begin(); it != j["model"]["vocab"].end(); ++it) {
    const int64_t id = it.value().get<int64_t>();
    same_ids += id < static_cast<int64_t>(b.vocab.size()) && b.vocab[id] == it.key();
  }
  EXPECT_EQ(same_ids, j["model"]["vocab"].size());

  // Token counts on the golden reference texts.
  const std::string dir = tmp_dir("austen4k");
  b.save(dir);
  // The whole file, parsed, equals the one Hugging Face wrote (only whitespace may differ).
  EXPECT_TRUE(nlohmann::json::parse(slurp(dir + "/tokenizer.json")) == j) << "tokenizer.json differs from golden";
  auto ours_tok = linearize::load_tokenizer(dir);
  auto ref_tok = linearize::load_tokenizer(golden);
  const auto cases = nlohmann::json::parse(slurp(linearize::test::golden_dir() + "/tok-bpe4k/reference.json"))["cases"];
  size_t n_ours = 0, n_ref = 0;
  for (const auto& c : cases) {
    const std::string text = c["text"].get<std::string>();
    n_ours += ours_tok->encode(text).size();
    n_ref += c["ids"].size();
    EXPECT_EQ(ref_tok->encode(text), c["ids"].get<std::vector<int32_t>>()) << text;
  }
  std::cout << "[ info ] reference.json tokens: ours " << n_ours << ", golden " << n_ref << "\n";
  EXPECT_LE(std::abs(static_cast<double>(n_ours) - static_cast<double>(n_ref)), 0.03 * static_cast<double>(n_ref));
}

// (3) The written folder loads with load_tokenizer, has the golden layout, and round-trips text.
TEST(BpeTrainer, WrittenTokenizerLoadsAndRoundTrips) {
  BpeTrainOptions o;
  o.vocab_size = 400;
  const std::string corpus =
      "The year 1984 had 12,345.67 dollars! She said: \"Well, well...\"\n\tTabs and  spaces.\n"
      "Emoji 🤖 and café; naïve déjà vu. The the the year year 2026.\n";
  std::vector<std::string> texts(5, corpus);
  TrainedBpe b = linearize::train_bpe_texts(texts, o);
  ASSERT_FALSE(b.merges.empty());
  const std::string dir = tmp_dir("roundtrip");
  b.save(dir);
  ASSERT_TRUE(fs::exists(dir + "/tokenizer.json"));
  ASSERT_TRUE(fs::exists(dir + "/tokenizer_config.json"));

  auto tok = linearize::load_tokenizer(dir);
  EXPECT_EQ(tok->kind(), "bpe");
  EXPECT_EQ(tok->vocab_size(), static_cast<int64_t>(b.vocab.size()));
  EXPECT_EQ(tok->token_to_id("<|endoftext|>"), 0);
  EXPECT_EQ(tok->token_to_id("<|im_start|>"), 1);
  EXPECT_EQ(tok->token_to_id("<|im_end|>"), 2);
  EXPECT_EQ(tok->encode("<|im_start|>user\nhi<|im_end|><|endoftext|>").front(), 1);
  for (const std::string& text :
       {std::string("Digits 1234567890 and 3.14159"), std::string("emoji 👩‍👩‍👧‍👦 and 🤖!!"),
        std::string("lines\n\n\nwith\r\n  indents\tand tabs  "), std::string("日本語のテキスト ünïcödé"),
        corpus}) {
    auto ids = tok->encode(text, false);
    EXPECT_EQ(tok->decode(ids), text);
  }
  // Digits are isolated: no merged token contains two digits.
  for (size_t i = 259; i < b.vocab.size(); ++i) {
    int digits = 0;
    for (char c : b.vocab[i]) digits += c >= '0' && c <= '9';
    EXPECT_LE(digits, 1) << b.vocab[i];
  }
  // Merged tokens encode the training text into fewer ids than bytes.
  EXPECT_LT(tok->encode(corpus).size(), corpus.size() * 3 / 4);

  const auto j = nlohmann::json::parse(slurp(dir + "/tokenizer.json"));
  const std::string golden = linearize::test::golden_dir() + "/tok-bpe4k/tokenizer.json";
  if (fs::exists(golden)) {  // same layout as the Hugging Face-written file, apart from the model
    auto g = nlohmann::json::parse(slurp(golden));
    for (const char* key : {"added_tokens", "normalizer", "pre_tokenizer", "post_processor", "decoder"})
      EXPECT_EQ(j[key], g[key]) << key;
    for (const char* key : {"type", "dropout", "unk_token", "byte_fallback", "ignore_merges"})
      EXPECT_EQ(j["model"][key], g["model"][key]) << key;
    for (int64_t id = 0; id < 259; ++id) EXPECT_EQ(g["model"]["vocab"][b.vocab[id]], id) << b.vocab[id];
  }
  const auto cfg = nlohmann::json::parse(slurp(dir + "/tokenizer_config.json"));
  EXPECT_EQ(cfg["bos_token"], "<|endoftext|>");
  EXPECT_EQ(cfg["eos_token"], "<|endoftext|>");
  EXPECT_EQ(cfg["pad_token"], "<|endoftext|>");
  EXPECT_EQ(cfg["added_tokens_decoder"]["2"]["content"], "<|im_end|>");
}

// (4) Two trainings of the same input write byte-identical files.
TEST(BpeTrainer, DeterministicOutput) {
  LINEARIZE_REQUIRE_PATH(linearize::test::data_dir() + "/corpus/austen_emma.txt");
  BpeTrainOptions o;
  o.vocab_size = 1024;
  o.max_bytes = 600000;
  const std::vector<std::string> files = {linearize::test::data_dir() + "/corpus/austen_persuasion.txt",
                                          linearize::test::data_dir() + "/corpus/austen_emma.txt"};
  TrainedBpe a = linearize::train_bpe(files, o);
  TrainedBpe b = linearize::train_bpe(files, o);
  EXPECT_EQ(a.bytes_read, 600000);
  const std::string da = tmp_dir("det_a"), db = tmp_dir("det_b");
  a.save(da);
  b.save(db);
  EXPECT_EQ(slurp(da + "/tokenizer.json"), slurp(db + "/tokenizer.json"));
  EXPECT_EQ(slurp(da + "/tokenizer_config.json"), slurp(db + "/tokenizer_config.json"));
  EXPECT_EQ(a.merges.size(), 1024u - 259u);
}

// jsonl input: one text per line from --field; the same texts as .txt lines give the same merges.
TEST(BpeTrainer, JsonlInput) {
  const std::string dir = tmp_dir("jsonl");
  std::vector<std::string> lines = {"the cat sat on the mat", "the dog sat on the log", "a cat and a dog"};
  std::string jsonl, txt;
  for (const auto& l : lines) {
    jsonl += nlohmann::json({{"text", l}, {"id", 1}}).dump() + "\n\n";
    txt += l + "\n";
  }
  spit(dir + "/a.jsonl", jsonl);
  BpeTrainOptions o;
  o.vocab_size = 300;
  TrainedBpe from_jsonl = linearize::train_bpe({dir + "/a.jsonl"}, o);
  TrainedBpe from_texts = linearize::train_bpe_texts(lines, o);
  EXPECT_EQ(from_jsonl.merges, from_texts.merges);
  EXPECT_EQ(from_jsonl.merges.front(), (std::pair<std::string, std::string>{"a", "t"}));  // cat sat mat
  o.jsonl_field = "body";
  try {
    linearize::train_bpe({dir + "/a.jsonl"}, o);
    FAIL() << "expected an error";
  } catch (const linearize::Error& e) {
    EXPECT_NE(std::string(e.what()).find("a.jsonl:1: missing string field \"body\""), std::string::npos) << e.what();
  }
}

// (5) Errors say what and where.
TEST(BpeTrainer, Errors) {
  const std::string dir = tmp_dir("errors");
  auto message = [](const std::function<void()>& fn) -> std::string {
    try {
      fn();
    } catch (const linearize::Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  BpeTrainOptions o;
  o.vocab_size = 300;
  EXPECT_NE(message([&] { linearize::train_bpe({}, o); }).find("at least one input file"), std::string::npos);
  EXPECT_NE(message([&] { linearize::train_bpe({dir + "/missing.txt"}, o); }).find(dir + "/missing.txt"),
            std::string::npos);
  EXPECT_NE(message([&] { linearize::train_bpe({dir}, o); }).find("folder"), std::string::npos);
  spit(dir + "/ok.txt", "hello hello hello world world world\n");
  spit(dir + "/bad.jsonl", "{\"text\": \"fine\"}\n{\"text\": \"broken\n");
  std::string m = message([&] { linearize::train_bpe({dir + "/ok.txt", dir + "/bad.jsonl"}, o); });
  EXPECT_NE(m.find("bad.jsonl:2:"), std::string::npos) << m;
  BpeTrainOptions small = o;
  small.vocab_size = 258;
  m = message([&] { linearize::train_bpe({dir + "/ok.txt"}, small); });
  EXPECT_NE(m.find("at least 259"), std::string::npos) << m;
  EXPECT_NE(m.find("258"), std::string::npos) << m;
  spit(dir + "/one.txt", "abc\n");
  m = message([&] { linearize::train_bpe({dir + "/one.txt"}, o); });
  EXPECT_NE(m.find("nothing to merge"), std::string::npos) << m;
  // The trained tokenizer is usable even with a tiny file (min frequency 1).
  o.min_frequency = 1;
  // pre-tokens "abc" and "Ċ": (a,b) and (b,c) tie -> "ab" (smaller ids), then "abc"
  EXPECT_EQ(linearize::train_bpe({dir + "/one.txt"}, o).merges,
            (Merges{{"a", "b"}, {"ab", "c"}}));
}

// The command: help lists the subcommand, a training writes the folder, bad input is one error line.
TEST(BpeTrainerCli, TrainCommand) {
  auto r = run_cli("tokenizer --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("train"), std::string::npos) << r.out;
  r = run_cli("tokenizer train --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("--min-frequency K"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--max-bytes N"), std::string::npos) << r.out;
  r = run_cli("--help");
  EXPECT_NE(r.out.find("tokenizer"), std::string::npos) << r.out;

  const std::string dir = tmp_dir("cli");
  spit(dir + "/a.txt", "low lower lowest newer newest wider widest\nlow low low newer newer\n");
  r = run_cli("tokenizer train --input " + dir + "/a.txt --vocab 280 --out " + dir + "/tok");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("merges"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(dir + "/tok/tokenizer.json"));
  auto tok = linearize::load_tokenizer(dir + "/tok");
  EXPECT_EQ(tok->decode(tok->encode("lowest newer")), "lowest newer");

  r = run_cli("tokenizer train --input " + dir + "/nope.txt --vocab 280 --out " + dir + "/tok2");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_NE(r.out.find("nope.txt"), std::string::npos) << r.out;
  r = run_cli("tokenizer train --input " + dir + "/a.txt --vocab 100 --out " + dir + "/tok3");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("--vocab must be at least 260, got 100"), std::string::npos) << r.out;
  r = run_cli("tokenizer frobnicate");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("unknown subcommand"), std::string::npos) << r.out;
}

// Without isolate_digits, digit runs are pre-tokens of their own and merge like words: the written
// tokenizer has no Digits pre-tokenizer, merges digit pairs, and still round-trips.
TEST(BpeTrainer, DigitRunsMergeWithoutIsolation) {
  BpeTrainOptions o;
  o.vocab_size = 600;
  o.isolate_digits = false;
  std::mt19937_64 rng(3);
  std::vector<std::string> texts;
  for (int i = 0; i < 400; ++i) texts.push_back("the code is " + std::to_string(1000000 + rng() % 9000000) + ".");
  TrainedBpe b = linearize::train_bpe_texts(texts, o);
  EXPECT_FALSE(b.isolate_digits);
  const std::string dir = tmp_dir("digit_runs");
  b.save(dir);
  const auto j = nlohmann::json::parse(slurp(dir + "/tokenizer.json"));
  EXPECT_EQ(j["pre_tokenizer"]["type"], "ByteLevel") << j["pre_tokenizer"].dump();
  int multi_digit = 0;
  for (size_t i = 259; i < b.vocab.size(); ++i) {
    int digits = 0;
    for (char c : b.vocab[i]) digits += c >= '0' && c <= '9';
    multi_digit += digits >= 2;
  }
  EXPECT_GT(multi_digit, 50);
  auto tok = linearize::load_tokenizer(dir);
  const std::string text = "the code is 4817263.";
  EXPECT_EQ(tok->decode(tok->encode(text, false)), text);
  EXPECT_LT(tok->encode(" 4817263", false).size(), 6u);  // fewer ids than the 8 bytes
}

// The Digits pre-tokenizer isolates every Unicode number (general categories Nd, Nl and No), as Hugging
// Face's does (Rust's char::is_numeric): "½", "²" and Arabic-Indic "٣" are split from the space before
// them like ASCII digits. The training text puts a space before several non-numbers that share the lead
// byte of those numerals (0xC2: © § ® ¬; 0xD9: ـ ف), so the first merges join the space to that byte;
// applied to " ½" they would join the space to the numeral, so the encodings show where the cut is.
TEST(BpeTrainer, DigitsIsolateNonAsciiNumerals) {
  BpeTrainOptions o;
  o.vocab_size = 262;
  o.isolate_digits = true;
  std::vector<std::string> texts(
      200, "a \xC2\xA9 b \xC2\xA7 c \xC2\xAE d \xC2\xAC e \xD9\x80 f \xD9\x81 g \xD9\x80 h \xD9\x81");
  TrainedBpe b = linearize::train_bpe_texts(texts, o);
  const std::string dir = tmp_dir("unicode_digits");
  b.save(dir);
  auto tok = linearize::load_tokenizer(dir);
  const int32_t space = *tok->token_to_id("\xC4\xA0");  // "Ġ"
  ASSERT_TRUE(tok->token_to_id("\xC4\xA0\xC3\x82").has_value()) << "expected the merge of the space and 0xC2";
  ASSERT_TRUE(tok->token_to_id("\xC4\xA0\xC3\x99").has_value()) << "expected the merge of the space and 0xD9";
  for (const std::string other : {"\xC2\xA9", "\xD9\x80"})  // © and ـ are not numbers: the space joins them
    EXPECT_NE(tok->encode(" " + other, false).front(), space) << other;
  for (const std::string numeral : {"\xC2\xBD", "\xC2\xB2", "\xD9\xA3"}) {  // ½ (No), ² (No), ٣ (Nd)
    const auto ids = tok->encode(" " + numeral, false);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids.front(), space) << "the space stays alone before " << numeral;
    EXPECT_EQ(tok->decode(ids), " " + numeral);
  }
}
