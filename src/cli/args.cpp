#include "cli/args.h"

#include <sstream>

#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "io/error.h"

namespace linearize::cli {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep))
    if (!cur.empty()) out.push_back(cur);
  return out;
}

Args::Args(const CommandSpec& spec, const std::vector<std::string>& argv) : spec_(spec) {
  const std::string where = "linearize " + spec.name;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "--help" || a == "-h") {
      help_ = true;
      return;
    }
    if (a.rfind("--", 0) == 0 && a.size() > 2) {
      std::string name = a.substr(2), value;
      bool inline_value = false;
      if (auto eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
        inline_value = true;
      }
      const OptionSpec& o = spec_of(name);
      if (o.value_name.empty()) {
        if (inline_value) throw Error(where + ": option --" + name + " takes no value");
        values_[name] = "1";
        continue;
      }
      if (!inline_value) {
        if (i + 1 >= argv.size())
          throw Error(where + ": option --" + name + " needs a value (" + o.value_name + ")");
        value = argv[++i];
      }
      values_[name] = value;
      continue;
    }
    positional_.push_back(a);
  }
  if (static_cast<int>(positional_.size()) < spec.min_positional)
    throw Error(where + ": missing argument " + spec.usage + " (see --help)");
  if (static_cast<int>(positional_.size()) > spec.max_positional)
    throw Error(where + ": unexpected argument \"" + positional_[spec.max_positional] + "\" (see --help)");
  // With --config, required options may come from the file: checked once it is applied.
  if (!values_.count("config")) check_required();
}

void Args::check_required() const {
  for (const auto& o : spec_.options)
    if (o.required && !values_.count(o.name))
      throw Error("linearize " + spec_.name + ": missing required option --" + o.name + " " + o.value_name);
}

const OptionSpec& Args::spec_of(const std::string& name) const {
  for (const auto& o : spec_.options)
    if (o.name == name) return o;
  throw Error("linearize " + spec_.name + ": unknown option --" + name + " (see --help)");
}

bool Args::knows(const std::string& name) const {
  for (const auto& o : spec_.options)
    if (o.name == name) return true;
  return false;
}

bool Args::has(const std::string& name) const { return values_.count(name) > 0; }

bool Args::flag(const std::string& name) const {
  spec_of(name);
  return values_.count(name) > 0;
}

std::optional<std::string> Args::maybe(const std::string& name) const {
  const auto& o = spec_of(name);
  if (auto it = values_.find(name); it != values_.end()) return it->second;
  if (!o.default_value.empty()) return o.default_value;
  return std::nullopt;
}

std::string Args::str(const std::string& name) const {
  auto v = maybe(name);
  if (!v) throw Error("linearize " + spec_.name + ": option --" + name + " is required");
  return *v;
}

int64_t Args::integer(const std::string& name) const {
  const std::string v = str(name);
  try {
    size_t used = 0;
    double d = std::stod(v, &used);  // accepts 1e6 for token budgets
    if (used != v.size() || d != static_cast<double>(static_cast<int64_t>(d))) throw 0;
    return static_cast<int64_t>(d);
  } catch (...) {
    throw Error("linearize " + spec_.name + ": --" + name + " expects an integer, got \"" + v + "\"");
  }
}

double Args::number(const std::string& name) const {
  const std::string v = str(name);
  try {
    size_t used = 0;
    double d = std::stod(v, &used);
    if (used != v.size()) throw 0;
    return d;
  } catch (...) {
    throw Error("linearize " + spec_.name + ": --" + name + " expects a number, got \"" + v + "\"");
  }
}

std::vector<std::string> Args::str_list(const std::string& name) const { return split(str(name), ','); }

std::vector<int64_t> Args::int_list(const std::string& name) const {
  std::vector<int64_t> out;
  for (const auto& s : str_list(name)) {
    try {
      size_t used = 0;
      out.push_back(std::stoll(s, &used));
      if (used != s.size()) throw 0;
    } catch (...) {
      throw Error("linearize " + spec_.name + ": --" + name + " expects a comma-separated list of integers, got \"" + s + "\"");
    }
  }
  return out;
}

void Args::apply_config_file(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": malformed JSON: " + e.what());
  }
  if (!j.is_object()) throw Error(path + ": a config file must hold one JSON object of option: value");
  for (auto it = j.begin(); it != j.end(); ++it) {
    std::string name = it.key();
    for (auto& c : name)
      if (c == '_') c = '-';
    const OptionSpec* spec = nullptr;
    for (const auto& o : spec_.options)
      if (o.name == name) spec = &o;
    if (!spec || name == "config")
      throw Error(path + ": unknown key \"" + it.key() + "\" for linearize " + spec_.name + " (see --help)");
    if (values_.count(name)) continue;  // the command line wins
    const auto& v = it.value();
    if (spec->value_name.empty()) {
      if (!v.is_boolean()) throw Error(path + ": key \"" + it.key() + "\" is a flag: use true or false");
      if (v.get<bool>()) values_[name] = "1";
    } else if (v.is_string()) {
      values_[name] = v.get<std::string>();
    } else if (v.is_array()) {
      std::string joined;
      for (const auto& x : v) joined += (joined.empty() ? "" : ",") + (x.is_string() ? x.get<std::string>() : x.dump());
      values_[name] = joined;
    } else if (v.is_number() || v.is_boolean() || (v.is_object() && spec->value_name == "JSON")) {
      values_[name] = v.dump();
    } else {
      throw Error(path + ": key \"" + it.key() + "\" must be a string, number or list");
    }
  }
  check_required();
}

std::string help_text(const CommandSpec& spec) {
  std::ostringstream h;
  h << "usage: linearize " << spec.name;
  if (!spec.usage.empty()) h << " " << spec.usage;
  if (!spec.options.empty()) h << " [options]";
  h << "\n\n" << spec.summary << "\n";
  if (!spec.options.empty()) {
    h << "\noptions:\n";
    for (const auto& o : spec.options) {
      std::string left = "  --" + o.name + (o.value_name.empty() ? "" : " " + o.value_name);
      h << left;
      if (left.size() < 28) h << std::string(28 - left.size(), ' ');
      else h << "\n" << std::string(28, ' ');
      h << o.help;
      if (o.required) h << " (required)";
      else if (!o.default_value.empty()) h << " (default: " << o.default_value << ")";
      h << "\n";
    }
    h << "  --help                    show this help\n";
  }
  if (!spec.details.empty()) h << "\n" << spec.details << "\n";
  return h.str();
}

}  // namespace linearize::cli
