// The kernel cache's directory as a tool sees it (tools/kiln_cache.cpp): its entries with what
// compiled them (each entry's `.meta` side file, written with it), their removal, a bound on
// the directory's size that evicts the least recently used, and export/import of all entries
// as one archive file for another machine of the same architecture. Only kiln's own files
// (<64 hex digits>.kcubin and .meta) are touched.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "gpu/sha256.h"

namespace kiln::gpu {

struct CacheEntryInfo {
  std::string key;                           // 64 hex digits
  std::uintmax_t bytes = 0;                  // the entry file (CUBIN and header)
  std::filesystem::file_time_type last_use;  // the entry file's time: written or last hit
  // From the .meta side file (empty when an entry has none).
  std::string name, nvrtc, code;
  int sm = 0;
  std::vector<std::string> options;
};

// Every entry, the most recently used first.
std::vector<CacheEntryInfo> list_cache(const std::filesystem::path& dir);
// The side file's text for an entry (name, target, options, source), written when it is stored.
std::string cache_meta_text(const std::string& name, int sm, const std::string& nvrtc,
                            const std::vector<std::string>& options, const std::string& code);
std::filesystem::path meta_path(const std::filesystem::path& dir, const Digest& key);
// Removes every entry; the count removed.
std::size_t clear_cache(const std::filesystem::path& dir);
// Removes the least recently used entries until the entries take at most `max_bytes`; the count.
std::size_t trim_cache(const std::filesystem::path& dir, std::uintmax_t max_bytes);
// Writes every entry into one archive file (atomically); the count. kiln::Error on failure.
std::size_t export_cache(const std::filesystem::path& dir, const std::filesystem::path& archive);
// Checks a whole archive (its format, every entry's checksum against its key, every side file's
// JSON), then writes its entries into `dir`; the count. kiln::Error naming the archive and what is
// wrong, before anything is written.
std::size_t import_cache(const std::filesystem::path& dir, const std::filesystem::path& archive);

}  // namespace kiln::gpu
