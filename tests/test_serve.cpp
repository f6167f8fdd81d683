// The serving engine in process, on tiny models: one batched decoding step for rows at different
// positions against each row alone (teacher and every mixer), the engine's greedy outputs with many
// requests in flight against generate(), its refusals (queue full, over the context or the memory
// budget), cancellation, and the OpenAI request parser's errors.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "infer/generate.h"
#include "infer/sampler.h"
#include "io/error.h"
#include "io/tokenizer.h"
#include "model/model_io.h"
#include "model/student.h"
#include "serve/batched_decode.h"
#include "serve/engine.h"
#include "serve/openai_api.h"
#include "test_util.h"
#include "train_fixtures.h"

using namespace linearize;

namespace {

CausalLM tiny_teacher(uint64_t seed) {
  torch::manual_seed(seed);
  auto c = test::small_llama(263, 32, 2, 4, 2, 64);
  c.eos_token_ids = {0};
  c.max_position_embeddings = 256;
  CausalLM m(c);
  init_weights_normal(*m, 0.1);
  m->eval();
  return m;
}

CausalLM tiny_model(const std::string& name) {
  auto teacher = tiny_teacher(11);
  if (name == "teacher") return teacher;
  torch::manual_seed(12);
  auto s = build_student(teacher, StudentSpec::make(parse_mixer_kind(name), "default", {}, teacher->config));
  s->eval();
  return s;
}

std::vector<int32_t> prompt_of(int64_t length, int64_t seed) {
  std::vector<int32_t> ids(length);
  for (int64_t i = 0; i < length; ++i) ids[i] = static_cast<int32_t>(3 + (seed * 37 + i * 11) % 250);
  return ids;
}

std::shared_ptr<const Tokenizer> byte_tokenizer() {
  static std::string dir = test::write_byte_tokenizer(test::fresh_dir("serve", "tok"));
  return load_tokenizer(dir);
}

}  // namespace

TEST(BatchedDecode, RowsAtDifferentPositionsMatchEachRowAlone) {
  torch::NoGradGuard no_grad;
  std::vector<std::string> models = {"teacher"};
  for (const auto& k : mixer_kinds()) models.push_back(k);
  for (const auto& name : models) {
    SCOPED_TRACE(name);
    auto model = tiny_model(name);
    const std::vector<int64_t> lengths = {5, 1, 12};  // three rows, three positions
    std::vector<ModelState> together, alone;
    std::vector<int32_t> next;
    for (size_t i = 0; i < lengths.size(); ++i) {
      auto p = prompt_of(lengths[i], static_cast<int64_t>(i));
      auto ids = torch::tensor(std::vector<int64_t>(p.begin(), p.end()), torch::kLong).unsqueeze(0);
      together.push_back(model->new_state());
      model->forward(ids, &together.back());
      alone.push_back(together.back());
      next.push_back(static_cast<int32_t>(7 + 5 * i));
    }
    double worst = 0;
    for (int step = 0; step < 4; ++step) {
      std::vector<DecodeRow> rows;
      for (size_t i = 0; i < lengths.size(); ++i) rows.push_back({&together[i], next[i]});
      auto batched = decode_rows(model, rows);  // [3, V]
      ASSERT_EQ(batched.size(0), 3);
      for (size_t i = 0; i < lengths.size(); ++i) {
        auto one = model->forward(torch::full({1, 1}, next[i], torch::kLong), &alone[i]).select(1, -1)[0];
        worst = std::max(worst, test::rel_err(batched[static_cast<int64_t>(i)], one));
        EXPECT_EQ(together[i][0].position, alone[i][0].position);
        next[i] = static_cast<int32_t>(one.argmax().item<int64_t>());
      }
    }
    EXPECT_LT(worst, 1e-5) << name;
    // The states carried on from the batch give what the row's own state gives.
    for (size_t i = 0; i < lengths.size(); ++i) {
      auto a = model->forward(torch::full({1, 1}, 9, torch::kLong), &together[i]);
      auto b = model->forward(torch::full({1, 1}, 9, torch::kLong), &alone[i]);
      EXPECT_LT(test::rel_err(a, b), 1e-5) << name << " row " << i;
    }
  }
}

