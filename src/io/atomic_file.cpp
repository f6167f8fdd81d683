#include "io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/error.h"

namespace linearize {

namespace {

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) return;  // best effort for folders on file systems that refuse it
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

void write_file_atomic(const std::string& path, const std::function<void(std::ostream&)>& write) {
  namespace fs = std::filesystem;
  fs::path target(path);
  fs::path folder = target.has_parent_path() ? target.parent_path() : fs::path(".");
  if (!fs::is_directory(folder)) fs::create_directories(folder);
  fs::path tmp = folder / ("." + target.filename().string() + ".tmp." + std::to_string(::getpid()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error("cannot write " + tmp.string() + ": " + std::strerror(errno));
    write(out);
    out.flush();
    if (!out) throw Error("writing " + tmp.string() + " failed (disk full?)");
  }
  fsync_path(tmp.string(), false);
  std::error_code ec;
  fs::rename(tmp, target, ec);
  if (ec) {
    fs::remove(tmp);
    throw Error("cannot rename " + tmp.string() + " to " + path + ": " + ec.message());
  }
  fsync_path(folder.string(), true);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open " + path + ": " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void refuse_output_inside(const std::string& output, const std::string& input, const std::string& what) {
  if (output.empty() || input.empty()) return;
  namespace fs = std::filesystem;
  std::error_code ec;
  auto norm = [&](const std::string& p) {
    fs::path c = fs::weakly_canonical(fs::absolute(p), ec);
    if (c.filename().empty()) c = c.parent_path();
    return c;
  };
  const fs::path out = norm(output), in = norm(input);
  const auto rel = out.lexically_relative(in);
  if (!rel.empty() && *rel.begin() != "..")
    throw Error("the output folder " + output + (out == in ? " is " : " is inside ") + what + " " + input +
                ": writing there would overwrite it; choose another output folder");
}

}  // namespace linearize
