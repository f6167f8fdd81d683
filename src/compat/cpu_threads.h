// CPU threads of libtorch's ops and of OpenBLAS. Tiny models (the demo's teacher and students: hidden 64)
// run fastest on one thread: on 2 cores, 400 teacher steps take 17 s on one thread and 23 s on two.
#pragma once

namespace linearize {

int cpu_threads();
// Sets both libtorch's intra-op threads (of the calling thread) and OpenBLAS's pool when OpenBLAS is loaded.
void set_cpu_threads(int threads);

// Holds a thread count while in scope and puts the previous one back after.
class CpuThreadsScope {
 public:
  explicit CpuThreadsScope(int threads) : previous_(cpu_threads()) { set_cpu_threads(threads); }
  ~CpuThreadsScope() { set_cpu_threads(previous_); }
  CpuThreadsScope(const CpuThreadsScope&) = delete;
  CpuThreadsScope& operator=(const CpuThreadsScope&) = delete;

 private:
  int previous_;
};

}  // namespace linearize
