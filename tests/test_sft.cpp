// Post-training on CPU with tiny models: the ChatML template and its loss mask, conversation reading
// and its errors, packed rows against separate documents (teacher and students), a short SFT run,
// chat through the recurrent state against a full re-encode (in process and through a pipe), and the
// ROUGE-L instruction score.
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "distill/sft.h"
#include "distill/sft_data.h"
#include "eval/instruct.h"
#include "infer/chat.h"
#include "io/chat_template.h"
#include "io/error.h"
#include "model/model_io.h"
#include "model/student.h"
#include "test_util.h"
#include "train_fixtures.h"

using namespace linearize;
namespace fs = std::filesystem;

namespace {

std::string tmpdir(const std::string& name) { return test::fresh_dir("sft", name); }

const std::string& byte_tok_dir() {
  static std::string d = test::write_byte_tokenizer(tmpdir("tok"));
  return d;
}

LlamaConfig tiny_config(int64_t vocab) {
  auto c = test::small_llama(vocab, 32, 2, 4, 2, 64);
  c.eos_token_ids = {0};
  return c;
}

CausalLM tiny_teacher(int64_t vocab, uint64_t seed = 1) {
  torch::manual_seed(seed);
  CausalLM m(tiny_config(vocab));
  init_weights_normal(*m, 0.1);
  m->eval();
  return m;
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::vector<Conversation> sample_conversations() {
  return {{{"user", "hi there"}, {"assistant", "hello, the cat"}},
          {{"system", "be brief"}, {"user", "name a colour"}, {"assistant", "red"}, {"user", "another"},
           {"assistant", "blue and green"}},
          {{"user", "the end"}, {"assistant", "an answer that is a little longer than the others"}}};
}

ChatTokens byte_marks() { return {1, 2, {}}; }

}  // namespace

TEST(ChatTemplate, MaskCoversExactlyAssistantTokens) {
  auto tok = load_tokenizer(byte_tok_dir());
  Conversation conv = {{"user", "hi"}, {"assistant", "ok"}};
  auto e = encode_chat(conv, "", *tok, byte_marks(), false);
  // Hand-built: <|im_start|> u s e r \n h i <|im_end|> \n <|im_start|> a s s i s t an t \n o k <|im_end|> \n
  // (byte b has id 3 + b; "an" is merge id 262).
  auto b = [](char c) { return 3 + static_cast<int32_t>(static_cast<unsigned char>(c)); };
  std::vector<int32_t> ids = {1, b('u'), b('s'), b('e'), b('r'), b('\n'), b('h'), b('i'), 2, b('\n'),
                              1, b('a'), b('s'), b('s'), b('i'), b('s'), b('t'), 262, b('t'), b('\n'),
                              b('o'), b('k'), 2, b('\n')};
  std::vector<uint8_t> mask(ids.size(), 0);
  mask[20] = mask[21] = mask[22] = 1;  // "o", "k" and the <|im_end|> closing the reply
  EXPECT_EQ(e.ids, ids);
  EXPECT_EQ(e.mask, mask);
  // A default system prompt adds an unmasked block in front; the mask still sums to 3.
  auto s = encode_chat(conv, "sys", *tok, byte_marks(), true);
  EXPECT_EQ(std::accumulate(s.mask.begin(), s.mask.end(), 0), 3);
  EXPECT_EQ(s.ids.size(), ids.size() + 13 + 10);  // system block (1+7+3+1+1) + generation prompt (1+9)
}

TEST(ChatTemplate, RoundTrips) {
  auto tok = load_tokenizer(byte_tok_dir());
  for (const auto& conv : sample_conversations()) {
    const std::string text = render_chatml(conv, "you help", false);
    auto e = encode_chat(conv, "you help", *tok, byte_marks(), false);
    EXPECT_EQ(tok->encode(text, /*parse_special=*/true), e.ids);  // piecewise ids = tokenizing the text
    EXPECT_EQ(tok->decode(e.ids), text);
    auto back = parse_chatml(text);
    ASSERT_EQ(back.size(), conv.size() + (conv[0].role == "system" ? 0 : 1));
    for (size_t i = 0; i < conv.size(); ++i) {
      EXPECT_EQ(back[back.size() - conv.size() + i].role, conv[i].role);
      EXPECT_EQ(back[back.size() - conv.size() + i].content, conv[i].content);
    }
  }
  auto gen = render_chatml({{"user", "q"}}, "", true);
  EXPECT_EQ(gen, "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(parse_chatml(gen).size(), 1u);
  // The standard ChatML template string is recognised, with SmolLM2's default system prompt.
  const std::string dir = tmpdir("tmpl");
  nlohmann::json cfg = {{"chat_template",
                         "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                         "{{ '<|im_start|>system\\nYou are a helpful AI assistant<|im_end|>\\n' }}{% endif %}"
                         "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
                         "{% endfor %}"}};
  write_text(dir + "/tokenizer_config.json", cfg.dump());
  std::string note;
  auto f = chat_format_for(dir, &note);
  EXPECT_EQ(f.default_system, "You are a helpful AI assistant");
  EXPECT_NE(note.find("from"), std::string::npos) << note;
  write_text(dir + "/tokenizer_config.json", R"({"chat_template": "[INST] {{ message['content'] }} [/INST]"})");
  f = chat_format_for(dir, &note);
  EXPECT_NE(note.find("not ChatML"), std::string::npos) << note;
}

TEST(SftData, RecordFormsAndErrorsNameFileAndLine) {
  const std::string dir = tmpdir("data");
  const std::string good = dir + "/good.jsonl";
  write_text(good,
             R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})" "\n"
             R"({"instruction": "add", "input": "1 2", "output": "3"})" "\n\n"
             R"({"instruction": "greet", "instances": [{"input": "", "output": "hi"}, {"input": "x", "output": "y"}]})" "\n");
  auto recs = read_conversations(good);
  ASSERT_EQ(recs.size(), 4u);
  EXPECT_EQ(recs[1].messages[0].content, "add\n\n1 2");
  EXPECT_EQ(recs[1].messages[1].content, "3");
  EXPECT_EQ(recs[2].messages[0].content, "greet");  // empty input: instruction alone
  EXPECT_EQ(recs[3].line, 4);
  auto expect_error = [&](const std::string& line2, const std::string& what) {
    const std::string bad = dir + "/bad.jsonl";
    write_text(bad, R"({"instruction": "ok", "output": "fine"})" "\n" + line2 + "\n");
    try {
      read_conversations(bad);
      ADD_FAILURE() << "no error for " << line2;
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(bad + ":2:"), std::string::npos) << m;
      EXPECT_NE(m.find(what), std::string::npos) << m;
    }
  };
  expect_error(R"({"messages": [{"role": "robot", "content": "x"}]})", "expected role system, user or assistant");
  expect_error(R"({"messages": [{"role": "user"}]})", "messages[0]: expected a string field \"content\"");
  expect_error(R"({"messages": [{"role": "user", "content": "x"}]})", "at least one assistant message");
  expect_error(R"({"instruction": "x"})", "\"output\"");
  expect_error(R"({"instruction": "x", "instances": [{"input": "a"}]})", "instances[0]");
  expect_error(R"({"text": "plain"})", "expected a conversation");
  expect_error(R"({"messages": [)", "malformed JSON");
}

