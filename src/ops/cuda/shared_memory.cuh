// A kernel's dynamic shared memory (the launch's third argument), declared as
//   LINEARIZE_DYNAMIC_SHARED(float, name);                      // extern __shared__ float name[]
//   LINEARIZE_DYNAMIC_SHARED_ALIGNED(128, unsigned char, name);  // ... __align__(128) unsigned char name[]
// On CUDA these are the plain declarations, token for token: a helper function returning the pointer
// compiled to different code for some kernels (other address arithmetic, 162 -> 152 registers in
// chunk_scalar_decay.cu). The emulated build (emulation/simt.h) makes `name` a pointer to its buffer.
#pragma once

#ifdef LINEARIZE_CUDA_EMULATION
#define LINEARIZE_DYNAMIC_SHARED(type, name) type* name = reinterpret_cast<type*>(::linearize::simt::dynamic_shared())
#define LINEARIZE_DYNAMIC_SHARED_ALIGNED(align, type, name) LINEARIZE_DYNAMIC_SHARED(type, name)
#else
#define LINEARIZE_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#define LINEARIZE_DYNAMIC_SHARED_ALIGNED(align, type, name) extern __shared__ __align__(align) type name[]
#endif
