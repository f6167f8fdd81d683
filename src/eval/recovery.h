// Recovery: how much of the teacher's zero-shot quality a student keeps,
//   recovery % = mean(student headline scores) / mean(teacher headline scores) x 100,
// over the tasks both results share (each task's headline "score", see tasks.h). Also the pieces of
// `linearize eval all`: the default NIAH settings and the merging of task and NIAH results.
//
// Not done here: per-task recovery ratios averaged (the paper averages scores first), significance.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace linearize {

// mean(student) / mean(teacher) x 100; errors when the lists differ in size, are empty, or the teacher
// mean is not positive.
double recovery_percent(const std::vector<double>& student, const std::vector<double>& teacher);

// Task names present in both results' "tasks" objects, in `task_names()` order then any others.
std::vector<std::string> shared_tasks(const nlohmann::json& student, const nlohmann::json& teacher);

// The headline scores tasks[name]["score"] of `results` for `names`; errors name the missing field.
std::vector<double> headline_scores(const nlohmann::json& results, const std::vector<std::string>& names);

// Recovery of two results JSONs (see tasks.h) over their shared tasks.
double recovery_percent(const nlohmann::json& student, const nlohmann::json& teacher);

// Display name of a result: its "label", else the last component of its "model" path.
std::string result_name(const nlohmann::json& results);
// File name (without .json) for a result: its "label", else the last two components of its "model" path
// ("135m__gdn"), so that students of one mixer under two teachers' folders do not overwrite each other.
std::string result_file_name(const nlohmann::json& results);

}  // namespace linearize
