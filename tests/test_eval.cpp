// Evaluation layer tests: the batched continuation scorer against one plain forward per sequence,
// multiple-choice metrics (acc, acc_norm per character), WinoGrande partial scoring, LAMBADA's greedy
// match, HellaSwag text cleanup, task file errors with FILE:LINE, NIAH against RULER's text (prompts,
// filling, depths, scoring), recovery arithmetic, and the report's Markdown and SVG output.
// Tests that need ../shared skip with a message when it is absent. No test runs more than a few
// hundred forward passes of a tiny model.
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "eval/niah.h"
#include "eval/recovery.h"
#include "eval/tasks.h"
#include "io/error.h"
#include "model/model_io.h"
#include "report/markdown.h"
#include "report/svg.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace linearize;

namespace {

std::string tmp_file(const std::string& name, const std::string& content) {
  auto d = fs::temp_directory_path() / ("linearize_eval_" + std::to_string(::getpid()));
  fs::create_directories(d);
  const auto p = (d / name).string();
  std::ofstream(p) << content;
  return p;
}

// Sum of log p(continuation) by one forward over the whole sequence, and whether it is greedy.
ContinuationScore score_by_hand(CausalLM& model, const TokenPair& r) {
  torch::NoGradGuard ng;
  std::vector<int64_t> all(r.context.begin(), r.context.end());
  all.insert(all.end(), r.continuation.begin(), r.continuation.end());
  auto x = torch::tensor(all, torch::kLong).unsqueeze(0);
  auto logp = torch::log_softmax(model->forward(x).squeeze(0).to(torch::kDouble), -1);  // [T, V]
  ContinuationScore s;
  s.greedy = true;
  const int64_t start = static_cast<int64_t>(r.context.size());
  for (int64_t i = 0; i < static_cast<int64_t>(r.continuation.size()); ++i) {
    const int64_t pos = start + i - 1;  // output at pos predicts token pos + 1
    s.loglik += logp[pos][all[pos + 1]].item<double>();
    s.greedy = s.greedy && logp[pos].argmax().item<int64_t>() == all[pos + 1];
  }
  s.tokens = static_cast<int64_t>(r.continuation.size());
  return s;
}

std::vector<int32_t> ids(std::initializer_list<int32_t> l) { return l; }

}  // namespace

// ---- scoring ----

