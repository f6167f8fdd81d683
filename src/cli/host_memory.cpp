#include "cli/host_memory.h"

#if defined(__GLIBC__)
#include <malloc.h>

#include <climits>
#endif

namespace linearize::cli {

void keep_freed_memory_for_reuse() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_MAX, 0);               // no block mapped on its own: all come from the heap
  mallopt(M_TRIM_THRESHOLD, INT_MAX);   // the heap's top goes back to the kernel only beyond 2 GiB free
#endif
}

}  // namespace linearize::cli
