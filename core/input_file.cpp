// Input files opened without blocking, checked to be regular files (core/input_file.h).
#include "core/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "core/error.h"

namespace kiln {
namespace {

std::string reason(int err) { return std::error_code(err, std::generic_category()).message(); }

}  // namespace

const char* file_kind_name(unsigned mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

int open_regular_fd(const std::filesystem::path& path) {
  // O_NONBLOCK: opening a FIFO with no writer would otherwise wait forever.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    throw Error(fmt::format("{}: cannot open for reading ({})", path.string(), reason(err)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int err = errno;
    const bool stat_failed = st.st_mode == 0;
    ::close(fd);
    if (stat_failed)
      throw Error(fmt::format("{}: cannot look at it ({})", path.string(), reason(err)));
    throw Error(
        fmt::format("{}: is {}, not a regular file", path.string(), file_kind_name(st.st_mode)));
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

FilePtr open_regular_file(const std::filesystem::path& path) {
  const int fd = open_regular_fd(path);
  std::FILE* f = ::fdopen(fd, "rb");
  if (f == nullptr) {
    const int err = errno;
    ::close(fd);
    throw Error(fmt::format("{}: cannot open for reading ({})", path.string(), reason(err)));
  }
  return FilePtr(f, std::fclose);
}

std::string read_regular_file(const std::filesystem::path& path, std::uint64_t max_bytes,
                              const std::string& limit_name) {
  FilePtr f = open_regular_file(path);
  struct stat st {};
  KILN_CHECK(::fstat(::fileno(f.get()), &st) == 0, "{}: cannot look at it ({})", path.string(),
             reason(errno));
  const auto size = static_cast<std::uint64_t>(st.st_size);
  KILN_CHECK(size <= max_bytes, "{}: {} bytes, more than the {} that {} allows", path.string(),
             size, max_bytes, limit_name);
  std::string text(static_cast<std::size_t>(size), '\0');
  const std::size_t got = std::fread(text.data(), 1, text.size(), f.get());
  KILN_CHECK(got == text.size() && !std::ferror(f.get()),
             "{}: read {} of its {} bytes (it changed or could not be read)", path.string(), got,
             size);
  return text;
}

}  // namespace kiln