TEST(EvalScoring, BatchedScorerMatchesOneForwardPerSequence) {
  const std::string folder = test::golden_dir() + "/llama-gqa";
  LINEARIZE_REQUIRE_PATH(folder);
  auto model = load_model(folder);
  // Different context and continuation lengths so that batches need padding.
  std::vector<TokenPair> reqs = {{ids({0, 5, 9, 11}), ids({7})},
                                 {ids({0, 5, 9, 11, 300, 301, 302, 17}), ids({40, 41, 42})},
                                 {ids({0}), ids({3, 4})},
                                 {ids({0, 100, 200}), ids({7, 8, 9, 10, 11})},
                                 {ids({0, 5, 9, 11, 12}), ids({511})}};
  ScoreOptions so;
  so.batch = 2;
  const auto got = score_continuations(model, reqs, so);
  ASSERT_EQ(got.size(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    const auto want = score_by_hand(model, reqs[i]);
    EXPECT_NEAR(got[i].loglik, want.loglik, 1e-4) << "request " << i;
    EXPECT_EQ(got[i].greedy, want.greedy) << "request " << i;
    EXPECT_EQ(got[i].tokens, want.tokens);
  }
}

TEST(EvalScoring, LeftTruncationKeepsTheContinuation) {
  const std::string folder = test::golden_dir() + "/llama-gqa";
  LINEARIZE_REQUIRE_PATH(folder);
  auto model = load_model(folder);
  TokenPair r{ids({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}), ids({10, 11})};
  ScoreOptions so;
  so.max_length = 6;  // keeps the last 7 tokens: 5..11, input 5..10
  const auto got = score_continuations(model, {r}, so);
  const auto want = score_by_hand(model, TokenPair{ids({5, 6, 7, 8, 9}), ids({10, 11})});
  EXPECT_NEAR(got[0].loglik, want.loglik, 1e-4);
}

TEST(EvalTasks, ArcOnStoriesMatchesHandScoringAndArgmax) {
  LINEARIZE_REQUIRE_SENTENCEPIECE();
  const std::string folder = test::data_dir() + "/models/stories260K";
  const std::string data = test::data_dir() + "/eval";
  LINEARIZE_REQUIRE_PATH(folder);
  LINEARIZE_REQUIRE_PATH(data + "/arc_easy.jsonl");
  auto model = load_model(folder);
  auto tok = load_tokenizer(folder);
  const TaskData task = load_task("arc_easy", data, 6);
  ASSERT_EQ(task.items.size(), 6u);
  EXPECT_EQ(task.items[0].options[0].context.substr(0, 10), "Question: ");
  EXPECT_EQ(task.items[0].options[0].context.substr(task.items[0].options[0].context.size() - 8), "\nAnswer:");
  const auto prefix = eval_prefix(model->config, *tok);
  ASSERT_EQ(prefix, std::vector<int32_t>{1});  // BOS for SentencePiece
  ScoreOptions so;
  so.batch = 5;
  const TaskResult r = evaluate_task(model, *tok, task, so);
  int64_t hits = 0, hits_norm = 0;
  for (const auto& item : task.items) {
    std::vector<double> ll, lln;
    for (size_t j = 0; j < item.options.size(); ++j) {
      const auto pair = encode_pair(*tok, prefix, 1, item.options[j]);
      // The continuation is the tail of the whole text's tokens.
      auto whole = tok->encode(item.options[j].context + item.options[j].continuation, false);
      ASSERT_GE(whole.size(), pair.continuation.size());
      EXPECT_TRUE(std::equal(pair.continuation.rbegin(), pair.continuation.rend(), whole.rbegin()));
      ll.push_back(score_by_hand(model, pair).loglik);
      lln.push_back(ll.back() / static_cast<double>(item.options[j].continuation.size() - 1));
    }
    hits += argmax_index(ll) == item.gold;
    hits_norm += argmax_index(lln) == item.gold;
  }
  EXPECT_EQ(r.n, 6);
  EXPECT_DOUBLE_EQ(r.acc, hits / 6.0);
  EXPECT_DOUBLE_EQ(r.acc_norm, hits_norm / 6.0);
  EXPECT_NEAR(r.acc_stderr, std::sqrt(r.acc * (1 - r.acc) / 5), 1e-12);
  EXPECT_EQ(r.metric, "acc");
}

TEST(EvalTasks, EncodePairMovesTrailingSpacesToTheContinuation) {
  LINEARIZE_REQUIRE_SENTENCEPIECE();
  const std::string folder = test::data_dir() + "/models/stories260K";
  LINEARIZE_REQUIRE_PATH(folder);
  auto tok = load_tokenizer(folder);
  const auto a = encode_pair(*tok, {1}, 1, {"Once upon a time ", "there was"});
  const auto b = encode_pair(*tok, {1}, 1, {"Once upon a time", " there was"});
  EXPECT_EQ(a.context, b.context);
  EXPECT_EQ(a.continuation, b.continuation);
  EXPECT_EQ(a.context.front(), 1);
}

TEST(EvalTasks, AccNormDividesByChoiceCharacters) {
  // "éé" is 4 bytes but 2 characters: lm-eval's acc_norm divides by len(str), the characters.
  const auto path = tmp_file("mc.jsonl", "{\"query\": \"q\", \"choices\": [\"ab\", \"\xc3\xa9\xc3\xa9\", \"abcdef\"], "
                                         "\"gold\": 2}\n");
  const TaskData t = load_multiple_choice_jsonl("openbookqa", path, -1);
  ASSERT_EQ(t.items.size(), 1u);
  EXPECT_EQ(t.items[0].norm_chars, (std::vector<int64_t>{2, 2, 6}));
  EXPECT_EQ(t.items[0].options[1].continuation, " \xc3\xa9\xc3\xa9");
  // acc: -2.2 is the largest; per character -1.1, -1.5, -0.9 picks the gold choice (per byte it would be
  // -1.1, -0.75, -0.9: the second).
  std::vector<std::vector<ContinuationScore>> s = {{{-2.2, false, 1}, {-3.0, false, 1}, {-5.4, false, 1}}};
  const TaskResult r = multiple_choice_metrics(t, s);
  EXPECT_EQ(r.acc, 0.0);
  EXPECT_EQ(r.acc_norm, 1.0);
  EXPECT_EQ(r.metric, "acc_norm");
  EXPECT_EQ(r.score(), 1.0);
}

TEST(EvalTasks, WinograndeScoresTheSharedContinuationAfterEachOption) {
  LINEARIZE_REQUIRE_SENTENCEPIECE();
  const auto path = tmp_file("wg.jsonl",
                             "{\"context_options\": [\"Sarah helped Maria so Sarah\", \"Sarah helped Maria so Maria\"], "
                             "\"continuation\": \"said thanks.\", \"gold\": 1}\n");
  const TaskData t = load_winogrande_jsonl(path, -1);
  ASSERT_EQ(t.items.size(), 1u);
  const auto& it = t.items[0];
  ASSERT_EQ(it.options.size(), 2u);
  EXPECT_EQ(it.options[0].context, "Sarah helped Maria so Sarah");
  EXPECT_EQ(it.options[1].context, "Sarah helped Maria so Maria");
  EXPECT_EQ(it.options[0].continuation, " said thanks.");
  EXPECT_EQ(it.options[1].continuation, " said thanks.");
  EXPECT_EQ(it.gold, 1);
  std::vector<std::vector<ContinuationScore>> s = {{{-5.0, false, 3}, {-4.0, false, 3}}};
  const TaskResult r = multiple_choice_metrics(t, s);
  EXPECT_EQ(r.acc, 1.0);
  EXPECT_EQ(r.acc_norm, 1.0);
  const std::string folder = test::data_dir() + "/models/stories260K";
  LINEARIZE_REQUIRE_PATH(folder);
  auto tok = load_tokenizer(folder);
  const auto a = encode_pair(*tok, {1}, 1, it.options[0]);
  const auto b = encode_pair(*tok, {1}, 1, it.options[1]);
  EXPECT_EQ(a.continuation, b.continuation);  // the same tokens are scored after both options
  EXPECT_NE(a.context, b.context);
}

TEST(EvalTasks, LambadaAccIsTheGreedyMatchOfEveryToken) {
  const std::string folder = test::golden_dir() + "/llama-gqa";
  LINEARIZE_REQUIRE_PATH(folder);
  auto model = load_model(folder);
  // Build a continuation the model itself predicts greedily, then spoil its last token.
  std::vector<int32_t> ctx = {0, 17, 99, 250};
  std::vector<int32_t> cont;
  {
    torch::NoGradGuard ng;
    std::vector<int64_t> seq(ctx.begin(), ctx.end());
    for (int k = 0; k < 3; ++k) {
      auto logits = model->forward(torch::tensor(seq, torch::kLong).unsqueeze(0));
      seq.push_back(logits[0][-1].argmax().item<int64_t>());
      cont.push_back(static_cast<int32_t>(seq.back()));
    }
  }
  auto spoiled = cont;
  spoiled.back() = (spoiled.back() + 1) % 512;
  const auto s = score_continuations(model, {{ctx, cont}, {ctx, spoiled}}, ScoreOptions{});
  EXPECT_TRUE(s[0].greedy);
  EXPECT_FALSE(s[1].greedy);
  TaskData t;
  t.name = "lambada";
  t.metric = "acc";
  t.kind = TaskKind::Lambada;
  t.items.resize(2);
  const TaskResult r = lambada_metrics(t, {{s[0]}, {s[1]}});
  EXPECT_EQ(r.acc, 0.5);
  EXPECT_NEAR(r.ppl, std::exp(-(s[0].loglik + s[1].loglik) / 2), 1e-9);
}

TEST(EvalTasks, LambadaFileGetsASpaceBeforeTheLastWord) {
  const auto path = tmp_file("lam.jsonl", "{\"context\": \"I don't care about\", \"continuation\": \"signs\"}\n");
  const TaskData t = load_lambada_jsonl(path, -1);
  ASSERT_EQ(t.items.size(), 1u);
  EXPECT_EQ(t.items[0].options[0].continuation, " signs");
  EXPECT_EQ(t.kind, TaskKind::Lambada);
}

TEST(EvalTasks, HellaswagPreprocessing) {
  EXPECT_EQ(hellaswag_preprocess("  How to x [title] Do this [header] step.  Then  "), "How to x. Do this step. Then");
  EXPECT_EQ(hellaswag_preprocess("a   b"), "a  b");  // one pass, as Python's str.replace
  EXPECT_EQ(hellaswag_preprocess("see [www.site.org] now"), "see now");
  EXPECT_EQ(hellaswag_capitalize_tail("Roof shingle removal: A man is sitting on a roof. he"),
            "Roof shingle removal: A man is sitting on a roof. He");
  EXPECT_EQ(hellaswag_capitalize_tail("Family: How to play. Ask them."), "Family: How to play. Ask them.");
}

TEST(EvalTasks, HellaswagKlosaxFile) {
  const std::string path = test::data_dir() + "/eval/hellaswag_val_full.txt.bz2";
  LINEARIZE_REQUIRE_PATH(path);
  const TaskData t = load_hellaswag_text(path, 3);
  ASSERT_EQ(t.items.size(), 3u);
  EXPECT_EQ(t.items[0].options[0].context, "Roof shingle removal: A man is sitting on a roof. He");
  EXPECT_EQ(t.items[0].options[3].continuation, " starts pulling up roofing on a roof.");
  EXPECT_EQ(t.items[0].gold, 3);
  EXPECT_EQ(t.items[2].gold, 2);
  EXPECT_EQ(t.metric, "acc_norm");
}

TEST(EvalTasks, MalformedLinesNameFileAndLine) {
  const auto bad_json = tmp_file("bad1.jsonl", "{\"query\": \"q\", \"choices\": [\"a\"], \"gold\": 0}\n{\"query\": \n");
  try {
    load_multiple_choice_jsonl("piqa", bad_json, -1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad_json + ":2:"), std::string::npos) << e.what();
  }
  const auto no_choices = tmp_file("bad2.jsonl", "\n{\"query\": \"q\", \"gold\": 0}\n");
  try {
    load_multiple_choice_jsonl("piqa", no_choices, -1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(no_choices + ":2:"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("choices"), std::string::npos) << e.what();
  }
  const auto bad_gold = tmp_file("bad3.jsonl", "{\"context_options\": [\"a\", \"b\"], \"continuation\": \"c\", \"gold\": 2}\n");
  try {
    load_winogrande_jsonl(bad_gold, -1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad_gold + ":1:"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("gold"), std::string::npos) << e.what();
  }
  const auto bad_hs = tmp_file("bad.txt", "ctx\n7\na\nb\nc\nd\n");
  EXPECT_THROW(load_hellaswag_text(bad_hs, -1), Error);
  EXPECT_THROW(load_task("nope", "/nonexistent", -1), Error);
}

// ---- NIAH ----

namespace {

std::string prose(size_t bytes) {
  std::ifstream in(test::data_dir() + "/corpus/austen_emma.txt");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return text.substr(0, bytes);
}

}  // namespace

// RULER's template with its single-needle rewrite (scripts/data/synthetic/niah.py), byte for byte.
TEST(EvalNiah, RulerTextByteForByte) {
  EXPECT_EQ(niah_prompt(false, "CTX", "amber-badger"),
            "A special magic number is hidden within the following text. Make sure to memorize it. I will quiz you "
            "about the number afterwards.\nCTX\nWhat is the special magic number for amber-badger mentioned in the "
            "provided text?");
  EXPECT_EQ(niah_answer_prefix(false, "amber-badger"),
            " The special magic number for amber-badger mentioned in the provided text is");
  EXPECT_EQ(niah_answer_prefix(true, "k"), " The special magic uuid for k mentioned in the provided text is");
  // Several answers keep RULER's plural template.
  EXPECT_EQ(niah_prompt(true, "C", "k", /*single=*/false),
            "Some special magic uuids are hidden within the following text. Make sure to memorize it. I will quiz "
            "you about the uuids afterwards.\nC\nWhat are all the special magic uuids for k mentioned in the provided "
            "text?");
  EXPECT_EQ(niah_answer_prefix(false, "k", false), " The special magic numbers for k mentioned in the provided text are");
  // The needle keeps the plural in every task.
  EXPECT_EQ(niah_needle(false, "k", "1234567"), "One of the special magic numbers for k is: 1234567.");
  EXPECT_EQ(niah_needle(true, "k", "v"), "One of the special magic uuids for k is: v.");
  EXPECT_EQ(niah_noise_paragraph(), "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.");
  // np.round(np.linspace(0, 100, 40)): halves to even, e.g. 100 * 20 / 39 = 51.28 -> 51.
  const auto& d = niah_depths_percent();
  ASSERT_EQ(d.size(), 40u);
  EXPECT_EQ((std::vector<int>(d.begin(), d.begin() + 6)), (std::vector<int>{0, 3, 5, 8, 10, 13}));
  EXPECT_EQ(d[20], 51);
  EXPECT_EQ(d[39], 100);
}

TEST(EvalNiah, KeysValuesAndScoring) {
  std::mt19937_64 rng(5);
  for (int i = 0; i < 200; ++i) {
    const auto n = niah_random_number(rng);
    ASSERT_EQ(n.size(), 7u);
    ASSERT_NE(n[0], '0');
    ASSERT_TRUE(std::regex_match(niah_random_uuid(rng),
                                 std::regex("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")));
    ASSERT_TRUE(std::regex_match(niah_random_key(rng, niah_key_adjectives(), niah_key_nouns()),
                                 std::regex("[a-z]+-[a-z]+")));
  }
  // string_match_all: a case-insensitive substring of the post-processed output.
  EXPECT_TRUE(niah_match(" 1234567.", "1234567"));
  EXPECT_FALSE(niah_match(" 123456", "1234567"));
  EXPECT_TRUE(niah_match("The UUID is ABCDEF12-0000", "abcdef12-0000"));
  EXPECT_EQ(niah_postprocess("  a\tb\x01" "c \n"), "a\nb\nc");
  EXPECT_FALSE(niah_match("anything", ""));
  EXPECT_THROW(niah_uses_uuid("s_niah_9"), Error);
  EXPECT_EQ(split_sentences("One.  Two!\nThree? \"Four.\" Five"),
            (std::vector<std::string>{"One.", "Two!", "Three?", "\"Four.\"", "Five"}));
  EXPECT_EQ(largest_fitting(1000, [](int64_t n) { return n * n <= 1000; }), 31);
  EXPECT_EQ(largest_fitting(20, [](int64_t n) { return n <= 64; }), 20);
  EXPECT_EQ(largest_fitting(20, [](int64_t n) { return n == 0; }), 0);
}

// S-NIAH-1: paragraphs of noise on lines of their own, the needle one more line, as many paragraphs as
// fit (one more would not), the same sample from the same seed.
TEST(EvalNiah, NoisePromptFillsTheLength) {
  LINEARIZE_REQUIRE_SENTENCEPIECE();
  const std::string folder = test::data_dir() + "/models/stories260K";
  LINEARIZE_REQUIRE_PATH(folder);
  auto tok = load_tokenizer(folder);
  const auto encode = plain_prompt_encoder(*tok, {1});
  const auto hay = noise_haystack();
  std::vector<double> depths;
  for (int64_t length : {384, 768}) {
    for (int k = 0; k < 12; ++k) {
      std::mt19937_64 rng(k), again(k);
      const auto s = make_niah_sample(hay, false, length, 32, encode, rng);
      EXPECT_EQ(make_niah_sample(hay, false, length, 32, encode, again).ids, s.ids);
      EXPECT_LE(static_cast<int64_t>(s.ids.size()) + 32, length);
      const auto more = encode(niah_prompt(false, niah_context(hay, s.units + 1, {{s.depth, s.needle}}), s.key),
                               s.answer_prefix);
      EXPECT_GT(static_cast<int64_t>(more.size()) + 32, length) << "one more paragraph would still fit";
      EXPECT_EQ(s.ids, encode(s.question, s.answer_prefix));
      // Lines: the template's first line, then the paragraphs and the needle, then the question.
      std::vector<std::string> lines;
      std::stringstream in(s.question);
      for (std::string line; std::getline(in, line);) lines.push_back(line);
      ASSERT_EQ(static_cast<int64_t>(lines.size()), s.units + 3);
      int64_t needle_line = -1;
      for (int64_t i = 1; i + 1 < static_cast<int64_t>(lines.size()); ++i) {
        if (lines[i] == s.needle) needle_line = i - 1;
        else EXPECT_EQ(lines[i], niah_noise_paragraph());
      }
      ASSERT_GE(needle_line, 0);
      EXPECT_EQ(needle_line, static_cast<int64_t>(s.depth * s.units));  // before paragraph floor(depth * units)
      EXPECT_EQ(lines.back(), "What is the special magic number for " + s.key + " mentioned in the provided text?");
      EXPECT_EQ(s.value.size(), 7u);
      depths.push_back(s.depth);
    }
  }
  // Random depths cover the haystack.
  EXPECT_LT(*std::min_element(depths.begin(), depths.end()), 0.25);
  EXPECT_GT(*std::max_element(depths.begin(), depths.end()), 0.75);
}

// S-NIAH-3: the essay's first words, the needle between two of its sentences at one of RULER's depths.
TEST(EvalNiah, UuidNeedleBetweenSentencesOfProse) {
  LINEARIZE_REQUIRE_SENTENCEPIECE();
  const std::string folder = test::data_dir() + "/models/stories260K";
  LINEARIZE_REQUIRE_PATH(folder);
  LINEARIZE_REQUIRE_PATH(test::data_dir() + "/corpus/austen_emma.txt");
  auto tok = load_tokenizer(folder);
  const auto hay = essay_haystack(prose(60000), "emma");
  for (int k = 0; k < 6; ++k) {
    std::mt19937_64 rng(k);
    const auto s = make_niah_sample(hay, true, 512, 128, plain_prompt_encoder(*tok, {1}), rng);
    EXPECT_TRUE(std::regex_match(s.value, std::regex("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")));
    EXPECT_LE(static_cast<int64_t>(s.ids.size()), 512 - 128);
    EXPECT_GE(static_cast<int64_t>(s.ids.size()), 512 - 128 - 8);  // cut by words: within a few tokens
    const int pct = static_cast<int>(std::lround(100 * s.depth));
    EXPECT_NE(std::find(niah_depths_percent().begin(), niah_depths_percent().end(), pct), niah_depths_percent().end());
    const size_t head = s.question.find('\n') + 1;
    const std::string context = s.question.substr(head, s.question.rfind('\n') - head);
    const size_t at = context.find(s.needle);
    ASSERT_NE(at, std::string::npos);
    // The context is the first `units` words with the needle put in whole between sentences.
    std::string without = context;
    without.erase(at, s.needle.size() + (at + s.needle.size() < context.size() ? 1 : 0));
    if (!without.empty() && without.back() == ' ') without.pop_back();
    std::string words;
    for (int64_t i = 0; i < s.units; ++i) words += (i ? " " : "") + hay.words[i];
    EXPECT_EQ(without, words);
    const auto sentences = split_sentences(words);
    EXPECT_EQ(split_sentences(context.substr(0, at)).size(), static_cast<size_t>(s.depth * sentences.size()));
  }
}

// The loop end to end on a real tiny model: the dump holds every sample, each scored as niah_match
// scores it, and the accuracy is their mean.
TEST(EvalNiah, RunDumpsEverySampleAndScoresIt) {
  LINEARIZE_REQUIRE_SENTENCEPIECE();
  const std::string folder = test::data_dir() + "/models/stories260K";
  LINEARIZE_REQUIRE_PATH(folder);
  auto model = load_model(folder);
  auto tok = load_tokenizer(folder);
  NiahOptions o;
  o.lengths = {300, 420};
  o.samples = 3;
  o.max_new_tokens = 12;
  o.dump = tmp_file("niah.jsonl", "");
  const auto r = run_niah(model, *tok, o, niah_encoder(model, *tok, folder, false));
  std::ifstream in(o.dump);
  int rows = 0;
  std::map<int64_t, int> right;
  for (std::string line; std::getline(in, line); ++rows) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["correct"].get<bool>(), niah_match(j["output"], j["reference"])) << line;
    EXPECT_LE(j["prompt_tokens"].get<int64_t>() + 12, j["length"].get<int64_t>());
    EXPECT_NE(j["input"].get<std::string>().find(j["key"].get<std::string>()), std::string::npos);
    right[j["length"].get<int64_t>()] += j["correct"].get<bool>();
  }
  EXPECT_EQ(rows, 6);
  EXPECT_FALSE(fs::exists(o.dump + ".partial"));
  for (int64_t len : o.lengths)
    EXPECT_DOUBLE_EQ(r["per_length"][std::to_string(len)].get<double>(), right[len] / 3.0);
  ASSERT_EQ(r["grid"].size(), 2u);
  EXPECT_EQ(r["grid"][0].size(), 5u);
  // --chat needs the chat tokens.
  try {
    niah_encoder(model, *tok, folder, true);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--chat"), std::string::npos) << e.what();
  }
}

