// The single exception type of the project. Messages say what was expected, what was found and where
// (file, tensor name, config field, line of a jsonl), so the command line can print them as one line.
#pragma once
#include <stdexcept>
#include <string>

namespace linearize {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace linearize