namespace {

// Summed assistant-token CE per document, in document order, for rows built from `chats`.
std::vector<double> per_document_loss(CausalLM& model, const std::vector<EncodedChat>& chats, int64_t seq_len,
                                      bool packing, bool packed_forward) {
  SftSource src(chats, seq_len, packing, 0, 0);
  torch::NoGradGuard ng;
  auto rows = src.rows();
  auto t = sft_token_losses(model, rows, packed_forward);
  std::vector<double> out;
  for (int64_t r = 0; r < rows.size(0); ++r) {
    const int64_t docs = rows[r][2].max().item<int64_t>() + 1;
    for (int64_t d = 0; d < docs; ++d)
      out.push_back((t.loss[r] * t.mask[r] * t.doc[r].eq(d).to(torch::kFloat)).sum().item<double>());
  }
  return out;
}

void expect_packing_exact(CausalLM& model, const std::string& what) {
  auto tok = load_tokenizer(byte_tok_dir());
  std::vector<EncodedChat> chats;
  for (const auto& c : sample_conversations()) chats.push_back(encode_chat(c, "", *tok, byte_marks(), false));
  // seq_len 200 packs all three into one row (about 40 + 80 + 80 tokens) ... or two.
  auto separate = per_document_loss(model, chats, 200, false, false);
  auto packed = per_document_loss(model, chats, 200, true, true);
  SftSource src(chats, 200, true, 0, 0);
  EXPECT_LT(src.num_rows(), 3) << what << ": the test needs documents sharing a row";
  ASSERT_EQ(separate.size(), packed.size()) << what;
  for (size_t i = 0; i < packed.size(); ++i) {
    EXPECT_GT(separate[i], 0) << what;
    EXPECT_NEAR(packed[i], separate[i], 1e-4 * separate[i]) << what << " document " << i;
  }
  // Without the boundaries the later documents' losses change: the check above has teeth.
  auto leaky = per_document_loss(model, chats, 200, true, false);
  double diff = 0;
  for (size_t i = 0; i < leaky.size(); ++i) diff += std::abs(leaky[i] - separate[i]);
  EXPECT_GT(diff, 1e-3) << what;
}

}  // namespace

