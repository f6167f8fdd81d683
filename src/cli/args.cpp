#include "cli/args.h"

#include <cmath>
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
  const std::string where = spec.title();
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
  check_numbers();
}

// Numeric options are parsed and range-checked as soon as they are known, before a command reads any file.
void Args::check_numbers() const {
  for (const auto& [name, value] : values_) {
    const std::string& kind = spec_of(name).value_name;
    if (kind == "N") integer(name);
    else if (kind == "X" || kind == "F" || kind == "T" || kind == "P") number(name);
  }
}

void Args::check_required() const {
  for (const auto& o : spec_.options)
    if (o.required && !values_.count(o.name))
      throw Error(spec_.title() + ": missing required option --" + o.name + " " + o.value_name);
}

const OptionSpec& Args::spec_of(const std::string& name) const {
  for (const auto& o : spec_.options)
    if (o.name == name) return o;
  throw Error(spec_.title() + ": unknown option --" + name + " (see --help)");
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
  if (!v) throw Error(spec_.title() + ": option --" + name + " is required");
  return *v;
}

namespace {

// The valid range of each numeric option, by name: the names mean the same in every command, so one table
// serves them all. NaN and infinity are refused everywhere.
struct Range {
  double lo = -INFINITY, hi = INFINITY;
  bool lo_open = false;  // lo itself excluded
};

const std::map<std::string, Range>& option_ranges() {
  static const std::map<std::string, Range> ranges = {
      // sizes and counts
      {"hidden", {1}}, {"layers", {1}}, {"heads", {1}}, {"kv-heads", {1}}, {"intermediate", {1}},
      {"seq-len", {1}}, {"sft-seq-len", {1}}, {"batch", {1}}, {"grad-accum", {1}}, {"steps", {1}},
      {"max-steps", {1}}, {"tokens", {1}}, {"threads", {1}}, {"samples", {1}}, {"max-new-tokens", {1}},
      {"log-every", {1}}, {"shard-tokens", {1}}, {"nproc-per-node", {1}}, {"limit", {1}}, {"max-tokens", {1}},
      {"checkpoint-every", {0}}, {"stop-after", {1}}, {"max-bytes", {0}}, {"seed", {0}}, {"vocab", {260}},
      {"prompt-tokens", {1}}, {"requests", {1}}, {"max-prefill-tokens", {0}}, {"memory-gib", {0, INFINITY, true}},
      // optimisation
      {"lr", {0, INFINITY, true}}, {"lr1", {0, INFINITY, true}}, {"lr2", {0, INFINITY, true}},
      {"lr3", {0, INFINITY, true}}, {"sft-lr", {0, INFINITY, true}}, {"warmup", {0, 1}}, {"clip", {0}},
      {"weight-decay", {0}}, {"epochs", {0, INFINITY, true}},
      // losses, sampling, model
      {"kl-weight", {0}}, {"ce-weight", {0}}, {"kl-temperature", {0, INFINITY, true}}, {"temperature", {0}},
      {"top-p", {0, 1, true}}, {"rope-theta", {0, INFINITY, true}}, {"scale", {0, INFINITY, true}},
  };
  return ranges;
}

std::string plain_number(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

}  // namespace

void Args::check_range(const std::string& name, double v) const {
  const std::string where = spec_.title() + ": --" + name;
  if (!std::isfinite(v)) throw Error(where + " must be a finite number, got \"" + str(name) + "\"");
  auto it = option_ranges().find(name);
  if (it == option_ranges().end()) return;
  const Range& r = it->second;
  const bool low = r.lo_open ? v <= r.lo : v < r.lo;
  if (!low && v <= r.hi) return;
  std::string expected;
  if (std::isfinite(r.hi))
    expected = "between " + plain_number(r.lo) + (r.lo_open ? " (excluded)" : "") + " and " + plain_number(r.hi);
  else
    expected = r.lo_open ? "greater than " + plain_number(r.lo) : "at least " + plain_number(r.lo);
  throw Error(where + " must be " + expected + ", got " + str(name));
}

int64_t Args::integer(const std::string& name) const {
  const std::string v = str(name);
  double d = 0;
  try {
    size_t used = 0;
    d = std::stod(v, &used);  // accepts 1e6 for token budgets
    if (used != v.size() || !(std::fabs(d) < 9.2e18) || d != static_cast<double>(static_cast<int64_t>(d))) throw 0;
  } catch (...) {
    throw Error(spec_.title() + ": --" + name + " expects an integer, got \"" + v + "\"");
  }
  check_range(name, d);
  return static_cast<int64_t>(d);
}

double Args::number(const std::string& name) const {
  const std::string v = str(name);
  double d = 0;
  try {
    size_t used = 0;
    d = std::stod(v, &used);
    if (used != v.size()) throw 0;
  } catch (...) {
    throw Error(spec_.title() + ": --" + name + " expects a number, got \"" + v + "\"");
  }
  check_range(name, d);
  return d;
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
      throw Error(spec_.title() + ": --" + name + " expects a comma-separated list of integers, got \"" + s + "\"");
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
      throw Error(path + ": unknown key \"" + it.key() + "\" for " + spec_.title() + " (see --help)");
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
  check_numbers();
}

std::string help_text(const CommandSpec& spec) {
  std::ostringstream h;
  h << "usage: " << spec.title();
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

std::string default_text(double v) {
  std::ostringstream o;
  o << v;  // shortest form at 6 significant digits: 0.0003, 1, 0.92
  return o.str();
}

std::string default_text(int64_t v) { return std::to_string(v); }

std::string default_text(const std::vector<double>& v, char sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? std::string(1, sep) : "") + default_text(v[i]);
  return out;
}

std::string default_text(const std::vector<int>& v, char sep) {
  return default_text(std::vector<int64_t>(v.begin(), v.end()), sep);
}

std::string default_text(const std::vector<int64_t>& v, char sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? std::string(1, sep) : "") + std::to_string(v[i]);
  return out;
}

}  // namespace linearize::cli
