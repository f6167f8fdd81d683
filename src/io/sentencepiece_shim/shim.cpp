// The SentencePiece shim: a thin C layer over sentencepiece::SentencePieceProcessor (see shim.h for
// why it exists). Built as its own shared library; never linked into the tool directly.
#include "shim.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace {
sentencepiece::SentencePieceProcessor* spm(void* h) { return static_cast<sentencepiece::SentencePieceProcessor*>(h); }

int copy_out(const std::string& s, char* out, int cap) {
  if (out && cap > 0) std::memcpy(out, s.data(), std::min<size_t>(s.size(), static_cast<size_t>(cap)));
  return static_cast<int>(s.size());
}
}  // namespace

extern "C" {

void* linearize_spm_load(const char* path, char* err, size_t err_len) {
  auto* p = new sentencepiece::SentencePieceProcessor();
  auto status = p->Load(path);
  if (!status.ok()) {
    if (err && err_len) {
      std::string m = status.ToString();
      std::strncpy(err, m.c_str(), err_len - 1);
      err[err_len - 1] = 0;
    }
    delete p;
    return nullptr;
  }
  return p;
}

void linearize_spm_free(void* h) { delete spm(h); }
int linearize_spm_vocab_size(void* h) { return spm(h)->GetPieceSize(); }

int linearize_spm_encode(void* h, const char* text, size_t len, int* out, int cap) {
  std::vector<int> ids;
  if (!spm(h)->Encode(std::string(text, len), &ids).ok()) return -1;
  for (int i = 0; i < static_cast<int>(ids.size()) && i < cap; ++i) out[i] = ids[i];
  return static_cast<int>(ids.size());
}

int linearize_spm_decode(void* h, const int* ids, int n, char* out, int cap) {
  std::string s;
  if (!spm(h)->Decode(std::vector<int>(ids, ids + n), &s).ok()) return -1;
  return copy_out(s, out, cap);
}

int linearize_spm_id_to_piece(void* h, int id, char* out, int cap) {
  if (id < 0 || id >= spm(h)->GetPieceSize()) return -1;
  return copy_out(spm(h)->IdToPiece(id), out, cap);
}

int linearize_spm_piece_to_id(void* h, const char* piece) { return spm(h)->PieceToId(piece); }
int linearize_spm_unk_id(void* h) { return spm(h)->unk_id(); }
int linearize_spm_is_control(void* h, int id) { return spm(h)->IsControl(id) ? 1 : 0; }
int linearize_spm_is_unknown(void* h, int id) { return spm(h)->IsUnknown(id) ? 1 : 0; }
int linearize_spm_is_byte(void* h, int id) { return spm(h)->IsByte(id) ? 1 : 0; }
}
