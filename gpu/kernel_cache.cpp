// KernelCache: the lookup order (memory, disk, compile), the parallel compile of the misses,
// and the cache key.
#include "gpu/kernel_cache.h"

#include "gpu/cache_admin.h"
#include "gpu/cache_entry.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "gpu/nvrtc_compiler.h"

namespace kiln::gpu {
namespace {

// Bump when compile_to_cubin's fixed options or the meaning of a key field change.
constexpr std::string_view kCompileScheme = "kiln-jit-cubin-1";

const std::string& cached_nvrtc_version() {
  static const std::string version = nvrtc_version();
  return version;
}

// NVRTC serialises part of its work: on the H200 host (16 cores) its throughput stopped
// growing at 4 to 8 threads (about 60-70 small kernels/s), and more threads only made each
// compile slower.
constexpr std::size_t kMaxCompileThreads = 8;

// Runs body(i) for i in [0, count) on min(hardware threads, kMaxCompileThreads, count)
// threads, the caller's among them. body must not throw.
template <typename Body>
void parallel_for(std::size_t count, const Body& body) {
  const std::size_t hardware = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t workers = std::min({hardware, kMaxCompileThreads, count});
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < count;) body(i);
  };
  std::vector<std::jthread> threads;
  for (std::size_t w = 1; w < workers; ++w) {
    try {
      threads.emplace_back(work);
    } catch (const std::system_error& error) {  // out of threads: fewer workers do the same work
      log().warn("kernel cache: cannot start a compile thread ({}); using {}", error.what(),
                 threads.size() + 1);
      break;
    }
  }
  work();
}

// Rethrows the first failure; when several kernels failed, a kiln::Error says how many.
void rethrow_first(const std::vector<std::exception_ptr>& errors) {
  std::size_t failed = 0;
  std::exception_ptr first;
  for (const std::exception_ptr& error : errors) {
    if (!error) continue;
    if (!first) first = error;
    ++failed;
  }
  if (!first) return;
  if (failed == 1) std::rethrow_exception(first);
  try {
    std::rethrow_exception(first);
  } catch (const Error& error) {
    throw Error(fmt::format("{}\n({} other kernels of the same request failed to compile too)",
                            error.what(), failed - 1));
  }
}

}  // namespace

std::uintmax_t cache_bound_bytes() {
  const char* text = std::getenv("KILN_CACHE_MAX_MIB");
  std::uintmax_t mib = 1024;
  if (text != nullptr && *text != '\0') {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(text, &end, 10);
    if (end != nullptr && *end == '\0')
      mib = std::min<unsigned long long>(v, 1ULL << 40);  // past a petabyte: no bound
    else
      log().warn("kernel cache: KILN_CACHE_MAX_MIB='{}' is not a number; the bound stays 1024 MiB",
                 text);
  }
  return mib << 20;
}

Digest kernel_cache_key(const KernelSource& src, const JitTarget& target) {
  Sha256 hash;
  hash.update_field(kCompileScheme).update_field(cached_nvrtc_version());
  hash.update_field(fmt::format("sm_{}", target.sm)).update_field(src.name).update_field(src.code);
  hash.update_field(std::to_string(src.options.size()));
  for (const std::string& option : src.options) hash.update_field(option);
  if (src.arch_specific) hash.update_field("arch-specific");  // older keys unchanged without it
  return hash.finish();
}

KernelCache::KernelCache(std::filesystem::path disk_dir) : disk_(std::move(disk_dir)) {}

std::filesystem::path KernelCache::entry_path(const KernelSource& src,
                                              const JitTarget& target) const {
  return disk_.entry_path(kernel_cache_key(src, target));
}

void KernelCache::clear_memory() {
  std::lock_guard lock(mutex_);
  memory_.clear();
}

bool KernelCache::find_in_memory(const Digest& key, std::vector<char>& cubin) const {
  std::lock_guard lock(mutex_);
  auto it = memory_.find(key);
  if (it == memory_.end()) return false;
  cubin = it->second;
  return true;
}

