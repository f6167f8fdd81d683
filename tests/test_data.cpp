// The data layer (src/data): synthetic retrieval episodes in RULER's NIAH form, whose answers must be
// the values of the needles their questions name; streamed, sharded tokenization against the in-memory
// path; memory-mapped datasets and their errors; the window order.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include <zlib.h>
#include <zstd.h>

#include <filesystem>
#include <fstream>
#include <cmath>
#include <functional>

#include "data/niah_text.h"
#include "data/retrieval_episodes.h"
#include "data/synthetic_text.h"
#include "data/token_dataset.h"
#include "data/tokenize_stream.h"
#include "io/atomic_file.h"
#include "io/error.h"
#include "io/token_shards.h"
#include "io/tokenizer.h"
#include "test_util.h"
#include "train/data_loader.h"
#include "train/training_data.h"

using namespace linearize;
namespace fs = std::filesystem;

namespace {

// Episode options with the training text's key words.
RetrievalEpisodeOptions training_episode_options() {
  RetrievalEpisodeOptions o;
  o.key_adjectives = training_key_adjectives();
  o.key_nouns = training_key_nouns();
  return o;
}

// The lines of an episode's context (between its first line and its first question) that are not needles.
std::vector<std::string> filler_lines(const std::string& text) {
  static const std::regex needle("One of the special magic (numbers|uuids) for [a-z]+-[a-z]+ is: [0-9a-f-]+\\.");
  const size_t head = text.find('\n') + 1, tail = text.find("\nWhat is the special magic");
  std::vector<std::string> lines;
  std::stringstream ctx(text.substr(head, tail - head));
  for (std::string l; std::getline(ctx, l);)
    if (!std::regex_match(l, needle)) lines.push_back(l);
  return lines;
}

}  // namespace

TEST(RetrievalEpisodes, AnswersAreTheNamedNeedlesValues) {
  RetrievalEpisodeOptions o = training_episode_options();
  o.max_needles = 4;
  o.max_questions = 3;
  o.uuid_fraction = 0.3;
  std::mt19937_64 rng(11), again(11);
  const std::regex needle_re("One of the special magic (numbers|uuids) for ([a-z]+-[a-z]+) is: ([0-9a-f-]+)\\.");
  const std::regex answer_re("What is the special magic (number|uuid) for ([a-z]+-[a-z]+) mentioned in the provided "
                             "text\\? The special magic (number|uuid) for ([a-z]+-[a-z]+) mentioned in the provided "
                             "text is ([0-9a-f-]+)\\.");
  std::set<std::string> layouts;
  int questions = 0, distractors = 0;
  for (int e = 0; e < 200; ++e) {
    const std::string text = retrieval_episode(rng, english_like_sentence, o);
    ASSERT_EQ(text, retrieval_episode(again, english_like_sentence, o)) << "not deterministic";
    ASSERT_TRUE(text.rfind("A special magic number is hidden", 0) == 0 || text.rfind("A special magic uuid is hidden", 0) == 0)
        << text.substr(0, 80);
    std::map<std::string, std::string> facts;
    for (std::sregex_iterator it(text.begin(), text.end(), needle_re), end; it != end; ++it) {
      ASSERT_FALSE(facts.count((*it)[2])) << "two needles with one key";
      facts[(*it)[2]] = (*it)[3];
      EXPECT_NE(std::find(o.key_nouns.begin(), o.key_nouns.end(), std::string((*it)[2]).substr(std::string((*it)[2]).find('-') + 1)),
                o.key_nouns.end());
    }
    ASSERT_GE(facts.size(), 1u);
    ASSERT_LE(facts.size(), 4u);
    int answered = 0;
    for (std::sregex_iterator it(text.begin(), text.end(), answer_re), end; it != end; ++it, ++answered) {
      EXPECT_EQ((*it)[2], (*it)[4]);
      ASSERT_TRUE(facts.count((*it)[2])) << "a question about a key with no needle";
      EXPECT_EQ(facts[(*it)[2]], (*it)[5]);
      EXPECT_EQ(((*it)[1] == "uuid"), ((*it)[5].length() == 36));
    }
    ASSERT_GE(answered, 1);
    ASSERT_LE(answered, 3);
    questions += answered;
    distractors += static_cast<int>(facts.size()) - answered;
    // Layout: the context (between the first line and the first question) on one line or several, the
    // same paragraph repeated or not.
    const auto lines = filler_lines(text);
    if (lines.size() <= 1) layouts.insert("essay");
    else layouts.insert(std::set<std::string>(lines.begin(), lines.end()).size() == 1 ? "repeat" : "lines");
  }
  EXPECT_EQ(layouts, (std::set<std::string>{"essay", "lines", "repeat"}));
  EXPECT_GT(questions, 300);
  EXPECT_GT(distractors, 100);
}