// Prompts prefilled together (a shared batch of the first P tokens, then each tail alone) give each
// prompt's own logits and a state that decodes on as the prompt's own does, for the teacher, every mixer
// and a hybrid.
TEST(BatchedDecode, PromptsPrefilledTogetherMatchEachPromptAlone) {
  torch::NoGradGuard no_grad;
  std::vector<std::string> models = {"teacher", "hybrid"};
  for (const auto& k : mixer_kinds()) models.push_back(k);
  for (const auto& name : models) {
    SCOPED_TRACE(name);
    CausalLM model = name == "hybrid" ? tiny_teacher(11) : tiny_model(name);
    if (name == "hybrid") {
      torch::manual_seed(12);
      model = build_student(model, StudentSpec::make(MixerKind::gated_deltanet, "default", {1}, model->config));
      model->eval();
    }
    const std::vector<int64_t> lengths = {9, 14, 9, 30, 17};  // shared part: the first 8 tokens of each
    std::vector<std::vector<int32_t>> prompts;
    std::vector<ModelState> together(lengths.size()), alone;
    std::vector<const std::vector<int32_t>*> ptrs;
    std::vector<ModelState*> states;
    for (size_t i = 0; i < lengths.size(); ++i) prompts.push_back(prompt_of(lengths[i], static_cast<int64_t>(i)));
    for (size_t i = 0; i < lengths.size(); ++i) ptrs.push_back(&prompts[i]), states.push_back(&together[i]);
    const auto logits = prefill_rows(model, ptrs, states);
    ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{5, model->config.vocab_size}));
    for (size_t i = 0; i < lengths.size(); ++i) {
      alone.push_back(model->new_state());
      auto ids = torch::tensor(std::vector<int64_t>(prompts[i].begin(), prompts[i].end()), torch::kLong).unsqueeze(0);
      const auto own = model->forward(ids, &alone.back()).select(1, -1)[0];
      EXPECT_LT(test::rel_err(logits[static_cast<int64_t>(i)], own), 1e-5) << "row " << i;
      EXPECT_EQ(together[i][0].position, lengths[i]);
    }
    // Decoding on: rows batched from the prefilled states against each prompt's own state.
    std::vector<DecodeRow> rows;
    for (size_t i = 0; i < lengths.size(); ++i) rows.push_back({&together[i], static_cast<int32_t>(5 + i)});
    const auto next = decode_rows(model, rows);
    for (size_t i = 0; i < lengths.size(); ++i) {
      const auto own = model->forward(torch::full({1, 1}, static_cast<int64_t>(5 + i), torch::kLong), &alone[i]).select(1, -1)[0];
      EXPECT_LT(test::rel_err(next[static_cast<int64_t>(i)], own), 1e-5) << "row " << i;
    }
  }
  // One prompt: nothing shared; an empty prompt is refused.
  auto model = tiny_model("teacher");
  std::vector<int32_t> one = prompt_of(6, 1), none;
  ModelState s1, s2;
  EXPECT_EQ(prefill_rows(model, {&one}, {&s1}).size(0), 1);
  EXPECT_THROW(prefill_rows(model, {&one, &none}, {&s1, &s2}), Error);
}

// Also through graphs (their eager stand-in here; the CUDA graphs themselves are checked against eager
// steps in test_cuda_mixers.cpp): students position-free step in a graph per batch size, padded to a power
// of two and refilled when the rows change; the teacher and RetNet stay eager.
TEST(BatchedDecode, AStackedBatchKeptAcrossStepsAndChangesMatchesEachRowAlone) {
  torch::NoGradGuard no_grad;
  for (const auto& [name, graphs] : std::vector<std::pair<std::string, DecodeGraphs>>{
           {"teacher", DecodeGraphs::off}, {"retnet", DecodeGraphs::off}, {"kda", DecodeGraphs::off},
           {"teacher", DecodeGraphs::stand_in}, {"retnet", DecodeGraphs::stand_in}, {"kda", DecodeGraphs::stand_in},
           {"gla", DecodeGraphs::stand_in}, {"mlstm", DecodeGraphs::stand_in}}) {
    SCOPED_TRACE(name + (graphs == DecodeGraphs::stand_in ? " with graphs" : ""));
    auto model = tiny_model(name);
    std::vector<ModelState> together, alone;
    for (int64_t len : {6, 2, 9}) {
      auto p = prompt_of(len, len);
      together.push_back(model->new_state());
      model->forward(torch::tensor(std::vector<int64_t>(p.begin(), p.end()), torch::kLong).unsqueeze(0), &together.back());
      alone.push_back(together.back());
    }
    DecodeBatch batch(model, graphs);
    double worst = 0;
    // Steps 0-2: all three rows (stacked once); steps 3-4: row 1 has left; step 5: it is back, first.
    for (int step = 0; step < 6; ++step) {
      std::vector<size_t> order = step < 3 ? std::vector<size_t>{0, 1, 2} : step < 5 ? std::vector<size_t>{0, 2}
                                                                                     : std::vector<size_t>{1, 0, 2};
      if (step == 3) batch.flush();  // the engine flushes before a row leaves
      std::vector<DecodeRow> rows;
      for (size_t i : order) rows.push_back({&together[i], static_cast<int32_t>(10 + step + 3 * i)});
      auto logits = batch.step(rows);
      for (size_t k = 0; k < order.size(); ++k) {
        const size_t i = order[k];
        auto one = model->forward(torch::full({1, 1}, 10 + step + 3 * static_cast<int64_t>(i), torch::kLong), &alone[i]);
        worst = std::max(worst, test::rel_err(logits[static_cast<int64_t>(k)], one.select(1, -1)[0]));
      }
    }
    batch.flush();
    EXPECT_LT(worst, 1e-5);
    // Graphs for 4 rows (three padded) and 2; the third batch refills the first.
    const bool graphed = graphs == DecodeGraphs::stand_in && name != "teacher" && name != "retnet";
    EXPECT_EQ(batch.graphs_captured(), graphed ? 2 : 0);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(together[i][0].position, alone[i][0].position);
      auto a = model->forward(torch::full({1, 1}, 5, torch::kLong), &together[i]);
      auto b = model->forward(torch::full({1, 1}, 5, torch::kLong), &alone[i]);
      EXPECT_LT(test::rel_err(a, b), 1e-5) << "row " << i;
    }
  }
}

