// C interface of the SentencePiece shim (liblinearize_spm.so).
//
// Why a shim: Debian's libsentencepiece bundles its own copy of protobuf-lite and exports those
// symbols; linked into the same process as libtorch (which uses libprotobuf) the two copies
// interpose and the process crashes during static initialisation. The shim links libsentencepiece and
// is loaded at run time with dlopen(RTLD_LOCAL | RTLD_DEEPBIND), so its protobuf stays private.
#pragma once
#include <cstddef>

extern "C" {

// Returns a handle, or null with a message in err.
void* linearize_spm_load(const char* path, char* err, size_t err_len);
void linearize_spm_free(void* handle);
int linearize_spm_vocab_size(void* handle);
// Writes up to cap ids into out; returns the number of ids (call again with a larger buffer when
// the result exceeds cap); -1 on error.
int linearize_spm_encode(void* handle, const char* text, size_t len, int* out, int cap);
// Decoded text of ids; returns its byte length (may exceed cap: call again), -1 on error.
int linearize_spm_decode(void* handle, const int* ids, int n, char* out, int cap);
// The piece string of an id; returns its byte length (may exceed cap), -1 for a bad id.
int linearize_spm_id_to_piece(void* handle, int id, char* out, int cap);
int linearize_spm_piece_to_id(void* handle, const char* piece);  // unk id when absent
int linearize_spm_unk_id(void* handle);
// 1 for control (<s>, </s>), unknown, or byte (<0xAB>) pieces; 0 otherwise.
int linearize_spm_is_control(void* handle, int id);
int linearize_spm_is_unknown(void* handle, int id);
int linearize_spm_is_byte(void* handle, int id);
}