// noise_fraction: that share of episodes repeats one paragraph of 2-6 short statements on every line of
// the context; without it, episodes are what they were (the option draws nothing).
TEST(RetrievalEpisodes, NoiseFillerRepeatsShortStatements) {
  RetrievalEpisodeOptions o = training_episode_options();
  o.min_chars = 400;
  o.max_chars = 800;
  std::mt19937_64 a(5), b(5);
  RetrievalEpisodeOptions zero = o;
  zero.noise_fraction = 0.0;
  for (int e = 0; e < 20; ++e) ASSERT_EQ(retrieval_episode(a, english_like_sentence, o), retrieval_episode(b, english_like_sentence, zero));
  o.noise_fraction = 0.5;
  const std::regex statement(
      "(The [a-z]+ is [a-z]+|Here we are|On and on it goes|Off we go again|So it goes|Round and round|Up and down we went)\\.");
  int noise = 0;
  std::set<size_t> sentence_counts;
  for (int e = 0; e < 400; ++e) {
    const std::string text = retrieval_episode(a, english_like_sentence, o);
    const auto lines = filler_lines(text);
    if (lines.size() < 2) continue;
    // A noise paragraph: every line the same, made of short statements only.
    std::vector<std::string> parts;
    for (std::sregex_iterator it(lines[0].begin(), lines[0].end(), statement), end; it != end; ++it) parts.push_back((*it)[0]);
    std::string rejoined;
    for (const auto& p : parts) rejoined += (rejoined.empty() ? "" : " ") + p;
    if (rejoined != lines[0]) continue;
    ASSERT_EQ(std::set<std::string>(lines.begin(), lines.end()).size(), 1u) << text.substr(0, 300);
    EXPECT_GE(lines.size() * (lines[0].size() + 1), 400u - 160u);
    sentence_counts.insert(parts.size());
    ++noise;
  }
  EXPECT_GT(noise, 150);
  EXPECT_LT(noise, 250);
  EXPECT_EQ(sentence_counts, (std::set<size_t>{2, 3, 4, 5, 6}));
  o.noise_fraction = 1.5;
  EXPECT_THROW(retrieval_episode(a, english_like_sentence, o), Error);
}

// Training keys are held out from the evaluation's.
TEST(RetrievalEpisodes, TrainingKeysAreNotEvaluationKeys) {
  for (const auto& w : training_key_adjectives())
    EXPECT_EQ(std::count(niah_key_adjectives().begin(), niah_key_adjectives().end(), w), 0) << w;
  for (const auto& w : training_key_nouns())
    EXPECT_EQ(std::count(niah_key_nouns().begin(), niah_key_nouns().end(), w), 0) << w;
  RetrievalEpisodeOptions o;
  std::mt19937_64 rng(1);
  EXPECT_THROW(retrieval_episode(rng, english_like_sentence, o), Error);  // no key words
}

// ---- streamed tokenization, shards, memory-mapped reading ----

namespace {

std::string data_tmp(const std::string& name) { return test::fresh_dir("data", name); }

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

void write_gzip(const std::string& path, const std::string& text) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, text.data(), static_cast<unsigned>(text.size())), static_cast<int>(text.size()));
  gzclose(f);
}

void write_zstd(const std::string& path, const std::string& text) {
  std::string out(ZSTD_compressBound(text.size()), '\0');
  const size_t n = ZSTD_compress(out.data(), out.size(), text.data(), text.size(), 3);
  ASSERT_FALSE(ZSTD_isError(n));
  out.resize(n);
  write_text(path, out);
}

std::vector<int32_t> all_tokens(const TokenDataset& d) { return d.slice(0, d.size()); }

}  // namespace

