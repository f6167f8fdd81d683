#include "compat/cpu_threads.h"

#include <dlfcn.h>

#include <ATen/Parallel.h>

namespace linearize {

int cpu_threads() { return at::get_num_threads(); }

void set_cpu_threads(int threads) {
  at::set_num_threads(threads);
  // libtorch does not tell OpenBLAS (Debian's BLAS, a pool of its own); looked up so that builds on other
  // BLAS libraries need nothing.
  using SetThreads = void (*)(int);
  if (auto set = reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) set(threads);
}

}  // namespace linearize
