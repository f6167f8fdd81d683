// Small UTF-8 helpers for the tokenizers: replacing invalid sequences with U+FFFD the way Rust's
// String::from_utf8_lossy does (one U+FFFD per maximal invalid subpart), and finding where an
// incomplete trailing character starts, for streaming decode.
//
// Unicode NFC (tokenizers whose tokenizer.json has an NFC normalizer, e.g. Qwen's) comes from utf8proc;
// case mapping and Unicode categories from PCRE2.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace linearize::utf8 {

// Length in bytes of the valid UTF-8 sequence starting at s[i], or 0 when the bytes there are not a
// complete valid sequence. `*valid_prefix` (optional) receives how many bytes form a valid prefix of
// some sequence (at least 1 when the result is 0): the length of the maximal invalid subpart.
size_t sequence_length(const std::string& s, size_t i, size_t* valid_prefix = nullptr);

// `s` with every maximal invalid subpart replaced by U+FFFD. Valid input is returned unchanged.
std::string sanitize(const std::string& s);

// True when s is entirely valid UTF-8.
bool is_valid(const std::string& s);

// Number of leading bytes of `s` that can be emitted now: everything except a trailing sequence that
// is a valid but incomplete prefix of a character (which more bytes could still complete).
size_t complete_prefix_length(const std::string& s);

// Number of characters (code points) of valid UTF-8 text, as Python's len(str) counts them.
size_t codepoint_count(const std::string& s);

// Valid UTF-8 text in Unicode normalization form C (canonical composition), as tokenizers' NFC
// normalizer gives it.
std::string nfc(const std::string& s);

// Appends the UTF-8 encoding of codepoint cp.
void append_codepoint(std::string& out, uint32_t cp);

}  // namespace linearize::utf8
