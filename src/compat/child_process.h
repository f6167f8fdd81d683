// Child processes of this program (the demo's students, `launch`'s ranks): start a copy of a program with
// extra environment variables and, optionally, its output in a log file; wait for whichever child ends
// first. POSIX fork + exec; the callers keep their own bookkeeping of which child is which.
#pragma once
#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace linearize {

// The path of the running executable (/proc/self/exe), for commands that start copies of it.
std::string self_exe();

struct ChildEnv {
  std::string name, value;
  bool overwrite = true;  // false: keep a value the user already set (OMP_NUM_THREADS under launch)
};

// Starts `program args...` with `env` added to this process's environment, stdout and stderr into `log`
// (created or truncated) when it is not empty. Throws Error when no process can be started; a program that
// cannot be executed makes the child exit with code 127 after one line on its stderr.
pid_t start_child(const std::string& program, const std::vector<std::string>& args, const std::vector<ChildEnv>& env,
                  const std::string& log = "");

struct ChildExit {
  pid_t pid;
  int code;  // the exit status, or 128 + the signal that ended it
};

// Waits for any child of this process (retrying when a signal interrupts the wait); nothing when none is
// left to wait for.
std::optional<ChildExit> wait_any_child();

}  // namespace linearize
