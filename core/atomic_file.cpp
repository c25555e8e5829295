// Atomic file replacement (see atomic_file.h): an O_EXCL temp file beside the target,
// checked writes, fsync, rename over the target, fsync of the directory.
#include "core/atomic_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <system_error>

#include "core/error.h"
#include "core/input_file.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

constexpr std::uint64_t kNoLimit = std::numeric_limits<std::uint64_t>::max();

// strerror, but thread-safe.
std::string reason(int err) { return std::error_code(err, std::generic_category()).message(); }

// The KILN_FAKE_DISK_FULL_AFTER test hook (bytes a temp file may hold), or kNoLimit.
std::uint64_t fake_disk_capacity() {
  const char* value = std::getenv("KILN_FAKE_DISK_FULL_AFTER");
  if (value == nullptr || *value == '\0') return kNoLimit;
  const std::string_view text(value);
  std::uint64_t bytes = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), bytes);
  KILN_CHECK(ec == std::errc() && end == text.data() + text.size(),
             "KILN_FAKE_DISK_FULL_AFTER='{}' is not a byte count", text);
  return bytes;
}

fs::path directory_of(const fs::path& path) {
  const fs::path parent = path.parent_path();
  return parent.empty() ? fs::path(".") : parent;
}

// A temp file that removes itself unless released; closes its descriptor once.
class TempFile {
 public:
  explicit TempFile(const fs::path& target) {
    static std::atomic<std::uint64_t> counter{0};
    const fs::path dir = directory_of(target);
    for (int attempt = 0; attempt < 100; ++attempt) {
      path_ = dir / (atomic_temp_prefix(target) + std::to_string(::getpid()) + "." +
                     std::to_string(counter++));
      fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd_ >= 0) return;
      if (errno != EEXIST) break;
    }
    const int err = errno;
    throw Error(fmt::format("{}: cannot create a temporary file in {} to write it ({})",
                            target.string(), dir.string(), reason(err)));
  }
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  int fd() const { return fd_; }
  const fs::path& path() const { return path_; }
  // Closes the descriptor; returns 0 or the errno of close().
  int close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc == 0 ? 0 : errno;
  }
  // After a successful rename there is nothing left to remove.
  void release() { path_.clear(); }

 private:
  fs::path path_;
  int fd_ = -1;
};

// The file that an atomic write of `path` replaces: `path` itself, or, where `path` is a
// symbolic link, the file it points to (the link stays a link). Refuses a dangling link
// and a target that exists but is not a regular file (a device, a FIFO, a directory), so
// that nothing but a regular file is ever replaced.
fs::path replaced_file(const fs::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    const int err = errno;
    KILN_CHECK(err == ENOENT, "{}: cannot look at it ({})", path.string(), reason(err));
    return path;  // a new file
  }
  fs::path target = path;
  if (S_ISLNK(st.st_mode)) {
    std::error_code ec;
    target = fs::canonical(path, ec);
    KILN_CHECK(!ec, "{}: a symbolic link to a file that does not exist ({})", path.string(),
               ec.message());
    KILN_CHECK(::stat(target.c_str(), &st) == 0, "{}: cannot look at its target {}", path.string(),
               target.string());
  }
  KILN_CHECK(S_ISREG(st.st_mode), "{}: exists and is {}; refusing to replace it with a file",
             path.string(), file_kind_name(st.st_mode));
  return target;
}

// Whether `name` is "<prefix><pid>.<counter>" of a process that no longer runs.
bool stale_temp_name(const std::string& name, const std::string& prefix) {
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return false;
  const std::string_view rest = std::string_view(name).substr(prefix.size());
  const auto dot = rest.find('.');
  if (dot == std::string_view::npos) return false;
  long pid = 0;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + dot, pid);
  std::uint64_t counter = 0;
  const auto [end2, ec2] =
      std::from_chars(rest.data() + dot + 1, rest.data() + rest.size(), counter);
  if (ec != std::errc() || end != rest.data() + dot || ec2 != std::errc() ||
      end2 != rest.data() + rest.size() || pid <= 0 || pid == ::getpid())
    return false;
  return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

// Removes the temp files of `target` left by writers of ours (same user) that were killed.
void remove_stale_temps(const fs::path& target) {
  const std::string prefix = atomic_temp_prefix(target);
  const fs::path dir = directory_of(target);
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (!stale_temp_name(name, prefix)) continue;
    struct stat st {};
    const fs::path file = dir / name;
    if (::lstat(file.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid())
      ::unlink(file.c_str());
  }
  ::closedir(d);
}

// Keeps the permission bits of a file being replaced (best effort: a new file keeps 0666 & ~umask).
void copy_mode(const fs::path& target, int fd) {
  struct stat st {};
  if (::stat(target.c_str(), &st) == 0 && S_ISREG(st.st_mode))
    (void)::fchmod(fd, st.st_mode & 07777);
}

