#include "demo/demo.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <random>
#include <sstream>

#include "data/retrieval_episodes.h"
#include "data/synthetic_text.h"
#include "distill/stages.h"
#include "eval/niah.h"
#include "eval/perplexity.h"
#include "io/atomic_file.h"
#include "io/bpe_trainer.h"
#include "io/token_shards.h"
#include "io/tokenizer.h"
#include "model/mixers/mixer_config.h"
#include "model/model_io.h"
#include "report/study_reference.h"
#include "report/svg.h"
#include "train/pretrain.h"

namespace linearize {

namespace fs = std::filesystem;

namespace {

// Sizes of one demo run; --quick shrinks everything to fit about three minutes on 2 cores.
struct DemoPlan {
  int64_t documents, episodes, heldout_docs, vocab;  // English-like documents, retrieval episodes
  int64_t episode_min_chars, episode_max_chars, episode_needles, episode_questions;
  int64_t hidden, layers, heads, kv_heads, seq_len, batch, pretrain_steps;
  double pretrain_lr;
  int64_t distill_tokens;
  std::vector<int64_t> niah_lengths;
  int64_t niah_samples;
};

DemoPlan plan_for(bool quick) {
  DemoPlan p;
  if (quick) {
    p = {400, 1200, 20, 512, 150, 600, 5, 5, 64, 2, 4, 2, 128, 16, 320, 3e-3, 16 * 128 * 40, {128, 256, 512}, 10};
  } else {
    p = {1000, 3000, 40, 1024, 200, 1400, 5, 5, 128, 4, 4, 2, 256, 16, 250, 3e-3, 16 * 256 * 40, {128, 256, 512, 1024, 2048}, 10};
  }
  return p;
}

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void say(const std::string& s) { std::cerr << "[demo] " << s << std::endl; }

std::string fixed(double v, int digits) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(digits) << v;
  return o.str();
}

// S-NIAH-1 accuracy per context length, through the same code as `linearize eval niah`.
std::vector<std::pair<int64_t, double>> niah_accuracy(CausalLM& model, const Tokenizer& tok, const DemoPlan& p,
                                                      uint64_t seed) {
  NiahOptions o;
  o.task = "s_niah_1";
  o.lengths = p.niah_lengths;
  o.samples = p.niah_samples;
  o.max_new_tokens = 16;  // a 7-digit value, its full stop and the newline, with room to spare
  o.seed = seed;
  const auto r = run_niah(model, tok, o, niah_encoder(model, tok, "", false));
  std::vector<std::pair<int64_t, double>> out;
  for (int64_t l : p.niah_lengths) out.emplace_back(l, r["per_length"][std::to_string(l)].get<double>());
  return out;
}

DemoRow evaluate(const std::string& name, const std::string& folder, const std::vector<int32_t>& heldout,
                 const DemoPlan& p, uint64_t seed, torch::Device device) {
  LoadOptions lo;
  lo.device = device;
  auto model = load_model(folder, lo);
  auto tok = load_tokenizer(folder);
  DemoRow row;
  row.model = name;
  row.heldout_ppl = perplexity(model, heldout, p.seq_len, 8).ppl;
  row.recall = niah_accuracy(model, *tok, p, seed);
  for (auto& [l, a] : row.recall) row.recall_mean += a / static_cast<double>(row.recall.size());
  return row;
}

bool is_model_folder(const std::string& dir) {
  return fs::exists(fs::path(dir) / "config.json") && fs::exists(fs::path(dir) / "model.safetensors");
}

std::string table(const std::vector<DemoRow>& rows) {
  std::ostringstream o;
  o << "| model | held-out ppl | ppl recovery % |";
  for (auto& [l, a] : rows.front().recall) o << " S-NIAH-1 @" << l << " |";
  o << " S-NIAH-1 mean | recall recovery % | distill s |\n|---|---|---|";
  for (size_t i = 0; i < rows.front().recall.size(); ++i) o << "---|";
  o << "---|---|---|\n";
  for (const auto& r : rows) {
    o << "| " << r.model << " | " << fixed(r.heldout_ppl, 2) << " | " << fixed(r.ppl_recovery, 1) << " |";
    for (auto& [l, a] : r.recall) o << " " << fixed(100 * a, 0) << " |";
    o << " " << fixed(100 * r.recall_mean, 1) << " | " << fixed(r.recall_recovery, 1) << " | "
      << (r.model == "teacher" ? "-" : fixed(r.seconds, 0)) << " |\n";
  }
  return o.str();
}

// Mean S-NIAH-1 accuracy of the rows named, over the lengths where `keep(length)`; -1 when none.
double mean_recall(const std::vector<DemoRow>& rows, const std::vector<std::string>& names,
                   const std::function<bool(int64_t)>& keep) {
  double sum = 0;
  int n = 0;
  for (const auto& r : rows)
    if (std::find(names.begin(), names.end(), r.model) != names.end())
      for (auto& [l, a] : r.recall)
        if (keep(l)) sum += a, ++n;
  return n ? sum / n : -1;
}

std::string pct(double x) { return fixed(100 * x, 0) + "%"; }

// Two or three sentences on what the table shows, each number taken from it.
std::string findings(const std::vector<DemoRow>& rows, const DemoPlan& p) {
  std::ostringstream md;
  const auto all = [](int64_t) { return true; };
  const int64_t train_len = p.seq_len;
  const double t_in = mean_recall(rows, {"teacher"}, [&](int64_t l) { return l <= train_len; });
  const double t_out = mean_recall(rows, {"teacher"}, [&](int64_t l) { return l > train_len; });
  md << "The teacher, trained on " << train_len << "-token windows, finds the needle in " << pct(t_in)
     << " of the prompts up to that length";
  if (t_out >= 0) md << " and in " << pct(t_out) << " beyond it, where its positions were never trained";
  md << ". ";
  std::vector<const DemoRow*> students;
  for (const auto& r : rows)
    if (r.model != "teacher") students.push_back(&r);
  if (students.empty()) return md.str() + "\n";
  std::sort(students.begin(), students.end(), [](auto a, auto b) { return a->recall_mean > b->recall_mean; });
  const DemoRow& best = *students.front();
  const DemoRow& worst = *students.back();
  md << "Among the students " << best.model << " retrieves best (" << pct(best.recall_mean) << " on average, "
     << pct(best.recall.front().second) << " at " << best.recall.front().first << " tokens and "
     << pct(best.recall.back().second) << " at " << best.recall.back().first << ") and " << worst.model
     << " worst (" << pct(worst.recall_mean) << ")";
  const double delta = mean_recall(rows, {"deltanet", "gated_deltanet", "kda"}, all);
  const double additive = mean_recall(rows, {"linear_attention", "retnet", "gla"}, all);
  if (delta >= 0 && additive >= 0)
    md << "; the delta-rule mixers (DeltaNet, Gated DeltaNet, KDA) average " << pct(delta)
       << ", the additive ones (linear attention, RetNet, GLA) " << pct(additive);
  md << ". ";
  // The study's S-NIAH-1 at 2k against our longest length, over the mixers of this run.
  std::vector<double> ours, theirs;
  for (const auto* r : students)
    if (study_niah_2k().count(r->model)) ours.push_back(r->recall.back().second), theirs.push_back(study_niah_2k().at(r->model));
  const double rho = spearman(ours, theirs);
  md << "The study's S-NIAH-1 at 2k tokens (1.7B students) ranks Gated DeltaNet (81.8%) over mLSTM (25.2%) over "
        "KDA (2.0%) over the rest (0%)";
  if (std::isnan(rho))
    md << "; with every student at the same accuracy at " << rows.front().recall.back().first
       << " tokens, this run cannot rank them.";
  else
    md << "; our ranking at " << rows.front().recall.back().first << " tokens agrees with it at Spearman's rho = "
       << fixed(rho, 2) << " (1 = the same order, 0 = unrelated, -1 = reversed).";
  md << " With " << p.niah_samples << " samples per length a difference of 20 points is within the noise of "
     << "a single cell.\n";
  return md.str();
}

void write_report(const std::vector<DemoRow>& rows, const DemoOptions& o, const DemoPlan& p, const std::string& dir,
                  double total_seconds) {
  fs::create_directories(dir);
  // Figures: S-NIAH-1 against context length (one line per model), and the two recoveries per mixer.
  std::vector<Series> lines;
  for (const auto& r : rows) {
    Series s;
    s.name = r.model;
    for (auto& [l, a] : r.recall) s.points.emplace_back(static_cast<double>(l), 100 * a);
    lines.push_back(s);
  }
  std::vector<Bar> recall_bars, ppl_bars;
  for (const auto& r : rows) {
    if (r.model == "teacher") continue;
    recall_bars.push_back({r.model, r.recall_recovery});
    ppl_bars.push_back({r.model, r.ppl_recovery});
  }
  const std::vector<std::pair<std::string, std::string>> figures = {
      {"recall_by_length.svg", svg_line_chart("S-NIAH-1 accuracy vs context length", lines,
                                              "context length (tokens)", "accuracy %", true)},
      {"recall_recovery.svg", svg_bar_chart("Recall recovery (student / teacher)", recall_bars, "%", 100)},
      {"ppl_recovery.svg", svg_bar_chart("Perplexity recovery (teacher ppl / student ppl)", ppl_bars, "%", 100)},
  };
  for (const auto& [name, svg] : figures)
    write_file_atomic((fs::path(dir) / name).string(), [&](std::ostream& out) { out << svg; });

  std::ostringstream md;
  md << "# linearize demo" << (o.quick ? " (quick)" : "") << "\n\n"
     << "Seed " << o.seed << ". Teacher: Llama, hidden " << p.hidden << ", " << p.layers << " layers, " << p.heads
     << " heads (" << p.kv_heads << " KV), trained " << p.pretrain_steps << " steps of " << p.batch << " x "
     << p.seq_len << " tokens on " << p.documents << " generated documents and " << p.episodes
     << " retrieval episodes in RULER's NIAH form (BPE vocabulary " << p.vocab << "). Each student: three "
     << "distillation stages, " << p.distill_tokens << " tokens in all (splits 0.1 | 0.1 | 0.8). Recall: "
     << "S-NIAH-1 as RULER builds it (its noise haystack and key words, never in the training text), "
     << p.niah_samples << " samples per length, greedy. Total time " << fixed(total_seconds / 60, 1) << " min.\n\n"
     << table(rows) << "\n## What this run shows\n\n" << findings(rows, p)
     << "\nThese are tiny models on synthetic text: the numbers show the pipeline working and how the mixers "
        "behave at this scale, not the study's results.\n\n";
  for (const auto& [name, svg] : figures) md << "![" << name << "](" << name << ")\n\n";
  write_file_atomic((fs::path(dir) / "report.md").string(), [&](std::ostream& out) { out << md.str(); });

  nlohmann::json j = nlohmann::json::array();
  for (const auto& r : rows) {
    nlohmann::json rec = nlohmann::json::object();
    for (auto& [l, a] : r.recall) rec[std::to_string(l)] = a;
    j.push_back({{"model", r.model}, {"heldout_ppl", r.heldout_ppl}, {"ppl_recovery", r.ppl_recovery},
                 {"recall_task", "s_niah_1"}, {"recall", rec}, {"recall_mean", r.recall_mean},
                 {"recall_recovery", r.recall_recovery}, {"distill_seconds", r.seconds}, {"seed", o.seed},
                 {"quick", o.quick}, {"teacher_seq_len", p.seq_len}});
  }
  write_file_atomic((fs::path(dir) / "results.json").string(), [&](std::ostream& out) { out << j.dump(2) << "\n"; });
}

}  // namespace

