// The study runner (see study.h): teachers, cells, WSD budget branches, evaluations, report.
#include "study/study.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>

#include "compat/device.h"
#include "data/retrieval_episodes.h"
#include "data/synthetic_text.h"
#include "distill/stages.h"
#include "eval/niah.h"
#include "eval/perplexity.h"
#include "eval/recovery.h"
#include "eval/tasks.h"
#include "io/atomic_file.h"
#include "io/bpe_trainer.h"
#include "io/error.h"
#include "io/token_shards.h"
#include "io/tokenizer.h"
#include "model/model_io.h"
#include "study/study_report.h"
#include "train/checkpoint.h"
#include "train/pretrain.h"
#include "train/trainer.h"

namespace linearize {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

void say(const std::string& s) { std::cerr << "[study] " << s << std::endl; }

bool is_model_folder(const std::string& dir) {
  return fs::exists(fs::path(dir) / "config.json") && fs::exists(fs::path(dir) / "model.safetensors");
}

std::string minutes(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f min", s / 60);
  return b;
}

// Thrown when the time limit is reached at a safe point.
struct OutOfTime {};

class Runner {
 public:
  Runner(const StudySpec& spec, const StudyOptions& o) : spec_(spec), o_(o), t0_(Clock::now()) {
    out_ = o.out.empty() ? (fs::path("runs") / spec.name).string() : o.out;
    // Checked before anything runs; a report alone needs no device, so a GPU study's report can be
    // rewritten on a machine without one.
    const std::string device = o.report_only ? "cpu" : o.device.empty() ? spec.device : o.device;
    device_ = parse_device_name(device, spec.file + ": device \"" + device + "\"");
    if (o.cuda_graph && !o.report_only && !device_.is_cuda())
      throw Error("--cuda-graph needs a CUDA device (the study runs on " + device_.str() + ")");
    step_graph_ = o.cuda_graph ? TrainLoopOptions::StepGraph::cuda_graph : TrainLoopOptions::StepGraph::off;
    for (const auto& t : spec.teachers) refuse_output_inside(out_, t.path, "the teacher " + t.name + "'s folder");
    if (o.max_minutes > 0) deadline_ = t0_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.max_minutes * 60));
  }

  StudyOutcome run() {
    fs::create_directories(out_);
    write_file_atomic((fs::path(out_) / "study.json").string(), [&](std::ostream& s) { s << spec_.raw.dump(2) << "\n"; });
    const auto cells = selected_cells();
    StudyOutcome outcome;
    outcome.expected = static_cast<int64_t>(cells.size() * spec_.budgets.size());
    if (!o_.report_only) {
      // Every cell's settings are read before anything trains, so that a bad variant fails at once.
      for (const auto& c : cells) distill_options(c, spec_.budgets.back(), out_);
      for (const auto& t : spec_.teachers)
        if (t.pretrain) pretrain_schedule(t);
      try {
        prepare_data();
        for (const auto& t : spec_.teachers) {  // only the teachers of the selected cells (--only)
          const bool used = std::any_of(cells.begin(), cells.end(), [&](const StudyCell& c) { return c.teacher == &t; });
          if (used) teacher(t);
        }
        int64_t n = 0;
        for (const auto& c : cells) {
          ++n;
          const auto start = Clock::now();
          const bool worked = !cell_done(c);
          run_cell(c, n, static_cast<int64_t>(cells.size()), time_left(cells, n));
          if (worked) {
            auto& [seconds, count] = cell_seconds_[c.teacher];
            seconds += std::chrono::duration<double>(Clock::now() - start).count(), ++count;
          }
        }
      } catch (const OutOfTime&) {
        say("stopped after " + minutes(elapsed()) + " (--max-minutes); run the same command again to continue");
      }
    }
    for (const auto& c : cells)
      for (int64_t b : spec_.budgets) outcome.results += fs::exists(result_path(c.budget_id(b)));
    outcome.finished = outcome.results == outcome.expected;
    outcome.report_dir = (fs::path(out_) / "report").string();
    write_study_report(spec_, out_, outcome.report_dir);
    say(std::to_string(outcome.results) + "/" + std::to_string(outcome.expected) + " results; report in " +
        outcome.report_dir + "/report.md (" + minutes(elapsed()) + ")");
    return outcome;
  }

 private:
  double elapsed() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }
  void check_time() const {
    if (deadline_ && Clock::now() >= *deadline_) throw OutOfTime{};
  }
  std::string result_path(const std::string& id) const { return (fs::path(out_) / "results" / (id + ".json")).string(); }
  bool cell_done(const StudyCell& c) const {
    return std::all_of(spec_.budgets.begin(), spec_.budgets.end(),
                       [&](int64_t b) { return fs::exists(result_path(c.budget_id(b))); });
  }
  // The grid's ETA at cell `n` (1-based): the cells not done from n on, at the mean time a cell of the
  // same teacher took so far in this run; cells of a teacher with none timed yet are counted, not timed.
  std::string time_left(const std::vector<StudyCell>& cells, int64_t n) const {
    double seconds = 0;
    int64_t timed = 0, untimed = 0;
    for (size_t i = static_cast<size_t>(n - 1); i < cells.size(); ++i) {
      if (cell_done(cells[i])) continue;
      const auto it = cell_seconds_.find(cells[i].teacher);
      if (it == cell_seconds_.end()) {
        ++untimed;
      } else {
        seconds += it->second.first / static_cast<double>(it->second.second), ++timed;
      }
    }
    if (timed + untimed == 0) return "";
    std::string s = "; " + std::to_string(timed + untimed) + (timed + untimed == 1 ? " cell left" : " cells left");
    if (timed) s += ", about " + minutes(seconds) + (untimed ? " for " + std::to_string(timed) + " of them" : "");
    return s;
  }
  std::string teacher_dir(const StudyTeacher& t) const {
    return t.pretrain ? (fs::path(out_) / "teachers" / t.name).string() : t.path;
  }

  std::vector<StudyCell> selected_cells() const {
    std::vector<StudyCell> out;
    for (const auto& c : study_cells(spec_)) {
      bool take = o_.only.empty();
      for (const auto& pat : o_.only) take |= c.id().find(pat) != std::string::npos;
      if (take) out.push_back(c);
    }
    if (out.empty()) throw Error("--only selects no cell of " + spec_.file);
    return out;
  }

  // The last `fraction` of a text, cut after a line so that no line is split: {head, tail}.
  static std::pair<std::string, std::string> split_tail(const std::string& text, double fraction) {
    size_t cut = static_cast<size_t>(static_cast<double>(text.size()) * (1 - fraction));
    const size_t newline = text.find('\n', cut);
    cut = newline == std::string::npos ? text.size() : newline + 1;
    return {text.substr(0, cut), text.substr(cut)};
  }

  // The mixture file (an inline mixture is written out), the held-out text, the tokenizer. With
  // eval.ppl.data.held_out, every text file of the mixture is cut in two: its head (data/train/) is what
  // the tokenizer, the teachers and the students read, its tail goes into data/heldout.txt.
  void prepare_data() {
    fs::create_directories(fs::path(out_) / "data");
    std::string held_out;
    if (spec_.data.is_string()) {
      data_ = spec_.data.get<std::string>();
    } else {
      nlohmann::json m = spec_.data;
      for (auto& s : m["sources"]) {
        if (s.contains("path") && !fs::path(s["path"].get<std::string>()).is_absolute())
          s["path"] = fs::absolute(fs::path(spec_.base) / s["path"].get<std::string>()).string();
        if (spec_.eval.ppl_held_out > 0 && held_out_source(s)) {
          const fs::path original = s["path"].get<std::string>();
          const auto [head, tail] = split_tail(read_file(original.string()), spec_.eval.ppl_held_out);
          // Absolute: mixture.json's relative paths would be read from its own folder.
          const auto head_path = fs::absolute(fs::path(out_) / "data" / "train" / original.filename());
          if (!fs::exists(head_path)) {
            fs::create_directories(head_path.parent_path());
            write_file_atomic(head_path.string(), [&](std::ostream& o) { o << head; });
          }
          held_out += tail + (tail.empty() || tail.back() == '\n' ? "" : "\n");
          heads_[fs::weakly_canonical(original).string()] = head_path.string();
          s["path"] = head_path.string();
        }
        if (s.contains("filler") && s["filler"] != "english_like" && !fs::path(s["filler"].get<std::string>()).is_absolute())
          s["filler"] = fs::absolute(fs::path(spec_.base) / s["filler"].get<std::string>()).string();
      }
      data_ = (fs::path(out_) / "data" / "mixture.json").string();
      write_file_atomic(data_, [&](std::ostream& s) { s << m.dump(2) << "\n"; });
    }
    ppl_data_ = spec_.eval.ppl_data;
    if (spec_.eval.ppl_held_out > 0) {
      ppl_data_ = (fs::path(out_) / "data" / "heldout.txt").string();
      if (!fs::exists(ppl_data_)) write_file_atomic(ppl_data_, [&](std::ostream& s) { s << held_out; });
    }
    if (!spec_.eval.ppl_generated.is_null()) {
      ppl_data_ = (fs::path(out_) / "data" / "heldout.txt").string();
      if (!fs::exists(ppl_data_)) {
        EnglishLikeOptions e;
        e.documents = spec_.eval.ppl_generated.value("documents", int64_t{40});
        e.seed = spec_.eval.ppl_generated.value("seed", uint64_t{1000003});
        std::string text;
        for (const auto& d : english_like_documents(e)) text += d + "\n\n";
        write_file_atomic(ppl_data_, [&](std::ostream& s) { s << text; });
      }
    }
    if (spec_.tokenizer.contains("path")) tokenizer_ = spec_.tokenizer["path"].get<std::string>();
    if (spec_.tokenizer.contains("train")) {
      tokenizer_ = (fs::path(out_) / "tokenizer").string();
      if (!fs::exists(fs::path(tokenizer_) / "tokenizer.json")) train_tokenizer(spec_.tokenizer["train"]);
    }
  }

  void train_tokenizer(const nlohmann::json& t) {
    BpeTrainOptions bo;
    bo.vocab_size = t.value("vocab", int64_t{4096});
    bo.isolate_digits = t.value("isolate_digits", true);
    std::vector<std::string> texts;
    for (const auto& in : t.value("inputs", std::vector<std::string>{})) {  // a held-out file: its head only
      const auto head = heads_.find(fs::weakly_canonical(in).string());
      texts.push_back(read_file(head == heads_.end() ? in : head->second));
    }
    if (t.contains("sample")) {  // generated text: the mixture's own kinds
      EnglishLikeOptions e;
      e.documents = t["sample"].value("documents", int64_t{200});
      e.seed = 17;
      for (auto& d : english_like_documents(e)) texts.push_back(std::move(d));
      RetrievalEpisodeOptions eo;
      eo.key_adjectives = training_key_adjectives();
      eo.key_nouns = training_key_nouns();
      eo.min_chars = 0;
      eo.max_chars = 900;
      eo.uuid_fraction = t["sample"].value("uuid_fraction", 0.0);
      std::mt19937_64 rng(19);
      for (int64_t i = 0; i < t["sample"].value("episodes", int64_t{2000}); ++i)
        texts.push_back(retrieval_episode(rng, english_like_sentence, eo));
    }
    if (texts.empty()) throw Error(spec_.file + ": tokenizer.train needs \"inputs\" or a \"sample\"");
    say("training a " + std::to_string(bo.vocab_size) + "-token BPE tokenizer");
    train_bpe_texts(texts, bo).save(tokenizer_);
  }

  ScheduleKind pretrain_schedule(const StudyTeacher& t) const {
    return parse_schedule_kind(t.pretrain->schedule, spec_.file + ": teacher " + t.name + ": pretrain.schedule");
  }

  void teacher(const StudyTeacher& t) {
    const std::string dir = teacher_dir(t);
    const std::string eval_path = (fs::path(out_) / "teachers" / (t.name + ".eval.json")).string();
    if (t.pretrain && !is_model_folder(dir)) {
      const auto& p = *t.pretrain;
      say("teacher " + t.name + ": pretraining " + std::to_string(p.steps) + " steps of " + std::to_string(p.batch) +
          " x " + std::to_string(p.seq_len));
      PretrainOptions po;
      po.tokenizer = tokenizer_;
      po.data = p.data.empty() ? data_ : p.data;
      po.out = dir;
      po.hidden = p.hidden, po.layers = p.layers, po.heads = p.heads, po.kv_heads = p.kv_heads;
      po.seq_len = p.seq_len;
      po.loop.batch = p.batch;
      po.loop.steps = p.steps;
      po.loop.schedule.lr = p.lr;
      po.loop.schedule.kind = pretrain_schedule(t);
      po.loop.schedule.warmup_frac = p.warmup;
      po.loop.device = device_;
      po.loop.resume = true;
      po.loop.checkpoint_every = std::max<int64_t>(100, p.steps / 10);
      po.loop.log_every = std::max<int64_t>(1, p.steps / 10);
      po.loop.deadline = deadline_;
      po.loop.deterministic = p.deterministic;
      po.loop.step_graph = step_graph_;
      pretrain(po);
      if (!is_model_folder(dir)) throw OutOfTime{};
      // Trained again where its results were kept but its weights were not (a GPU machine given back
      // between runs): the results go on only if this is the same teacher, bit for bit.
      if (fs::exists(eval_path)) {
        const std::string was = nlohmann::json::parse(read_file(eval_path)).value("fingerprint", std::string());
        const std::string now = model_fingerprint(dir);
        if (now != was)
          throw Error("teacher " + t.name + " was trained again and is not the teacher of the results in " + out_ +
                      " (fingerprint " + now + ", theirs " + was + "): training is not reproducible on this device; "
                      "move " + eval_path + " and results/" + t.name + "__* aside to run its row again");
        say("teacher " + t.name + ": trained again, the same teacher bit for bit (fingerprint " + now + ")");
      }
    }
    if (!fs::exists(eval_path)) {
      check_time();
      say("teacher " + t.name + ": evaluating");
      auto r = evaluate(dir);
      r["role"] = "teacher";
      r["label"] = t.name;
      r["teacher_name"] = t.name;
      r["fingerprint"] = model_fingerprint(dir);
      r["parameters"] = LlamaConfig::load(dir).parameter_count();
      write_json(r, eval_path);
    }
  }

  // Perplexity, zero-shot tasks and NIAH of a model folder, in the schema of `eval all`.
  nlohmann::json evaluate(const std::string& folder) {
    LoadOptions lo;
    lo.device = device_;
    lo.inference = true;
    auto model = load_model(folder, lo);
    auto tok = load_model_tokenizer(folder, model->config);
    nlohmann::json r = {{"model", folder}};
    const auto& e = spec_.eval;
    if (!ppl_data_.empty()) {
      const int64_t eos = model->config.eos_token_ids.empty() ? -1 : model->config.eos_token_ids[0];
      auto tokens = load_tokens(ppl_data_, tok.get(), eos, model->config.vocab_size);
      if (e.ppl_max_tokens > 0 && static_cast<int64_t>(tokens.size()) > e.ppl_max_tokens) tokens.resize(e.ppl_max_tokens);
      const auto p = perplexity(model, tokens, e.ppl_seq_len, 8);
      r["ppl"] = {{"data", ppl_data_}, {"seq_len", e.ppl_seq_len}, {"nll", p.nll}, {"ppl", p.ppl}, {"tokens", p.tokens}};
    }
    std::vector<TaskResult> tasks;
    for (const auto& name : e.tasks) {
      ScoreOptions so;
      tasks.push_back(evaluate_task(model, *tok, load_task(name, e.tasks_dir, e.tasks_limit > 0 ? e.tasks_limit : -1), so));
    }
    const auto tj = results_json(folder, tasks);
    r["tasks"] = tj["tasks"];
    r["average"] = tj["average"];
    r["niah"] = nlohmann::json::object();
    for (const auto& task : e.niah_tasks) {
      NiahOptions n;
      n.task = task;
      n.lengths = e.niah_lengths;
      n.samples = e.niah_samples;
      n.max_new_tokens = e.niah_max_new_tokens;
      n.haystack_file = e.niah_haystack;
      r["niah"][task] = run_niah(model, *tok, n, niah_encoder(model, *tok, folder, false));
    }
    return r;
  }

  void write_json(const nlohmann::json& j, const std::string& path) {
    fs::create_directories(fs::path(path).parent_path());
    write_file_atomic(path, [&](std::ostream& s) { s << j.dump(1) << "\n"; });
  }

  DistillOptions distill_options(const StudyCell& c, int64_t budget, const std::string& out) {
    DistillOptions d;
    const auto& v = c.variant->options;
    apply_distill_preset(d, v.value("preset", std::string("default")));
    d.teacher = teacher_dir(*c.teacher);
    d.data = data_;
    d.out = out;
    d.mixer = parse_mixer_kind(c.mixer);
    d.seq_len = spec_.seq_len;
    d.tokens = budget;
    for (int s = 0; s < 3; ++s) d.stage[s].lr = spec_.lr[s];
    // Stage 3 warms up, stays and decays over its last 20%, so that smaller budgets branch off it.
    d.stage[2].schedule = ScheduleKind::wsd;
    d.stage[2].decay = 0.2;
    if (v.contains("stages")) d.stages = v["stages"].get<std::vector<int>>();
    if (v.contains("splits")) d.splits = v["splits"].get<std::vector<double>>();
    if (v.contains("layers")) d.layers = v["layers"].get<std::vector<int64_t>>();
    if (v.contains("kl_weight")) d.kl_weight = v["kl_weight"].get<double>();
    if (v.contains("kl_temperature")) d.kl_temperature = v["kl_temperature"].get<double>();
    if (v.contains("kl_reduction"))
      d.kl_reduction = parse_kl_reduction(v["kl_reduction"].get<std::string>(), "variant " + c.variant->name + ": kl_reduction");
    if (v.contains("stage2_loss"))
      d.stage2_loss = parse_stage2_loss(v["stage2_loss"].get<std::string>(), "variant " + c.variant->name + ": stage2_loss");
    if (v.contains("paper_defects")) apply_paper_defects(d, v["paper_defects"].get<std::vector<std::string>>());
    if (v.contains("mixer_config")) d.mixer_overrides = v["mixer_config"];
    d.loop.batch = spec_.batch;
    d.loop.seed = c.seed;
    d.loop.device = device_;
    d.loop.resume = true;
    d.loop.deadline = deadline_;
    d.loop.step_graph = step_graph_;
    d.loop.log_every = std::max<int64_t>(50, stage3_steps(d) / 5);  // about five progress lines (tokens/s, ETA) a stage
    return d;
  }

  int64_t stage3_steps(const DistillOptions& d) const {
    const double sum = d.splits[0] + d.splits[1] + d.splits[2];
    return std::max<int64_t>(1, static_cast<int64_t>(d.tokens * d.splits[2] / sum) / (d.loop.batch * d.seq_len));
  }

  void run_cell(const StudyCell& c, int64_t n, int64_t total, const std::string& eta) {
    std::vector<int64_t> todo;
    for (int64_t b : spec_.budgets)
      if (!fs::exists(result_path(c.budget_id(b)))) todo.push_back(b);
    if (todo.empty()) return;
    check_time();
    const std::string run = (fs::path(out_) / "runs" / c.id()).string();
    const int64_t top = spec_.budgets.back();
    auto main = distill_options(c, top, run);
    // Where each smaller budget leaves the main run: its own decay start, when that lies after the main
    // run's warmup (else it is trained on its own).
    const int64_t main_steps = stage3_steps(main), warmup = static_cast<int64_t>(std::floor(0.1 * main_steps));
    std::vector<std::pair<int64_t, int64_t>> branches;  // budget, branch step
    std::vector<int64_t> alone;
    for (int64_t b : spec_.budgets) {
      if (b == top) continue;
      auto d = distill_options(c, b, run);
      const int64_t steps = stage3_steps(d), start = steps - static_cast<int64_t>(std::floor(0.2 * steps));
      if (start > warmup && std::find(d.stages.begin(), d.stages.end(), 3) != d.stages.end()) branches.emplace_back(b, start);
      else alone.push_back(b);
    }
    for (const auto& [b, step] : branches) main.loop.snapshot_steps.push_back(step);
    const std::string branching = branches.empty() ? ""
                                  : branches.size() == 1 ? " (1 budget branches off)"
                                                         : " (" + std::to_string(branches.size()) + " budgets branch off)";
    say("cell " + std::to_string(n) + "/" + std::to_string(total) + " " + c.id() + ": distilling " +
        std::to_string(top) + " tokens" + branching + " [" + minutes(elapsed()) + " so far" + eta + "]");
    if (!is_model_folder(run)) {
      if (!distill(main).finished) throw OutOfTime{};
    }
    finish(c, top, run);
    for (const auto& [b, step] : branches) {
      const std::string dir = (fs::path(run) / ("budget-" + std::to_string(b))).string();
      if (!is_model_folder(dir)) {
        check_time();
        // The branch starts from the main run's finished stages 1-2 and its stage-3 snapshot at `step`.
        fs::create_directories(dir);
        for (const char* stage : {"checkpoint-stage1", "checkpoint-stage2"})
          if (fs::exists(fs::path(run) / stage) && !fs::exists(fs::path(dir) / stage))
            copy_flat_folder((fs::path(run) / stage).string(), (fs::path(dir) / stage).string());
        if (!fs::exists(fs::path(dir) / "checkpoint-stage3"))
          copy_flat_folder(snapshot_dir(run, "stage3", step), (fs::path(dir) / "checkpoint-stage3").string());
        auto d = distill_options(c, b, dir);
        d.stage[2].warmup = static_cast<double>(warmup) / static_cast<double>(stage3_steps(d));  // the main run's warmup
        say("  budget " + std::to_string(b) + ": decay branch from stage-3 step " + std::to_string(step));
        if (!distill(d).finished) throw OutOfTime{};
      }
      finish(c, b, dir);
    }
    for (int64_t b : alone) {
      const std::string dir = (fs::path(run) / ("budget-" + std::to_string(b))).string();
      if (!is_model_folder(dir)) {
        check_time();
        say("  budget " + std::to_string(b) + ": its own run (too small to branch off)");
        if (!distill(distill_options(c, b, dir)).finished) throw OutOfTime{};
      }
      finish(c, b, dir);
    }
  }

  // Evaluates a finished student and writes its result with recovery against its own teacher.
  void finish(const StudyCell& c, int64_t budget, const std::string& folder) {
    const std::string path = result_path(c.budget_id(budget));
    if (fs::exists(path)) return;
    check_time();
    say("  evaluating " + c.budget_id(budget));
    auto r = evaluate(folder);
    const std::string tdir = teacher_dir(*c.teacher);
    const auto teacher = nlohmann::json::parse(read_file((fs::path(out_) / "teachers" / (c.teacher->name + ".eval.json")).string()));
    r["role"] = "student";
    r["label"] = c.budget_id(budget);
    r["cell"] = c.id();
    r["mixer"] = c.mixer;
    r["variant"] = c.variant->name;
    r["seed"] = c.seed;
    r["tokens"] = budget;
    r["teacher"] = tdir;
    r["teacher_name"] = c.teacher->name;
    r["teacher_fingerprint"] = teacher["fingerprint"];
    r["scale"] = teacher["parameters"];
    if (!shared_tasks(r, teacher).empty()) r["recovery"] = recovery_percent(r, teacher);
    if (r.contains("ppl") && teacher.contains("ppl"))
      r["ppl_recovery"] = 100.0 * teacher["ppl"]["ppl"].get<double>() / r["ppl"]["ppl"].get<double>();
    write_json(r, path);
  }

  const StudySpec& spec_;
  StudyOptions o_;
  Clock::time_point t0_;
  std::optional<Clock::time_point> deadline_;
  std::map<const StudyTeacher*, std::pair<double, int64_t>> cell_seconds_;  // per teacher: seconds, cells timed
  std::string out_, data_, ppl_data_, tokenizer_;
  std::map<std::string, std::string> heads_;  // a held-out text file (canonical path) -> its training head
  torch::Device device_ = torch::kCPU;
  TrainLoopOptions::StepGraph step_graph_ = TrainLoopOptions::StepGraph::off;
};

}  // namespace

std::string model_fingerprint(const std::string& folder) {
  uint64_t h = 1469598103934665603ULL;
  auto mix = [&](const std::string& s) {
    for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ULL;
  };
  const auto config = fs::path(folder) / "config.json";
  if (fs::exists(config)) mix(read_file(config.string()));
  std::vector<fs::path> weights;
  for (const auto& e : fs::directory_iterator(folder))
    if (e.path().extension() == ".safetensors") weights.push_back(e.path());
  std::sort(weights.begin(), weights.end());
  for (const auto& w : weights) {
    const auto size = fs::file_size(w);
    mix(w.filename().string() + ":" + std::to_string(size));
    std::ifstream in(w, std::ios::binary);
    std::string buf(static_cast<size_t>(std::min<uintmax_t>(size, 1 << 20)), '\0');
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    mix(buf);
    if (size > buf.size()) {
      in.seekg(static_cast<std::streamoff>(size - buf.size()));
      in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      mix(buf);
    }
  }
  char b[32];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(h));
  return b;
}

StudyOutcome run_study(const StudySpec& spec, const StudyOptions& options) { return Runner(spec, options).run(); }

}  // namespace linearize