TEST(SftPacking, TeacherBlockDiagonalMatchesSeparateDocuments) {
  auto teacher = tiny_teacher(263);
  expect_packing_exact(teacher, "teacher");
}

TEST(SftPacking, StudentsResetStateAtBoundaries) {
  auto teacher = tiny_teacher(263);
  for (const char* mixer : {"gated_deltanet", "deltanet", "gla", "retnet", "mlstm"}) {
    auto spec = StudentSpec::make(parse_mixer_kind(mixer), "default", {}, teacher->config);
    torch::manual_seed(2);
    auto student = build_student(teacher, spec);
    student->eval();
    expect_packing_exact(student, mixer);
  }
}

namespace {

std::string save_tiny(const std::string& name, CausalLM model) {
  const std::string dir = tmpdir(name);
  save_model(model, dir, byte_tok_dir());
  return dir;
}

std::string write_chat_data(const std::string& path) {
  std::string text;
  for (int rep = 0; rep < 3; ++rep)
    for (const auto& c : sample_conversations()) {
      nlohmann::json ms = nlohmann::json::array();
      for (const auto& m : c) ms.push_back({{"role", m.role}, {"content", m.content}});
      text += nlohmann::json({{"messages", ms}}).dump() + "\n";
    }
  write_text(path, text);
  return path;
}

}  // namespace

TEST(SftRun, TinyRunLowersAssistantLoss) {
  const std::string model = save_tiny("sft_teacher", tiny_teacher(263));
  SftOptions o;
  o.model = model;
  o.data = write_chat_data(tmpdir("sft_data") + "/chat.jsonl");
  o.out = tmpdir("sft_out");
  o.seq_len = 96;
  o.epochs = 40;
  o.packing = true;
  o.loop.batch = 2;
  o.loop.schedule.lr = 3e-3;
  o.loop.schedule.kind = ScheduleKind::cosine;
  o.loop.quiet = true;
  auto r = run_sft(o);
  ASSERT_TRUE(r.finished);
  EXPECT_GT(r.steps, 20);
  EXPECT_LT(r.loss_after, 0.6 * r.loss_before) << r.loss_before << " -> " << r.loss_after;
  auto reloaded = load_model(o.out);
  EXPECT_EQ(reloaded->config.vocab_size, 263);
  std::string note;
  chat_format_for(o.out, &note);
  EXPECT_NE(note.find("from"), std::string::npos) << note;  // sft wrote the ChatML template
}

