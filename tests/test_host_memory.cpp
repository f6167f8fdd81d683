// The test binary runs with the command line's malloc settings (cli/host_memory.h), set before any test,
// and a check that they do what they say.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "cli/host_memory.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

// AddressSanitizer brings its own allocator, so glibc's settings and counters mean nothing there.
#if defined(__SANITIZE_ADDRESS__)
#define LINEARIZE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LINEARIZE_ASAN 1
#endif
#endif

namespace {

const bool kFreedMemoryKept = (linearize::cli::keep_freed_memory_for_reuse(), true);

TEST(HostMemory, LargeBlocksComeFromTheHeapAndStayForReuse) {
#if defined(LINEARIZE_ASAN)
  GTEST_SKIP() << "skipped: AddressSanitizer replaces glibc's malloc, whose settings this test checks";
#elif defined(__GLIBC__)
  ASSERT_TRUE(kFreedMemoryKept);
  const size_t bytes = size_t{256} << 20;  // far above glibc's largest mapping threshold (32 MiB)
  const size_t mapped_before = mallinfo2().hblkhd;
  auto* p = static_cast<char*>(std::malloc(bytes));
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, bytes);
  EXPECT_EQ(mallinfo2().hblkhd, mapped_before) << "the block was mapped on its own";
  std::free(p);
  EXPECT_GE(mallinfo2().fordblks, bytes) << "the freed block went back to the kernel";
#else
  GTEST_SKIP() << "skipped: not glibc";
#endif
}

}  // namespace
