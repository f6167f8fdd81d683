#include "demo/demo.h"

#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "compat/child_process.h"
#include "compat/cpu_threads.h"
#include "data/retrieval_episodes.h"
#include "data/retrieval_mixtures.h"
#include "data/synthetic_text.h"
#include "distill/stages.h"
#include "eval/niah.h"
#include "eval/perplexity.h"
#include "io/atomic_file.h"
#include "io/error.h"
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

// Sizes of one demo run; --quick shrinks everything to fit about three minutes on 2 cores. The teacher
// is small and takes small batches: what it must learn (to find the needle and copy its value) comes
// after some thousands of optimizer steps, and a step of 4 short windows is the cheapest on two cores.
// Two heads of 32 channels (one KV head) retrieve better than four of 16 and train faster on one thread:
// at 256 tokens 85-95% against 65% (docs/demo.md).
struct DemoPlan {
  int64_t sample_documents, sample_episodes, heldout_docs, vocab;  // text the tokenizer is trained on
  int64_t hidden, layers, heads, kv_heads, seq_len, batch, pretrain_steps;
  double pretrain_lr;
  int64_t distill_batch, distill_tokens;
  std::vector<int64_t> niah_lengths;
  int64_t niah_samples;
};

// The full run's students get 768k tokens each: with 307k none of them retrieved; with 768k the
// delta-rule students find most needles at 160 tokens and the additive mixers none (docs/demo.md).
DemoPlan plan_for(bool quick) {
  if (quick) return {100, 1000, 20, 1024, 64, 2, 2, 1, 128, 4, 4000, 3e-3, 8, 8 * 128 * 120, {160, 256, 512}, 10};
  return {200, 2000, 40, 1024, 64, 2, 2, 1, 256, 4, 14000, 3e-3, 8, 8 * 256 * 375, {160, 256, 512, 1024}, 20};
}

// The training data, generated on the fly (train/training_data.h): RULER-form retrieval episodes with one
// needle, copy drills ("the codes are A B. again, the codes are A B.": dense practice for the induction that
// copying a needle's value token by token needs) and English-like documents. Without the drills a teacher
// of this size did not learn to retrieve within the budget. The full run adds long episodes (300-800
// characters, up to its training length), without which it retrieved only at the shortest length; the quick
// one trains on 128-token windows and leans on the drills, which teach retrieval in the fewest steps.
nlohmann::json demo_mixture(bool quick) {
  auto episodes = [](double weight, int64_t min_chars, int64_t max_chars) {
    return nlohmann::json{{"generator", "retrieval_episodes"}, {"weight", weight}, {"min_chars", min_chars},
                          {"max_chars", max_chars}, {"max_needles", 1}, {"max_questions", 1}};
  };
  auto drills = [](double weight) {
    return nlohmann::json{{"generator", "copy_drills"}, {"weight", weight}, {"max_values", 4}};
  };
  auto english = [](double weight) { return nlohmann::json{{"generator", "english_like"}, {"weight", weight}}; };
  if (quick) return copy_drill_mixture();
  return {{"sources", {episodes(0.35, 0, 300), episodes(0.25, 300, 800), drills(0.3), english(0.1)}}};
}

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void say(const std::string& s) { std::cerr << "[demo] " << s << std::endl; }

std::string fixed(double v, int digits) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(digits) << v;
  return o.str();
}

