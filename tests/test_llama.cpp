// The Llama teacher against Hugging Face transformers (../shared/golden/llama-*/reference.safetensors):
// logits, every per-layer tensor distillation reads, token NLL and greedy generation; and the KV-cache
// decode path against the full forward.
#include <filesystem>
#include <tuple>

#include "compat/torch_compat.h"
#include "eval/perplexity.h"
#include "infer/generate.h"
#include "infer/graphed_step.h"
#include "io/atomic_file.h"
#include "io/bpe_trainer.h"
#include "io/error.h"
#include "io/tokenizer.h"
#include "io/safetensors.h"
#include "model/model_io.h"
#include "model/packed_projections.h"
#include "model/student.h"
#include "test_util.h"

using namespace linearize;
namespace fs = std::filesystem;

namespace {

// Every golden folder holding a teacher's reference (config.json + model.safetensors + reference.safetensors):
// under LINEARIZE_GOLDEN (Llama) and the project's own tests/golden (Qwen2, Qwen3, Mistral; made by
// tests/golden/make_teacher_goldens.py).
std::vector<std::string> golden_llama_folders() {
  std::vector<std::string> out;
  for (const std::string& root : {test::golden_dir(), test::source_dir() + "/tests/golden"}) {
    if (!fs::is_directory(root)) continue;
    for (const auto& e : fs::directory_iterator(root))
      if (fs::exists(e.path() / "reference.safetensors") && fs::exists(e.path() / "config.json"))
        out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void check_golden_folder(const std::string& folder, torch::Device device) {
  SCOPED_TRACE(folder);
  LoadOptions lo;
  lo.device = device;
  auto model = load_model(folder, lo);
  SafetensorsFile ref(folder + "/reference.safetensors");
  auto ids = ref.get("input_ids").to(torch::kLong).to(device);
  Trace trace;
  torch::NoGradGuard ng;
  auto logits = model->forward(ids, nullptr, &trace);
  const double tol = 1e-4;
  EXPECT_LT(test::rel_err(logits, ref.get("logits")), tol) << "logits";
  for (int64_t i = 0; i < model->num_layers(); ++i) {
    const std::string s = "." + std::to_string(i);
    if (ref.contains("layer_in" + s)) {
      EXPECT_LT(test::rel_err(trace.layer_in[i], ref.get("layer_in" + s)), tol) << "layer_in" << s;
    }
    if (ref.contains("attn_in" + s)) {
      EXPECT_LT(test::rel_err(trace.attn_in[i], ref.get("attn_in" + s)), tol) << "attn_in" << s;
    }
    if (ref.contains("attn_out" + s)) {
      EXPECT_LT(test::rel_err(trace.attn_out[i], ref.get("attn_out" + s)), tol) << "attn_out" << s;
    }
    if (ref.contains("layer_out" + s)) {
      EXPECT_LT(test::rel_err(trace.layer_out[i], ref.get("layer_out" + s)), tol) << "layer_out" << s;
    }
  }
  EXPECT_LT(test::rel_err(trace.final_norm_out, ref.get("final_norm_out")), tol) << "final_norm_out";
  // Next-token NLL per position.
  auto lp = torch::log_softmax(logits.to(torch::kFloat), -1);
  auto nll = -lp.narrow(1, 0, ids.size(1) - 1).gather(-1, ids.narrow(1, 1, ids.size(1) - 1).unsqueeze(-1)).squeeze(-1);
  EXPECT_LT(test::rel_err(nll, ref.get("token_nll")), tol) << "token_nll";
  EXPECT_NEAR(nll.mean().item<double>(), ref.get("mean_nll").item<double>(), 1e-4);
  // Greedy generation, token for token.
  if (ref.contains("generate.prompt")) {
    auto prompt_t = ref.get("generate.prompt").to(torch::kInt).flatten();
    auto expect_t = ref.get("generate.output").to(torch::kInt).flatten();
    std::vector<int32_t> prompt(prompt_t.data_ptr<int32_t>(), prompt_t.data_ptr<int32_t>() + prompt_t.numel());
    std::vector<int32_t> expect(expect_t.data_ptr<int32_t>(), expect_t.data_ptr<int32_t>() + expect_t.numel());
    GenerateOptions go;
    go.max_new_tokens = static_cast<int64_t>(expect.size() - prompt.size());
    auto out = generate(model, prompt, go);
    std::vector<int32_t> full = prompt;
    full.insert(full.end(), out.begin(), out.end());
    EXPECT_EQ(full, expect);
  }
}

}  // namespace

TEST(LlamaGolden, MatchesTransformersOnCpu) {
  auto folders = golden_llama_folders();
  if (folders.empty()) GTEST_SKIP() << "skipped: no llama reference folders under " << test::golden_dir();
  for (const auto& f : folders) check_golden_folder(f, torch::kCPU);
}

TEST(CudaLlamaGolden, MatchesTransformers) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "skipped: CUDA not available";
  auto folders = golden_llama_folders();
  if (folders.empty()) GTEST_SKIP() << "skipped: no llama reference folders under " << test::golden_dir();
  for (const auto& f : folders) check_golden_folder(f, torch::kCUDA);
}

// KV-cache decoding one token at a time equals the full causal forward, for a GQA model with
// scaled RoPE; and a state snapshot taken mid-way resumes to the same logits.
// Rotary::apply keeps the last tables it made for every Rotary on the thread (the layers of a model share
// them): rotaries of other frequencies, positions, lengths and dtypes taking turns must each still rotate
// by their own angles, as apply_at (which makes its angles afresh every call) does.
TEST(Llama, RotaryTablesSharedBetweenLayersStayTheirOwn) {
  torch::manual_seed(3);
  const Rotary a(64, 10000.0), b(64, 500000.0), a_too(64, 10000.0);
  auto x = torch::randn({1, 2, 5, 64});
  auto positions = [](int64_t start, int64_t T) { return torch::arange(start, start + T).unsqueeze(0); };
  const auto want_a = a.apply_at(x, positions(3, 5)), want_b = b.apply_at(x, positions(3, 5));
  ASSERT_GT(test::rel_err(want_a, want_b), 1e-2) << "the two frequencies should rotate differently";
  for (int round = 0; round < 2; ++round) {
    EXPECT_LT(test::rel_err(a.apply(x, 3), want_a), 1e-6);
    EXPECT_LT(test::rel_err(b.apply(x, 3), want_b), 1e-6);
    EXPECT_LT(test::rel_err(a_too.apply(x, 3), want_a), 1e-6);
    EXPECT_LT(test::rel_err(a.apply(x, 4), a.apply_at(x, positions(4, 5))), 1e-6);
    EXPECT_LT(test::rel_err(a.apply(x.narrow(2, 0, 1), 3), want_a.narrow(2, 0, 1)), 1e-6);
    auto x16 = x.to(torch::kBFloat16);
    EXPECT_EQ(a.apply(x16, 3).scalar_type(), torch::kBFloat16);
    EXPECT_LT(test::rel_err(a.apply(x16, 3), a.apply_at(x16, positions(3, 5))), 1e-6);
  }
}

TEST(Llama, DecodeWithCacheEqualsFullForward) {
  torch::manual_seed(1);
  LlamaConfig c;
  c.vocab_size = 97; c.hidden_size = 48; c.intermediate_size = 64; c.num_hidden_layers = 2;
  c.num_attention_heads = 6; c.num_key_value_heads = 2; c.head_dim = 8; c.rope_theta = 1e4;
  c.rope_scaling.type = "linear"; c.rope_scaling.factor = 2.0; c.tie_word_embeddings = false;
  CausalLM model(c);
  init_weights_normal(*model, 0.2);
  torch::NoGradGuard ng;
  auto ids = torch::randint(0, c.vocab_size, {2, 19}, torch::kLong);
  auto full = model->forward(ids);
  ModelState st = model->new_state();
  auto first = model->forward(ids.narrow(1, 0, 7), &st);  // prefill 7 tokens
  EXPECT_LT(test::rel_err(first, full.narrow(1, 0, 7)), 1e-5);
  ModelState snapshot = st;
  std::vector<torch::Tensor> steps;
  for (int64_t t = 7; t < 19; ++t) steps.push_back(model->forward(ids.narrow(1, t, 1), &st));
  EXPECT_LT(test::rel_err(torch::cat(steps, 1), full.narrow(1, 7, 12)), 1e-5);
  EXPECT_EQ(st[0].position, 19);
  // Restore the snapshot: the same continuation again.
  auto again = model->forward(ids.narrow(1, 7, 12), &snapshot);
  EXPECT_LT(test::rel_err(again, full.narrow(1, 7, 12)), 1e-5);
}

// Packed for inference (model/packed_projections.h): q, k, v and the MLP's gate and up as one product
// each give the same logits, whole sequence and decode; the packed model saves and loads as any other;
// a move to another dtype ends the packing without changing the results.
TEST(Llama, PackedProjectionsGiveTheSameLogits) {
  torch::manual_seed(3);
  auto c = test::small_llama(61, 32, 2, 4, 2, 40);
  c.qkv_bias = c.o_bias = true;
  CausalLM model(c);
  init_weights_normal(*model, 0.2);
  torch::NoGradGuard ng;
  auto ids = torch::randint(0, c.vocab_size, {2, 11}, torch::kLong);
  auto run = [&](CausalLM& m) {  // whole sequence; prefill 10 tokens and decode the last
    ModelState st = m->new_state();
    auto prefix = m->forward(ids.narrow(1, 0, 10), &st);
    return std::make_pair(m->forward(ids), torch::cat({prefix, m->forward(ids.narrow(1, 10, 1), &st)}, 1));
  };
  const auto [full, stepped] = run(model);
  model->pack_projections();
  for (int64_t i = 0; i < model->num_layers(); ++i) {
    ASSERT_TRUE(model->layer(i)->mixer->projections_packed()) << "layer " << i;
    ASSERT_TRUE(model->layer(i)->mlp->gate_up.packed()) << "layer " << i;
  }
  const auto [packed_full, packed_stepped] = run(model);
  EXPECT_LT(test::rel_err(packed_full, full), 1e-5);
  EXPECT_LT(test::rel_err(packed_stepped, stepped), 1e-5);

  const std::string dir = (fs::temp_directory_path() / ("linearize_packed_" + std::to_string(::getpid()))).string();
  save_model(model, dir);
  LoadOptions lo;
  lo.inference = true;
  auto loaded = load_model(dir, lo);
  ASSERT_TRUE(loaded->layer(1)->mixer->projections_packed());
  EXPECT_LT(test::rel_err(loaded->forward(ids), full), 1e-5);
  remove_tree(dir);

  model->to(torch::kDouble);
  EXPECT_FALSE(model->layer(0)->mixer->projections_packed());
  EXPECT_FALSE(model->layer(0)->mlp->gate_up.packed());
  EXPECT_LT(test::rel_err(model->forward(ids).to(torch::kFloat), full), 1e-5);
}

// A packed group runs one product for a few rows (its outputs are views of one tensor) and the layers one by
// one for more than kMaxPackedRows rows; both give the layers' own outputs.
TEST(Llama, PackedProductOnlyForFewRows) {
  torch::manual_seed(6);
  torch::nn::Linear a(torch::nn::LinearOptions(8, 5)), b(torch::nn::LinearOptions(8, 3).bias(false));
  PackedProjections group;
  group.add(a);
  group.add(b);
  group.pack();
  ASSERT_TRUE(group.packed());
  torch::NoGradGuard ng;
  for (const int64_t rows : {int64_t{6}, PackedProjections::kMaxPackedRows + 1}) {
    SCOPED_TRACE(rows);
    const auto x = torch::randn({1, rows, 8});
    const auto out = group(x);
    EXPECT_EQ(out[a].storage().is_alias_of(out[b].storage()), rows <= PackedProjections::kMaxPackedRows);
    EXPECT_LT(test::rel_err(out[a], a(x)), 1e-6);
    EXPECT_LT(test::rel_err(out[b], b(x)), 1e-6);
  }
}

// A teacher's decode steps into a graph's fixed-capacity KV cache (through the graph's eager stand-in, so on
// any machine) give the growing cache's logits, with and without a sliding window; the state comes back as
// a growing cache that goes on the same; another state loads into the same buffers; a full cache is refused.
TEST(Llama, FixedCapacityCacheStepsMatchTheGrowingCache) {
  using Replay = GraphedDecodeStep::Replay;
  for (const int64_t window : {0, 5}) {
    SCOPED_TRACE("sliding window " + std::to_string(window));
    torch::manual_seed(5);
    auto c = test::small_llama(53, 32, 2, 4, 2, 40);
    c.sliding_window = window;
    CausalLM model(c);
    init_weights_normal(*model, 0.2);
    torch::NoGradGuard ng;
    const auto ids = torch::randint(0, c.vocab_size, {2, 20}, torch::kLong);
    ModelState st = model->new_state();
    model->forward(ids.narrow(1, 0, 7), &st);
    ModelState reference = st;
    std::string why;
    EXPECT_FALSE(GraphedDecodeStep::usable(model, st, &why, Replay::eager));
    EXPECT_NE(why.find("capacity"), std::string::npos) << why;
    const int64_t capacity = 17;
    ASSERT_TRUE(GraphedDecodeStep::usable(model, st, &why, Replay::eager, capacity)) << why;
    GraphedDecodeStep graph(model, st, 2, Replay::eager, capacity);
    for (int64_t t = 7; t < capacity; ++t) {
      const auto expected = model->forward(ids.narrow(1, t, 1), &reference);
      EXPECT_LT(test::rel_err(graph.step(ids.narrow(1, t, 1)), expected), 1e-5) << "token " << t;
    }
    EXPECT_THROW(graph.step(ids.narrow(1, capacity, 1)), Error);

    auto back = graph.state();
    ASSERT_EQ(back[0].position, capacity);
    EXPECT_FALSE(back[0].has("slot"));
    EXPECT_LT(test::rel_err(model->forward(ids.narrow(1, capacity, 3), &back),
                            model->forward(ids.narrow(1, capacity, 3), &reference)), 1e-5);

    ModelState other = model->new_state();  // 4 other tokens, then the same steps through the loaded graph
    const auto other_ids = torch::randint(0, c.vocab_size, {2, 8}, torch::kLong);
    model->forward(other_ids.narrow(1, 0, 4), &other);
    graph.load(other);
    for (int64_t t = 4; t < 8; ++t) {
      const auto expected = model->forward(other_ids.narrow(1, t, 1), &other);
      EXPECT_LT(test::rel_err(graph.step(other_ids.narrow(1, t, 1)), expected), 1e-5) << "loaded, token " << t;
    }
  }
}

// Attention with grouped KV heads (each KV head read by H / Hkv query heads, no copy) against fp64 scores with
// the heads spread, on the CPU and, where there is one, the GPU (flash in bf16): a whole causal sequence, one
// query over a cache, a block of queries over a longer cache (the bottom-right causal mask), no mask, and an
// explicit mask of packed documents (causal within each, rows packed differently).
TEST(Llama, GroupedAttentionMatchesSpreadHeads) {
  std::vector<torch::Device> devices{torch::kCPU};
  if (torch::cuda::is_available()) devices.push_back(torch::kCUDA);
  torch::manual_seed(7);
  const int64_t B = 2, H = 6, hkv = 2, D = 16;
  enum Mask { kNone, kCausal, kPacked };
  for (const auto device : devices)
    for (auto dt : {torch::kFloat, torch::kBFloat16}) {
      if (dt == torch::kBFloat16 && device.is_cpu()) continue;
      for (auto [tq, tk, kind] : std::vector<std::tuple<int64_t, int64_t, Mask>>{
               {9, 9, kCausal}, {1, 9, kCausal}, {4, 9, kCausal}, {5, 7, kNone}, {9, 9, kPacked}}) {
        auto opts = torch::TensorOptions().device(device).dtype(dt);
        auto q = torch::randn({B, H, tq, D}, opts), k = torch::randn({B, hkv, tk, D}, opts);
        auto v = torch::randn({B, hkv, tk, D}, opts);
        const double scale = 0.25;
        torch::Tensor visible;  // [B or 1, 1, Tq, Tk], true = attend
        if (kind == kCausal) visible = torch::ones({1, 1, tq, tk}, torch::kBool).tril(tk - tq);
        if (kind == kPacked) {  // documents [0,4) [4,9) in row 0, [0,2) [2,7) [7,9) in row 1
          auto doc = torch::tensor({0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 2, 2}, torch::kLong).view({B, tq});
          visible = doc.unsqueeze(2).eq(doc.unsqueeze(1)).logical_and(torch::ones({tq, tk}, torch::kBool).tril())
                        .unsqueeze(1);
        }
        auto got = kind == kPacked ? compat::attention(q, k, v, visible.to(device), scale)
                                   : compat::attention(q, k, v, kind == kCausal, scale);
        auto qd = q.to(torch::kCPU, torch::kDouble);
        auto kd = repeat_kv(k.to(torch::kCPU, torch::kDouble), H / hkv);
        auto vd = repeat_kv(v.to(torch::kCPU, torch::kDouble), H / hkv);
        auto scores = torch::matmul(qd, kd.transpose(-2, -1)) * scale;  // [B,H,Tq,Tk]
        if (visible.defined()) scores = scores.masked_fill(visible.logical_not(), -INFINITY);
        auto want = torch::matmul(torch::softmax(scores, -1), vd);
        const double err = test::rel_err(got.to(torch::kCPU, torch::kDouble), want);
        std::printf("[grouped attention] %s %s Tq=%ld Tk=%ld%s: %.1e\n", device.is_cpu() ? "cpu" : "cuda",
                    dt == torch::kFloat ? "fp32" : "bf16", static_cast<long>(tq), static_cast<long>(tk),
                    kind == kCausal ? " causal" : kind == kPacked ? " packed" : "", err);
        EXPECT_LT(err, dt == torch::kFloat ? 1e-5 : 1e-2) << tq << " " << tk << " " << kind;
      }
    }
}

// The KV cache is appended to in place (its storage stays while it has room, then grows by a block and keeps
// its entries), and a state and its snapshot stay each their own: the snapshot decodes other tokens into the
// entries the state has already filled, then both go on and each gives the full forward's logits of its tokens.
TEST(Llama, KvCacheGrowsInPlaceAndKeepsSnapshots) {
  torch::manual_seed(2);
  const LlamaConfig c = test::small_llama(53, 32, 2, 4, 2, 48);  // head size 8, 2 KV heads for 4
  CausalLM model(c);
  init_weights_normal(*model, 0.2);
  torch::NoGradGuard ng;
  const int64_t T = 262, fork = 251;
  auto ids = torch::randint(0, c.vocab_size, {2, T}, torch::kLong);
  auto other = ids.clone();
  other.narrow(1, fork, T - fork).random_(0, c.vocab_size);
  auto decode = [&](ModelState& st, const torch::Tensor& tokens, int64_t from, int64_t to) {
    std::vector<torch::Tensor> steps;
    for (int64_t t = from; t < to; ++t) steps.push_back(model->forward(tokens.narrow(1, t, 1), &st));
    return torch::cat(steps, 1);
  };
  ModelState st = model->new_state();
  model->forward(ids.narrow(1, 0, 248), &st);
  ASSERT_EQ(st[1].get("k").size(2), 256) << "capacity: whole blocks of 256 entries";
  const void* storage = st[1].get("k").data_ptr();
  auto first = decode(st, ids, 248, fork);
  EXPECT_EQ(st[1].get("k").data_ptr(), storage) << "a step with room left copied the cache";
  ModelState snapshot = st;  // at position `fork`
  auto mine = decode(st, ids, fork, 254);
  auto theirs = decode(snapshot, other, fork, 254);  // into the entries st has filled, were they shared
  mine = torch::cat({first, mine, decode(st, ids, 254, T)}, 1);
  theirs = torch::cat({theirs, decode(snapshot, other, 254, T)}, 1);
  EXPECT_EQ(st[1].get("k").size(2), 512);
  EXPECT_EQ(st[1].position, T);
  EXPECT_LT(test::rel_err(mine, model->forward(ids).narrow(1, 248, T - 248)), 1e-5);
  EXPECT_LT(test::rel_err(theirs, model->forward(other).narrow(1, fork, T - fork)), 1e-5);
}

// Activation recomputation changes memory, not numbers: the loss and every gradient equal those of a
// plain backward, for the teacher and a Gated DeltaNet student, also with the embedding frozen.
TEST(Llama, RecomputeGivesTheSameGradients) {
  torch::manual_seed(4);
  LlamaConfig c;
  c.vocab_size = 61; c.hidden_size = 32; c.intermediate_size = 48; c.num_hidden_layers = 3;
  c.num_attention_heads = 4; c.num_key_value_heads = 2; c.head_dim = 8; c.rope_theta = 1e4;
  c.tie_word_embeddings = true;
  CausalLM teacher(c);
  init_weights_normal(*teacher, 0.2);
  auto student = build_student(teacher, StudentSpec::make(MixerKind::gated_deltanet, "default", {}, c));
  auto ids = torch::randint(0, c.vocab_size, {2, 24}, torch::kLong);
  for (auto* model : {&teacher, &student}) {
    for (bool freeze_embedding : {false, true}) {
      (*model)->model->embed_tokens->weight.set_requires_grad(!freeze_embedding);
      std::vector<torch::Tensor> plain, recomputed;
      double loss_plain = 0, loss_recomputed = 0;
      for (bool recompute : {false, true}) {
        (*model)->recompute = recompute;
        (*model)->zero_grad();
        auto logits = (*model)->forward(ids.narrow(1, 0, 23));
        auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, c.vocab_size}), ids.narrow(1, 1, 23).reshape({-1}));
        loss.backward();
        (recompute ? loss_recomputed : loss_plain) = loss.item<double>();
        for (auto& p : (*model)->named_parameters())
          if (p.value().requires_grad()) {
            ASSERT_TRUE(p.value().grad().defined()) << p.key() << (recompute ? " (recomputed)" : "");
            (recompute ? recomputed : plain).push_back(p.value().grad().clone());
          }
      }
      (*model)->recompute = false;
      (*model)->model->embed_tokens->weight.set_requires_grad(true);
      EXPECT_EQ(loss_plain, loss_recomputed);
      ASSERT_EQ(plain.size(), recomputed.size());
      double worst = 0;
      for (size_t i = 0; i < plain.size(); ++i) worst = std::max(worst, test::rel_err(recomputed[i], plain[i]));
      EXPECT_LE(worst, 1e-6) << (model == &teacher ? "teacher" : "student") << (freeze_embedding ? ", frozen embedding" : "");
    }
  }
}

