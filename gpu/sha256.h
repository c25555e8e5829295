// SHA-256 (FIPS 180-4), used for the kernel cache's keys and its entries' checksums.
// Written here to keep kiln_gpu free of crypto dependencies; speed is not a goal.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::gpu {

using Digest = std::array<std::uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  Sha256& update(const void* data, std::size_t bytes);
  Sha256& update(std::string_view text) { return update(text.data(), text.size()); }
  // Appends `text` prefixed by its length, so that a sequence of fields hashes unambiguously.
  Sha256& update_field(std::string_view text);
  Digest finish();  // the object must not be updated afterwards

 private:
  void compress(const std::uint8_t* block);

  std::array<std::uint32_t, 8> state_;
  std::array<std::uint8_t, 64> buffer_{};
  std::size_t buffered_ = 0;
  std::uint64_t total_bytes_ = 0;
};

Digest sha256(const void* data, std::size_t bytes);
std::string to_hex(const Digest& digest);

}  // namespace kiln::gpu
