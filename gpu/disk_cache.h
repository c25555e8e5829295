// The kernel cache's directory of entry files, one per key. Problems with the directory
// never fail a run: they are logged and the cache carries on without the disk.
#pragma once

#include <atomic>
#include <filesystem>
#include <string>
#include <vector>

#include "gpu/sha256.h"

namespace kiln::gpu {

// $KILN_CACHE_DIR if set, else $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln; empty when
// none of these is set (then there is no disk cache).
std::filesystem::path default_cache_dir();

class DiskCache {
 public:
  // Creates `dir` if missing; when that fails (or `dir` is empty) the cache is disabled.
  explicit DiskCache(std::filesystem::path dir);

  enum class Status { hit, missing, invalid };
  struct Lookup {
    Status status = Status::missing;
    std::vector<char> payload;  // when status == hit
    std::string problem;        // when status == invalid: what was wrong with the file
  };
  // Reads and validates the entry for `key`. An invalid entry (truncated, corrupt, another
  // key) is logged at warn level and reported as invalid, never returned as a hit.
  Lookup load(const Digest& key) const;
  // Writes the entry for `key` atomically. On failure: logs a warning, disables the disk
  // cache for the rest of this object's life and returns false.
  bool store(const Digest& key, const std::vector<char>& payload);

  bool enabled() const { return enabled_; }
  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path entry_path(const Digest& key) const;

 private:
  std::filesystem::path dir_;
  std::atomic<bool> enabled_{false};
};

}  // namespace kiln::gpu