bool KernelCache::find_on_disk(const Request& request, std::vector<char>& cubin) {
  DiskCache::Lookup lookup = disk_.load(request.key);
  if (lookup.status != DiskCache::Status::hit) return false;
  cubin = std::move(lookup.payload);
  std::lock_guard lock(mutex_);
  memory_.emplace(request.key, cubin);
  return true;
}

std::vector<char> KernelCache::compile_and_store(const Request& request, const JitTarget& target) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<char> cubin = compile_to_cubin(*request.source, target);
  const std::chrono::duration<double, std::milli> elapsed =
      std::chrono::steady_clock::now() - start;
  log().debug("kernel cache: miss, compiled {} in {:.1f} ms", request.source->name,
              elapsed.count());
  if (disk_.store(request.key, cubin)) {  // the side file kiln-cache lists and shows
    const std::string meta =
        cache_meta_text(request.source->name, target.sm, cached_nvrtc_version(),
                        request.source->options, request.source->code);
    write_file_atomically(meta_path(disk_.dir(), request.key),
                          std::vector<char>(meta.begin(), meta.end()));
  }
  std::lock_guard lock(mutex_);
  memory_.emplace(request.key, cubin);
  return cubin;
}

void KernelCache::compile_in_parallel(const std::vector<Request*>& misses, const JitTarget& target,
                                      std::vector<CompiledKernel>& results) {
  std::vector<std::vector<char>> cubins(misses.size());
  std::vector<std::exception_ptr> errors(misses.size());
  parallel_for(misses.size(), [&](std::size_t i) {
    try {
      cubins[i] = compile_and_store(*misses[i], target);
    } catch (...) {
      errors[i] = std::current_exception();
    }
  });
  rethrow_first(errors);
  for (std::size_t i = 0; i < misses.size(); ++i)
    for (std::size_t slot : misses[i]->slots) results[slot].cubin = cubins[i];
}

std::vector<CompiledKernel> KernelCache::get_or_compile(const std::vector<KernelSource>& sources,
                                                        const JitTarget& target) {
  std::vector<CompiledKernel> results(sources.size());
  std::map<Digest, Request> requests;  // one per distinct key: a repeated source is compiled once
  for (std::size_t i = 0; i < sources.size(); ++i) {
    results[i].name = sources[i].name;
    results[i].after_prior_grids = sources[i].after_prior_grids;
    const Digest key = kernel_cache_key(sources[i], target);
    auto [it, added] = requests.try_emplace(key, Request{&sources[i], key, {}});
    it->second.slots.push_back(i);
  }
  std::vector<Request*> misses;
  for (auto& [key, request] : requests) {
    std::vector<char> cubin;
    const bool in_memory = find_in_memory(key, cubin);
    const bool on_disk = !in_memory && find_on_disk(request, cubin);
    if (!in_memory && !on_disk) {
      misses.push_back(&request);
      continue;
    }
    log().debug("kernel cache: hit ({}) {}", in_memory ? "memory" : "disk", request.source->name);
    for (std::size_t slot : request.slots) {
      results[slot].cubin = cubin;
      results[slot].from_memory = in_memory;
      results[slot].from_disk = on_disk;
    }
  }
  // Source order, so that the error reported first is the first failing kernel of `sources`.
  std::sort(misses.begin(), misses.end(),
            [](const Request* a, const Request* b) { return a->slots[0] < b->slots[0]; });
  if (!misses.empty()) {
    compile_in_parallel(misses, target, results);
    // The bound, least recently used first: at the first compile and then every 64 compiles
    // (a listing per kernel would cost a cold start more than it saves).
    const std::size_t before = compiled_.fetch_add(misses.size());
    if (disk_.enabled() && (before == 0 || before / 64 != (before + misses.size()) / 64))
      trim_cache(disk_.dir(), cache_bound_bytes());
  }
  return results;
}

CompiledKernel KernelCache::get_or_compile(const KernelSource& source, const JitTarget& target) {
  return std::move(get_or_compile(std::vector<KernelSource>{source}, target).front());
}

KernelCache& global_kernel_cache() {
  static KernelCache cache;
  return cache;
}

}  // namespace kiln::gpu
