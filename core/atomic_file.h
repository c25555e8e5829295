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
  AtomicFileSink(int fd, std::string path_for_errors, std::uint64_t fake_capacity);

  // Writes all of `bytes` or throws kiln::Error naming the target and strerror (ENOSPC, EIO, ...).
  void write(std::span<const std::uint8_t> bytes);
  void write(const void* data, std::size_t bytes);
  std::uint64_t bytes_written() const { return written_; }

 private:
  int fd_;
  std::string path_;        // the target, for messages
  std::uint64_t capacity_;  // KILN_FAKE_DISK_FULL_AFTER, or UINT64_MAX
  std::uint64_t written_ = 0;
};

// Replaces `path` with what `write` produces. The temp file is named
// "<target file name>.tmp.<pid>.<counter>" in the target's directory; on any failure
// (including an exception from `write`) it is removed, the previous file is untouched and
// a kiln::Error naming `path` and the system's reason is thrown (the callback's own
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

// kiln::Error unless `dir` exists and is writable: "<what>: the directory <dir> does not
// exist" (or "is not writable"). Run before long work whose results go there.
void check_writable_directory(const std::filesystem::path& dir, const std::string& what);

}  // namespace kiln
