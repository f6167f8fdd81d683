// RULER single-needle prompts (sizing the haystack in tokens, placing the needle) and the greedy
// exact-match evaluation loop. See niah.h; this file does not print anything.
#include "eval/niah.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "infer/generate.h"
#include "io/atomic_file.h"
#include "io/error.h"

namespace linearize {

namespace {

// Our own word lists for the needle keys (RULER draws adjective-noun pairs from a dictionary).
const std::vector<std::string>& key_adjectives() {
  static const std::vector<std::string> w = {
      "abundant", "amber",   "brave",   "brisk",   "calm",    "clever",  "crimson", "curious", "dusty",
      "eager",    "elegant", "faint",   "fierce",  "gentle",  "gloomy",  "golden",  "hollow",  "humble",
      "icy",      "jolly",   "keen",    "lively",  "lucky",   "mellow",  "misty",   "modest",  "nimble",
      "noisy",    "odd",     "pale",    "patient", "quiet",   "rapid",   "rustic",  "shiny",   "silent",
      "sturdy",   "swift",   "tender",  "tidy",    "vast",    "vivid",   "wary",    "witty",   "young"};
  return w;
}

const std::vector<std::string>& key_nouns() {
  static const std::vector<std::string> w = {
      "anchor", "badger",  "basket",  "bottle", "bridge", "candle",  "canyon",  "castle", "cloud",
      "comet",  "cottage", "crayon",  "desert", "engine", "feather", "forest",  "garden", "glacier",
      "hammer", "harbor",  "island",  "kettle", "ladder", "lantern", "meadow",  "mirror", "needle",
      "orchid", "pebble",  "pepper",  "piano",  "pillow", "quilt",   "rabbit",  "saddle", "spoon",
      "sweater", "thimble", "tiger",  "trumpet", "tunnel", "violin", "wagon",   "window", "zipper"};
  return w;
}

std::string random_key(std::mt19937_64& rng) {
  const auto& a = key_adjectives();
  const auto& n = key_nouns();
  const std::string first = a[rng() % a.size()];
  return first + "-" + n[rng() % n.size()];
}

std::string random_number(std::mt19937_64& rng) { return std::to_string(1000000 + rng() % 9000000); }

std::string random_uuid(std::mt19937_64& rng) {
  unsigned char b[16];
  for (auto& x : b) x = static_cast<unsigned char>(rng() & 0xff);
  b[6] = static_cast<unsigned char>((b[6] & 0x0f) | 0x40);  // version 4
  b[8] = static_cast<unsigned char>((b[8] & 0x3f) | 0x80);  // RFC 4122 variant
  char s[37];
  std::snprintf(s, sizeof s, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
                b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return s;
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t p = 0; (p = s.find(from, p)) != std::string::npos; p += to.size()) s.replace(p, from.size(), to);
}

// Words for the value kind: RULER says "numbers"/"number" or "uuids"/"uuid".
std::string kind_words(const std::string& task, std::string text) {
  if (niah_uses_uuid(task)) {
    replace_all(text, "numbers", "uuids");
    replace_all(text, "number", "uuid");
  }
  return text;
}

// Haystack sentences [0, n) with the needle before sentence `pos`, joined by single spaces.
std::string build_context(const std::vector<std::string>& haystack, int64_t n, int64_t pos, const std::string& needle) {
  std::string out;
  for (int64_t i = 0; i <= n; ++i) {
    if (i == pos) out += (out.empty() ? "" : " ") + needle;
    if (i < n) out += (out.empty() ? "" : " ") + haystack[i % haystack.size()];
  }
  return out;
}

int64_t needle_position(double depth, int64_t n) {
  return std::clamp<int64_t>(static_cast<int64_t>(std::llround(depth * n)), 0, n);
}

}  // namespace

std::vector<std::string> noise_sentences() {
  return {"The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.", "There and back again."};
}

std::vector<std::string> split_sentences(const std::string& text) {
  // Collapse whitespace runs to one space, then cut after . ! ? (and a closing quote) before a space.
  std::string flat;
  for (char c : text) {
    const bool space = c == ' ' || c == '\n' || c == '\r' || c == '\t';
    if (space) {
      if (!flat.empty() && flat.back() != ' ') flat += ' ';
    } else {
      flat += c;
    }
  }
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i < flat.size(); ++i) {
    if (flat[i] != '.' && flat[i] != '!' && flat[i] != '?') continue;
    size_t end = i + 1;
    while (end < flat.size() && (flat[end] == '"' || flat[end] == '\'')) ++end;
    if (end < flat.size() && flat[end] != ' ') continue;
    if (end > start) out.push_back(flat.substr(start, end - start));
    start = end + 1;
    i = end;
  }
  if (start < flat.size()) {
    std::string tail = flat.substr(start);
    if (tail.find_first_not_of(' ') != std::string::npos) out.push_back(tail);
  }
  return out;
}