// ---- recovery ----

TEST(EvalRecovery, MeanOverMean) {
  EXPECT_NEAR(recovery_percent(std::vector<double>{0.5, 0.3}, std::vector<double>{0.5, 0.5}), 80.0, 1e-12);
  EXPECT_THROW(recovery_percent(std::vector<double>{}, std::vector<double>{}), Error);
  EXPECT_THROW(recovery_percent(std::vector<double>{0.5}, std::vector<double>{0.0}), Error);
  nlohmann::json s = {{"model", "s"}, {"tasks", {{"piqa", {{"score", 0.6}}}, {"arc_easy", {{"score", 0.4}}}}}};
  nlohmann::json t = {{"model", "t"},
                      {"tasks", {{"piqa", {{"score", 0.8}}}, {"arc_easy", {{"score", 0.6}}}, {"lambada", {{"score", 0.9}}}}}};
  EXPECT_EQ(shared_tasks(s, t), (std::vector<std::string>{"arc_easy", "piqa"}));
  EXPECT_NEAR(recovery_percent(s, t), 100.0 * 0.5 / 0.7, 1e-12);
  EXPECT_EQ(result_name(nlohmann::json{{"model", "/x/y/gdn-1b/"}}), "gdn-1b");
}

// ---- report ----

namespace {

std::vector<ReportInput> sample_inputs() {
  auto tasks = [](double a, double b) {
    return nlohmann::json{{"arc_easy", {{"score", a}, {"metric", "acc"}}}, {"hellaswag", {{"score", b}, {"metric", "acc_norm"}}}};
  };
  auto niah = [](double x) {
    return nlohmann::json{{"s_niah_1",
                           {{"lengths", {512, 1024}}, {"depths", {0.0, 0.5, 1.0}}, {"samples", 2},
                            {"grid", {{x, x, 1.0}, {0.0, x, 0.5}}}, {"per_length", {{"512", x}, {"1024", x / 2}}},
                            {"average", x}}}};
  };
  std::vector<ReportInput> in(3);
  in[0] = {"teacher-1b", "t.json", {{"model", "/m/teacher-1b"}, {"role", "teacher"}, {"tasks", tasks(0.8, 0.6)}, {"average", 0.7}, {"niah", niah(1.0)}}, true};
  in[1] = {"gdn", "g.json", {{"model", "/m/gdn"}, {"mixer", "gated_deltanet"}, {"scale", 1.0}, {"tasks", tasks(0.7, 0.5)}, {"average", 0.6}, {"niah", niah(0.5)}}, false};
  in[2] = {"la", "l.json", {{"model", "/m/la"}, {"mixer", "linear_attention"}, {"scale", 1.0}, {"tasks", tasks(0.5, 0.4)}, {"average", 0.45}}, false};
  return in;
}

}  // namespace

