// UTF-8 validation by the well-formed byte ranges of Unicode Table 3-7 (what Rust, Python and the
// WHATWG decoder all follow), so U+FFFD replacement matches Hugging Face tokenizers byte for byte.
#include "io/utf8.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>

namespace linearize::utf8 {
namespace {

bool in(unsigned char c, unsigned char lo, unsigned char hi) { return c >= lo && c <= hi; }

// Expected total length for lead byte b and the allowed range of the second byte; 0 if b cannot lead.
int lead_info(unsigned char b, unsigned char* lo, unsigned char* hi) {
  *lo = 0x80;
  *hi = 0xBF;
  if (b < 0x80) return 1;
  if (in(b, 0xC2, 0xDF)) return 2;
  if (b == 0xE0) { *lo = 0xA0; return 3; }
  if (in(b, 0xE1, 0xEC) || in(b, 0xEE, 0xEF)) return 3;
  if (b == 0xED) { *hi = 0x9F; return 3; }
  if (b == 0xF0) { *lo = 0x90; return 4; }
  if (in(b, 0xF1, 0xF3)) return 4;
  if (b == 0xF4) { *hi = 0x8F; return 4; }
  return 0;
}

}  // namespace

size_t sequence_length(const std::string& s, size_t i, size_t* valid_prefix) {
  unsigned char lo, hi;
  const int need = lead_info(static_cast<unsigned char>(s[i]), &lo, &hi);
  if (need == 0) {
    if (valid_prefix) *valid_prefix = 1;
    return 0;
  }
  size_t k = 1;
  for (; k < static_cast<size_t>(need); ++k) {
    if (i + k >= s.size()) break;
    const unsigned char c = static_cast<unsigned char>(s[i + k]);
    const bool ok = (k == 1) ? in(c, lo, hi) : in(c, 0x80, 0xBF);
    if (!ok) break;
  }
  if (k == static_cast<size_t>(need)) return k;
  if (valid_prefix) *valid_prefix = k;
  return 0;
}

std::string sanitize(const std::string& s) {
  if (is_valid(s)) return s;
  std::string out;
  out.reserve(s.size() + 8);
  size_t i = 0;
  while (i < s.size()) {
    size_t bad = 0;
    const size_t n = sequence_length(s, i, &bad);
    if (n > 0) {
      out.append(s, i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD
      i += bad;
    }
  }
  return out;
}

bool is_valid(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = sequence_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

size_t complete_prefix_length(const std::string& s) {
  // A pending character is at most 3 bytes long (a 4th byte would complete it).
  const size_t start = s.size() > 3 ? s.size() - 3 : 0;
  for (size_t i = start; i < s.size(); ++i) {
    const unsigned char b = static_cast<unsigned char>(s[i]);
    if (b < 0xC2 || b > 0xF4) continue;  // cannot start a character that more bytes would complete
    size_t prefix = 0;
    if (sequence_length(s, i, &prefix) == 0 && i + prefix == s.size()) return i;
  }
  return s.size();
}

void append_codepoint(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

size_t codepoint_count(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;  // every byte but a continuation byte starts one
  return n;
}

std::string nfc(const std::string& s) {
  if (s.empty()) return s;
  const utf8proc_ssize_t n = static_cast<utf8proc_ssize_t>(s.size());
  utf8proc_uint8_t* out = nullptr;
  const auto len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), n, &out,
                                static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  std::unique_ptr<utf8proc_uint8_t, void (*)(void*)> owned(out, std::free);
  if (len < 0) return s;  // not valid UTF-8: callers sanitize first, so this keeps the text as it is
  return std::string(reinterpret_cast<const char*>(out), static_cast<size_t>(len));
}

}  // namespace linearize::utf8
