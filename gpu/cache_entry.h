// The kernel cache's entry file format: a fixed header (magic "KILNCUBN", format version,
// payload size, SHA-256 of the payload, the full key) then the payload; and atomic writes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "gpu/sha256.h"

namespace kiln::gpu {

// Layout, all integers little-endian:
//   [0, 8)   "KILNCUBN"           [8, 12)  format version (u32)   [12, 16) header size (u32)
//   [16, 24) payload size (u64)   [24, 56) SHA-256 of payload     [56, 88) key
//   [88, 88 + payload size)       payload
inline constexpr std::uint32_t kEntryFormatVersion = 1;
inline constexpr std::size_t kEntryHeaderBytes = 88;

// `bytes` (at most 8) little-endian bytes of `value` appended to `out`, and read back from `in`
// at `offset` (the caller checks the bounds).
void put_le(std::vector<char>& out, std::uint64_t value, int bytes);
std::uint64_t get_le(const std::vector<char>& in, std::size_t offset, int bytes);

std::vector<char> encode_entry(const Digest& key, const std::vector<char>& payload);

// The payload of `bytes` if it is a whole, intact entry for `key`; otherwise an empty
// payload and `problem` says what is wrong ("truncated: ...", "checksum mismatch", ...).
struct DecodedEntry {
  std::vector<char> payload;
  std::string problem;  // empty when the entry is valid
};
DecodedEntry decode_entry(const std::vector<char>& bytes, const Digest& key);

// Writes `bytes` to a unique temporary file beside `path`, fsyncs it and renames it over
// `path`, so that readers see the old file or the new one, never a part. Returns "" on
// success, else what failed (with errno's text); never throws for I/O problems.
std::string write_file_atomically(const std::filesystem::path& path,
                                  const std::vector<char>& bytes);

}  // namespace kiln::gpu
