// RULER's single-needle text and the sizing of a prompt in tokens (see niah_text.h).
#include "data/niah_text.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "io/error.h"
#include "io/tokenizer.h"

namespace linearize {

namespace {

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t p = 0; (p = s.find(from, p)) != std::string::npos; p += to.size()) s.replace(p, from.size(), to);
}

// RULER's template with {kind}, {context} and {query}, the answer prefix appended; for one query with
// one value it is rewritten to the singular as RULER does (on the template, before filling it in).
std::string filled_template(bool uuid, const std::string& context, const std::string& key, bool single,
                            bool question) {
  std::string t = question ? "Some special magic {kind} are hidden within the following text. Make sure to memorize "
                             "it. I will quiz you about the {kind} afterwards.\n{context}\nWhat are all the special "
                             "magic {kind} for {query} mentioned in the provided text?"
                           : " The special magic {kind} for {query} mentioned in the provided text are";
  std::string kind = niah_kind_word(uuid);
  if (single) {
    replace_all(t, "Some", "A");
    replace_all(t, "are all", "is");
    replace_all(t, "are", "is");
    kind.pop_back();  // "numbers" -> "number"
  }
  // {context} last: the haystack may itself contain braces.
  replace_all(t, "{kind}", kind);
  replace_all(t, "{query}", key);
  replace_all(t, "{context}", context);
  return t;
}

}  // namespace

std::string niah_noise_paragraph() {
  return "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
}

std::string niah_kind_word(bool uuid) { return uuid ? "uuids" : "numbers"; }

std::string niah_prompt(bool uuid, const std::string& context, const std::string& key, bool single) {
  return filled_template(uuid, context, key, single, true);
}

std::string niah_answer_prefix(bool uuid, const std::string& key, bool single) {
  return filled_template(uuid, "", key, single, false);
}

std::string niah_needle(bool uuid, const std::string& key, const std::string& value) {
  return "One of the special magic " + niah_kind_word(uuid) + " for " + key + " is: " + value + ".";
}

// Our own word lists for the evaluation's keys (RULER draws adjective-noun pairs from wonderwords').
const std::vector<std::string>& niah_key_adjectives() {
  static const std::vector<std::string> w = {
      "abundant", "amber",   "brave",   "brisk",   "calm",    "clever",  "crimson", "curious", "dusty",
      "eager",    "elegant", "faint",   "fierce",  "gentle",  "gloomy",  "golden",  "hollow",  "humble",
      "icy",      "jolly",   "keen",    "lively",  "lucky",   "mellow",  "misty",   "modest",  "nimble",
      "noisy",    "odd",     "pale",    "patient", "quiet",   "rapid",   "rustic",  "shiny",   "silent",
      "sturdy",   "swift",   "tender",  "tidy",    "vast",    "vivid",   "wary",    "witty",   "young"};
  return w;
}

const std::vector<std::string>& niah_key_nouns() {
  static const std::vector<std::string> w = {
      "anchor", "badger",  "basket",  "bottle", "bridge", "candle",  "canyon",  "castle", "cloud",
      "comet",  "cottage", "crayon",  "desert", "engine", "feather", "forest",  "garden", "glacier",
      "hammer", "harbor",  "island",  "kettle", "ladder", "lantern", "meadow",  "mirror", "needle",
      "orchid", "pebble",  "pepper",  "piano",  "pillow", "quilt",   "rabbit",  "saddle", "spoon",
      "sweater", "thimble", "tiger",  "trumpet", "tunnel", "violin", "wagon",   "window", "zipper"};
  return w;
}

std::string niah_random_key(std::mt19937_64& rng, const std::vector<std::string>& adjectives,
                            const std::vector<std::string>& nouns) {
  const std::string first = adjectives[rng() % adjectives.size()];
  return first + "-" + nouns[rng() % nouns.size()];
}

std::string niah_random_number(std::mt19937_64& rng) { return std::to_string(1000000 + rng() % 9000000); }

