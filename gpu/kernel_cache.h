// The kernel cache: memory first, then the disk, else NVRTC; the misses of one request are
// compiled in parallel. Keys cover the source, options, architecture and NVRTC version.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <vector>

#include "gpu/disk_cache.h"
#include "gpu/kernel_source.h"
#include "gpu/sha256.h"

namespace kiln::gpu {

// SHA-256 of everything that determines a kernel's CUBIN: name, code, options, sm, NVRTC
// version and kiln's compile scheme.
Digest kernel_cache_key(const KernelSource& src, const JitTarget& target);
// The bound on the disk cache's size: $KILN_CACHE_MAX_MIB MiB (default 1024); after the first
// request that compiles and then every 64 compiles, the least recently used entries go until
// the rest fit.
std::uintmax_t cache_bound_bytes();

class KernelCache {
 public:
  // Disk entries live in `disk_dir` (created if missing); the default reads the environment
  // now (see default_cache_dir). An unusable directory leaves a memory-only cache.
  explicit KernelCache(std::filesystem::path disk_dir = default_cache_dir());

  // One CompiledKernel per source, in order. Misses are compiled in parallel on
  // min(hardware threads, 8, misses) threads; a compile error throws kiln::Error (the first
  // failing kernel's, noting how many others failed). Thread-safe; two concurrent requests
  // that miss the same kernel may both compile it (the results are identical).
  std::vector<CompiledKernel> get_or_compile(const std::vector<KernelSource>& sources,
                                             const JitTarget& target);
  CompiledKernel get_or_compile(const KernelSource& source, const JitTarget& target);

  // Where the disk entry of `src` for `target` is (or would be) stored.
  std::filesystem::path entry_path(const KernelSource& src, const JitTarget& target) const;
  bool disk_enabled() const { return disk_.enabled(); }
  const std::filesystem::path& disk_dir() const { return disk_.dir(); }
  void clear_memory();

 private:
  struct Request {
    const KernelSource* source;
    Digest key;
    std::vector<std::size_t> slots;  // positions in the result that want this kernel
  };
  bool find_in_memory(const Digest& key, std::vector<char>& cubin) const;
  bool find_on_disk(const Request& request, std::vector<char>& cubin);
  std::vector<char> compile_and_store(const Request& request, const JitTarget& target);
  void compile_in_parallel(const std::vector<Request*>& misses, const JitTarget& target,
                           std::vector<CompiledKernel>& results);

  DiskCache disk_;
  std::atomic<std::size_t> compiled_{0};  // kernels this cache compiled (the size bound's clock)
  mutable std::mutex mutex_;              // guards memory_
  std::map<Digest, std::vector<char>> memory_;  // key -> cubin
};

// The process-wide cache, on default_cache_dir() as read at its first use.
KernelCache& global_kernel_cache();

}  // namespace kiln::gpu