// The engine picks each step's tokens for the whole batch at once (one transfer from the device): row i
// gets what its own sampler gives it alone, greedy (ties to the first maximum) or seeded sampling.
TEST(Sampling, NextTokensOfABatchAreEachRowsOwn) {
  torch::manual_seed(4);
  auto logits = torch::randn({5, 40});
  logits[2][7] = logits[2][31] = 9.0;  // a tie: the first maximum wins
  std::vector<SamplingOptions> options(5);
  for (int pass = 0; pass < 2; ++pass) {  // all greedy (argmax over the batch), then mixed
    if (pass == 1) {
      options[1].greedy = false, options[1].temperature = 0.8, options[1].seed = 7;
      options[3].greedy = false, options[3].top_p = 0.5, options[3].seed = 9;
    }
    std::vector<Sampler> batch, alone;
    for (const auto& o : options) batch.emplace_back(o), alone.emplace_back(o);
    std::vector<Sampler*> ptrs;
    for (auto& b : batch) ptrs.push_back(&b);
    for (int step = 0; step < 3; ++step) {
      const auto got = next_tokens(logits, ptrs);
      ASSERT_EQ(got.size(), 5u);
      for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(got[i], alone[i].next(logits[i])) << "pass " << pass << " row " << i;
      EXPECT_EQ(got[2], 7);
    }
  }
  std::vector<Sampler*> too_few;
  EXPECT_THROW(next_tokens(logits, too_few), Error);
}

TEST(Engine, ManyRequestsInFlightGiveTheGreedyTokensOfGenerate) {
  for (const std::string name : {"teacher", "gated_deltanet", "retnet"}) {
    SCOPED_TRACE(name);
    auto model = tiny_model(name);
    auto tok = byte_tokenizer();
    // Expected: generate() alone, greedy, on 16 prompts of different lengths.
    std::vector<std::vector<int32_t>> prompts;
    std::vector<std::string> expected;
    for (int i = 0; i < 16; ++i) {
      prompts.push_back(prompt_of(1 + (i * 7) % 23, i));
      GenerateOptions go;
      go.max_new_tokens = 12 + i % 5;
      auto out = generate(model, prompts.back(), go);
      StreamDecoder d(*tok);
      for (auto id : prompts.back()) d.push(id);
      std::string text;
      for (auto id : out) text += d.push(id);
      expected.push_back(text + d.flush());
    }
    // Prompts prefilled alone, or together where they join together; and steps through graphs (their
    // eager stand-in).
    for (const auto& [prefill, graphs] : std::vector<std::pair<int64_t, DecodeGraphs>>{
             {1, DecodeGraphs::off}, {8192, DecodeGraphs::off}, {8192, DecodeGraphs::stand_in}}) {
      SCOPED_TRACE("max_prefill_tokens " + std::to_string(prefill) + (graphs == DecodeGraphs::stand_in ? ", graphs" : ""));
      EngineOptions eo;
      eo.max_sequences = 16;
      eo.max_prefill_tokens = prefill;
      eo.graphs = graphs;
      Engine engine(model, tok, eo);
      std::vector<std::shared_ptr<Generation>> gens;
      for (int i = 0; i < 16; ++i) {
        GenerationRequest r;
        r.prompt = prompts[i];
        r.decode_after = prompts[i];
        r.max_tokens = 12 + i % 5;
        gens.push_back(engine.submit(r));
      }
      for (int i = 0; i < 16; ++i) {
        std::string text;
        Generation::Update u;
        do {
          u = gens[i]->wait(std::chrono::milliseconds(100));
          text += u.text;
        } while (u.finish == Finish::running);
        EXPECT_EQ(u.finish, Finish::length) << "request " << i;
        EXPECT_EQ(u.completion_tokens, 12 + i % 5);
        EXPECT_EQ(text, expected[i]) << "request " << i;
      }
      const auto s = engine.stats();
      EXPECT_LT(s.steps, 16 * 16) << "the requests were not batched";
      // A warm-up request (serve runs one on a GPU before listening) ends and leaves nothing behind.
      EXPECT_GE(engine.warm_up(), 0.0);
      const auto after = engine.stats();
      EXPECT_EQ(after.running, 0);
      EXPECT_EQ(after.waiting, 0);
      EXPECT_EQ(after.reserved_bytes, 0);
      EXPECT_EQ(s.running, 0);
      EXPECT_EQ(s.reserved_bytes, 0);
    }
  }
}

