#include "cli/self_exe.h"

#include <unistd.h>

#include <vector>

#include "io/error.h"

namespace linearize::cli {

std::string self_exe() {
  std::vector<char> buf(4096);
  const ssize_t n = ::readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n <= 0) throw Error("cannot find this program's path (/proc/self/exe)");
  return std::string(buf.data(), static_cast<size_t>(n));
}

}  // namespace linearize::cli