// Makes the rename durable. Filesystems that cannot sync a directory say EINVAL; that is fine.
void sync_directory(const fs::path& target) {
  const fs::path dir = directory_of(target);
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int err = fd < 0 ? errno : 0;
  if (fd >= 0) {
    if (::fsync(fd) != 0 && errno != EINVAL) err = errno;
    ::close(fd);
  }
  KILN_CHECK(err == 0, "{}: written, but its directory {} could not be synced to disk ({})",
             target.string(), dir.string(), reason(err));
}

}  // namespace

AtomicFileSink::AtomicFileSink(int fd, std::string path_for_errors, std::uint64_t fake_capacity,
                               std::string after_failure)
    : fd_(fd),
      path_(std::move(path_for_errors)),
      capacity_(fake_capacity),
      after_failure_(std::move(after_failure)) {}

void AtomicFileSink::write(std::span<const std::uint8_t> bytes) {
  write(bytes.data(), bytes.size());
}

void AtomicFileSink::write(const void* data, std::size_t bytes) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  std::size_t left = bytes;
  while (left > 0) {
    const std::uint64_t room = capacity_ - written_;  // written_ <= capacity_ always
    const int full = room == 0 ? ENOSPC : 0;          // the fake full disk of the test hook
    KILN_CHECK(full == 0, "{}: write failed after {} bytes ({}); {}", path_, written_, reason(full),
               after_failure_);
    const std::size_t chunk =
        static_cast<std::size_t>(std::min<std::uint64_t>({left, std::uint64_t{1} << 30, room}));
    const ssize_t n = ::write(fd_, p, chunk);
    if (n < 0 && errno == EINTR) continue;
    const int err = n < 0 ? errno : 0;
    KILN_CHECK(err == 0, "{}: write failed after {} bytes ({}); {}", path_, written_, reason(err),
               after_failure_);
    KILN_CHECK(n > 0, "{}: write failed after {} bytes (the system wrote nothing); {}", path_,
               written_, after_failure_);
    p += n;
    left -= static_cast<std::size_t>(n);
    written_ += static_cast<std::uint64_t>(n);
  }
}

std::string atomic_temp_prefix(const std::filesystem::path& path) {
  return path.filename().string() + ".tmp.";
}

void write_file_atomically(const std::filesystem::path& path,
                           const std::function<void(AtomicFileSink&)>& write) {
  KILN_CHECK(path.has_filename(), "{}: not a file path (it names a directory)", path.string());
  const fs::path target = replaced_file(path);
  const std::uint64_t capacity = fake_disk_capacity();
  remove_stale_temps(target);
  TempFile temp(target);
  copy_mode(target, temp.fd());
  std::error_code ec;
  const std::string after_failure =
      fs::exists(target, ec) ? "the previous file is intact" : "nothing was left in its place";
  AtomicFileSink sink(temp.fd(), path.string(), capacity, after_failure);
  write(sink);
  if (::fsync(temp.fd()) != 0) {
    const int err = errno;
    throw Error(fmt::format("{}: could not sync the written data to disk ({})", path.string(),
                            reason(err)));
  }
  const int close_err = temp.close();
  KILN_CHECK(close_err == 0, "{}: closing the written file failed ({})", path.string(),
             reason(close_err));
  if (::rename(temp.path().c_str(), target.c_str()) != 0) {
    const int err = errno;
    throw Error(fmt::format("{}: could not replace it with the written file ({})", path.string(),
                            reason(err)));
  }
  temp.release();
  sync_directory(target);
}

void write_file_atomically(const std::filesystem::path& path, std::span<const std::uint8_t> bytes) {
  write_file_atomically(path, [&](AtomicFileSink& sink) { sink.write(bytes); });
}

void check_writable_directory(const std::filesystem::path& dir, const std::string& what) {
  std::error_code ec;
  KILN_CHECK(fs::is_directory(dir, ec), "{}: the directory {} does not exist", what, dir.string());
  // Created, not asked (access() says yes to root on a read-only mount).
  const fs::path probe = dir / fmt::format(".kiln-write-test.{}", ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  const int err = fd < 0 ? errno : 0;
  if (fd >= 0) {
    ::close(fd);
    ::unlink(probe.c_str());
  }
  KILN_CHECK(err == 0 || err == EEXIST, "{}: the directory {} is not writable ({})", what,
             dir.string(), reason(err));
}

void check_atomic_target(const std::filesystem::path& path, const std::string& what) {
  KILN_CHECK(path.has_filename(), "{}: {} is not a file path (it names a directory)", what,
             path.string());
  const fs::path target = replaced_file(path);
  check_writable_directory(fs::absolute(target).parent_path(), what);
}

}  // namespace kiln