std::vector<DemoRow> run_demo(const DemoOptions& o) {
  const auto t_start = Clock::now();
  const DemoPlan p = plan_for(o.quick);
  const fs::path root(o.out);
  fs::create_directories(root / "data");
  std::vector<std::string> mixers = o.mixers.empty() ? mixer_kinds() : o.mixers;

  // 1. Text: English-like documents with planted facts, and retrieval episodes in RULER's NIAH form whose
  // filler is the same grammar's sentences (the evaluation's noise haystack and key words are held out).
  EnglishLikeOptions co;
  co.documents = p.documents;
  co.seed = o.seed * 2 + 1;
  auto docs = english_like_documents(co);
  RetrievalEpisodeOptions eo;
  eo.min_chars = p.episode_min_chars;
  eo.max_chars = p.episode_max_chars;
  eo.max_needles = p.episode_needles;
  eo.max_questions = p.episode_questions;
  eo.key_adjectives = training_key_adjectives();
  eo.key_nouns = training_key_nouns();
  std::mt19937_64 episode_rng(o.seed * 2 + 3);
  std::vector<std::string> texts;
  for (size_t d = 0, e = 0; d < docs.size() || e < static_cast<size_t>(p.episodes);) {
    // Interleaved in proportion, so any slice of the stream holds both kinds.
    const bool episode = e < static_cast<size_t>(p.episodes) &&
                         (d >= docs.size() || e * docs.size() < d * static_cast<size_t>(p.episodes));
    if (episode) texts.push_back(retrieval_episode(episode_rng, english_like_sentence, eo)), ++e;
    else texts.push_back(docs[d++]);
  }
  co.documents = p.heldout_docs;
  co.seed = o.seed * 2 + 2;
  auto heldout_docs = english_like_documents(co);
  say("1/5 generated " + std::to_string(p.documents) + " documents, " + std::to_string(p.episodes) +
      " retrieval episodes and " + std::to_string(heldout_docs.size()) + " held-out documents");

  // 2. Tokenizer and teacher.
  const std::string tok_dir = (root / "tokenizer").string();
  if (!fs::exists(fs::path(tok_dir) / "tokenizer.json")) {
    BpeTrainOptions bo;
    bo.vocab_size = p.vocab;
    bo.isolate_digits = false;  // digit pairs and triples become tokens: values copy token by token
    auto trained = train_bpe_texts(texts, bo);
    trained.save(tok_dir);
  }
  auto tok = load_tokenizer(tok_dir);
  const int32_t eos = *tok->token_to_id("<|endoftext|>");
  auto encode_docs = [&](const std::vector<std::string>& ds) {
    std::vector<int32_t> ids;
    for (const auto& d : ds) {
      auto x = tok->encode(d, false);
      ids.insert(ids.end(), x.begin(), x.end());
      ids.push_back(eos);
    }
    return ids;
  };
  const std::string train_u32 = (root / "data" / "train.u32").string();
  auto train_ids = encode_docs(texts);
  write_token_shard(train_u32, train_ids);
  auto heldout_ids = encode_docs(heldout_docs);
  write_token_shard((root / "data" / "heldout.u32").string(), heldout_ids);
  say("2/5 tokenizer (" + std::to_string(tok->vocab_size()) + " tokens): " + std::to_string(train_ids.size()) +
      " training tokens; training the teacher");

  const std::string teacher_dir = (root / "teacher").string();
  if (!is_model_folder(teacher_dir)) {
    PretrainOptions po;
    po.tokenizer = tok_dir;
    po.data = train_u32;
    po.out = teacher_dir;
    po.hidden = p.hidden;
    po.layers = p.layers;
    po.heads = p.heads;
    po.kv_heads = p.kv_heads;
    po.seq_len = p.seq_len;
    po.loop.batch = p.batch;
    po.loop.steps = p.pretrain_steps;
    po.loop.schedule.lr = p.pretrain_lr;
    po.loop.schedule.kind = "cosine";
    po.loop.schedule.warmup_frac = 0.05;
    po.loop.seed = o.seed;
    po.loop.device = o.device;
    po.loop.log_every = std::max<int64_t>(1, p.pretrain_steps / 5);
    pretrain(po);
  }

  // 3. Students.
  std::vector<std::pair<std::string, double>> student_dirs;
  for (size_t i = 0; i < mixers.size(); ++i) {
    const auto& m = mixers[i];
    const std::string dir = (root / "students" / m).string();
    say("3/5 distilling " + m + " (" + std::to_string(i + 1) + "/" + std::to_string(mixers.size()) + ")");
    const auto t0 = Clock::now();
    if (!is_model_folder(dir)) {
      DistillOptions d;
      d.teacher = teacher_dir;
      d.data = train_u32;
      d.out = dir;
      d.mixer = m;
      d.seq_len = p.seq_len;
      d.tokens = p.distill_tokens;
      d.splits = {0.1, 0.1, 0.8};
      d.stage[0].lr = 3e-3;
      d.stage[1].lr = 2e-3;
      d.stage[2].lr = 1e-3;
      d.loop.batch = p.batch;
      d.loop.seed = o.seed;
      d.loop.device = o.device;
      d.loop.resume = true;
      d.loop.log_every = 1000000;  // one line per stage start and end
      distill(d);
    }
    student_dirs.emplace_back(dir, since(t0));
  }

  // 4. Evaluation.
  say("4/5 evaluating the teacher and " + std::to_string(mixers.size()) + " students (perplexity, S-NIAH-1 at " +
      std::to_string(p.niah_lengths.size()) + " context lengths)");
  std::vector<DemoRow> rows;
  rows.push_back(evaluate("teacher", teacher_dir, heldout_ids, p, o.seed + 99, o.device));
  for (size_t i = 0; i < mixers.size(); ++i) {
    auto row = evaluate(mixers[i], student_dirs[i].first, heldout_ids, p, o.seed + 99, o.device);
    row.seconds = student_dirs[i].second;
    rows.push_back(row);
  }
  const auto& t = rows.front();
  for (auto& r : rows) {
    r.ppl_recovery = 100.0 * t.heldout_ppl / r.heldout_ppl;
    r.recall_recovery = t.recall_mean > 0 ? 100.0 * r.recall_mean / t.recall_mean : 0;
  }

  // 5. Report.
  const std::string report_dir = (root / "report").string();
  write_report(rows, o, p, report_dir, since(t_start));
  std::cout << "\n" << table(rows) << "\n";
  say("5/5 report written to " + report_dir + "/report.md (" + fixed(since(t_start) / 60, 1) + " min)");
  return rows;
}

}  // namespace linearize
