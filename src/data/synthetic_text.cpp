#include "data/synthetic_text.h"

#include <algorithm>

namespace linearize {

namespace {

const std::vector<std::string> kSubjects = {
    "the farmer", "a young girl", "the old king", "my neighbour", "the teacher", "a tired sailor",
    "the baker", "her brother", "the little fox", "a quiet child", "the captain", "our grandmother",
    "the painter", "a stranger", "the doctor", "his cousin"};
const std::vector<std::string> kVerbs = {
    "carries", "finds", "paints", "watches", "remembers", "builds", "follows", "opens",
    "cleans", "visits", "draws", "loses", "mends", "counts", "brings", "hides"};
const std::vector<std::string> kObjects = {
    "a basket", "the old bridge", "a small house", "the garden gate", "a wooden boat", "the long road",
    "a letter", "the apple tree", "a warm coat", "the village well", "a silver key", "the blue cup",
    "a heavy stone", "the evening star", "a loaf of bread", "the broken clock"};
const std::vector<std::string> kPlaces = {
    "to the river", "near the hill", "in the kitchen", "by the sea", "at the market", "under the trees",
    "across the field", "behind the barn", "in the forest", "on the roof"};
const std::vector<std::string> kTimes = {
    "in the morning", "after the rain", "before dinner", "every sunday", "at night", "in winter",
    "with great care", "without a word", "once again", "all day long"};
const std::vector<std::string> kColours = {"red", "green", "blue", "yellow", "black", "white",
                                           "golden", "silver", "brown", "purple", "orange", "grey"};
const std::vector<std::string> kThings = {"door", "box", "gate", "chest", "lamp", "boat",
                                          "tower", "bell", "wagon", "drawer", "trunk", "cabinet"};

const std::string& pick(const std::vector<std::string>& v, std::mt19937_64& rng) { return v[rng() % v.size()]; }

std::string four_digits(std::mt19937_64& rng) { return std::to_string(1000 + rng() % 9000); }

struct Fact {
  std::string key;    // "red door"
  std::string value;  // "4172"
};

std::string fact_sentence(const Fact& f) { return "the code of the " + f.key + " is " + f.value + ". "; }
std::string question_prefix(const Fact& f) {
  return "question: what is the code of the " + f.key + "? the code of the " + f.key + " is";
}

}  // namespace

std::string english_like_sentence(std::mt19937_64& rng) {
  switch (rng() % 4) {
    case 0:
      return pick(kSubjects, rng) + " " + pick(kVerbs, rng) + " " + pick(kObjects, rng) + " " + pick(kPlaces, rng) + ". ";
    case 1:
      return pick(kSubjects, rng) + " " + pick(kVerbs, rng) + " " + pick(kObjects, rng) + " " + pick(kTimes, rng) + ". ";
    case 2:
      return pick(kTimes, rng) + ", " + pick(kSubjects, rng) + " " + pick(kVerbs, rng) + " " + pick(kObjects, rng) + ". ";
    default:
      return pick(kSubjects, rng) + " " + pick(kVerbs, rng) + " " + pick(kObjects, rng) + ", and then " +
             pick(kSubjects, rng) + " " + pick(kVerbs, rng) + " it " + pick(kPlaces, rng) + ". ";
  }
}

std::string english_like_document(std::mt19937_64& rng, int64_t sentences, int64_t facts) {
  std::vector<Fact> planted;
  for (int64_t i = 0; i < facts; ++i) {
    Fact f{pick(kColours, rng) + " " + pick(kThings, rng), four_digits(rng)};
    bool dup = false;
    for (const auto& p : planted) dup |= p.key == f.key;
    if (!dup) planted.push_back(f);
  }
  // Facts go into the first third, questions into the last third, in a shuffled order.
  std::vector<std::pair<int64_t, std::string>> inserts;
  for (const auto& f : planted) {
    inserts.emplace_back(static_cast<int64_t>(rng() % std::max<int64_t>(1, sentences / 3)), fact_sentence(f));
    const int64_t q = sentences - sentences / 3 + static_cast<int64_t>(rng() % std::max<int64_t>(1, sentences / 3));
    inserts.emplace_back(q, question_prefix(f) + " " + f.value + ". ");
  }
  std::string doc;
  for (int64_t s = 0; s <= sentences; ++s) {
    for (const auto& [at, text] : inserts)
      if (at == s) doc += text;
    if (s < sentences) doc += english_like_sentence(rng);
  }
  return doc;
}

std::string copy_drill(std::mt19937_64& rng, int64_t max_values, int64_t max_filler) {
  std::string values;
  const int64_t n = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(std::max<int64_t>(1, max_values)));
  for (int64_t i = 0; i < n; ++i) values += (i ? " " : "") + std::to_string(1000000 + rng() % 9000000);
  std::string filler;
  const int64_t f = max_filler > 0 ? static_cast<int64_t>(rng() % static_cast<uint64_t>(max_filler + 1)) : 0;
  for (int64_t i = 0; i < f; ++i) filler += english_like_sentence(rng);
  return "the codes are " + values + ". " + filler + "again, the codes are " + values + ".";
}

std::vector<std::string> english_like_documents(const EnglishLikeOptions& o) {
  std::mt19937_64 rng(o.seed);
  std::vector<std::string> docs;
  for (int64_t d = 0; d < o.documents; ++d) {
    // Lengths vary so that fact-to-question distances cover short and long spans.
    const int64_t n = o.sentences_per_document / 2 + static_cast<int64_t>(rng() % (o.sentences_per_document + 1));
    docs.push_back(english_like_document(rng, n, o.facts_per_document));
  }
  return docs;
}

}  // namespace linearize