TEST(Engine, RefusesWhatCannotFitAndFreesCancelledSequences) {
  auto model = tiny_model("teacher");
  auto tok = byte_tokenizer();
  EngineOptions eo;
  eo.max_sequences = 1;
  eo.max_queue = 1;
  Engine engine(model, tok, eo);
  auto request = [&](int64_t max_tokens, int64_t prompt = 4) {
    GenerationRequest r;
    r.prompt = prompt_of(prompt, 1);
    r.max_tokens = max_tokens;
    return r;
  };
  auto status_of = [&](const GenerationRequest& r) {
    try {
      engine.submit(r);
    } catch (const RequestRefused& e) {
      return e.status;
    }
    return 200;
  };
  EXPECT_EQ(status_of(request(300)), 400);  // over the 256-token context
  EXPECT_EQ(status_of(request(0)), 400);
  EXPECT_EQ(status_of(request(4, 0)), 400);  // empty prompt
  // One running, one waiting, the third refused with 429.
  auto a = engine.submit(request(200));
  for (int i = 0; i < 100 && engine.stats().running == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  auto b = engine.submit(request(200));
  EXPECT_EQ(status_of(request(200)), 429);
  // Cancelling frees the slots: both end as cancelled or finished, and nothing stays reserved.
  a->cancel();
  b->cancel();
  for (auto& g : {a, b}) {
    Generation::Update u;
    do u = g->wait(std::chrono::milliseconds(100));
    while (u.finish == Finish::running);
  }
  for (int i = 0; i < 100 && engine.stats().running > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(engine.stats().running, 0);
  EXPECT_EQ(engine.stats().reserved_bytes, 0);

  // A memory budget of two full-length teacher sequences: a third waits until one ends.
  EngineOptions small;
  small.max_memory_gib = 2.0 * static_cast<double>(engine.state_bytes_for(256)) / (1024.0 * 1024 * 1024);
  Engine bounded(model, tok, small);
  std::vector<std::shared_ptr<Generation>> gens;
  for (int i = 0; i < 3; ++i) gens.push_back(bounded.submit(request(200)));
  int64_t most = 0;
  for (auto& g : gens) {
    Generation::Update u;
    do {
      u = g->wait(std::chrono::milliseconds(5));
      most = std::max(most, bounded.stats().running);
    } while (u.finish == Finish::running);
    EXPECT_EQ(u.finish, Finish::length);
  }
  EXPECT_EQ(most, 2);
  EXPECT_EQ(status_of(request(1)), 200);
}

TEST(Engine, StopStringsEndTheTextBeforeThem) {
  auto model = tiny_model("gla");
  auto tok = byte_tokenizer();
  GenerateOptions go;
  go.max_new_tokens = 30;
  const auto prompt = prompt_of(6, 3);
  auto out = generate(model, prompt, go);
  StreamDecoder d(*tok);
  for (auto id : prompt) d.push(id);
  std::string full;
  for (auto id : out) full += d.push(id);
  full += d.flush();
  ASSERT_GE(full.size(), 8u);
  const std::string stop = full.substr(5, 2);
  Engine engine(model, tok, EngineOptions{});
  GenerationRequest r;
  r.prompt = prompt;
  r.decode_after = prompt;
  r.max_tokens = 30;
  r.stop = {stop};
  auto g = engine.submit(r);
  std::string text;
  Generation::Update u;
  do {
    u = g->wait(std::chrono::milliseconds(100));
    text += u.text;
  } while (u.finish == Finish::running);
  EXPECT_EQ(u.finish, Finish::stop);
  EXPECT_EQ(text, full.substr(0, full.find(stop)));
}

TEST(OpenAiApi, BadRequestsNameTheField) {
  auto field_of = [](const std::string& body, bool chat = false) -> std::string {
    try {
      parse_completion_call(body, chat, "m");
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << body;
      EXPECT_EQ(e.body()["error"]["type"], "invalid_request_error");
      return e.param.empty() ? "(none)" : e.param;
    }
    return "(accepted)";
  };
  EXPECT_EQ(field_of("{not json"), "(none)");
  EXPECT_EQ(field_of("[1,2]"), "(none)");
  EXPECT_EQ(field_of(R"({"prompt": "a"})"), "model");
  EXPECT_EQ(field_of(R"({"model": "other", "prompt": "a"})"), "model");
  EXPECT_EQ(field_of(R"({"model": 3, "prompt": "a"})"), "model");
  EXPECT_EQ(field_of(R"({"model": "m"})"), "prompt");
  EXPECT_EQ(field_of(R"({"model": "m", "prompt": 5})"), "prompt");
  EXPECT_EQ(field_of(R"({"model": "m", "prompt": [1, "a"]})"), "prompt");
  EXPECT_EQ(field_of(R"({"model": "m", "prompt": [3, 4, 5]})"), "(accepted)");
  EXPECT_EQ(field_of(R"({"model": "m", "prompt": "a", "max_tokens": 0})"), "max_tokens");
  EXPECT_EQ(field_of(R"({"model": "m", "prompt": "a", "max_tokens": "9"})"), "max_tokens");
  EXPECT_EQ(field_of(R"({"model": "m", "prompt": "a", "max_tokens": 1.5})"), "max_tokens");
  EXPECT_EQ(field_of(R"({"model": "m", "prompt": "a", "temperature": 3})"), "temperature");
  EXPECT_EQ(field_of(R"({"model": "m", "prompt": "a", "temperature": "hot"})"), "temperature");
  EXPECT_EQ(field_of(R"({"model": "m", "prompt": "a", "top_p": 0})"), "top_p");
  EXPECT_EQ(field_of(R"({"model": "m", "prompt": "a", "stop": 7})"), "stop");
  EXPECT_EQ(field_of(R"({"model": "m", "prompt": "a", "stop": ["a","b","c","d","e"]})"), "stop");
  EXPECT_EQ(field_of(R"({"model": "m", "prompt": "a", "stop": [""]})"), "stop");
  EXPECT_EQ(field_of(R"({"model": "m", "prompt": "a", "stream": "yes"})"), "stream");
  EXPECT_EQ(field_of(R"({"model": "m", "prompt": "a", "n": 2})"), "n");
  EXPECT_EQ(field_of(R"({"model": "m", "prompt": "a", "seed": "x"})"), "seed");
  EXPECT_EQ(field_of(R"({"model": "m", "messages": []})", true), "messages");
  EXPECT_EQ(field_of(R"({"model": "m", "messages": [{"role": "robot", "content": "x"}]})", true), "messages[0].role");
  EXPECT_EQ(field_of(R"({"model": "m", "messages": [{"role": "user"}]})", true), "messages[0].content");
  EXPECT_EQ(field_of(R"({"model": "m", "messages": [{"role": "user", "content": 4}]})", true), "messages[0].content");
  EXPECT_EQ(field_of(R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -1})", true),
            "max_completion_tokens");
  // Accepted: the forms clients send, and fields this server does not know.
  EXPECT_EQ(field_of(R"({"model": "m", "prompt": ["a"], "max_tokens": 3, "temperature": 0, "stop": "x", "user": "u"})"),
            "(accepted)");
  auto c = parse_completion_call(
      R"({"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
          "stream": true, "stream_options": {"include_usage": true}, "seed": 4})",
      true, "m");
  ASSERT_EQ(c.messages.size(), 2u);
  EXPECT_EQ(c.messages[1].content, "hi");
  EXPECT_TRUE(c.stream && c.include_usage);
  EXPECT_EQ(*c.seed, 4u);
}
