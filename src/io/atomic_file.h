// Atomic file writes: write to a temporary file in the same folder, fsync it, rename over the target,
// fsync the folder. A killed process leaves either the old file or the new one, never a torn one.
#pragma once
#include <functional>
#include <ostream>
#include <string>

namespace linearize {

// Calls `write` with a stream on a temporary file, then publishes it as `path`.
void write_file_atomic(const std::string& path, const std::function<void(std::ostream&)>& write);

// Reads a whole file; throws linearize::Error naming the path when it cannot be read.
// Throws a one-line Error unless `path` is a regular file (following links): a missing path, a folder, a
// FIFO or a device given where a file is expected is refused before anything opens it (a FIFO would block).
void require_regular_file(const std::string& path);

std::string read_file(const std::string& path);

// Removes a file or a folder with everything in it (POSIX nftw; nothing happens when it is absent). Used
// for checkpoint folders instead of std::filesystem::remove_all, which crashed in one GPU build.
void remove_tree(const std::string& path);
// Copies the regular files of folder `from` (not recursing) into a new folder `to`, fsynced.
void copy_flat_folder(const std::string& from, const std::string& to);

// Throws Error when `output` is the folder `input` or lies inside it (after resolving . and .. and links):
// writing there would overwrite `what` (e.g. "the teacher"). Nothing is checked when either is empty.
void refuse_output_inside(const std::string& output, const std::string& input, const std::string& what);

}  // namespace linearize