std::vector<double> niah_depths(int64_t n) {
  if (n < 1) throw Error("--depths must be at least 1, got " + std::to_string(n));
  if (n == 1) return {0.5};
  std::vector<double> d;
  for (int64_t i = 0; i < n; ++i) d.push_back(static_cast<double>(i) / (n - 1));
  return d;
}

bool niah_uses_uuid(const std::string& task) {
  if (task == "s_niah_1" || task == "s_niah_2") return false;
  if (task == "s_niah_3") return true;
  throw Error("unknown NIAH task \"" + task + "\" (known: s_niah_1, s_niah_2, s_niah_3)");
}

int64_t niah_max_new_tokens(const std::string& task) { return niah_uses_uuid(task) ? 30 : 12; }

std::string niah_needle(const std::string& task, const std::string& key, const std::string& value) {
  return kind_words(task, "One of the special magic numbers for " + key + " is: " + value + ".");
}

std::string niah_prompt(const std::string& task, const std::string& context, const std::string& key) {
  const std::string head = kind_words(task,
      "Some special magic numbers are hidden within the following text. Make sure to memorize it. "
      "I will quiz you about the numbers afterwards.\n");
  const std::string tail = kind_words(task, "\nWhat is the special magic number for " + key +
                                                " mentioned in the provided text? The special magic number for " +
                                                key + " mentioned in the provided text is");
  return head + context + tail;
}

bool niah_match(const std::string& generated, const std::string& value) {
  return !value.empty() && generated.find(value) != std::string::npos;
}

NiahSample make_niah_sample(const Tokenizer& tokenizer, const std::vector<int32_t>& prefix, const std::string& task,
                            const std::vector<std::string>& haystack, int64_t length, double depth,
                            std::mt19937_64& rng) {
  if (haystack.empty()) throw Error("NIAH: the haystack has no sentences");
  NiahSample s;
  s.key = random_key(rng);
  s.value = niah_uses_uuid(task) ? random_uuid(rng) : random_number(rng);
  s.needle = niah_needle(task, s.key, s.value);
  const int64_t budget = length - niah_max_new_tokens(task) - static_cast<int64_t>(prefix.size());
  auto count = [&](int64_t n) {
    return static_cast<int64_t>(tokenizer.encode(niah_prompt(task, build_context(haystack, n, needle_position(depth, n), s.needle), s.key), false).size());
  };
  const int64_t fixed = count(0);
  if (fixed > budget)
    throw Error("NIAH: length " + std::to_string(length) + " is too short for the prompt itself (" +
                std::to_string(fixed + niah_max_new_tokens(task) + prefix.size()) + " tokens without haystack)");
  // First guess from per-sentence token counts, then correct with the real count of the whole prompt.
  std::vector<int64_t> cached(haystack.size(), -1);
  int64_t n = 0, sum = fixed;
  while (true) {
    int64_t& c = cached[n % haystack.size()];
    if (c < 0) c = static_cast<int64_t>(tokenizer.encode(haystack[n % haystack.size()], false).size());
    if (sum + c > budget) break;
    sum += c;
    ++n;
  }
  int64_t best = 0;
  for (int iter = 0; iter < 16; ++iter) {
    const int64_t actual = count(n);
    const double per = n > 0 ? std::max(1.0, static_cast<double>(actual - fixed) / n) : 4.0;
    if (actual <= budget) {
      best = std::max(best, n);
      const int64_t step = static_cast<int64_t>((budget - actual) / per);
      if (step == 0 || n + step <= best) break;
      n += step;
    } else {
      n = std::max<int64_t>(best, n - std::max<int64_t>(1, static_cast<int64_t>(std::ceil((actual - budget) / per))));
      if (n == best) break;
    }
  }
  s.sentences = best;
  s.needle_position = needle_position(depth, best);
  s.text = niah_prompt(task, build_context(haystack, best, s.needle_position, s.needle), s.key);
  s.ids = prefix;
  const auto body = tokenizer.encode(s.text, false);
  s.ids.insert(s.ids.end(), body.begin(), body.end());
  return s;
}

