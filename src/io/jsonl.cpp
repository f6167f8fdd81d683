#include "io/jsonl.h"

#include <cerrno>
#include <cstring>
#include <fstream>

#include "io/error.h"
#include "io/atomic_file.h"

namespace linearize {

void for_each_jsonl(const std::string& path, const std::function<void(const nlohmann::json&, int64_t)>& fn) {
  require_regular_file(path);
  std::ifstream in(path);
  if (!in) throw Error("cannot open " + path + ": " + std::strerror(errno));
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw Error(path + ":" + std::to_string(n) + ": malformed JSON line: " + e.what());
    }
    fn(j, n);
  }
}

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  for_each_jsonl(path, [&](const nlohmann::json& j, int64_t) { out.push_back(j); });
  return out;
}

std::string jsonl_string(const nlohmann::json& j, const std::string& field, const std::string& path, int64_t line) {
  if (!j.is_object() || !j.contains(field) || !j[field].is_string())
    throw Error(path + ":" + std::to_string(line) + ": missing string field \"" + field + "\"");
  return j[field].get<std::string>();
}

}  // namespace linearize
