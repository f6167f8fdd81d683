// How the process's C allocator (glibc malloc) treats tensor-sized blocks, set once at start by the
// executables (the command line, the test binary, the GPU bench).
//
// By default glibc maps each large block (above a threshold that grows to at most 32 MiB) from the kernel
// and unmaps it on free, and hands the top of its heap back once 128 KiB or more lie free there. A
// libtorch program frees and allocates tensors of the same sizes over and over, so every step then
// faults all of their pages in again. Where a page fault is dear (on the 2-core VMs we build and test on,
// some 12 us a 4 KiB page: about 3 s a GB), that dominated CPU training: a distillation test spent 34 of
// its 39 s in the kernel. Here no block is mapped on its own and the heap keeps what it has freed (up to
// 2 GiB at its top), so freed blocks are used again.
#pragma once

namespace linearize::cli {

// Heap for every block, freed memory kept for reuse. A no-op where the C library is not glibc.
void keep_freed_memory_for_reuse();

}  // namespace linearize::cli
