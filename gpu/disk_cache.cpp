// Reading, validating and atomically writing the kernel cache's entry files.
#include "gpu/disk_cache.h"

#include <cstdlib>
#include <fstream>
#include <system_error>

#include "core/log.h"
#include "gpu/cache_entry.h"

namespace kiln::gpu {
namespace {

std::filesystem::path env_path(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::filesystem::path(value) : std::filesystem::path();
}

// Reads the whole file; false when it does not exist or cannot be read.
bool read_file(const std::filesystem::path& path, std::vector<char>& bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return !in.bad();
}

}  // namespace

std::filesystem::path default_cache_dir() {
  if (auto dir = env_path("KILN_CACHE_DIR"); !dir.empty()) return dir;
  if (auto dir = env_path("XDG_CACHE_HOME"); !dir.empty()) return dir / "kiln";
  if (auto dir = env_path("HOME"); !dir.empty()) return dir / ".cache" / "kiln";
  return {};
}

DiskCache::DiskCache(std::filesystem::path dir) : dir_(std::move(dir)) {
  if (dir_.empty()) {
    log().warn(
        "kernel cache: no cache directory (KILN_CACHE_DIR, XDG_CACHE_HOME and HOME are unset); "
        "compiled kernels are kept in memory only");
    return;
  }
  std::error_code error;
  std::filesystem::create_directories(dir_, error);
  if (error || !std::filesystem::is_directory(dir_, error)) {
    log().warn(
        "kernel cache: cannot create the directory {} ({}); compiled kernels are kept in memory "
        "only",
        dir_.string(), error ? error.message() : "not a directory");
    return;
  }
  enabled_ = true;
}

std::filesystem::path DiskCache::entry_path(const Digest& key) const {
  return dir_ / (to_hex(key) + ".kcubin");
}

DiskCache::Lookup DiskCache::load(const Digest& key) const {
  if (!enabled_) return {};
  const std::filesystem::path path = entry_path(key);
  std::vector<char> bytes;
  if (!read_file(path, bytes)) return {};
  DecodedEntry entry = decode_entry(bytes, key);
  if (!entry.problem.empty()) {
    log().warn(
        "kernel cache: ignoring invalid entry {} ({}); the kernel is recompiled and the entry "
        "rewritten",
        path.string(), entry.problem);
    return {Status::invalid, {}, entry.problem};
  }
  std::error_code touched;  // the time kiln-cache and the size bound order entries by
  std::filesystem::last_write_time(path, std::filesystem::file_time_type::clock::now(), touched);
  return {Status::hit, std::move(entry.payload), ""};
}

bool DiskCache::store(const Digest& key, const std::vector<char>& payload) {
  if (!enabled_) return false;
  const std::string problem = write_file_atomically(entry_path(key), encode_entry(key, payload));
  if (problem.empty()) return true;
  if (enabled_.exchange(false))
    log().warn("kernel cache: {}; the disk cache in {} is off for the rest of this run", problem,
               dir_.string());
  return false;
}

}  // namespace kiln::gpu
