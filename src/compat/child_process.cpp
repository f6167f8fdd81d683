#include "compat/child_process.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <iostream>

#include "io/error.h"

namespace linearize {

std::string self_exe() {
  std::vector<char> buf(4096);
  const ssize_t n = ::readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n <= 0) throw Error("cannot find this program's path (/proc/self/exe)");
  return std::string(buf.data(), static_cast<size_t>(n));
}

pid_t start_child(const std::string& program, const std::vector<std::string>& args, const std::vector<ChildEnv>& env,
                  const std::string& log) {
  // The argument vector is built before fork, so that the child only redirects, sets variables and execs.
  std::vector<char*> argv{const_cast<char*>(program.c_str())};
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw Error("cannot start a process for " + program);
  if (pid > 0) return pid;
  if (!log.empty()) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) ::dup2(fd, 1), ::dup2(fd, 2);
  }
  for (const auto& e : env) ::setenv(e.name.c_str(), e.value.c_str(), e.overwrite ? 1 : 0);
  ::execv(program.c_str(), argv.data());
  std::cerr << "error: cannot run " << program << "\n";
  ::_exit(127);
}

std::optional<ChildExit> wait_any_child() {
  for (;;) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      return std::nullopt;
    }
    return ChildExit{pid, WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status)};
  }
}

}  // namespace linearize