nlohmann::json run_niah(CausalLM& model, const Tokenizer& tokenizer, const NiahOptions& options,
                        const std::function<void(int64_t, int64_t)>& progress) {
  const bool uuid = niah_uses_uuid(options.task);
  std::vector<std::string> haystack = noise_sentences();
  if (options.task != "s_niah_1") {
    if (options.haystack_file.empty()) throw Error("NIAH " + options.task + " needs a haystack text file");
    haystack = split_sentences(read_file(options.haystack_file));
    if (haystack.empty()) throw Error(options.haystack_file + ": no sentences found for the haystack");
  }
  if (options.samples < 1) throw Error("--samples must be at least 1");
  std::vector<int32_t> prefix;
  if (tokenizer.kind() == "sentencepiece" && model->config.bos_token_id)
    prefix.push_back(static_cast<int32_t>(*model->config.bos_token_id));
  const auto depths = niah_depths(options.depths);
  GenerateOptions gen;
  gen.max_new_tokens = niah_max_new_tokens(options.task);
  for (auto id : model->config.eos_token_ids) gen.stop_ids.push_back(id);
  const int64_t total = static_cast<int64_t>(options.lengths.size() * depths.size()) * options.samples;
  int64_t done = 0;
  nlohmann::json grid = nlohmann::json::array(), per_length = nlohmann::json::object();
  double all_sum = 0;
  for (size_t li = 0; li < options.lengths.size(); ++li) {
    nlohmann::json row = nlohmann::json::array();
    double row_sum = 0;
    for (size_t di = 0; di < depths.size(); ++di) {
      int64_t correct = 0;
      for (int64_t k = 0; k < options.samples; ++k) {
        std::seed_seq seq{static_cast<uint64_t>(options.seed), static_cast<uint64_t>(options.lengths[li]),
                          static_cast<uint64_t>(di), static_cast<uint64_t>(k), static_cast<uint64_t>(uuid)};
        std::mt19937_64 rng(seq);
        const auto s = make_niah_sample(tokenizer, prefix, options.task, haystack, options.lengths[li], depths[di], rng);
        const auto out = generate(model, s.ids, gen);
        correct += niah_match(tokenizer.decode(out), s.value);
        if (progress) progress(++done, total);
      }
      const double acc = static_cast<double>(correct) / options.samples;
      row.push_back(acc);
      row_sum += acc;
    }
    grid.push_back(row);
    per_length[std::to_string(options.lengths[li])] = row_sum / depths.size();
    all_sum += row_sum / depths.size();
  }
  return {{"task", options.task},   {"lengths", options.lengths}, {"depths", depths},
          {"samples", options.samples}, {"grid", grid},             {"per_length", per_length},
          {"average", options.lengths.empty() ? 0.0 : all_sum / options.lengths.size()}};
}

}  // namespace linearize
