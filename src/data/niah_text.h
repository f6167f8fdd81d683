// The text of RULER's single-needle tasks (S-NIAH-1/2/3), built here from RULER's definitions, and the
// sizing of a prompt to a length in the model's own tokens. Shared by the evaluation (eval/niah.h) and
// the training episodes that teach small teachers the same form (data/retrieval_episodes.h).
//
//   prompt   "Some special magic {kind} are hidden within the following text. Make sure to memorize it.
//            I will quiz you about the {kind} afterwards.\n{context}\nWhat are all the special magic {kind}
//            for {key} mentioned in the provided text?"
//   answer   " The special magic {kind} for {key} mentioned in the provided text are"  (appended to the prompt)
//   needle   "One of the special magic {kind} for {key} is: {value}."
// {kind} is "numbers" (values: 7-digit numbers, 1000000..9999999) or "uuids" (version-4 UUIDs); keys are
// adjective-noun pairs joined by '-' ("amber-badger", from our own word lists). With one query and one
// value, as in every single-needle task, RULER rewrites prompt and answer prefix to the singular before
// filling them in ("Some" -> "A", "are all" -> "is", "are" -> "is", "numbers" -> "number"), so S-NIAH asks
// "What is the special magic number for {key} ...? The special magic number for {key} ... is"; the
// needle keeps the plural.
//
// Haystacks:
//   noise  RULER's noise paragraph repeated; the units are whole paragraphs joined by "\n", and the needle
//          is one more unit inserted before a uniformly drawn paragraph.
//   essay  prose cut to a number of words (whitespace runs collapsed; cycled when the text is too short),
//          split into sentences, and the needle put between sentences at a depth drawn from RULER's 40
//          depths round(linspace(0, 100, 40)) %. RULER uses Paul Graham's essays; we use the prose file
//          the caller gives (by default a public-domain novel), the one difference from RULER.
// A prompt of `length` tokens holds the largest number of units for which the encoded prompt (answer
// prefix included) plus the generation budget fits the length.
#pragma once
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace linearize {

class Tokenizer;

// RULER's noise paragraph.
std::string niah_noise_paragraph();

// "numbers" or "uuids".
std::string niah_kind_word(bool uuid);
// The filled template (the question) and the answer prefix, singular as RULER writes them for one
// query with one value; plural (`single` false) for questions with several answers.
std::string niah_prompt(bool uuid, const std::string& context, const std::string& key, bool single = true);
std::string niah_answer_prefix(bool uuid, const std::string& key, bool single = true);
std::string niah_needle(bool uuid, const std::string& key, const std::string& value);

// Keys and values. `adjectives` x `nouns` gives the keys; the evaluation uses niah_key_adjectives() x
// niah_key_nouns(), training text uses other lists so that its facts are held out from the evaluation.
const std::vector<std::string>& niah_key_adjectives();
const std::vector<std::string>& niah_key_nouns();
std::string niah_random_key(std::mt19937_64& rng, const std::vector<std::string>& adjectives,
                            const std::vector<std::string>& nouns);
std::string niah_random_number(std::mt19937_64& rng);  // 7 digits
std::string niah_random_uuid(std::mt19937_64& rng);    // 8-4-4-4-12 hex, version 4

// RULER's depths in percent: round(linspace(0, 100, 40)).
const std::vector<int>& niah_depths_percent();

// Collapses whitespace runs to one space and cuts after . ! ? (and closing quotes) before a space.
std::vector<std::string> split_sentences(const std::string& text);

struct Haystack {
  bool noise = true;               // noise paragraphs, else essay words
  std::vector<std::string> words;  // essay: the prose's words
  std::string name = "noise";      // "noise" or the prose file, for results
};
Haystack noise_haystack();
// Throws Error naming `name` when the text has no words.
Haystack essay_haystack(const std::string& text, const std::string& name);

// A needle and where it goes: `at` in [0, 1) picks the unit it precedes (noise) or the sentence
// boundary round-down(at * sentences) (essay).
struct PlacedNeedle {
  double at = 0;
  std::string text;
};

// The context of `units` haystack units with the needles placed (in the order of their `at`): noise
// paragraphs on lines of their own, or the essay's sentences joined by spaces.
std::string niah_context(const Haystack& haystack, int64_t units, std::vector<PlacedNeedle> needles);
// `units` joined by `separator`, each needle put before unit floor(at * units.size()) (after the last
// for at = 1).
std::string join_with_needles(const std::vector<std::string>& units, std::vector<PlacedNeedle> needles,
                              const std::string& separator);

// Ids of a whole prompt from its question text (the filled template) and its answer prefix: plain
// (prefix ids + encode(question + answer)) or through a chat template.
using PromptEncoder = std::function<std::vector<int32_t>(const std::string& question, const std::string& answer)>;
PromptEncoder plain_prompt_encoder(const Tokenizer& tokenizer, std::vector<int32_t> prefix);

struct NiahSample {
  std::string key, value, needle;
  std::string question, answer_prefix;  // the filled template and the answer prefix (text = both)
  std::vector<int32_t> ids;             // the encoded prompt
  int64_t units = 0;                    // haystack units (paragraphs or words) in the context
  double depth = 0;                     // the needle's depth, 0..1
};

// One S-NIAH prompt of at most `length` - `generation_budget` tokens with a fresh key and value, the
// needle at a random depth (RULER's way for the haystack's kind). Deterministic in rng. Throws Error
// when even a prompt without haystack does not fit.
NiahSample make_niah_sample(const Haystack& haystack, bool uuid, int64_t length, int64_t generation_budget,
                            const PromptEncoder& encode, std::mt19937_64& rng);

// The largest n in [0, max_units] with fits(n), for fits true at 0 and monotone (false from some n on).
int64_t largest_fitting(int64_t max_units, const std::function<bool(int64_t)>& fits);

}  // namespace linearize
