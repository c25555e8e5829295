// Atomic file replacement: write a unique temp file beside the target, fsync it, rename it
// over the target, fsync the directory. A crash or error at any point leaves the old file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>

namespace kiln {

// The open temp file handed to a writer callback; every write is checked.
class AtomicFileSink {
 public:
  // `after_failure` ends every error message: what a failed write leaves at the target.
  AtomicFileSink(int fd, std::string path_for_errors, std::uint64_t fake_capacity,
                 std::string after_failure);

  // Writes all of `bytes` or throws kiln::Error naming the target and strerror (ENOSPC, EIO, ...).
  void write(std::span<const std::uint8_t> bytes);
  void write(const void* data, std::size_t bytes);
  std::uint64_t bytes_written() const { return written_; }

 private:
  int fd_;
  std::string path_;        // the target, for messages
  std::uint64_t capacity_;  // KILN_FAKE_DISK_FULL_AFTER, or UINT64_MAX
  std::string after_failure_;
  std::uint64_t written_ = 0;
};

// Replaces `path` with what `write` produces. Only a regular file is ever replaced: a `path`
// that is a symbolic link has the file it points to replaced (the link stays), and one that
// exists but is not a regular file (a directory, a device, a FIFO, a socket) or is a dangling
// link is refused with a kiln::Error before anything is written. The temp file is created
// exclusively as "<target file name>.tmp.<pid>.<counter>" in the target's directory, where
// leftovers of our own killed writers (same user, no such process) are removed first; on any
// failure (including an exception from `write`) it is removed, the previous file is untouched
// and a kiln::Error naming `path` and the system's reason is thrown (the callback's own
// kiln::Error passes through unchanged).
//
// Test hook: when the environment variable KILN_FAKE_DISK_FULL_AFTER=<bytes> is set (read at
// each call), the write that would take the temp file past that many bytes writes up to the
// limit and then fails with ENOSPC, as a full disk does.
void write_file_atomically(const std::filesystem::path& path,
                           const std::function<void(AtomicFileSink&)>& write);
void write_file_atomically(const std::filesystem::path& path, std::span<const std::uint8_t> bytes);

// The prefix of temp file names for `path` ("<file name>.tmp."), so tests and cleanup tools
// can find leftovers of a writer that was killed.
std::string atomic_temp_prefix(const std::filesystem::path& path);

// kiln::Error unless `dir` exists and a file can be created in it (tried, not asked):
// "<what>: the directory <dir> does not exist" (or "is not writable (<reason>)"). Run before
// long work whose results go there.
void check_writable_directory(const std::filesystem::path& dir, const std::string& what);

// kiln::Error unless write_file_atomically(path, ...) could replace `path` now: a file path
// whose target write_file_atomically accepts, in a writable directory. Run before training.
void check_atomic_target(const std::filesystem::path& path, const std::string& what);

}  // namespace kiln