std::string niah_random_uuid(std::mt19937_64& rng) {
  unsigned char b[16];
  for (auto& x : b) x = static_cast<unsigned char>(rng() & 0xff);
  b[6] = static_cast<unsigned char>((b[6] & 0x0f) | 0x40);  // version 4
  b[8] = static_cast<unsigned char>((b[8] & 0x3f) | 0x80);  // RFC 4122 variant
  char s[37];
  std::snprintf(s, sizeof s, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
                b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return s;
}

const std::vector<int>& niah_depths_percent() {
  static const std::vector<int> d = [] {
    std::vector<int> v;
    for (int i = 0; i < 40; ++i) v.push_back(static_cast<int>(std::nearbyint(100.0 * i / 39)));  // numpy rounds half to even
    return v;
  }();
  return d;
}

std::vector<std::string> split_sentences(const std::string& text) {
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

Haystack noise_haystack() { return Haystack{}; }

Haystack essay_haystack(const std::string& text, const std::string& name) {
  Haystack h;
  h.noise = false;
  h.name = name;
  std::string word;
  for (char c : text + " ") {
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') {
      if (!word.empty()) h.words.push_back(word);
      word.clear();
    } else {
      word += c;
    }
  }
  if (h.words.empty()) throw Error(name + ": no words found for the haystack");
  return h;
}

std::string join_with_needles(const std::vector<std::string>& units, std::vector<PlacedNeedle> needles,
                              const std::string& separator) {
  std::stable_sort(needles.begin(), needles.end(),
                   [](const PlacedNeedle& a, const PlacedNeedle& b) { return a.at < b.at; });
  const int64_t n = static_cast<int64_t>(units.size());
  std::string out;
  auto add = [&](const std::string& piece) { out += (out.empty() ? "" : separator) + piece; };
  size_t next = 0;
  for (int64_t i = 0; i <= n; ++i) {
    while (next < needles.size() && (i == n || static_cast<int64_t>(needles[next].at * n) <= i)) add(needles[next++].text);
    if (i < n) add(units[i]);
  }
  return out;
}

std::string niah_context(const Haystack& haystack, int64_t units, std::vector<PlacedNeedle> needles) {
  if (haystack.noise) return join_with_needles(std::vector<std::string>(units, niah_noise_paragraph()), needles, "\n");
  std::string text;
  for (int64_t i = 0; i < units; ++i) text += (i ? " " : "") + haystack.words[i % haystack.words.size()];
  return join_with_needles(split_sentences(text), needles, " ");
}

PromptEncoder plain_prompt_encoder(const Tokenizer& tokenizer, std::vector<int32_t> prefix) {
  return [&tokenizer, prefix](const std::string& question, const std::string& answer) {
    auto ids = prefix;
    const auto body = tokenizer.encode(question + answer, false);
    ids.insert(ids.end(), body.begin(), body.end());
    return ids;
  };
}

int64_t largest_fitting(int64_t max_units, const std::function<bool(int64_t)>& fits) {
  // Doubling first, so that no call is asked about more than twice the answer, then bisection.
  int64_t lo = 0, hi = 1;  // fits(lo) holds; hi is the first candidate not yet known to fit
  while (hi <= max_units && fits(hi)) lo = hi, hi *= 2;
  hi = std::min(hi - 1, max_units);  // the answer is in [lo, hi]
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

NiahSample make_niah_sample(const Haystack& haystack, bool uuid, int64_t length, int64_t generation_budget,
                            const PromptEncoder& encode, std::mt19937_64& rng) {
  NiahSample s;
  s.key = niah_random_key(rng, niah_key_adjectives(), niah_key_nouns());
  s.value = uuid ? niah_random_uuid(rng) : niah_random_number(rng);
  s.needle = niah_needle(uuid, s.key, s.value);
  s.answer_prefix = niah_answer_prefix(uuid, s.key);
  // noise: a uniform slot among the paragraphs; essay: one of RULER's 40 depths.
  const double at = haystack.noise ? std::uniform_real_distribution<double>(0.0, 1.0)(rng)
                                   : niah_depths_percent()[rng() % niah_depths_percent().size()] / 100.0;
  const int64_t budget = length - generation_budget;
  auto prompt_ids = [&](int64_t units) {
    return encode(niah_prompt(uuid, niah_context(haystack, units, {{at, s.needle}}), s.key), s.answer_prefix);
  };
  auto fits = [&](int64_t units) { return static_cast<int64_t>(prompt_ids(units).size()) <= budget; };
  if (!fits(0))
    throw Error("NIAH: length " + std::to_string(length) + " is too short for the prompt itself (" +
                std::to_string(prompt_ids(0).size() + generation_budget) + " tokens with no haystack and " +
                std::to_string(generation_budget) + " to generate)");
  // Each unit costs at least one token, so `budget` units is an upper bound.
  s.units = largest_fitting(budget, fits);
  s.question = niah_prompt(uuid, niah_context(haystack, s.units, {{at, s.needle}}), s.key);
  s.ids = encode(s.question, s.answer_prefix);
  s.depth = at;
  return s;
}

}  // namespace linearize
