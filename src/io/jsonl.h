// JSON Lines reading with error locations: every malformed line is reported as FILE:LINE with the
// parser's complaint. Blank lines are skipped.
#pragma once
#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

namespace linearize {

// Calls fn(object, line_number) for every non-blank line of `path`.
void for_each_jsonl(const std::string& path, const std::function<void(const nlohmann::json&, int64_t)>& fn);

// All lines of a jsonl file.
std::vector<nlohmann::json> read_jsonl(const std::string& path);

// The string field `field` of `j`, or an error "FILE:LINE: missing string field "field"".
std::string jsonl_string(const nlohmann::json& j, const std::string& field, const std::string& path, int64_t line);

}  // namespace linearize
