// Recovery arithmetic over results JSONs. See recovery.h.
#include "eval/recovery.h"

#include <algorithm>
#include <filesystem>
#include <numeric>

#include "eval/tasks.h"
#include "io/error.h"

namespace linearize {

double recovery_percent(const std::vector<double>& student, const std::vector<double>& teacher) {
  if (student.size() != teacher.size())
    throw Error("recovery: " + std::to_string(student.size()) + " student scores vs " +
                std::to_string(teacher.size()) + " teacher scores");
  if (student.empty()) throw Error("recovery: no shared tasks between student and teacher");
  const double s = std::accumulate(student.begin(), student.end(), 0.0) / student.size();
  const double t = std::accumulate(teacher.begin(), teacher.end(), 0.0) / teacher.size();
  if (!(t > 0)) throw Error("recovery: the teacher's mean score is " + std::to_string(t) + " (must be positive)");
  return 100.0 * s / t;
}

std::vector<std::string> shared_tasks(const nlohmann::json& student, const nlohmann::json& teacher) {
  std::vector<std::string> out;
  if (!student.contains("tasks") || !teacher.contains("tasks")) return out;
  const auto& a = student["tasks"];
  const auto& b = teacher["tasks"];
  for (const auto& n : task_names())
    if (a.contains(n) && b.contains(n)) out.push_back(n);
  for (const auto& [n, v] : a.items())
    if (b.contains(n) && std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
  return out;
}

std::vector<double> headline_scores(const nlohmann::json& results, const std::vector<std::string>& names) {
  std::vector<double> out;
  for (const auto& n : names) {
    const auto& t = results.at("tasks");
    if (!t.contains(n) || !t[n].contains("score") || !t[n]["score"].is_number())
      throw Error("results of " + result_name(results) + ": tasks." + n + ".score missing or not a number");
    out.push_back(t[n]["score"].get<double>());
  }
  return out;
}

double recovery_percent(const nlohmann::json& student, const nlohmann::json& teacher) {
  const auto names = shared_tasks(student, teacher);
  return recovery_percent(headline_scores(student, names), headline_scores(teacher, names));
}

std::string result_name(const nlohmann::json& results) {
  if (results.contains("label") && results["label"].is_string()) return results["label"].get<std::string>();
  if (results.contains("model") && results["model"].is_string()) {
    std::filesystem::path p(results["model"].get<std::string>());
    if (p.filename().empty()) p = p.parent_path();
    return p.filename().string();
  }
  return "model";
}

std::string result_file_name(const nlohmann::json& results) {
  if (results.contains("label") && results["label"].is_string()) return results["label"].get<std::string>();
  if (results.contains("model") && results["model"].is_string()) {
    std::filesystem::path p = std::filesystem::path(results["model"].get<std::string>()).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();
    const std::string parent = p.parent_path().filename().string();
    return (parent.empty() || parent == "." || parent == "..") ? p.filename().string() : parent + "__" + p.filename().string();
  }
  return "model";
}

}  // namespace linearize
