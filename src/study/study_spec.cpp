// Reading, checking and enumerating studies (see study_spec.h), and the built-in presets.
#include "study/study_spec.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "io/atomic_file.h"
#include "io/error.h"
#include "io/hf_config.h"
#include "model/mixers/mixer_config.h"

namespace linearize {

namespace fs = std::filesystem;

namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

void check_keys(const nlohmann::json& j, const std::vector<std::string>& allowed, const std::string& where) {
  if (!j.is_object()) throw Error(where + ": expected an object, found " + j.dump().substr(0, 80));
  for (const auto& [k, v] : j.items())
    if (std::find(allowed.begin(), allowed.end(), k) == allowed.end())
      throw Error(where + ": unknown key \"" + k + "\" (expected " + join(allowed) + ")");
}

template <typename T>
T get(const nlohmann::json& j, const std::string& key, const T& fallback, const std::string& where) {
  if (!j.contains(key)) return fallback;
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw Error(where + ": \"" + key + "\" has the wrong type (" + j.at(key).dump().substr(0, 60) + ")");
  }
}

std::string resolve(const std::string& base, const std::string& p) {
  if (p.empty() || fs::path(p).is_absolute()) return p;
  return (fs::path(base) / p).string();
}

bool safe_name(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'; });
}

}  // namespace

bool held_out_source(const nlohmann::json& source) {
  return source.is_object() && source.contains("path") && source["path"].is_string() &&
         fs::path(source["path"].get<std::string>()).extension() == ".txt";
}

