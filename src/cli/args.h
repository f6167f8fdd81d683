// A small declarative option parser for the subcommands: each command lists its options once, and
// the same list drives parsing, defaults, validation and the --help text.
//   --name VALUE | --name=VALUE   options with a value
//   --flag                        boolean flags
//   positional arguments, named in the usage line
// Unknown options and missing required values are errors naming the option and the command.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace linearize::cli {

struct OptionSpec {
  std::string name;        // without dashes, e.g. "max-new-tokens"
  std::string value_name;  // e.g. "N"; empty for a boolean flag
  std::string help;
  std::string default_value{};  // shown in help; empty = no default ({} spares aggregates naming it)
  bool required = false;
};

struct CommandSpec {
  std::string name;      // e.g. "eval ppl"
  std::string summary;   // one line
  std::string usage;     // positional part, e.g. "MODEL_DIR"
  std::string details;   // free text after the options in --help
  std::vector<OptionSpec> options;
  int min_positional = 0, max_positional = 0;
  std::string program = "linearize";  // the binary (the benches have their own)
  // How help and errors name the command: "linearize eval ppl", or the program alone when `name` is empty.
  std::string title() const { return name.empty() ? program : program + " " + name; }
};

class Args {
 public:
  // Throws linearize::Error for bad input; returns help_requested() when --help/-h was given.
  Args(const CommandSpec& spec, const std::vector<std::string>& argv);

  bool help_requested() const { return help_; }
  bool has(const std::string& name) const;  // given on the command line (or flag set)
  bool flag(const std::string& name) const;
  bool knows(const std::string& name) const;  // the command has this option
  std::string str(const std::string& name) const;  // value or default; error if neither
  std::optional<std::string> maybe(const std::string& name) const;
  int64_t integer(const std::string& name) const;
  double number(const std::string& name) const;
  std::vector<int64_t> int_list(const std::string& name) const;  // "1,2,3"
  std::vector<std::string> str_list(const std::string& name) const;
  const std::vector<std::string>& positional() const { return positional_; }

  // Fills options not given on the command line from a JSON object file ({"seq-len": 512, ...};
  // underscores may stand for dashes; true sets a flag). Unknown keys are an error naming the file
  // and key, before any work starts.
  void apply_config_file(const std::string& path);

 private:
  void check_required() const;
  void check_numbers() const;
  void check_range(const std::string& name, double v) const;  // NaN, inf and out-of-range values are errors
  const OptionSpec& spec_of(const std::string& name) const;
  const CommandSpec& spec_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
  bool help_ = false;
};

std::string help_text(const CommandSpec& spec);

// A default as --help shows it, taken from the code's own defaults ("0.0003", "1"; lists joined by `sep`:
// "1,2,3", "0.026|0.053|0.92"), so that the help cannot drift from what the code does.
std::string default_text(double v);
std::string default_text(int64_t v);
std::string default_text(const std::vector<double>& v, char sep);
std::string default_text(const std::vector<int>& v, char sep);
std::string default_text(const std::vector<int64_t>& v, char sep);

std::vector<std::string> split(const std::string& s, char sep);

}  // namespace linearize::cli