// The streamed path gives the in-memory path's ids token for token, with one thread or several, pieces
// of a few KiB and shards of a few thousand tokens; compressed inputs give their plain files' ids.
TEST(TokenizeStream, EqualsInMemoryPathOnTheSharedCorpus) {
  const std::string tokdir = test::golden_dir() + "/tok-smollm2";
  const std::string persuasion = test::data_dir() + "/corpus/austen_persuasion.txt";
  LINEARIZE_REQUIRE_PATH(tokdir);
  LINEARIZE_REQUIRE_PATH(persuasion);
  auto tok = load_tokenizer(tokdir);
  ASSERT_TRUE(tok->safe_to_split_at_newlines());
  const std::string dir = data_tmp("stream");
  const std::string text = read_file(persuasion).substr(0, 120000);
  std::string jsonl;
  for (const std::string line : {"First line.", "Second: \xc3\xa9t\xc3\xa9 \xf0\x9f\xa4\x96", "Third"})
    jsonl += nlohmann::json({{"text", line}}).dump() + "\n\n";  // blank lines between records are skipped
  write_text(dir + "/a.txt", text);
  write_text(dir + "/b.jsonl", jsonl);
  write_gzip(dir + "/c.txt.gz", text);
  write_zstd(dir + "/d.jsonl.zst", jsonl);
  const auto want = tokenize_documents(*tok, {dir + "/a.txt", dir + "/b.jsonl", dir + "/a.txt", dir + "/b.jsonl"}, 0);
  for (int threads : {1, 3}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    TokenizeOptions o;
    o.inputs = {dir + "/a.txt", dir + "/b.jsonl", dir + "/c.txt.gz", dir + "/d.jsonl.zst"};
    o.output = dir + "/out" + std::to_string(threads);
    o.eos_id = 0;
    o.shard_tokens = 7000;
    o.threads = threads;
    o.chunk_bytes = 4096;
    const auto r = tokenize_to_dataset(*tok, o);
    EXPECT_EQ(r.tokens, static_cast<int64_t>(want.size()));
    EXPECT_EQ(r.documents, 2 + 6);
    const auto d = TokenDataset::open(o.output, nullptr, -1);
    EXPECT_EQ(all_tokens(d), want);
    EXPECT_EQ(d.index()["shards"].size(), (want.size() + 6999) / 7000);
    EXPECT_EQ(d.index()["sources"][2]["bytes"], static_cast<int64_t>(text.size()));
    d.check_tokenizer(*tok, "smollm2");  // the same tokenizer passes
  }
  // One .u32 shard, the legacy output.
  TokenizeOptions o;
  o.inputs = {dir + "/a.txt"};
  o.output = dir + "/one.u32";
  o.eos_id = 0;
  tokenize_to_dataset(*tok, o);
  EXPECT_EQ(read_token_shard(dir + "/one.u32"), tokenize_documents(*tok, {dir + "/a.txt"}, 0));
}

