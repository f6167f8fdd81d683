// Report assembly: Markdown tables and the choice of figures. See markdown.h.
#include "report/markdown.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "eval/recovery.h"
#include "eval/tasks.h"
#include "io/atomic_file.h"
#include "io/error.h"
#include "report/svg.h"

namespace linearize {

namespace fs = std::filesystem;

namespace {

std::string pct(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", 100 * v);
  return b;
}

std::string fixed1(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

std::string task_title(const std::string& t) {
  static const std::map<std::string, std::string> names = {
      {"lambada", "LAMBADA"},      {"arc_easy", "ARC-e"},  {"arc_challenge", "ARC-c"}, {"hellaswag", "HellaSwag"},
      {"piqa", "PIQA"},            {"winogrande", "WinoGrande"}, {"openbookqa", "OBQA"}};
  auto it = names.find(t);
  return it == names.end() ? t : it->second;
}

// Task columns: the known tasks in paper order, then any others, as they appear in the inputs.
std::vector<std::string> task_columns(const std::vector<ReportInput>& inputs) {
  std::vector<std::string> out;
  auto seen = [&](const std::string& n) { return std::find(out.begin(), out.end(), n) != out.end(); };
  for (const auto& n : task_names())
    for (const auto& in : inputs)
      if (in.results.contains("tasks") && in.results["tasks"].contains(n) && !seen(n)) out.push_back(n);
  for (const auto& in : inputs)
    if (in.results.contains("tasks"))
      for (const auto& [n, v] : in.results["tasks"].items())
        if (!seen(n)) out.push_back(n);
  return out;
}

std::vector<std::string> niah_tasks(const std::vector<ReportInput>& inputs) {
  std::set<std::string> s;
  for (const auto& in : inputs)
    if (in.results.contains("niah"))
      for (const auto& [t, v] : in.results["niah"].items()) s.insert(t);
  return {s.begin(), s.end()};
}

std::string file_safe(const std::string& s) {
  std::string out;
  for (char c : s) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.') ? c : '_';
  return out;
}

std::string label_with_mixer(const ReportInput& in) {
  const auto& r = in.results;
  if (r.contains("mixer") && r["mixer"].is_string() && r["mixer"].get<std::string>() != in.name)
    return in.name + " (" + r["mixer"].get<std::string>() + ")";
  return in.name;
}

std::string tasks_table(const std::vector<ReportInput>& inputs) {
  const auto cols = task_columns(inputs);
  bool any_recovery = false;
  for (const auto& in : inputs) any_recovery = any_recovery || report_recovery(in, inputs) >= 0;
  std::ostringstream o;
  o << "| model |";
  for (const auto& c : cols) o << " " << task_title(c) << " |";
  o << " average |" << (any_recovery ? " recovery % |" : "") << "\n|---|";
  for (size_t i = 0; i < cols.size() + 1 + any_recovery; ++i) o << "---:|";
  o << "\n";
  for (const auto& in : inputs) {
    o << "| " << label_with_mixer(in) << (in.teacher ? " (teacher)" : "") << " |";
    for (const auto& c : cols) {
      const auto& t = in.results.value("tasks", nlohmann::json::object());
      o << " " << (t.contains(c) && t[c].contains("score") ? pct(t[c]["score"].get<double>()) : "-") << " |";
    }
    o << " " << (in.results.contains("average") ? pct(in.results["average"].get<double>()) : "-") << " |";
    if (any_recovery) {
      const double r = report_recovery(in, inputs);
      o << " " << (in.teacher ? "100.0" : r >= 0 ? fixed1(r) : "-") << " |";
    }
    o << "\n";
  }
  o << "\nHeadline metrics (%): ";
  for (size_t i = 0; i < cols.size(); ++i) {
    std::string metric = "acc";
    for (const auto& in : inputs)
      if (in.results.contains("tasks") && in.results["tasks"].contains(cols[i]))
        metric = in.results["tasks"][cols[i]].value("metric", metric);
    o << (i ? ", " : "") << task_title(cols[i]) << " " << metric;
  }
  o << ". Average = mean of the headline metrics; recovery = mean(student) / mean(teacher) x 100 over the "
       "tasks both share.\n";
  return o.str();
}

std::string niah_table(const std::vector<ReportInput>& inputs, const std::string& task) {
  std::vector<int64_t> lengths;
  for (const auto& in : inputs)
    if (in.results.contains("niah") && in.results["niah"].contains(task))
      for (const auto& l : in.results["niah"][task]["lengths"]) lengths.push_back(l.get<int64_t>());
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  std::ostringstream o;
  o << "| model |";
  for (auto l : lengths) o << " " << l << " |";
  o << " average |\n|---|";
  for (size_t i = 0; i <= lengths.size(); ++i) o << "---:|";
  o << "\n";
  for (const auto& in : inputs) {
    if (!in.results.contains("niah") || !in.results["niah"].contains(task)) continue;
    const auto& n = in.results["niah"][task];
    o << "| " << label_with_mixer(in) << (in.teacher ? " (teacher)" : "") << " |";
    for (auto l : lengths) {
      const std::string k = std::to_string(l);
      o << " " << (n["per_length"].contains(k) ? pct(n["per_length"][k].get<double>()) : "-") << " |";
    }
    o << " " << pct(n.value("average", 0.0)) << " |\n";
  }
  return o.str();
}

Heatmap niah_heatmap(const ReportInput& in, const std::string& task) {
  const auto& n = in.results["niah"][task];
  Heatmap h;
  h.title = in.name + ": " + task + " accuracy";
  h.x_label = "context length (tokens)";
  h.y_label = "needle depth";
  for (const auto& l : n["lengths"]) h.col_labels.push_back(std::to_string(l.get<int64_t>()));
  const auto& depths = n["depths"];
  for (size_t d = 0; d < depths.size(); ++d) {
    char b[16];
    std::snprintf(b, sizeof b, "%.0f%%", 100 * depths[d].get<double>());
    h.row_labels.push_back(b);
    std::vector<double> row;
    for (size_t l = 0; l < n["lengths"].size(); ++l) {
      const auto& cell = n["grid"][l][d];  // null: no needle fell in this depth bin
      row.push_back(cell.is_number() ? cell.get<double>() : std::nan(""));
    }
    h.values.push_back(row);
  }
  return h;
}

// Recovery (or average %) against `field` ("scale" or "tokens"), one series per mixer.
std::vector<Series> scaling_series(const std::vector<ReportInput>& inputs, const std::string& field, bool recovery) {
  std::map<std::string, Series> by_mixer;
  for (const auto& in : inputs) {
    if (in.teacher || !in.results.contains(field) || !in.results[field].is_number()) continue;
    const std::string mixer = in.results.value("mixer", in.name);
    const double y = recovery ? report_recovery(in, inputs) : 100 * in.results.value("average", 0.0);
    if (recovery && y < 0) continue;
    by_mixer[mixer].name = mixer;
    by_mixer[mixer].points.emplace_back(in.results[field].get<double>(), y);
  }
  std::vector<Series> out;
  for (auto& [k, s] : by_mixer) out.push_back(s);
  return out;
}

}  // namespace

std::vector<ReportInput> load_report_inputs(const std::vector<std::string>& paths) {
  std::vector<ReportInput> out;
  for (const auto& p : paths) {
    ReportInput in;
    in.source = p;
    try {
      in.results = nlohmann::json::parse(read_file(p));
    } catch (const nlohmann::json::exception& e) {
      throw Error(p + ": not valid JSON: " + e.what());
    }
    if (!in.results.is_object() || (!in.results.contains("tasks") && !in.results.contains("niah") &&
                                    !in.results.contains("grid")))
      throw Error(p + ": expected a results object with \"tasks\" or \"niah\" (from `linearize eval`)");
    if (in.results.contains("grid") && !in.results.contains("niah")) {  // a bare `eval niah` result
      const std::string task = in.results.value("task", "s_niah_1");
      nlohmann::json wrapped = {{"model", in.results.value("model", p)}, {"niah", {{task, in.results}}}};
      in.results = wrapped;
    }
    in.name = result_name(in.results);
    in.teacher = in.results.value("role", "") == "teacher";
    out.push_back(std::move(in));
  }
  return out;
}

namespace {

std::string normal_path(const std::string& p) {
  std::error_code ec;
  fs::path c = fs::weakly_canonical(fs::path(p), ec);
  if (ec) c = fs::path(p).lexically_normal();
  if (c.filename().empty()) c = c.parent_path();  // "/m/large/" is "/m/large"
  return c.string();
}

// The student's own teacher among the inputs: the one whose "model" is the student's "teacher"; with no
// "teacher" recorded, the only teacher when there is exactly one.
const ReportInput* own_teacher(const ReportInput& input, const std::vector<ReportInput>& all) {
  const bool named = input.results.contains("teacher") && input.results["teacher"].is_string();
  const ReportInput* only = nullptr;
  int teachers = 0;
  for (const auto& t : all) {
    if (!t.teacher) continue;
    ++teachers;
    only = &t;
    if (named && t.results.contains("model") && t.results["model"].is_string() &&
        normal_path(t.results["model"].get<std::string>()) == normal_path(input.results["teacher"].get<std::string>()))
      return &t;
  }
  return !named && teachers == 1 ? only : nullptr;
}

}  // namespace

double report_recovery(const ReportInput& input, const std::vector<ReportInput>& all) {
  if (input.teacher) return 100.0;
  if (const auto* t = own_teacher(input, all))
    if (input.results.contains("tasks") && !shared_tasks(input.results, t->results).empty())
      return recovery_percent(input.results, t->results);
  if (input.results.contains("recovery") && input.results["recovery"].is_number())
    return input.results["recovery"].get<double>();
  return -1;
}

std::vector<std::pair<std::string, std::string>> report_figures(const std::vector<ReportInput>& inputs) {
  std::vector<std::pair<std::string, std::string>> figs;
  for (const auto& task : niah_tasks(inputs))
    for (const auto& in : inputs)
      if (in.results.contains("niah") && in.results["niah"].contains(task))
        figs.emplace_back("niah_" + file_safe(task) + "_" + file_safe(in.name) + ".svg", svg_heatmap(niah_heatmap(in, task)));
  std::vector<Bar> bars;
  for (const auto& in : inputs) {
    const double r = report_recovery(in, inputs);
    if (!in.teacher && r >= 0) bars.push_back({label_with_mixer(in), r});
  }
  if (!bars.empty())
    figs.emplace_back("recovery.svg", svg_bar_chart("Recovery of teacher quality", bars, "recovery %", 100));
  bool teacher = std::any_of(inputs.begin(), inputs.end(), [](const ReportInput& i) { return i.teacher; });
  for (const std::string field : {"scale", "tokens"}) {
    const auto series = scaling_series(inputs, field, teacher);
    if (series.empty()) continue;
    const std::string y = teacher ? "recovery %" : "average headline score %";
    const std::string x = field == "scale" ? "model scale" : "distillation tokens";
    figs.emplace_back(field + ".svg", svg_line_chart(y + " vs " + x, series, x, y, true));
  }
  return figs;
}

std::string markdown_report(const std::vector<ReportInput>& inputs, const std::vector<std::string>& figures) {
  std::ostringstream o;
  o << "# Evaluation report\n\nInputs: ";
  for (size_t i = 0; i < inputs.size(); ++i) o << (i ? ", " : "") << "`" << inputs[i].source << "`";
  o << "\n\n";
  if (!task_columns(inputs).empty()) o << "## Zero-shot tasks\n\n" << tasks_table(inputs) << "\n";
  for (const auto& task : niah_tasks(inputs))
    o << "## Needle in a haystack: " << task << "\n\nAccuracy (%) per context length: the needle's value found in "
      << "the greedy output (RULER's string match), needles at random depths.\n\n" << niah_table(inputs, task) << "\n";
  if (!figures.empty()) {
    o << "## Figures\n\n";
    for (const auto& f : figures) o << "![" << f << "](" << f << ")\n\n";
  }
  return o.str();
}

std::vector<std::string> write_report(const std::vector<ReportInput>& inputs, const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::vector<std::string> written, names;
  for (const auto& [name, svg] : report_figures(inputs)) {
    const std::string path = (std::filesystem::path(dir) / name).string();
    write_file_atomic(path, [&](std::ostream& out) { out << svg; });
    written.push_back(path);
    names.push_back(name);
  }
  const std::string md = (std::filesystem::path(dir) / "report.md").string();
  write_file_atomic(md, [&](std::ostream& out) { out << markdown_report(inputs, names); });
  written.insert(written.begin(), md);
  return written;
}

}  // namespace linearize