// Saving and loading a model folder reproduces the logits exactly; a tensor missing from the file is
// reported by name.
TEST(Llama, SaveLoadRoundTrip) {
  torch::manual_seed(2);
  LlamaConfig c;
  c.vocab_size = 50; c.hidden_size = 32; c.intermediate_size = 40; c.num_hidden_layers = 2;
  c.num_attention_heads = 4; c.num_key_value_heads = 4; c.head_dim = 8; c.rope_theta = 1e4;
  c.tie_word_embeddings = true; c.bos_token_id = 1; c.eos_token_ids = {2};
  c.raw = {{"model_type", "llama"}};
  CausalLM model(c);
  init_weights_normal(*model);
  const std::string dir = (fs::temp_directory_path() / ("linearize_rt_" + std::to_string(::getpid()))).string();
  save_model(model, dir);
  auto loaded = load_model(dir);
  auto ids = torch::randint(0, 50, {1, 9}, torch::kLong);
  torch::NoGradGuard ng;
  EXPECT_TRUE(torch::equal(model->forward(ids), loaded->forward(ids)));

  // Drop one tensor and save again: the loader names it.
  std::vector<std::pair<std::string, torch::Tensor>> ts;
  for (auto& p : model->named_parameters())
    if (p.key() != "model.layers.1.mlp.up_proj.weight") ts.emplace_back(p.key(), p.value());
  save_safetensors(dir + "/model.safetensors", ts);
  try {
    load_model(dir);
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("missing tensor \"model.layers.1.mlp.up_proj.weight\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
  }
}

// config.json is checked against the weights before anything is allocated: a vocabulary of a trillion
// tokens or a layer count the file lacks is one clear error; so are a tokenizer larger than the model's
// vocabulary and a shard index pointing outside the folder.
TEST(Llama, ConfigTokenizerAndShardsCheckedBeforeLoading) {
  torch::manual_seed(3);
  LlamaConfig c;
  c.vocab_size = 300; c.hidden_size = 16; c.intermediate_size = 32; c.num_hidden_layers = 2;
  c.num_attention_heads = 2; c.num_key_value_heads = 2; c.head_dim = 8; c.rope_theta = 1e4;
  c.tie_word_embeddings = true; c.eos_token_ids = {0};
  c.raw = {{"model_type", "llama"}};
  CausalLM model(c);
  init_weights_normal(*model);
  const std::string dir = (fs::temp_directory_path() / ("linearize_cfg_" + std::to_string(::getpid()))).string();
  save_model(model, dir);
  auto expect_error = [&](const std::string& what, auto&& fn) {
    try {
      fn();
      ADD_FAILURE() << "expected an error containing: " << what;
    } catch (const linearize::Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  const std::string config_path = dir + "/config.json";
  const std::string good = linearize::read_file(config_path);
  auto with = [&](const char* key, nlohmann::json v) {
    auto j = nlohmann::json::parse(good);
    j[key] = v;
    linearize::write_file_atomic(config_path, [&](std::ostream& o) { o << j.dump(); });
  };
  with("vocab_size", int64_t{1} << 40);
  expect_error("vocab_size and hidden_size say model.embed_tokens.weight is [1099511627776, 16] but the weights hold [300, 16]",
               [&] { load_model(dir); });
  with("num_hidden_layers", 3);
  expect_error("num_hidden_layers is 3 but the weights have no layer 2", [&] { load_model(dir); });
  with("num_hidden_layers", 1);
  expect_error("num_hidden_layers is 1 but the weights hold model.layers.1.", [&] { load_model(dir); });
  with("intermediate_size", 64);
  expect_error("intermediate_size and hidden_size say", [&] { load_model(dir); });
  with("vocab_size", 300);
  EXPECT_EQ(load_model(dir)->config.vocab_size, 300);

  // A byte-level tokenizer (259 tokens plus merges) against a model of 300 and of 200 tokens.
  linearize::BpeTrainOptions bo;
  bo.vocab_size = 280;
  linearize::train_bpe_texts({"the cat sat on the mat with the hat", "the dog sat on the log"}, bo).save(dir);
  EXPECT_LE(linearize::load_model_tokenizer(dir, c)->vocab_size(), 300);
  c.vocab_size = 200;
  expect_error("the tokenizer has", [&] { linearize::load_model_tokenizer(dir, c); });

  // Sharded weights whose index names a file outside the folder.
  fs::rename(dir + "/model.safetensors", dir + "/shard.safetensors");
  for (const char* bad : {"../shard.safetensors", "/etc/passwd", "sub/shard.safetensors"}) {
    linearize::write_file_atomic(dir + "/model.safetensors.index.json", [&](std::ostream& o) {
      o << nlohmann::json({{"weight_map", {{"model.embed_tokens.weight", bad}}}}).dump();
    });
    expect_error("expected a file name in the model's folder", [&] { load_model(dir); });
  }
  linearize::remove_tree(dir);
}

// The real tiny Llama from llama2.c: greedy generation from BOS reproduces llama2.c's text, and the
// NLL of golden.json's sentence matches llama2.c's.
TEST(Stories260K, GreedyMatchesLlama2c) {
  LINEARIZE_REQUIRE_SENTENCEPIECE();
  const std::string folder = test::data_dir() + "/models/stories260K";
  LINEARIZE_REQUIRE_PATH(folder);
  auto model = load_model(folder);
  auto tok = load_tokenizer(folder);
  std::string expected = read_file(folder + "/expected_greedy_200.txt");
  GenerateOptions go;
  go.max_new_tokens = 200;
  auto out = generate(model, {1}, go);
  StreamDecoder stream(*tok);
  std::string text;
  for (int32_t id : out) text += stream.push(id);
  text += stream.flush();
  auto trim = [](std::string s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    size_t i = 0;
    while (i < s.size() && (s[i] == '\n' || s[i] == ' ')) ++i;
    return s.substr(i);
  };
  EXPECT_EQ(trim(text), trim(expected));
}

TEST(Stories260K, SentenceNllMatchesLlama2c) {
  LINEARIZE_REQUIRE_SENTENCEPIECE();
  const std::string folder = test::data_dir() + "/models/stories260K";
  LINEARIZE_REQUIRE_PATH(folder + "/golden.json");
  auto golden = nlohmann::json::parse(read_file(folder + "/golden.json"));
  auto model = load_model(folder);
  auto tok = load_tokenizer(folder);
  std::vector<int32_t> ids = {1};
  auto body = tok->encode(golden["sentence"].get<std::string>());
  ids.insert(ids.end(), body.begin(), body.end());
  ASSERT_EQ(static_cast<int64_t>(ids.size()), golden["n_tokens"].get<int64_t>());
  auto r = perplexity(model, ids, static_cast<int64_t>(ids.size()), 1);
  const double tol = golden["tolerance"].get<double>();
  EXPECT_NEAR(r.nll * r.tokens, golden["nll"].get<double>(), tol * golden["nll"].get<double>());
  EXPECT_NEAR(r.ppl, golden["perplexity"].get<double>(), tol * golden["perplexity"].get<double>());
}
