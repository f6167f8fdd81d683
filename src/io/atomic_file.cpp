#include "io/atomic_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

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

void require_regular_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw Error("cannot open " + path + ": " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) throw Error(path + " is a folder; expected a file");
  if (!S_ISREG(st.st_mode)) throw Error(path + " is not a regular file (a FIFO, socket or device); expected a file");
}

std::string read_file(const std::string& path) {
  require_regular_file(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open " + path + ": " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

namespace {

int remove_entry(const char* path, const struct stat*, int type, struct FTW*) {
  return type == FTW_DP ? ::rmdir(path) : ::unlink(path);
}

}  // namespace

void remove_tree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;  // absent
  if (nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
    throw Error("cannot remove " + path + ": " + std::strerror(errno));
}

void copy_flat_folder(const std::string& from, const std::string& to) {
  remove_tree(to);
  if (::mkdir(to.c_str(), 0755) != 0) throw Error("cannot create " + to + ": " + std::strerror(errno));
  DIR* d = ::opendir(from.c_str());
  if (!d) throw Error("cannot read " + from + ": " + std::strerror(errno));
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n == "." || n == "..") continue;
    struct stat st {};
    if (::stat((from + "/" + n).c_str(), &st) == 0 && S_ISREG(st.st_mode)) names.push_back(n);
  }
  ::closedir(d);
  for (const auto& n : names) {
    std::ifstream in(from + "/" + n, std::ios::binary);
    std::ofstream out(to + "/" + n, std::ios::binary | std::ios::trunc);
    out << in.rdbuf();
    out.close();
    if (!in || !out) throw Error("cannot copy " + from + "/" + n + " to " + to);
    const int fd = ::open((to + "/" + n).c_str(), O_RDONLY);
    if (fd >= 0) ::fsync(fd), ::close(fd);
  }
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