TEST(SftRun, AddsChatTokensToASentencePieceModel) {
  LINEARIZE_REQUIRE_SENTENCEPIECE();
  const std::string model = test::data_dir() + "/models/stories260K";
  LINEARIZE_REQUIRE_PATH(model);
  SftOptions o;
  o.model = model;
  o.data = write_chat_data(tmpdir("sp_data") + "/chat.jsonl");
  o.out = tmpdir("sp_out");
  o.seq_len = 64;
  o.max_steps = 2;
  o.loop.batch = 2;
  o.loop.quiet = true;
  auto r = run_sft(o);
  ASSERT_TRUE(r.finished);
  auto m = load_model(o.out);
  EXPECT_EQ(m->config.vocab_size, 514);  // 512 + <|im_start|> + <|im_end|>
  auto tok = load_tokenizer(o.out);
  EXPECT_EQ(find_added_token(*tok, o.out, kImStart), 512);
  EXPECT_EQ(find_added_token(*tok, o.out, kImEnd), 513);
  auto base = load_model(model);
  EXPECT_TRUE(torch::allclose(m->model->embed_tokens->weight.narrow(0, 0, 512),
                              base->model->embed_tokens->weight, 1e-2, 1e-2));  // two small steps
  ChatOptions co;
  co.max_new_tokens = 5;
  ChatSession chat(m, *tok, o.out, co);
  chat.reply("Once upon a time");
  EXPECT_GT(chat.ids().size(), 10u);
}

namespace {

// Second reply of a two-turn chat, and the same reply generated from a full encode of the conversation.
void expect_chat_matches_reencode(CausalLM model, const std::string& what) {
  auto tok = load_tokenizer(byte_tok_dir());
  ChatOptions co;
  co.system = "be kind";
  co.max_new_tokens = 8;
  ChatSession chat(model, *tok, byte_tok_dir(), co);
  chat.reply("hi there");
  auto after_first = chat.ids();
  const std::string second = chat.reply("and then");
  std::vector<int32_t> prompt = after_first;
  encode_message({"user", "and then"}, *tok, chat.marks(), &prompt);
  auto g = encode_generation_prompt(*tok, chat.marks());
  prompt.insert(prompt.end(), g.begin(), g.end());
  GenerateOptions go;
  go.max_new_tokens = 8;
  go.stop_ids = {2, 1, 0};
  auto out = generate(model, prompt, go);  // from an empty state
  std::vector<int32_t> body;
  for (auto id : out)
    if (id > 2) body.push_back(id);
  EXPECT_EQ(tok->decode(body), second) << what;
  // ids() holds the whole conversation: prompt + reply + <|im_end|>\n.
  ASSERT_GE(chat.ids().size(), prompt.size() + 2);
  EXPECT_TRUE(std::equal(prompt.begin(), prompt.end(), chat.ids().begin())) << what;
  EXPECT_EQ(chat.ids()[chat.ids().size() - 2], 2) << what;
  chat.reset();
  EXPECT_TRUE(chat.conversation().empty());
}

}  // namespace

TEST(Chat, SecondTurnEqualsFullReencode) {
  auto teacher = tiny_teacher(263, 5);
  expect_chat_matches_reencode(teacher, "teacher");
  auto spec = StudentSpec::make(MixerKind::gated_deltanet, "default", {}, teacher->config);
  auto student = build_student(teacher, spec);
  student->eval();
  expect_chat_matches_reencode(student, "gated_deltanet");
}

