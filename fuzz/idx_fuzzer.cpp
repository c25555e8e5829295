// libFuzzer harness for the IDX reader: the bytes go into a memfd that read_idx opens by its
// /proc/self/fd path (plain or gzip); it must return a tensor or throw kiln::Error.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "data/idx.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const int fd = memfd_create("idx_fuzz", MFD_CLOEXEC);
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (fd < 0 || ftruncate(fd, 0) != 0) std::abort();
  if (size > 0 && pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) std::abort();
  try {
    const kiln::Tensor t = kiln::read_idx(path);
    if (t.shape().rank() < 1 || t.shape().rank() > 8) std::abort();
  } catch (const kiln::Error& e) {
    if (std::string(e.what()).rfind(path + ": ", 0) != 0)
      std::abort();  // every message names the file
  }
  return 0;
}
