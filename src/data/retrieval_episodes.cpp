// Synthetic retrieval episodes in RULER's NIAH form (see retrieval_episodes.h).
#include "data/retrieval_episodes.h"

#include <algorithm>

#include "data/niah_text.h"
#include "io/error.h"

namespace linearize {

namespace {

enum class Layout { essay, lines, repeat };

std::string paragraph(std::mt19937_64& rng, const SentenceSource& filler, int64_t sentences) {
  std::string p;
  for (int64_t i = 0; i < sentences; ++i) {
    std::string s = filler(rng);
    while (!s.empty() && s.back() == ' ') s.pop_back();
    p += (p.empty() ? "" : " ") + s;
  }
  return p;
}

// The question line of RULER's template for `key` ("What is the special magic number for {key} ...?").
std::string question_line(bool uuid, const std::string& key) {
  const std::string prompt = niah_prompt(uuid, "", key);
  return prompt.substr(prompt.rfind('\n') + 1);
}

}  // namespace

std::string short_statement(std::mt19937_64& rng) {
  static const std::vector<std::string> things = {"river", "road", "hill", "wind", "rain", "field", "tree", "stone",
                                                  "sea", "moon", "night", "bread", "snow", "path", "lake", "fire"};
  static const std::vector<std::string> states = {"wide", "long", "calm", "old", "quiet", "warm", "cold", "bright",
                                                  "dark", "soft", "still", "deep", "high", "low", "near", "far"};
  static const std::vector<std::string> phrases = {"Here we are.", "On and on it goes.", "Off we go again.",
                                                   "So it goes.", "Round and round.", "Up and down we went."};
  if (rng() % 4 == 0) return phrases[rng() % phrases.size()] + " ";
  return "The " + things[rng() % things.size()] + " is " + states[rng() % states.size()] + ". ";
}

const std::vector<std::string>& training_key_adjectives() {
  static const std::vector<std::string> w = {"red",    "green",  "blue",   "yellow", "black", "white",
                                             "silver", "brown",  "purple", "orange", "grey",  "pink",
                                             "violet", "scarlet", "ivory", "copper", "bronze", "teal"};
  return w;
}

const std::vector<std::string>& training_key_nouns() {
  static const std::vector<std::string> w = {"door", "box",   "gate",  "chest", "lamp", "boat",  "tower", "bell",
                                             "drawer", "trunk", "cabinet", "ring", "coin", "hat", "cup", "jar",
                                             "shelf", "barrel", "sack", "clock"};
  return w;
}

std::string retrieval_episode(std::mt19937_64& rng, const SentenceSource& filler, const RetrievalEpisodeOptions& o) {
  if (o.key_adjectives.empty() || o.key_nouns.empty()) throw Error("retrieval episodes: no key words given");
  if (o.max_needles < 1 || o.max_questions < 1 || o.paragraph_sentences < 1 || o.min_chars < 0 ||
      o.max_chars < o.min_chars || !(o.noise_fraction >= 0 && o.noise_fraction <= 1))
    throw Error("retrieval episodes: needles, questions and paragraph sentences must be >= 1, "
                "0 <= min_chars <= max_chars and 0 <= noise_fraction <= 1");
  auto layout = static_cast<Layout>(rng() % 3);
  // Drawn only when asked for, so that episodes without noise stay as they were.
  const bool noise = o.noise_fraction > 0 && std::uniform_real_distribution<double>(0, 1)(rng) < o.noise_fraction;
  if (noise) layout = Layout::repeat;
  const bool uuid = std::uniform_real_distribution<double>(0, 1)(rng) < o.uuid_fraction;
  const int64_t budget = o.min_chars + static_cast<int64_t>(rng() % static_cast<uint64_t>(o.max_chars - o.min_chars + 1));

  // Filler units until the budget is reached.
  std::vector<std::string> units;
  int64_t chars = 0;
  if (layout == Layout::repeat) {
    const std::string p = noise ? paragraph(rng, short_statement, 2 + static_cast<int64_t>(rng() % 5))
                                : paragraph(rng, filler, o.paragraph_sentences);
    const int64_t n = std::max<int64_t>(1, budget / std::max<int64_t>(1, static_cast<int64_t>(p.size()) + 1));
    units.assign(n, p);
  } else {
    while (chars < budget) {
      units.push_back(layout == Layout::essay ? paragraph(rng, filler, 1) : paragraph(rng, filler, o.paragraph_sentences));
      chars += static_cast<int64_t>(units.back().size()) + 1;
    }
  }

  // Needles with distinct keys, at uniform positions.
  const int64_t n_needles = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(o.max_needles));
  std::vector<std::pair<std::string, std::string>> facts;  // key, value
  while (static_cast<int64_t>(facts.size()) < n_needles) {
    std::string key = niah_random_key(rng, o.key_adjectives, o.key_nouns);
    if (std::any_of(facts.begin(), facts.end(), [&](const auto& f) { return f.first == key; })) continue;
    facts.emplace_back(key, uuid ? niah_random_uuid(rng) : niah_random_number(rng));
  }
  std::vector<PlacedNeedle> needles;
  for (const auto& [key, value] : facts)
    needles.push_back({std::uniform_real_distribution<double>(0, 1)(rng), niah_needle(uuid, key, value)});
  const std::string context = join_with_needles(units, needles, layout == Layout::essay ? " " : "\n");

  // Questions about distinct needles, in random order, each answered on its own line.
  std::shuffle(facts.begin(), facts.end(), rng);
  const int64_t n_questions = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(std::min(n_needles, o.max_questions)));
  std::string text = niah_prompt(uuid, context, facts[0].first);
  for (int64_t q = 0; q < n_questions; ++q) {
    const auto& [key, value] = facts[q];
    if (q > 0) text += question_line(uuid, key);
    text += niah_answer_prefix(uuid, key) + " " + value + ".\n";
  }
  return text;
}

}  // namespace linearize
