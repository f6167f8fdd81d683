// Synthetic retrieval episodes: training text in the form of RULER's needle-in-a-haystack prompts
// (data/niah_text.h), so that a small teacher learns to retrieve and NIAH can tell its students apart.
//
// An episode is RULER's template around a context of filler with one or more needles, followed by one or
// more questions, each answered on its own line:
//   A special magic number is hidden within the following text. Make sure to memorize it. I will quiz
//   you about the number afterwards.\n{filler and needles}\nWhat is the special magic number for {key}
//   mentioned in the provided text? The special magic number for {key} mentioned in the provided text
//   is {value}.\n[What is ... {key2} ... is {value2}.\n]
// With several needles the other ones are distractors with other keys, so the answer depends on the key.
// The filler comes from the caller (a sentence generator) in one of three layouts, drawn per episode:
//   essay   sentences joined by spaces, needles between sentences
//   lines   paragraphs of a few sentences, one per line, each needle a line of its own
//   repeat  one paragraph repeated on every line, each needle a line of its own (S-NIAH-1's layout)
// A share of episodes (noise_fraction) instead repeat a paragraph of 2-6 short statements of our own
// ("The river is wide. Here we are."), the kind of filler S-NIAH-1 repeats: a model that has only seen
// long repeated paragraphs loses the needle among dozens of short "X is Y." lines.
// Keys come from the caller's word lists: training text should use lists other than the evaluation's
// (niah_key_adjectives / niah_key_nouns) so that its facts are held out.
#pragma once
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace linearize {

struct RetrievalEpisodeOptions {
  int64_t min_chars = 200, max_chars = 1000;  // the filler's length, drawn uniformly per episode
  int64_t max_needles = 3;                    // 1 .. max_needles needles per episode
  int64_t max_questions = 2;                  // 1 .. min(needles, max_questions) questions
  int64_t paragraph_sentences = 3;            // sentences per paragraph (lines, repeat)
  double uuid_fraction = 0.0;                 // share of episodes with UUID values instead of numbers
  double noise_fraction = 0.0;                // share of episodes with repeated short statements as filler
  std::vector<std::string> key_adjectives, key_nouns;
};

using SentenceSource = std::function<std::string(std::mt19937_64&)>;

// The demo corpus's keys for training text: its colours and things ("amber-door" style pairs that the
// evaluation's lists do not contain).
const std::vector<std::string>& training_key_adjectives();
const std::vector<std::string>& training_key_nouns();

// One short statement of the noise filler ("The river is wide." or "Here we are."), ending in a space.
std::string short_statement(std::mt19937_64& rng);

// One episode, deterministic in rng.
std::string retrieval_episode(std::mt19937_64& rng, const SentenceSource& filler, const RetrievalEpisodeOptions& options);

}  // namespace linearize