TEST(Chat, ScriptedConversationThroughAPipe) {
  auto teacher = tiny_teacher(263, 7);
  auto spec = StudentSpec::make(MixerKind::gla, "default", {}, teacher->config);
  auto student = build_student(teacher, spec);
  student->eval();
  const std::string dir = tmpdir("chat_student");
  save_student(student, spec, dir, byte_tok_dir());
  const std::string cmd = "printf 'hello\\nwhat now\\n/exit\\nignored\\n' | " + std::string(LINEARIZE_BINARY) +
                          " chat --model " + dir + " --max-new-tokens 6 --system 'be kind' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  EXPECT_EQ(WEXITSTATUS(pclose(p)), 0) << out;
  auto loaded = load_model(dir);
  auto tok = load_tokenizer(dir);
  ChatOptions co;
  co.system = "be kind";
  co.max_new_tokens = 6;
  ChatSession chat(loaded, *tok, dir, co);
  const std::string a = chat.reply("hello"), b = chat.reply("what now");
  EXPECT_EQ(out, a + "\n" + b + "\n");
}

TEST(InstructEval, RougeLHandComputed) {
  EXPECT_EQ(rouge_tokens("Hello, World! It's 3pm."), (std::vector<std::string>{"hello", "world", "it", "s", "3pm"}));
  EXPECT_NEAR(rouge_l_f("The cat sat on the mat", "the cat is on the mat"), 5.0 / 6, 1e-12);  // LCS 5 of 6 and 6
  EXPECT_NEAR(rouge_l_f("A-B c", "a b"), 0.8, 1e-12);         // LCS 2: P 2/3, R 1
  EXPECT_NEAR(rouge_l_f("hello world", "world hello"), 0.5, 1e-12);  // LCS 1: P = R = 1/2
  EXPECT_NEAR(rouge_l_f("x y z", "a b"), 0.0, 1e-12);
  EXPECT_NEAR(rouge_l_f("", "a b"), 0.0, 1e-12);
  EXPECT_NEAR(rouge_l_f("a b c d", "a b c d"), 1.0, 1e-12);
}

TEST(InstructEval, ScoresItemsOfATinyModel) {
  auto tok = load_tokenizer(byte_tok_dir());
  auto model = tiny_teacher(263, 3);
  const std::string data = tmpdir("instruct") + "/items.jsonl";
  write_text(data, R"({"instruction": "say hi", "instances": [{"input": "", "output": "hi"}, {"input": "x", "output": "y"}]})" "\n"
                   R"({"instruction": "count", "input": "1 2", "output": "3"})" "\n");
  InstructOptions o;
  o.data = data;
  o.max_new_tokens = 4;
  auto r = evaluate_instruct(model, *tok, byte_tok_dir(), o);
  EXPECT_EQ(r["items"].get<int64_t>(), 2);  // one item per record
  EXPECT_GE(r["rouge_l"].get<double>(), 0.0);
  EXPECT_LE(r["rouge_l"].get<double>(), 1.0);
  EXPECT_EQ(r["samples"][1]["reference"], "3");
}

TEST(InstructEval, CommandLineAndHelp) {
  auto sh = [](const std::string& args) {
    FILE* p = popen((std::string(LINEARIZE_BINARY) + " " + args + " 2>&1").c_str(), "r");
    std::string out;
    std::array<char, 4096> buf;
    while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
    return std::make_pair(WEXITSTATUS(pclose(p)), out);
  };
  const std::string model = save_tiny("cli_instruct", tiny_teacher(263, 4));
  const std::string data = tmpdir("cli_instruct_data") + "/items.jsonl";
  write_text(data, R"({"instruction": "say hi", "output": "hi"})" "\n");
  auto [code, out] = sh("eval instruct --model " + model + " --data " + data + " --max-new-tokens 3 --json");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("\"rouge_l\""), std::string::npos) << out;
  for (const char* c : {"sft --help", "chat --help", "eval instruct --help"}) EXPECT_EQ(sh(c).first, 0) << c;
  EXPECT_NE(sh("distill --help").second.find("--recipe NAME"), std::string::npos);
  auto bad = sh("sft --model " + model + " --data " + data + "x --out " + tmpdir("never"));
  EXPECT_EQ(bad.first, 1);
  EXPECT_NE(bad.second.find(data + "x"), std::string::npos) << bad.second;
}