// "retrieval episodes 60%, copy drills 30%, English-like documents 10%": the mixture in words, summed by kind.
std::string mixture_summary(const nlohmann::json& mixture) {
  const std::vector<std::pair<std::string, std::string>> names = {
      {"retrieval_episodes", "retrieval episodes in RULER's NIAH form"},
      {"copy_drills", "copy drills"},
      {"english_like", "English-like documents"}};
  std::string out;
  for (const auto& [generator, words] : names) {
    double weight = 0;
    for (const auto& s : mixture["sources"])
      if (s.value("generator", "") == generator) weight += s["weight"].get<double>();
    if (weight == 0) continue;
    out += (out.empty() ? "" : ", ") + words + " " + fixed(100 * weight, 0) + "%";
  }
  return out;
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
  lo.inference = true;
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
  const DemoRow* teacher = nullptr;
  for (const auto& r : rows)
    if (r.model == "teacher") teacher = &r;
  if (teacher) {
    md << "The teacher, trained on " << train_len << "-token windows, finds the needle in ";
    for (size_t i = 0; i < teacher->recall.size(); ++i)
      md << (i == 0 ? "" : i + 1 == teacher->recall.size() ? " and " : ", ") << pct(teacher->recall[i].second) << " of the prompts at "
         << teacher->recall[i].first << " tokens";
    md << " (lengths above " << train_len << " use positions it never trained on). ";
  }
  std::vector<const DemoRow*> students;
  for (const auto& r : rows)
    if (r.model != "teacher") students.push_back(&r);
  if (students.empty()) return md.str() + "\n";
  std::sort(students.begin(), students.end(), [](auto a, auto b) { return a->recall_mean > b->recall_mean; });
  const DemoRow& best = *students.front();
  const DemoRow& worst = *students.back();
  if (best.recall_mean == 0) {
    md << "No student finds the needle at any length";
  } else {
    md << "Among the students " << best.model << " retrieves best (" << pct(best.recall_mean) << " on average, "
       << pct(best.recall.front().second) << " at " << best.recall.front().first << " tokens and "
       << pct(best.recall.back().second) << " at " << best.recall.back().first << ") and " << worst.model
       << " worst (" << pct(worst.recall_mean) << ")";
  }
  const double delta = mean_recall(rows, {"deltanet", "gated_deltanet", "kda"}, all);
  const double additive = mean_recall(rows, {"linear_attention", "retnet", "gla"}, all);
  if (delta >= 0 && additive >= 0)
    md << "; the delta-rule mixers (DeltaNet, Gated DeltaNet, KDA) average " << pct(delta)
       << ", the additive ones (linear attention, RetNet, GLA) " << pct(additive);
  md << ". ";
  // The study's S-NIAH-1 at 2k against our mean over the tested lengths, over the mixers of this run.
  std::vector<double> ours, theirs;
  for (const auto* r : students)
    if (study_niah_2k().count(r->model)) ours.push_back(r->recall_mean), theirs.push_back(study_niah_2k().at(r->model));
  const double rho = spearman(ours, theirs);
  md << "The study's S-NIAH-1 at 2k tokens (1.7B students) ranks Gated DeltaNet (81.8%) over mLSTM (25.2%) over "
        "KDA (2.0%) over the rest (0%)";
  if (std::isnan(rho))
    md << "; with every student at the same mean accuracy, this run cannot rank them.";
  else
    md << "; our ranking by mean accuracy agrees with it at Spearman's rho = "
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
     << p.seq_len << " tokens generated as it trains (data/mixture.json: " << mixture_summary(demo_mixture(o.quick))
     << "; BPE vocabulary " << p.vocab << "). Each student: three "
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

// What one student's distillation takes, as options of `linearize distill` (the child-process path) and as
// DistillOptions (the in-process path): the same run either way.
struct StudentRun {
  std::string mixer, dir, teacher, data;
  int64_t seq_len, tokens, batch;
  uint64_t seed;
  torch::Device device = torch::kCPU;

  DistillOptions options() const {
    DistillOptions d;
    d.teacher = teacher;
    d.data = data;
    d.out = dir;
    d.mixer = parse_mixer_kind(mixer, "--mixers");
    d.seq_len = seq_len;
    d.tokens = tokens;
    d.splits = {0.1, 0.1, 0.8};
    d.stage[0].lr = 3e-3;
    d.stage[1].lr = 2e-3;
    d.stage[2].lr = 1e-3;
    d.loop.batch = batch;
    d.loop.seed = seed;
    d.loop.device = device;
    d.loop.resume = true;
    d.loop.log_every = 1000000;  // one line per stage start and end
    return d;
  }
  std::vector<std::string> arguments() const {
    return {"distill", "--teacher", teacher, "--mixer", mixer, "--data", data, "--out", dir,
            "--seq-len", std::to_string(seq_len), "--tokens", std::to_string(tokens), "--splits", "0.1|0.1|0.8",
            "--lr1", "3e-3", "--lr2", "2e-3", "--lr3", "1e-3", "--batch", std::to_string(batch),
            "--seed", std::to_string(seed), "--device", "cpu", "--resume", "--log-every", "1000000"};
  }
};

// The last `n` lines of a file, for an error message.
std::string tail_of(const std::string& path, int n) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::string out;
  for (size_t i = lines.size() > static_cast<size_t>(n) ? lines.size() - n : 0; i < lines.size(); ++i)
    out += "\n  " + lines[i];
  return out;
}