// Interrupted runs, finished folders, truncated shards, corrupt indexes, another tokenizer: each one clear
// error naming the file, or a clean restart.
TEST(TokenizeStream, BrokenDatasetsAndRestarts) {
  const std::string tokdir = test::golden_dir() + "/tok-bpe4k";
  LINEARIZE_REQUIRE_PATH(tokdir);
  auto tok = load_tokenizer(tokdir);
  const std::string dir = data_tmp("broken");
  write_text(dir + "/a.txt", "Some text to tokenize. It has two sentences.\nAnd a line more.\n");
  TokenizeOptions o;
  o.inputs = {dir + "/a.txt"};
  o.output = dir + "/ds";
  o.eos_id = 0;
  o.shard_tokens = 5;
  // Leftovers of a killed run: shards but no index.json. They are removed and the run starts again.
  fs::create_directories(o.output);
  write_text(o.output + "/shard-00000.u32", "junkjunk");
  write_text(o.output + "/shard-00007.u32.partial", "junk");
  tokenize_to_dataset(*tok, o);
  EXPECT_FALSE(fs::exists(o.output + "/shard-00007.u32.partial"));
  const auto good = all_tokens(TokenDataset::open(o.output, nullptr, -1));
  EXPECT_EQ(good, tokenize_documents(*tok, o.inputs, 0));
  auto error_of = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of([&] { tokenize_to_dataset(*tok, o); }).find("already holds a tokenized dataset"), std::string::npos);
  // Truncated shard.
  fs::resize_file(o.output + "/shard-00001.u32", 6);
  auto msg = error_of([&] { TokenDataset::open(o.output, nullptr, -1); });
  EXPECT_NE(msg.find("shard-00001.u32"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  // No index, a corrupt one, one of another format.
  fs::remove(o.output + "/index.json");
  msg = error_of([&] { TokenDataset::open(o.output, nullptr, -1); });
  EXPECT_NE(msg.find("no index.json"), std::string::npos) << msg;
  write_text(o.output + "/index.json", "{\"format\": \"linearize-tokens\", \"version\": 1, \"tok");
  msg = error_of([&] { TokenDataset::open(o.output, nullptr, -1); });
  EXPECT_NE(msg.find("index.json: malformed JSON"), std::string::npos) << msg;
  write_text(o.output + "/index.json", "{\"format\": \"other\"}");
  msg = error_of([&] { TokenDataset::open(o.output, nullptr, -1); });
  EXPECT_NE(msg.find("not a token dataset index"), std::string::npos) << msg;
  write_text(dir + "/odd.u32", "12345");
  msg = error_of([&] { TokenDataset::open(dir + "/odd.u32", nullptr, -1); });
  EXPECT_NE(msg.find("not a multiple of 4"), std::string::npos) << msg;
  // Another tokenizer is refused.
  o.output = dir + "/ds2";
  tokenize_to_dataset(*tok, o);
  const std::string other = test::golden_dir() + "/tok-smollm2";
  if (fs::exists(other)) {
    msg = error_of([&] { TokenDataset::open(o.output, nullptr, -1).check_tokenizer(*load_tokenizer(other), "m"); });
    EXPECT_NE(msg.find("another tokenizer"), std::string::npos) << msg;
  }
  // Inputs that are no text files.
  msg = error_of([&] { expand_inputs({dir}); });
  EXPECT_NE(msg.find("folder"), std::string::npos) << msg;
  msg = error_of([&] { expand_inputs({dir + "/*.nothing"}); });
  EXPECT_NE(msg.find("matches no file"), std::string::npos) << msg;
}

TEST(TokenizeStream, PermutationAndWindows) {
  for (uint64_t n : {1ull, 2ull, 7ull, 1000ull, 4097ull}) {
    Permutation p(n, 42);
    std::vector<bool> seen(n, false);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t j = p(i);
      ASSERT_LT(j, n);
      ASSERT_FALSE(seen[j]) << n << ": " << j << " twice";
      seen[j] = true;
    }
  }
  Permutation a(1000, 1), b(1000, 2);
  int same = 0;
  for (uint64_t i = 0; i < 1000; ++i) same += a(i) == b(i);
  EXPECT_LT(same, 20);
  // A loader over a mapped dataset gives the windows of one over the same tokens in memory; a rank's part
  // of a batch is that slice of the whole batch.
  std::vector<int32_t> tokens(5000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i % 97);
  const std::string path = data_tmp("windows") + "/t.u32";
  write_token_shard(path, tokens);
  const auto d = TokenDataset::open(path, nullptr, -1);
  WindowLoader mapped(d, {100, 4900}, 32, 5, "mapped", 97), memory(tokens, {100, 4900}, 32, 5);
  for (int step = 0; step < 10; ++step) {
    auto x = memory.next(8);
    ASSERT_TRUE(torch::equal(mapped.next_part(8, 2, 3), x.narrow(0, 2, 3)));
  }
  WindowLoader bad(d, {0, 5000}, 32, 5, "mapped", 50);
  EXPECT_THROW(for (int i = 0; i < 20; ++i) bad.next(8), Error);
}

// ---- mixtures ----