TEST(Report, MarkdownHasEveryModelAndTask) {
  const auto inputs = sample_inputs();
  const auto figs = report_figures(inputs);
  std::vector<std::string> names;
  for (const auto& f : figs) names.push_back(f.first);
  const std::string md = markdown_report(inputs, names);
  for (const char* s : {"teacher-1b", "gdn", "la", "ARC-e", "HellaSwag", "average", "recovery %", "s_niah_1", "512", "1024"})
    EXPECT_NE(md.find(s), std::string::npos) << s << "\n" << md;
  EXPECT_NE(md.find("| 85.7 |"), std::string::npos) << md;  // gdn: 0.6 / 0.7
  EXPECT_NE(md.find("| 64.3 |"), std::string::npos) << md;  // la: 0.45 / 0.7
  EXPECT_NE(md.find("recovery.svg"), std::string::npos);
  EXPECT_NE(md.find("niah_s_niah_1_gdn.svg"), std::string::npos);
  EXPECT_NE(md.find("scale.svg"), std::string::npos);
}

TEST(Report, SvgIsWellFormed) {
  Heatmap h;
  h.title = "a <b> & c";
  h.row_labels = {"0%", "50%", "100%"};
  h.col_labels = {"512", "1024"};
  h.values = {{1, 0.5}, {0, 1}, {0.25, 0.75}};
  const std::string svg = svg_heatmap(h);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  size_t cells = 0;
  for (size_t p = 0; (p = svg.find("class=\"cell\"", p)) != std::string::npos; ++p) ++cells;
  EXPECT_EQ(cells, 6u);
  EXPECT_NE(svg.find("a &lt;b&gt; &amp; c"), std::string::npos);
  // Every opened element is closed: count "<text" vs "</text>".
  auto count = [&](const std::string& s, const std::string& what) {
    size_t n = 0;
    for (size_t p = 0; (p = s.find(what, p)) != std::string::npos; ++p) ++n;
    return n;
  };
  EXPECT_EQ(count(svg, "<text"), count(svg, "</text>"));
  EXPECT_EQ(accuracy_colour(0), "#d73027");
  EXPECT_EQ(accuracy_colour(1), "#1a9850");
  const std::string bars = svg_bar_chart("r", {{"gdn", 94.2}, {"la", 80}}, "recovery %", 100);
  EXPECT_EQ(bars.rfind("<svg", 0), 0u);
  EXPECT_EQ(count(bars, "class=\"bar\""), 2u);
  const std::string lines = svg_line_chart("s", {{"gdn", {{1e8, 90}, {1e9, 94}}}}, "scale", "recovery %", true);
  EXPECT_EQ(lines.rfind("<svg", 0), 0u);
  EXPECT_EQ(count(lines, "class=\"series\""), 1u);
}