// Runs each student's `program distill ...` as a child process with one CPU thread, `jobs` at a time, its
// output in `<dir>.log`; returns each one's seconds. The first failure stops the others and is an Error
// naming the student and quoting the end of its log.
std::vector<double> distill_in_children(const std::vector<StudentRun>& runs, const std::string& program,
                                        int64_t jobs) {
  std::vector<double> seconds(runs.size(), 0);
  std::vector<pid_t> pids(runs.size(), -1);
  std::vector<Clock::time_point> started(runs.size());
  size_t next = 0, running = 0;
  auto stop_all = [&] {
    for (pid_t pid : pids)
      if (pid > 0) ::kill(pid, SIGTERM);
    for (pid_t& pid : pids)
      if (pid > 0) ::waitpid(pid, nullptr, 0), pid = -1;
  };
  while (next < runs.size() || running > 0) {
    while (next < runs.size() && static_cast<int64_t>(running) < jobs) {
      const auto& r = runs[next];
      try {
        pids[next] = start_child(program, r.arguments(), {{"OMP_NUM_THREADS", "1"}}, r.dir + ".log");
      } catch (const Error&) {
        stop_all();
        throw Error("demo: cannot start a process for " + r.mixer);
      }
      started[next] = Clock::now();
      ++next, ++running;
    }
    const auto ended = wait_any_child();
    if (!ended) {
      stop_all();
      throw Error("demo: lost track of the student processes");
    }
    const auto it = std::find(pids.begin(), pids.end(), ended->pid);
    if (it == pids.end()) continue;
    const size_t i = static_cast<size_t>(it - pids.begin());
    *it = -1;
    --running;
    seconds[i] = since(started[i]);
    const int code = ended->code;
    if (code != 0) {
      stop_all();
      throw Error("demo: distilling " + runs[i].mixer + " failed (exit code " + std::to_string(code) + "); the end of " +
                  runs[i].dir + ".log:" + tail_of(runs[i].dir + ".log", 5));
    }
    say("  " + runs[i].mixer + " done in " + fixed(seconds[i], 0) + " s");
  }
  return seconds;
}

}  // namespace

