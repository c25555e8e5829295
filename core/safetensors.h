// The safetensors format: an 8-byte little-endian header length N, N bytes of JSON header,
// then the raw little-endian tensor data. Saving is atomic; loading validates everything.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace kiln {

// Header lengths above this are rejected (the limit of the reference implementation).
inline constexpr std::uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;
// Tensors of higher rank are rejected.
inline constexpr std::size_t kSafetensorsMaxRank = 8;

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;        // host tensors, each in its own storage
  std::map<std::string, std::string> metadata;  // the header's "__metadata__"
};

// Writes `tensors` (host tensors, unique non-empty names other than "__metadata__") and
// `metadata` to `path` atomically (see atomic_file.h). The header lists the tensors in
// data order: sorted by element size, largest first, otherwise in the order given, so that
// every tensor is aligned to its element size in the file (as the reference writer does);
// it is padded with spaces to a multiple of 8 bytes. Throws kiln::Error naming the path.
void save_safetensors(const std::filesystem::path& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads and validates a safetensors file of dtypes F32, F64, BF16, F16, I32, I64 and U8. Every
// problem (truncation, bad JSON, unknown keys or dtypes, bad shapes or offsets, overlapping
// tensors, bytes that belong to no tensor) throws kiln::Error "<path>: <what is wrong>".
SafetensorsFile load_safetensors(const std::filesystem::path& path);

// The same validation over bytes in memory; `name_for_errors` starts every message.
SafetensorsFile parse_safetensors(std::span<const std::uint8_t> bytes,
                                  const std::string& name_for_errors);

}  // namespace kiln
