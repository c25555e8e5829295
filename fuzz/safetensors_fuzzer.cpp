// libFuzzer harness for the safetensors reader: on any bytes, parse_safetensors returns a
// consistent result or throws kiln::Error; anything else (a crash, a sanitizer report, another
// exception) is a bug. Inputs of the odd sizes also go through load_safetensors, which must agree.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <string>

#include "core/safetensors.h"

namespace {

// What a parse produced: an error message or the file, reduced to comparable facts.
struct Outcome {
  std::optional<std::string> error;
  kiln::SafetensorsFile file;
};

Outcome parse(std::span<const std::uint8_t> bytes) {
  try {
    return {std::nullopt, kiln::parse_safetensors(bytes, "fuzz.safetensors")};
  } catch (const kiln::Error& e) {
    return {std::string(e.what()), {}};
  }
}

// A memfd holding the input, read back through its /proc path.
Outcome load(std::span<const std::uint8_t> bytes) {
  static const int fd = memfd_create("safetensors_fuzz", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, 0) != 0) std::abort();
  if (!bytes.empty() &&
      pwrite(fd, bytes.data(), bytes.size(), 0) != static_cast<ssize_t>(bytes.size()))
    std::abort();
  try {
    return {std::nullopt, kiln::load_safetensors("/proc/self/fd/" + std::to_string(fd))};
  } catch (const kiln::Error& e) {
    return {std::string(e.what()), {}};
  }
}

// Invariants of a successful parse: tensors tile the data section exactly.
void check(const Outcome& out, std::size_t size) {
  if (out.error) {
    if (out.error->rfind("fuzz.safetensors: ", 0) != 0)
      std::abort();  // every message names the file
    return;
  }
  std::uint64_t bytes = 0;
  for (const auto& [name, t] : out.file.tensors) bytes += t.nbytes();
  if (bytes + 8 > size) std::abort();
}

bool same(const Outcome& a, const Outcome& b) {
  if (a.error.has_value() != b.error.has_value()) return false;
  if (a.error) return true;  // the two name the file differently
  if (a.file.metadata != b.file.metadata || a.file.tensors.size() != b.file.tensors.size())
    return false;
  for (const auto& [name, t] : a.file.tensors) {
    const auto it = b.file.tensors.find(name);
    if (it == b.file.tensors.end() || it->second.shape() != t.shape() ||
        it->second.dtype() != t.dtype())
      return false;
    if (t.nbytes() > 0 && std::memcmp(t.raw(), it->second.raw(), t.nbytes()) != 0) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  const Outcome parsed = parse(bytes);
  check(parsed, size);
  // The file path costs syscalls: take every input that parsed, and one in eight of the rest.
  if (!parsed.error || size % 8 == 3) {
    const Outcome loaded = load(bytes);
    if (!same(parsed, loaded)) {
      std::fprintf(stderr, "parse and load disagree: %s vs %s\n",
                   parsed.error.value_or("ok").c_str(), loaded.error.value_or("ok").c_str());
      std::abort();
    }
  }
  return 0;
}