// A mixture's rows follow its weights, the same seed gives the same batches, a restored position
// continues exactly, and the stages' parts of a file source are disjoint.
TEST(Mixture, WeightsSeedsPositionsAndParts) {
  const std::string tokdir = test::golden_dir() + "/tok-bpe4k";
  LINEARIZE_REQUIRE_PATH(tokdir);
  auto tok = load_tokenizer(tokdir);
  const std::string dir = data_tmp("mixture");
  // Two file sources told apart by their ids: all 5s and all 7s.
  write_token_shard(dir + "/fives.u32", std::vector<int32_t>(20000, 5));
  write_token_shard(dir + "/sevens.u32", std::vector<int32_t>(20000, 7));
  write_text(dir + "/mix.json", R"({"sources": [
      {"path": "fives.u32", "weight": 0.5},
      {"path": "sevens.u32", "weight": 0.3},
      {"generator": "retrieval_episodes", "weight": 0.2, "max_chars": 300}]})");
  const auto data = TrainingData::open(dir + "/mix.json", *tok, 0, tok->vocab_size(), "test");
  auto a = data.loader({}, 0, 32, 3, "mix"), b = data.loader({}, 0, 32, 3, "mix");
  std::map<std::string, int> counts;
  const int rows = 3000;
  for (int step = 0; step < rows / 30; ++step) {
    auto x = a->next(30, torch::kCPU);
    ASSERT_TRUE(torch::equal(x, b->next(30, torch::kCPU))) << "same seed, other batches";
    for (int64_t r = 0; r < 30; ++r) {
      const auto row = x[r];
      counts[(row == 5).all().item<bool>() ? "fives" : (row == 7).all().item<bool>() ? "sevens" : "episodes"]++;
    }
  }
  // Binomial spread: 3 standard deviations.
  for (const auto& [name, w] : std::map<std::string, double>{{"fives", 0.5}, {"sevens", 0.3}, {"episodes", 0.2}})
    EXPECT_NEAR(counts[name], rows * w, 3 * std::sqrt(rows * w * (1 - w))) << name;
  // The position: a loader restored from it continues with the same rows.
  auto saved = a->position_json();
  auto c = data.loader({}, 0, 32, 3, "mix");
  c->set_position_json(saved);
  EXPECT_TRUE(torch::equal(c->next(16, torch::kCPU), a->next(16, torch::kCPU)));
  // Generated rows are RULER-form text in the model's tokens.
  auto episodes = data.loader({}, 0, 200, 3, "mix");
  bool saw_episode = false;
  for (int i = 0; i < 20 && !saw_episode; ++i) {
    auto row = episodes->next(1, torch::kCPU)[0];
    std::vector<int32_t> ids(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.size(0));
    saw_episode = tok->decode(ids).find("special magic") != std::string::npos;
  }
  EXPECT_TRUE(saw_episode);
  // Stage parts of a file source never overlap: part 0 of [0.5, 0.5] reads only the first half.
  std::vector<int32_t> ramp(4000);
  for (size_t i = 0; i < ramp.size(); ++i) ramp[i] = static_cast<int32_t>(i);  // the id is the position
  write_token_shard(dir + "/ramp.u32", ramp);
  const auto plain = TrainingData::open(dir + "/ramp.u32", *tok, 0, tok->vocab_size(), "test");
  auto first = plain.loader({0.5, 0.5}, 0, 16, 1, "ramp"), second = plain.loader({0.5, 0.5}, 1, 16, 1, "ramp");
  for (int i = 0; i < 20; ++i) {
    EXPECT_LT(first->next(8, torch::kCPU).max().item<int64_t>(), 2000);
    EXPECT_GE(second->next(8, torch::kCPU).min().item<int64_t>(), 2000);
  }
}

TEST(Mixture, BadSpecsAreOneClearLine) {
  const std::string dir = data_tmp("badspec");
  auto error_of = [&](const std::string& json) {
    write_text(dir + "/m.json", json);
    try {
      read_data_spec(dir + "/m.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of(R"({"sources": [{"path": "x.u32", "wieght": 1}]})").find("unknown key \"wieght\""), std::string::npos);
  EXPECT_NE(error_of(R"({"sources": [{"generator": "wikipedia"}]})").find("unknown generator"), std::string::npos);
  EXPECT_NE(error_of(R"({"sources": [{"path": "x.u32", "weight": -1}]})").find("positive"), std::string::npos);
  EXPECT_NE(error_of(R"({"sources": []})").find("a data mixture is"), std::string::npos);
  EXPECT_NE(error_of(R"({"sources": [{"path": "x.u32"}], "seed": 1})").find("unknown key \"seed\""), std::string::npos);
  EXPECT_NE(error_of("{\"sources\": [").find("malformed JSON"), std::string::npos);
}

// A copy drill repeats its list after "again", with at most max_filler sentences between.
TEST(SyntheticText, CopyDrillsRepeatTheirList) {
  std::mt19937_64 rng(4);
  const std::regex drill("the codes are ([0-9 ]+)\\. (.*)again, the codes are ([0-9 ]+)\\.");
  std::set<size_t> counts;
  for (int i = 0; i < 100; ++i) {
    const std::string d = copy_drill(rng, 3, 2);
    std::smatch m;
    ASSERT_TRUE(std::regex_match(d, m, drill)) << d;
    EXPECT_EQ(m[1], m[3]);
    counts.insert(static_cast<size_t>(std::count(m[1].first, m[1].second, ' ')) + 1);
    EXPECT_LE(std::count(m[2].first, m[2].second, '.'), 2);
  }
  EXPECT_EQ(counts, (std::set<size_t>{1, 2, 3}));
}