std::vector<DemoRow> run_demo(const DemoOptions& o) {
  const auto t_start = Clock::now();
  const DemoPlan p = plan_for(o.quick);
  // Models this small train faster on one CPU thread than on two (compat/cpu_threads.h).
  std::optional<CpuThreadsScope> one_thread;
  if (o.device.is_cpu()) one_thread.emplace(1);
  const fs::path root(o.out);
  fs::create_directories(root / "data");
  std::vector<std::string> mixers = o.mixers.empty() ? mixer_kinds() : o.mixers;
  for (const auto& m : mixers) parse_mixer_kind(m, "--mixers");  // a misspelt mixer fails before any training

  // 1. Text: a sample of the training mixture for the tokenizer, held-out documents for perplexity, and
  // the mixture itself (generated as training goes). The evaluation's noise haystack and key words are
  // never in it.
  const std::string mixture = (root / "data" / "mixture.json").string();
  write_file_atomic(mixture, [&](std::ostream& out) { out << demo_mixture(o.quick).dump(2) << "\n"; });
  EnglishLikeOptions co;
  co.documents = p.sample_documents;
  co.seed = o.seed * 2 + 1;
  auto texts = english_like_documents(co);
  RetrievalEpisodeOptions eo;
  eo.min_chars = 0;
  eo.max_chars = 900;
  eo.key_adjectives = training_key_adjectives();
  eo.key_nouns = training_key_nouns();
  std::mt19937_64 episode_rng(o.seed * 2 + 3);
  for (int64_t e = 0; e < p.sample_episodes; ++e) texts.push_back(retrieval_episode(episode_rng, english_like_sentence, eo));
  co.documents = p.heldout_docs;
  co.seed = o.seed * 2 + 2;
  auto heldout_docs = english_like_documents(co);
  say("1/5 generated " + std::to_string(texts.size()) + " texts for the tokenizer and " +
      std::to_string(heldout_docs.size()) + " held-out documents; training data: " + mixture);

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
  std::vector<int32_t> heldout_ids;
  for (const auto& d : heldout_docs) {
    auto x = tok->encode(d, false);
    heldout_ids.insert(heldout_ids.end(), x.begin(), x.end());
    heldout_ids.push_back(eos);
  }
  write_token_shard((root / "data" / "heldout.u32").string(), heldout_ids);
  say("2/5 tokenizer (" + std::to_string(tok->vocab_size()) + " tokens); training the teacher");

  const std::string teacher_dir = (root / "teacher").string();
  if (!is_model_folder(teacher_dir)) {
    PretrainOptions po;
    po.tokenizer = tok_dir;
    po.data = mixture;
    po.out = teacher_dir;
    po.hidden = p.hidden;
    po.layers = p.layers;
    po.heads = p.heads;
    po.kv_heads = p.kv_heads;
    po.seq_len = p.seq_len;
    po.loop.batch = p.batch;
    po.loop.steps = p.pretrain_steps;
    po.loop.schedule.lr = p.pretrain_lr;
    po.loop.schedule.kind = ScheduleKind::wsd;
    po.loop.schedule.warmup_frac = 0.01;
    po.loop.seed = o.seed;
    po.loop.device = o.device;
    po.loop.log_every = std::max<int64_t>(1, p.pretrain_steps / 5);
    pretrain(po);
  }

  // 3. Students: on the CPU in child processes, one thread and one core each; else one after another here.
  std::vector<StudentRun> runs;
  for (const auto& m : mixers)
    runs.push_back({m, (root / "students" / m).string(), teacher_dir, mixture, p.seq_len, p.distill_tokens,
                    p.distill_batch, o.seed, o.device});
  std::vector<StudentRun> todo;
  for (const auto& r : runs)
    if (!is_model_folder(r.dir)) todo.push_back(r);
  const int64_t cores = std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()));
  const int64_t jobs = std::min<int64_t>(o.jobs > 0 ? o.jobs : cores, static_cast<int64_t>(todo.size()));
  std::map<std::string, double> seconds;
  if (o.device.is_cpu() && !o.program.empty() && jobs > 1) {
    fs::create_directories(root / "students");
    say("3/5 distilling " + std::to_string(todo.size()) + " students, " + std::to_string(jobs) +
        " at a time (one process and one thread each; logs in " + (root / "students").string() + "/<mixer>.log)");
    const auto took = distill_in_children(todo, o.program, jobs);
    for (size_t i = 0; i < todo.size(); ++i) seconds[todo[i].mixer] = took[i];
  } else {
    for (size_t i = 0; i < todo.size(); ++i) {
      say("3/5 distilling " + todo[i].mixer + " (" + std::to_string(i + 1) + "/" + std::to_string(todo.size()) + ")");
      const auto t0 = Clock::now();
      distill(todo[i].options());
      seconds[todo[i].mixer] = since(t0);
    }
  }
  std::vector<std::pair<std::string, double>> student_dirs;
  for (const auto& r : runs) student_dirs.emplace_back(r.dir, seconds.count(r.mixer) ? seconds[r.mixer] : 0.0);

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
