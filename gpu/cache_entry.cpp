// Encoding, validation and atomic writing of kernel cache entry files.
#include "gpu/cache_entry.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include <fmt/format.h>

namespace kiln::gpu {
namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'C', 'U', 'B', 'N'};

bool same_digest(const std::vector<char>& in, std::size_t offset, const Digest& digest) {
  return std::memcmp(in.data() + offset, digest.data(), digest.size()) == 0;
}

std::string errno_text(const std::string& what, const std::filesystem::path& path) {
  return fmt::format("{} {}: {}", what, path.string(), std::strerror(errno));
}

std::filesystem::path temp_path_beside(const std::filesystem::path& path) {
  thread_local std::mt19937_64 random(std::random_device{}());
  const std::size_t thread = std::hash<std::thread::id>{}(std::this_thread::get_id());
  const std::string name = fmt::format(".{}.{}.{:x}.{:016x}.tmp", path.filename().string(),
                                       static_cast<long>(::getpid()), thread, random());
  return path.parent_path() / name;
}

// Writes all of `bytes` to `fd`, retrying short writes and EINTR.
bool write_all(int fd, const std::vector<char>& bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

// Makes a rename inside `dir` durable; best effort (the entry is valid either way).
void sync_directory(const std::filesystem::path& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

}  // namespace

void put_le(std::vector<char>& out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

std::uint64_t get_le(const std::vector<char>& in, std::size_t offset, int bytes) {
  std::uint64_t value = 0;
  for (int i = 0; i < bytes; ++i)
    value |= std::uint64_t{static_cast<unsigned char>(in[offset + i])} << (8 * i);
  return value;
}

std::vector<char> encode_entry(const Digest& key, const std::vector<char>& payload) {
  std::vector<char> out(kMagic, kMagic + sizeof(kMagic));
  out.reserve(kEntryHeaderBytes + payload.size());
  put_le(out, kEntryFormatVersion, 4);
  put_le(out, kEntryHeaderBytes, 4);
  put_le(out, payload.size(), 8);
  const Digest checksum = sha256(payload.data(), payload.size());
  out.insert(out.end(), checksum.begin(), checksum.end());
  out.insert(out.end(), key.begin(), key.end());
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

DecodedEntry decode_entry(const std::vector<char>& bytes, const Digest& key) {
  if (bytes.size() < kEntryHeaderBytes)
    return {{},
            fmt::format("truncated: {} bytes, shorter than the {}-byte header", bytes.size(),
                        kEntryHeaderBytes)};
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0)
    return {{}, "bad magic (not a KILNCUBN entry)"};
  const std::uint64_t version = get_le(bytes, 8, 4), header = get_le(bytes, 12, 4),
                      size = get_le(bytes, 16, 8);
  if (version != kEntryFormatVersion || header != kEntryHeaderBytes)
    return {{},
            fmt::format("format version {} with a {}-byte header, expected version {} with {}",
                        version, header, kEntryFormatVersion, kEntryHeaderBytes)};
  if (size != bytes.size() - kEntryHeaderBytes)
    return {{},
            fmt::format("truncated or padded: header says {} payload bytes, file has {}", size,
                        bytes.size() - kEntryHeaderBytes)};
  if (!same_digest(bytes, 56, key))
    return {{}, "key mismatch (the entry belongs to another kernel)"};
  std::vector<char> payload(bytes.begin() + kEntryHeaderBytes, bytes.end());
  if (!same_digest(bytes, 24, sha256(payload.data(), payload.size())))
    return {{}, "payload checksum mismatch"};
  return {std::move(payload), ""};
}

std::string write_file_atomically(const std::filesystem::path& path,
                                  const std::vector<char>& bytes) {
  const std::filesystem::path temp = temp_path_beside(path);
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return errno_text("cannot create", temp);
  std::string problem;
  if (!write_all(fd, bytes)) problem = errno_text("cannot write", temp);
  if (problem.empty() && ::fsync(fd) != 0) problem = errno_text("cannot fsync", temp);
  if (::close(fd) != 0 && problem.empty()) problem = errno_text("cannot close", temp);
  if (problem.empty() && ::rename(temp.c_str(), path.c_str()) != 0)
    problem = errno_text("cannot rename onto", path);
  if (!problem.empty()) {
    ::unlink(temp.c_str());
    return problem;
  }
  sync_directory(path.parent_path());
  return "";
}

}  // namespace kiln::gpu
