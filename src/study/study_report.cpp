// The study's report (see study_report.h).
#include "study/study_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "io/atomic_file.h"
#include "io/error.h"
#include "report/study_reference.h"
#include "report/svg.h"

namespace linearize {

namespace fs = std::filesystem;

namespace {

std::string num(double v, int digits) {
  if (!std::isfinite(v)) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}

std::vector<nlohmann::json> read_all(const std::string& dir) {
  std::vector<nlohmann::json> out;
  if (!fs::is_directory(dir)) return out;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    try {
      out.push_back(nlohmann::json::parse(read_file(f.string())));
    } catch (const nlohmann::json::exception& e) {
      throw Error(f.string() + ": malformed JSON: " + e.what());
    }
  }
  return out;
}

double get_ppl(const nlohmann::json& r) {
  return r.contains("ppl") && r["ppl"].contains("ppl") ? r["ppl"]["ppl"].get<double>() : std::nan("");
}

// NIAH accuracy (0..1) of `task` at `length`, NaN when absent.
double niah_at(const nlohmann::json& r, const std::string& task, int64_t length) {
  if (!r.contains("niah") || !r["niah"].contains(task)) return std::nan("");
  const auto& pl = r["niah"][task]["per_length"];
  const auto k = std::to_string(length);
  return pl.contains(k) ? pl[k].get<double>() : std::nan("");
}

struct Data {
  std::vector<std::string> teachers, mixers, variants;
  std::map<std::string, nlohmann::json> teacher_eval;    // name -> eval
  std::vector<nlohmann::json> results;
  int64_t top_budget = 0;
  // The result of (teacher, mixer, variant, budget); seeds averaged by taking the first seed present.
  const nlohmann::json* find(const std::string& t, const std::string& m, const std::string& v, int64_t b) const {
    for (const auto& r : results)
      if (r.value("teacher_name", "") == t && r.value("mixer", "") == m && r.value("variant", "") == v &&
          r.value("tokens", int64_t{-1}) == b)
        return &r;
    return nullptr;
  }
};

std::string recovery_table(const Data& d, const std::string& variant, const std::string& field, const std::string& what) {
  std::ostringstream o;
  o << "| mixer |";
  for (const auto& t : d.teachers) o << " " << t << " |";
  o << "\n|---|";
  for (size_t i = 0; i < d.teachers.size(); ++i) o << "---:|";
  o << "\n";
  bool any = false;
  for (const auto& m : d.mixers) {
    o << "| " << m << " |";
    for (const auto& t : d.teachers) {
      const auto* r = d.find(t, m, variant, d.top_budget);
      const bool have = r && r->contains(field) && (*r)[field].is_number();
      any |= have;
      o << " " << (have ? num((*r)[field].get<double>(), 1) : "-") << " |";
    }
    o << "\n";
  }
  return any ? "**" + what + "**\n\n" + o.str() : "";
}

// Sentences on what the numbers show, each computed from them: the best mixer per teacher, whether the
// mixers with a data-dependent gate beat the others at every scale (the study: yes), how linear attention's perplexity gap moves
// with scale (the study: it widens), and which mixers retrieve.
std::string findings(const Data& d, const StudySpec& spec, const std::string& variant,
                     const std::function<int64_t(const std::string&)>& params) {
  std::ostringstream o;
  auto metric = [&](const nlohmann::json* r) {
    if (!r) return std::nan("");
    if (r->contains("recovery") && (*r)["recovery"].is_number()) return (*r)["recovery"].get<double>();
    return r->contains("ppl_recovery") ? (*r)["ppl_recovery"].get<double>() : std::nan("");
  };
  const bool tasks = !spec.eval.tasks.empty();
  const std::string what = tasks ? "task recovery" : "perplexity recovery";
  const std::set<std::string> gated = {"gla", "gated_deltanet", "kda", "mlstm"};  // data-dependent decay
  int gated_ahead = 0, scales = 0;
  for (const auto& t : d.teachers) {
    std::string best;
    double best_v = -1, g = 0, u = 0;
    int ng = 0, nu = 0;
    for (const auto& m : d.mixers) {
      const double v = metric(d.find(t, m, variant, d.top_budget));
      if (!std::isfinite(v)) continue;
      if (v > best_v) best_v = v, best = m;
      if (gated.count(m)) g += v, ++ng;
      else u += v, ++nu;
    }
    if (best.empty()) continue;
    o << "With teacher " << t << " (" << params(t) << " parameters) " << best << " recovers most (" << num(best_v, 1)
      << "% " << what << "). ";
    if (ng && nu) {
      ++scales;
      gated_ahead += g / ng > u / nu;
    }
  }
  if (scales > 0)
    o << "The mixers with a data-dependent gate (GLA, Gated DeltaNet, KDA, mLSTM) average more than those without "
         "(linear attention, RetNet, DeltaNet) at "
      << gated_ahead << " of " << scales << " teacher scales (the study: at every scale). ";
  if (d.teachers.size() > 1) {
    auto gap = [&](const std::string& t) {
      const auto* r = d.find(t, "linear_attention", variant, d.top_budget);
      if (!r || !d.teacher_eval.count(t) || !r->contains("ppl")) return std::nan("");
      return 100 * ((*r)["ppl"]["ppl"].get<double>() / d.teacher_eval.at(t)["ppl"]["ppl"].get<double>() - 1);
    };
    const double first = gap(d.teachers.front()), last = gap(d.teachers.back());
    if (std::isfinite(first) && std::isfinite(last))
      o << "Linear attention's perplexity gap goes from " << num(first, 1) << "% with the smallest teacher to "
        << num(last, 1) << "% with the largest (the study: its recovery gap widens from 14% to 20%). ";
  }
  for (const auto& task : spec.eval.niah_tasks) {
    for (const auto& t : d.teachers) {
      if (!d.teacher_eval.count(t) || !d.teacher_eval.at(t)["niah"].contains(task)) continue;
      const double teacher_avg = d.teacher_eval.at(t)["niah"][task]["average"].get<double>();
      std::string best;
      double best_v = -1;
      for (const auto& m : d.mixers)
        if (const auto* r = d.find(t, m, variant, d.top_budget); r && r->contains("niah") && (*r)["niah"].contains(task)) {
          const double v = (*r)["niah"][task]["average"].get<double>();
          if (v > best_v) best_v = v, best = m;
        }
      if (best.empty()) continue;
      o << task << " with teacher " << t << ": the teacher averages " << num(100 * teacher_avg, 0)
        << "% over the lengths, the best student (" << best << ") " << num(100 * best_v, 0) << "%"
        << (teacher_avg < 0.5 ? "; with a teacher this weak at retrieval, the students' NIAH columns say little" : "")
        << ". ";
    }
  }
  return o.str();
}

}  // namespace