StudySpec parse_study(const nlohmann::json& j, const std::string& file, const std::string& base) {
  const std::string f = file.empty() ? "study" : file;
  check_keys(j, {"name", "tokenizer", "data", "teachers", "mixers", "variants", "budgets", "seeds", "distill", "eval",
                 "device", "notes"},
             f);
  StudySpec s;
  s.file = file;
  s.base = base;
  s.raw = j;
  s.name = get<std::string>(j, "name", "study", f);
  s.device = get<std::string>(j, "device", "cpu", f);

  if (j.contains("tokenizer")) {
    s.tokenizer = j["tokenizer"];
    check_keys(s.tokenizer, {"path", "train"}, f + ": tokenizer");
    if (s.tokenizer.contains("path")) s.tokenizer["path"] = resolve(base, get<std::string>(s.tokenizer, "path", "", f + ": tokenizer"));
    if (s.tokenizer.contains("train")) {
      auto& t = s.tokenizer["train"];
      check_keys(t, {"inputs", "sample", "vocab", "isolate_digits"}, f + ": tokenizer.train");
      if (t.contains("inputs"))
        for (auto& in : t["inputs"]) in = resolve(base, in.get<std::string>());
    }
  }
  if (!j.contains("data")) throw Error(f + ": missing \"data\" (a token dataset, a mixture file or an inline mixture)");
  s.data = j["data"];
  if (s.data.is_string()) {
    s.data = resolve(base, s.data.get<std::string>());
  } else if (!s.data.is_object() || !s.data.contains("sources")) {
    throw Error(f + ": \"data\" must be a path or a mixture object {\"sources\": [...]}");
  }

  if (!j.contains("teachers") || !j["teachers"].is_array() || j["teachers"].empty())
    throw Error(f + ": \"teachers\" must be a non-empty list");
  for (size_t i = 0; i < j["teachers"].size(); ++i) {
    const auto& t = j["teachers"][i];
    const std::string w = f + ": teachers[" + std::to_string(i) + "]";
    check_keys(t, {"name", "path", "pretrain"}, w);
    StudyTeacher teacher;
    teacher.name = get<std::string>(t, "name", "", w);
    if (!safe_name(teacher.name)) throw Error(w + ": \"name\" must be letters, digits, '-', '_' or '.'");
    if (t.contains("path") == t.contains("pretrain")) throw Error(w + ": give either \"path\" or \"pretrain\"");
    if (t.contains("path")) {
      teacher.path = resolve(base, get<std::string>(t, "path", "", w));
      if (!fs::exists(fs::path(teacher.path) / "config.json"))
        throw Error(w + ": " + teacher.path + " is not a model folder (no config.json)");
      try {
        const auto c = LlamaConfig::load(teacher.path);
        if (c.raw.contains("linearize")) throw Error(teacher.path + " is a linearized student, not a teacher");
      } catch (const Error& e) {
        throw Error(w + ": " + e.what());
      }
    } else {
      const auto& p = t["pretrain"];
      check_keys(p, {"hidden", "layers", "heads", "kv_heads", "seq_len", "batch", "steps", "lr", "schedule", "warmup", "data",
                     "deterministic"},
                 w + ".pretrain");
      StudyPretrain pt;
      pt.hidden = get(p, "hidden", pt.hidden, w), pt.layers = get(p, "layers", pt.layers, w);
      pt.heads = get(p, "heads", pt.heads, w), pt.kv_heads = get(p, "kv_heads", pt.kv_heads, w);
      pt.seq_len = get(p, "seq_len", pt.seq_len, w), pt.batch = get(p, "batch", pt.batch, w);
      pt.steps = get(p, "steps", pt.steps, w), pt.lr = get(p, "lr", pt.lr, w), pt.warmup = get(p, "warmup", pt.warmup, w);
      pt.schedule = get(p, "schedule", pt.schedule, w);
      pt.deterministic = get(p, "deterministic", pt.deterministic, w);
      pt.data = resolve(base, get<std::string>(p, "data", "", w));
      for (int64_t v : {pt.hidden, pt.layers, pt.heads, pt.kv_heads, pt.seq_len, pt.batch, pt.steps})
        if (v <= 0) throw Error(w + ".pretrain: sizes and steps must be positive");
      if (pt.hidden % pt.heads != 0 || pt.heads % pt.kv_heads != 0)
        throw Error(w + ".pretrain: hidden must divide by heads and heads by kv_heads");
      teacher.pretrain = pt;
      if (!s.tokenizer.is_object() || s.tokenizer.empty())
        throw Error(w + ": a teacher trained by the study needs the study's \"tokenizer\"");
    }
    for (const auto& other : s.teachers)
      if (other.name == teacher.name) throw Error(w + ": two teachers named \"" + teacher.name + "\"");
    s.teachers.push_back(teacher);
  }

  const auto kinds = mixer_kinds();
  s.mixers = get<std::vector<std::string>>(j, "mixers", kinds, f);
  if (s.mixers.empty()) throw Error(f + ": \"mixers\" is empty");
  for (const auto& m : s.mixers)
    if (std::find(kinds.begin(), kinds.end(), m) == kinds.end())
      throw Error(f + ": unknown mixer \"" + m + "\" (expected " + join(kinds) + ")");

  if (j.contains("variants")) {
    if (!j["variants"].is_array() || j["variants"].empty()) throw Error(f + ": \"variants\" must be a non-empty list");
    for (size_t i = 0; i < j["variants"].size(); ++i) {
      const auto& v = j["variants"][i];
      const std::string w = f + ": variants[" + std::to_string(i) + "]";
      check_keys(v, {"name", "preset", "stages", "splits", "layers", "kl_weight", "kl_temperature", "kl_reduction",
                     "stage2_loss", "paper_defects", "mixer_config"},
                 w);
      StudyVariant var;
      var.name = get<std::string>(v, "name", "", w);
      if (!safe_name(var.name)) throw Error(w + ": \"name\" must be letters, digits, '-', '_' or '.'");
      var.options = v;
      var.options.erase("name");
      s.variants.push_back(var);
    }
  } else {
    s.variants.push_back(StudyVariant{});
  }

  if (!j.contains("budgets")) throw Error(f + ": missing \"budgets\" (distillation tokens, e.g. [1e6, 4e6])");
  for (const auto& b : j["budgets"]) {
    if (!b.is_number() || !(b.get<double>() >= 1)) throw Error(f + ": budgets must be positive token counts, found " + b.dump());
    s.budgets.push_back(static_cast<int64_t>(std::llround(b.get<double>())));
  }
  if (s.budgets.empty()) throw Error(f + ": \"budgets\" is empty");
  std::sort(s.budgets.begin(), s.budgets.end());
  s.budgets.erase(std::unique(s.budgets.begin(), s.budgets.end()), s.budgets.end());
  s.seeds = get<std::vector<uint64_t>>(j, "seeds", s.seeds, f);
  if (s.seeds.empty()) throw Error(f + ": \"seeds\" is empty");

  if (j.contains("distill")) {
    const auto& d = j["distill"];
    check_keys(d, {"seq_len", "batch", "lr"}, f + ": distill");
    s.seq_len = get(d, "seq_len", s.seq_len, f + ": distill");
    s.batch = get(d, "batch", s.batch, f + ": distill");
    if (d.contains("lr")) {
      const auto lr = get<std::vector<double>>(d, "lr", {}, f + ": distill");
      if (lr.size() != 3) throw Error(f + ": distill.lr needs three learning rates, one per stage");
      for (int i = 0; i < 3; ++i) s.lr[i] = lr[i];
    }
    if (s.seq_len < 1 || s.batch < 1) throw Error(f + ": distill.seq_len and distill.batch must be positive");
  }

  if (j.contains("eval")) {
    const auto& e = j["eval"];
    check_keys(e, {"ppl", "tasks", "niah"}, f + ": eval");
    auto& ev = s.eval;
    if (e.contains("ppl")) {
      const auto& p = e["ppl"];
      check_keys(p, {"data", "seq_len", "max_tokens"}, f + ": eval.ppl");
      if (p.contains("data") && p["data"].is_object() && p["data"].contains("held_out")) {
        check_keys(p["data"], {"held_out"}, f + ": eval.ppl.data");
        const auto& h = p["data"]["held_out"];
        if (!h.is_number() || !(h.get<double>() > 0 && h.get<double>() <= 0.5))
          throw Error(f + ": eval.ppl.data.held_out: expected a fraction in (0, 0.5], found " + h.dump());
        bool has_text = false;
        if (j.contains("data") && j["data"].is_object() && j["data"].contains("sources"))
          for (const auto& src : j["data"]["sources"]) has_text = has_text || held_out_source(src);
        if (!has_text)
          throw Error(f + ": eval.ppl.data.held_out needs an inline \"data\" mixture with at least one .txt file source");
        ev.ppl_held_out = h.get<double>();
      } else if (p.contains("data") && p["data"].is_object()) {
        check_keys(p["data"], {"generator", "documents", "seed"}, f + ": eval.ppl.data");
        if (p["data"].value("generator", "") != "english_like")
          throw Error(f + ": eval.ppl.data: the only generator for held-out text is english_like");
        ev.ppl_generated = p["data"];
      } else {
        ev.ppl_data = resolve(base, get<std::string>(p, "data", "", f + ": eval.ppl"));
      }
      ev.ppl_seq_len = get(p, "seq_len", ev.ppl_seq_len, f + ": eval.ppl");
      ev.ppl_max_tokens = get(p, "max_tokens", ev.ppl_max_tokens, f + ": eval.ppl");
    }
    if (e.contains("tasks")) {
      const auto& t = e["tasks"];
      check_keys(t, {"names", "limit", "data_dir"}, f + ": eval.tasks");
      ev.tasks = get<std::vector<std::string>>(t, "names", {}, f + ": eval.tasks");
      ev.tasks_limit = get(t, "limit", ev.tasks_limit, f + ": eval.tasks");
      ev.tasks_dir = resolve(base, get<std::string>(t, "data_dir", "", f + ": eval.tasks"));
    }
    if (e.contains("niah")) {
      const auto& n = e["niah"];
      check_keys(n, {"tasks", "lengths", "samples", "max_new_tokens", "haystack"}, f + ": eval.niah");
      ev.niah_tasks = get(n, "tasks", ev.niah_tasks, f + ": eval.niah");
      ev.niah_lengths = get(n, "lengths", ev.niah_lengths, f + ": eval.niah");
      ev.niah_samples = get(n, "samples", ev.niah_samples, f + ": eval.niah");
      ev.niah_max_new_tokens = get(n, "max_new_tokens", ev.niah_max_new_tokens, f + ": eval.niah");
      ev.niah_haystack = resolve(base, get<std::string>(n, "haystack", "", f + ": eval.niah"));
      if (ev.niah_samples < 1) throw Error(f + ": eval.niah.samples must be at least 1");
    }
  }
  return s;
}

StudySpec read_study(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": malformed JSON: " + e.what());
  }
  return parse_study(j, path, fs::path(path).parent_path().string());
}

std::string StudyCell::id() const {
  return teacher->name + "__" + mixer + "__" + variant->name + "__s" + std::to_string(seed);
}

std::string StudyCell::budget_id(int64_t budget) const { return id() + "__" + std::to_string(budget); }

std::vector<StudyCell> study_cells(const StudySpec& spec) {
  std::vector<StudyCell> out;
  for (const auto& t : spec.teachers)
    for (const auto& m : spec.mixers)
      for (const auto& v : spec.variants)
        for (uint64_t seed : spec.seeds) out.push_back({&t, m, &v, seed});
  return out;
}

std::vector<std::string> study_presets() { return {"paper", "mini", "gpu"}; }

}  // namespace linearize
