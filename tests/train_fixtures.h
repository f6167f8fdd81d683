// Small self-made training material for tests that must run without ../shared: a byte-level
// tokenizer and a synthetic corpus with regular structure (so a tiny model learns it quickly).
#pragma once
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "io/tokenizer_bpe.h"

namespace linearize::test {

// A byte-level BPE tokenizer.json: 3 special tokens, 256 bytes, a few merges.
inline std::string write_byte_tokenizer(const std::string& folder) {
  std::filesystem::create_directories(folder);
  std::vector<std::string> vocab = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  for (int b = 0; b < 256; ++b) vocab.push_back(byte_level_symbol(static_cast<uint8_t>(b)));
  const std::string g = byte_level_symbol(' ');
  std::vector<std::pair<std::string, std::string>> merges = {{g, "t"}, {"h", "e"}, {g + "t", "he"}, {"a", "n"}};
  for (const auto& [a, b] : merges) vocab.push_back(a + b);
  std::vector<AddedToken> added;
  for (int i = 0; i < 3; ++i) added.push_back({vocab[i], i, true, false, false, false});
  write_tokenizer_json(folder + "/tokenizer.json", vocab, merges, added, true);
  return folder;
}

// Sentences from a tiny grammar, deterministic for a seed.
inline std::string synthetic_corpus(int sentences, uint64_t seed) {
  const char* subjects[] = {"the cat", "a dog", "the old man", "my sister", "the bird"};
  const char* verbs[] = {"sees", "likes", "finds", "takes", "wants"};
  const char* objects[] = {"the red ball", "a green apple", "the small box", "an open door", "the blue hat"};
  std::mt19937_64 rng(seed);
  std::string out;
  for (int i = 0; i < sentences; ++i) {
    out += subjects[rng() % 5];
    out += " ";
    out += verbs[rng() % 5];
    out += " ";
    out += objects[rng() % 5];
    out += ". ";
  }
  return out;
}

}  // namespace linearize::test