void write_study_report(const StudySpec& spec, const std::string& out, const std::string& report_dir) {
  fs::create_directories(report_dir);
  Data d;
  d.results = read_all((fs::path(out) / "results").string());
  for (const auto& t : spec.teachers) {
    const auto p = fs::path(out) / "teachers" / (t.name + ".eval.json");
    if (fs::exists(p)) d.teacher_eval[t.name] = nlohmann::json::parse(read_file(p.string()));
  }
  // Teachers by size, as scale figures read; those with neither an evaluation nor a result yet (a study
  // run part of the way) are left out of the tables rather than shown as rows of dashes.
  for (const auto& t : spec.teachers) {
    const bool has_result = std::any_of(d.results.begin(), d.results.end(), [&](const nlohmann::json& r) {
      return r.value("teacher_name", "") == t.name;
    });
    if (d.teacher_eval.count(t.name) || has_result) d.teachers.push_back(t.name);
  }
  auto params = [&](const std::string& t) {
    return d.teacher_eval.count(t) ? d.teacher_eval.at(t).value("parameters", int64_t{0}) : int64_t{0};
  };
  std::stable_sort(d.teachers.begin(), d.teachers.end(), [&](auto& a, auto& b) { return params(a) < params(b); });
  d.mixers = spec.mixers;
  for (const auto& v : spec.variants) d.variants.push_back(v.name);
  d.top_budget = spec.budgets.back();

  std::vector<std::pair<std::string, std::string>> figures;
  std::ostringstream md;
  md << "# Study: " << spec.name << "\n\n"
     << d.results.size() << " student results, " << d.teacher_eval.size() << " of " << spec.teachers.size()
     << " teachers evaluated. Mixers: " << spec.mixers.size() << "; budgets: ";
  for (size_t i = 0; i < spec.budgets.size(); ++i) md << (i ? ", " : "") << spec.budgets[i];
  md << " tokens (smaller budgets are WSD branches of the largest run); seeds: " << spec.seeds.size() << ".\n\n";

  // Teachers.
  md << "## Teachers\n\n| teacher | parameters | held-out ppl |";
  const bool has_tasks = !spec.eval.tasks.empty();
  if (has_tasks) md << " task average % |";
  for (const auto& task : spec.eval.niah_tasks) md << " " << task << " mean % |";
  md << "\n|---|---:|---:|" << (has_tasks ? "---:|" : "");
  for (size_t i = 0; i < spec.eval.niah_tasks.size(); ++i) md << "---:|";
  md << "\n";
  for (const auto& t : d.teachers) {
    if (!d.teacher_eval.count(t)) continue;
    const auto& e = d.teacher_eval.at(t);
    md << "| " << t << " | " << e.value("parameters", int64_t{0}) << " | " << num(get_ppl(e), 2) << " |";
    if (has_tasks) md << " " << num(100 * e.value("average", 0.0), 1) << " |";
    for (const auto& task : spec.eval.niah_tasks)
      md << " " << (e["niah"].contains(task) ? num(100 * e["niah"][task]["average"].get<double>(), 1) : "-") << " |";
    md << "\n";
  }
  md << "\n";

  for (const auto& variant : d.variants) {
    if (d.variants.size() > 1) md << "## Variant " << variant << "\n\n";
    if (const std::string f = findings(d, spec, variant, params); !f.empty())
      md << "## What the numbers show" << (d.variants.size() > 1 ? " (" + variant + ")" : "") << "\n\n" << f << "\n\n";
    // Recovery and the perplexity gap, at the largest budget.
    md << "## Recovery at " << d.top_budget << " tokens\n\n";
    md << recovery_table(d, variant, "recovery", "Task recovery % (mean student score / mean teacher score)") << "\n";
    md << recovery_table(d, variant, "ppl_recovery", "Perplexity recovery % (teacher ppl / student ppl)") << "\n";
    std::vector<Series> gaps;
    md << "**Perplexity gap to the teacher % (student ppl / teacher ppl - 1)**\n\n| mixer |";
    for (const auto& t : d.teachers) md << " " << t << " |";
    md << "\n|---|";
    for (size_t i = 0; i < d.teachers.size(); ++i) md << "---:|";
    md << "\n";
    for (const auto& m : d.mixers) {
      Series s;
      s.name = m;
      md << "| " << m << " |";
      for (const auto& t : d.teachers) {
        const auto* r = d.find(t, m, variant, d.top_budget);
        const double gap = r && d.teacher_eval.count(t) ? 100 * (get_ppl(*r) / get_ppl(d.teacher_eval.at(t)) - 1) : std::nan("");
        md << " " << num(gap, 1) << " |";
        if (std::isfinite(gap) && params(t) > 0) s.points.emplace_back(static_cast<double>(params(t)), gap);
      }
      md << "\n";
      if (!s.points.empty()) gaps.push_back(s);
    }
    md << "\n";
    if (!gaps.empty() && d.teachers.size() > 1)
      figures.push_back({"gap_by_scale_" + variant + ".svg",
                         svg_line_chart("Perplexity gap to the teacher (" + variant + ")", gaps,
                                        "teacher parameters", "gap %", true)});

    // NIAH.
    for (const auto& task : spec.eval.niah_tasks) {
      for (const auto& t : d.teachers) {
        md << "## " << task << ", teacher " << t << "\n\nAccuracy % per context length (RULER's string match).\n\n";
        Heatmap h;
        h.title = task + ": " + t + " (" + variant + ")";
        h.x_label = "context length (tokens)";
        h.y_label = "model";
        md << "| model |";
        for (int64_t l : spec.eval.niah_lengths) {
          md << " " << l << " |";
          h.col_labels.push_back(std::to_string(l));
        }
        md << "\n|---|";
        for (size_t i = 0; i < spec.eval.niah_lengths.size(); ++i) md << "---:|";
        md << "\n";
        auto row = [&](const std::string& label, const nlohmann::json* r) {
          md << "| " << label << " |";
          std::vector<double> v;
          for (int64_t l : spec.eval.niah_lengths) {
            const double a = r ? niah_at(*r, task, l) : std::nan("");
            md << " " << num(100 * a, 0) << " |";
            v.push_back(a);
          }
          md << "\n";
          h.row_labels.push_back(label);
          h.values.push_back(v);
        };
        row("teacher", d.teacher_eval.count(t) ? &d.teacher_eval.at(t) : nullptr);
        for (const auto& m : d.mixers) row(m, d.find(t, m, variant, d.top_budget));
        md << "\n";
        figures.push_back({"niah_" + task + "_" + t + "_" + variant + ".svg", svg_heatmap(h)});
      }
    }

    // The budget curve.
    if (spec.budgets.size() > 1) {
      for (const auto& t : d.teachers) {
        std::vector<Series> curve;
        for (const auto& m : d.mixers) {
          Series s;
          s.name = m;
          for (int64_t b : spec.budgets)
            if (const auto* r = d.find(t, m, variant, b)) {
              const char* f = r->contains("recovery") ? "recovery" : "ppl_recovery";
              if (r->contains(f)) s.points.emplace_back(static_cast<double>(b), (*r)[f].get<double>());
            }
          if (!s.points.empty()) curve.push_back(s);
        }
        if (!curve.empty())
          figures.push_back({"budget_" + t + "_" + variant + ".svg",
                             svg_line_chart("Recovery against distillation tokens, teacher " + t, curve,
                                            "distillation tokens", has_tasks ? "task recovery %" : "ppl recovery %", true)});
      }
    }

    // Agreement with the study's S-NIAH-1 at 2k.
    if (std::find(spec.eval.niah_tasks.begin(), spec.eval.niah_tasks.end(), "s_niah_1") != spec.eval.niah_tasks.end() &&
        !spec.eval.niah_lengths.empty()) {
      int64_t near = spec.eval.niah_lengths.front();
      for (int64_t l : spec.eval.niah_lengths)
        if (std::abs(std::log(static_cast<double>(l) / 2048)) < std::abs(std::log(static_cast<double>(near) / 2048))) near = l;
      md << "## Agreement with the study (S-NIAH-1 at 2k tokens)\n\nThe study's 1.7B students: Gated DeltaNet 81.8%, "
            "mLSTM 25.2%, KDA 2.0%, DeltaNet, GLA, linear attention and RetNet 0%. Spearman's rank correlation of "
            "our accuracies at "
         << near << " tokens with those (1 = the same order, 0 = unrelated):\n\n| teacher | rho | mixers |\n|---|---:|---:|\n";
      for (const auto& t : d.teachers) {
        std::vector<double> ours, theirs;
        for (const auto& m : d.mixers)
          if (const auto* r = d.find(t, m, variant, d.top_budget); r && study_niah_2k().count(m)) {
            const double a = niah_at(*r, "s_niah_1", near);
            if (std::isfinite(a)) ours.push_back(a), theirs.push_back(study_niah_2k().at(m));
          }
        md << "| " << t << " | " << num(spearman(ours, theirs), 2) << " | " << ours.size() << " |\n";
      }
      md << "\n(rho is undefined, shown as -, when every mixer has the same accuracy.)\n\n";
    }
  }

  for (const auto& [name, svg] : figures) {
    write_file_atomic((fs::path(report_dir) / name).string(), [&](std::ostream& s) { s << svg; });
    md << "![" << name << "](" << name << ")\n\n";
  }
  write_file_atomic((fs::path(report_dir) / "report.md").string(), [&](std::ostream& s) { s << md.str(); });
  nlohmann::json all = {{"study", spec.name}, {"teachers", nlohmann::json::object()}, {"results", d.results}};
  for (const auto& [t, e] : d.teacher_eval) all["teachers"][t] = e;
  write_file_atomic((fs::path(report_dir) / "results.json").string(), [&](std::ostream& s) { s << all.dump(1) << "\n"; });
}

}  // namespace linearize