TEST(Report, WritesFilesFromResultsJson) {
  const auto inputs = sample_inputs();
  std::vector<std::string> paths;
  for (const auto& in : inputs) paths.push_back(tmp_file(in.source, in.results.dump()));
  const auto loaded = load_report_inputs(paths);
  ASSERT_EQ(loaded.size(), 3u);
  EXPECT_TRUE(loaded[0].teacher);
  EXPECT_EQ(loaded[1].name, "gdn");
  const auto dir = (fs::temp_directory_path() / ("linearize_report_" + std::to_string(::getpid()))).string();
  const auto written = write_report(loaded, dir);
  EXPECT_TRUE(fs::exists(dir + "/report.md"));
  EXPECT_TRUE(fs::exists(dir + "/recovery.svg"));
  EXPECT_TRUE(fs::exists(dir + "/niah_s_niah_1_teacher-1b.svg"));
  EXPECT_THROW(load_report_inputs({tmp_file("junk.json", "[1,2]")}), Error);
}

// With two teachers among the inputs, each student's recovery is against its own teacher (its "teacher"
// path), never the first teacher listed; result files of one mixer under two teachers get two names.
TEST(Report, RecoveryAgainstEachStudentsOwnTeacher) {
  auto tasks = [](double a) { return nlohmann::json{{"arc_easy", {{"score", a}, {"metric", "acc"}}}}; };
  std::vector<ReportInput> in(4);
  in[0] = {"small", "s.json", {{"model", "/m/small"}, {"role", "teacher"}, {"tasks", tasks(0.5)}}, true};
  in[1] = {"large", "l.json", {{"model", "/m/large"}, {"role", "teacher"}, {"tasks", tasks(0.8)}}, true};
  in[2] = {"gdn-small", "a.json", {{"model", "/m/small/gdn"}, {"teacher", "/m/small"}, {"tasks", tasks(0.4)}}, false};
  in[3] = {"gdn-large", "b.json", {{"model", "/m/large/gdn"}, {"teacher", "/m/large/"}, {"tasks", tasks(0.4)}}, false};
  EXPECT_NEAR(report_recovery(in[2], in), 80.0, 1e-9);  // 0.4 / 0.5
  EXPECT_NEAR(report_recovery(in[3], in), 50.0, 1e-9);  // 0.4 / 0.8, not against the first teacher
  ReportInput stranger = {"x", "x.json", {{"model", "/m/x"}, {"teacher", "/m/other"}, {"tasks", tasks(0.4)}}, false};
  EXPECT_LT(report_recovery(stranger, in), 0);  // its teacher is not among the inputs
  ReportInput unnamed = {"y", "y.json", {{"model", "/m/y"}, {"tasks", tasks(0.4)}}, false};
  EXPECT_LT(report_recovery(unnamed, in), 0);   // two teachers and none named: ambiguous
  EXPECT_NEAR(report_recovery(unnamed, {in[0], unnamed}), 80.0, 1e-9);
  EXPECT_EQ(result_file_name(in[2].results), "small__gdn");
  EXPECT_NE(result_file_name(in[2].results), result_file_name(in[3].results));
  EXPECT_EQ(result_file_name(nlohmann::json{{"model", "gdn"}}), "gdn");
  EXPECT_EQ(result_file_name(nlohmann::json{{"label", "mine"}, {"model", "/a/b"}}), "mine");
}
