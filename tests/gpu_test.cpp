// Tests of kiln_gpu: SHA-256, NVRTC compilation, the kernel cache in memory and on disk
// (damaged entries, two processes, unusable directories) and, where a GPU exists, launching.
#include <doctest/doctest.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "gpu/cache_admin.h"
#include "gpu/cache_entry.h"
#include "gpu/cuda_runtime.h"
#include "gpu/disk_cache.h"
#include "gpu/kernel_cache.h"
#include "gpu/nvrtc_compiler.h"
#include "gpu/sha256.h"
#include "tests/temp_dir.h"
#ifdef KILN_HAVE_CUDA
#include "gpu/cuda_check.h"
#endif

namespace fs = std::filesystem;
using namespace kiln::gpu;

namespace {

using kiln::test::TempDir;

// Sets (or, with nullptr, unsets) an environment variable for a scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    had_ = std::getenv(name) != nullptr;
    value ? ::setenv(name, value, 1) : ::unsetenv(name);
  }
  ~ScopedEnv() { had_ ? ::setenv(name_.c_str(), old_.c_str(), 1) : ::unsetenv(name_.c_str()); }

 private:
  std::string name_, old_;
  bool had_ = false;
};

// Records kiln's log at debug level for a scope; the other sinks keep showing warn and up.
class LogCapture {
 public:
  LogCapture()
      : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(4096)),
        old_level_(kiln::log().level()) {
    for (auto& sink : kiln::log().sinks()) {
      old_sink_levels_.push_back(sink->level());
      sink->set_level(std::max(sink->level(), old_level_));
    }
    kiln::log().sinks().push_back(sink_);
    kiln::log().set_level(spdlog::level::debug);
  }
  ~LogCapture() {
    kiln::log().sinks().pop_back();
    for (std::size_t i = 0; i < old_sink_levels_.size(); ++i)
      kiln::log().sinks()[i]->set_level(old_sink_levels_[i]);
    kiln::log().set_level(old_level_);
  }
  bool has(const std::string& level, const std::string& text) const {
    for (const std::string& line : sink_->last_formatted())
      if (line.find("[" + level + "]") != std::string::npos && line.find(text) != std::string::npos)
        return true;
    return false;
  }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
  spdlog::level::level_enum old_level_;
  std::vector<spdlog::level::level_enum> old_sink_levels_;
};

std::vector<char> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& path, const std::vector<char>& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

[[maybe_unused]] bool contains(const std::vector<char>& bytes, const std::string& text) {
  return std::search(bytes.begin(), bytes.end(), text.begin(), text.end()) != bytes.end();
}

// A 64-bit little-endian ELF image for NVIDIA GPUs (e_machine EM_CUDA = 190).
[[maybe_unused]] bool is_cubin(const std::vector<char>& b) {
  return b.size() > 64 && b[0] == 0x7f && b[1] == 'E' && b[2] == 'L' && b[3] == 'F' && b[4] == 2 &&
         b[5] == 1 && static_cast<unsigned char>(b[18]) == 190 && b[19] == 0;
}

// out = tanh(in) * 0.5 over n elements, in a grid-stride loop.
KernelSource tanh_kernel(const std::string& name = "kiln_tanh_half",
                         std::vector<std::string> options = {}) {
  return {name,
          "extern \"C\" __global__ void " + name +
              "(const float* a, float* b, long long n) {\n"
              "  for (long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long "
              "long)blockDim.x * gridDim.x)\n"
              "    b[i] = tanhf(a[i]) * 0.5f;\n"
              "}\n",
          std::move(options)};
}

[[maybe_unused]] double elapsed_ms(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

TEST_CASE("sha256 matches the FIPS 180-2 test vectors whole or in pieces") {
  auto hex = [](const std::string& s) { return to_hex(sha256(s.data(), s.size())); };
  CHECK(hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const std::string million(1000000, 'a');
  CHECK(hex(million) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  Sha256 pieces;
  for (std::size_t at = 0; at < million.size(); at += 777) pieces.update(million.substr(at, 777));
  CHECK(to_hex(pieces.finish()) == hex(million));
  // Length-prefixed fields: ("ab", "c") and ("a", "bc") must not collide.
  CHECK(Sha256().update_field("ab").update_field("c").finish() !=
        Sha256().update_field("a").update_field("bc").finish());
}

TEST_CASE("a disk cache entry round-trips and every kind of damage is detected") {
  TempDir dir;
  DiskCache disk(dir.path());
  REQUIRE(disk.enabled());
  const Digest key = sha256("key", 3), other_key = sha256("other", 5);
  const std::vector<char> payload(10000, 'p');
  CHECK(disk.load(key).status == DiskCache::Status::missing);
  REQUIRE(disk.store(key, payload));
  const fs::path path = disk.entry_path(key);
  CHECK(fs::file_size(path) == kEntryHeaderBytes + payload.size());
  CHECK(disk.load(key).status == DiskCache::Status::hit);
  CHECK(disk.load(key).payload == payload);
  const std::vector<char> good = read_bytes(path);
  CHECK(std::string(good.data(), 8) == "KILNCUBN");

  auto damaged = [&](auto damage) {
    std::vector<char> bytes = good;
    damage(bytes);
    write_bytes(path, bytes);
    return disk.load(key);
  };
  CHECK(damaged([](auto& b) { b.resize(b.size() / 2); }).problem.find("truncated") == 0);
  CHECK(damaged([](auto& b) { b.resize(10); }).problem.find("truncated") == 0);
  CHECK(damaged([](auto& b) { b.clear(); }).status == DiskCache::Status::invalid);
  CHECK(damaged([](auto& b) { b.push_back('x'); }).status == DiskCache::Status::invalid);
  CHECK(damaged([](auto& b) { b[0] = 'X'; }).problem.find("bad magic") == 0);
  CHECK(damaged([](auto& b) { b[8] = 2; }).problem.find("format version 2") == 0);
  CHECK(damaged([](auto& b) { b[kEntryHeaderBytes + 5000] ^= 1; }).problem ==
        "payload checksum mismatch");
  CHECK(damaged([](auto& b) { b[30] ^= 1; }).problem == "payload checksum mismatch");
  write_bytes(path, encode_entry(other_key, payload));
  CHECK(disk.load(key).problem.find("key mismatch") == 0);
  CHECK(disk.load(key).payload.empty());
}

TEST_CASE("the cache directory is KILN_CACHE_DIR or XDG_CACHE_HOME/kiln or HOME/.cache/kiln") {
  TempDir dir;
  {
    ScopedEnv a("KILN_CACHE_DIR", (dir.path() / "from-env").c_str()), b("XDG_CACHE_HOME", "/xdg");
    CHECK(default_cache_dir() == dir.path() / "from-env");
    KernelCache cache;  // reads the environment at construction and creates the directory
    CHECK(cache.disk_dir() == dir.path() / "from-env");
    CHECK(cache.disk_enabled());
    CHECK(fs::is_directory(dir.path() / "from-env"));
  }
  {
    ScopedEnv a("KILN_CACHE_DIR", nullptr), b("XDG_CACHE_HOME", "/xdg"), c("HOME", "/home/u");
    CHECK(default_cache_dir() == fs::path("/xdg/kiln"));
  }
  {
    ScopedEnv a("KILN_CACHE_DIR", ""), b("XDG_CACHE_HOME", nullptr), c("HOME", "/home/u");
    CHECK(default_cache_dir() == fs::path("/home/u/.cache/kiln"));
  }
}

#ifdef KILN_HAVE_CUDA

TEST_CASE("NVRTC compiles an elementwise kernel to an sm_90 CUBIN") {
  CHECK(std::regex_match(nvrtc_version(), std::regex(R"(\d+\.\d+)")));
  compile_to_cubin(tanh_kernel("kiln_warm_up"), JitTarget{90});  // loads NVRTC's builtins once
  const auto start = std::chrono::steady_clock::now();
  const std::vector<char> cubin = compile_to_cubin(tanh_kernel(), JitTarget{90});
  MESSAGE("one NVRTC compile of the tanh kernel: " << elapsed_ms(start) << " ms, " << cubin.size()
                                                   << " bytes");
  CHECK(is_cubin(cubin));
  CHECK(contains(cubin, "kiln_tanh_half"));
  CHECK(compile_to_cubin(tanh_kernel(), JitTarget{90}) ==
        cubin);  // deterministic: caching is sound
  const std::vector<char> sm80 = compile_to_cubin(tanh_kernel(), JitTarget{80});
  CHECK(is_cubin(sm80));
  CHECK(sm80 != cubin);
}

TEST_CASE(
    "a compile error is a kiln::Error with the kernel name and NVRTC log and the numbered source") {
  const KernelSource broken{"kiln_broken",
                            "extern \"C\" __global__ void kiln_broken(float* p) {\n"
                            "  float x = p[0];\n"
                            "  p[1] = x +* ;\n"
                            "}\n",
                            {}};
  std::string message;
  try {
    compile_to_cubin(broken, JitTarget{90});
  } catch (const kiln::Error& error) {
    message = error.what();
  }
  INFO(message);
  CHECK(message.find("kiln_broken") != std::string::npos);
  CHECK(message.find("NVRTC_ERROR_COMPILATION") != std::string::npos);
  CHECK(message.find("kiln_broken.cu(3): error") !=
        std::string::npos);  // the log, pointing at line 3
  CHECK(message.find("    3 |   p[1] = x +* ;") != std::string::npos);  // the numbered source
  CHECK(message.find("--gpu-architecture=sm_90") != std::string::npos);
}

TEST_CASE("bad options are kiln::Errors that name them") {
  CHECK_THROWS_WITH_AS(compile_to_cubin(tanh_kernel("k", {"--no-such-option"}), JitTarget{90}),
                       doctest::Contains("--no-such-option"), kiln::Error);
  CHECK_THROWS_WITH_AS(
      compile_to_cubin(tanh_kernel("k", {"--gpu-architecture=sm_80"}), JitTarget{90}),
      doctest::Contains("not allowed"), kiln::Error);
  CHECK_THROWS_WITH_AS(compile_to_cubin(tanh_kernel("k"), JitTarget{7}), doctest::Contains("sm_7"),
                       kiln::Error);
  // A -std in the options replaces the default -std=c++17 instead of clashing with it.
  CHECK(is_cubin(compile_to_cubin(tanh_kernel("k", {"-std=c++20"}), JitTarget{90})));
}

TEST_CASE("the kernel cache looks in memory then on disk and never trusts a damaged entry") {
  TempDir dir;
  ScopedEnv env("KILN_CACHE_DIR", dir.path().c_str());
  const KernelSource src = tanh_kernel("kiln_cached");
  const JitTarget sm90{90};
  LogCapture log;

  KernelCache first;
  const CompiledKernel compiled = first.get_or_compile(src, sm90);
  CHECK_FALSE(compiled.from_disk);
  CHECK_FALSE(compiled.from_memory);
  REQUIRE(is_cubin(compiled.cubin));
  CHECK(log.has("debug", "kernel cache: miss, compiled kiln_cached in"));
  const fs::path path = first.entry_path(src, sm90);
  CHECK(path.parent_path() == dir.path());
  CHECK(fs::file_size(path) == kEntryHeaderBytes + compiled.cubin.size());
  CHECK(first.get_or_compile(src, sm90).from_memory);
  CHECK(log.has("debug", "kernel cache: hit (memory) kiln_cached"));

  auto fresh_lookup = [&] { return KernelCache().get_or_compile(src, sm90); };
  const CompiledKernel loaded = fresh_lookup();
  CHECK(loaded.from_disk);
  CHECK_FALSE(loaded.from_memory);
  CHECK(loaded.cubin == compiled.cubin);
  CHECK(log.has("debug", "kernel cache: hit (disk) kiln_cached"));

  auto recompiled_after = [&](const std::string& problem, auto damage) {
    std::vector<char> bytes = read_bytes(path);
    damage(bytes);
    write_bytes(path, bytes);
    const CompiledKernel again = fresh_lookup();
    CHECK_MESSAGE(!again.from_disk, problem);
    CHECK_MESSAGE(again.cubin == compiled.cubin, problem);
    CHECK_MESSAGE(log.has("warning", problem), problem);
    CHECK_MESSAGE(fs::file_size(path) == kEntryHeaderBytes + compiled.cubin.size(),
                  problem);  // rewritten whole
    CHECK_MESSAGE(fresh_lookup().from_disk, problem);
  };
  SUBCASE("truncated to half") {
    fs::resize_file(path, fs::file_size(path) / 2);
    recompiled_after("truncated", [](auto&) {});
  }
  SUBCASE("empty") {
    recompiled_after("truncated", [](auto& b) { b.clear(); });
  }
  SUBCASE("flipped payload bytes") {
    recompiled_after("payload checksum mismatch", [](auto& b) { b[b.size() - 100] ^= 0x5a; });
  }
  SUBCASE("bad magic") {
    recompiled_after("bad magic", [](auto& b) { b[3] = 'x'; });
  }
  SUBCASE("another kernel's entry under this key") {
    KernelCache other_cache;
    const KernelSource other = tanh_kernel("kiln_cached_other");
    REQUIRE(other_cache.get_or_compile(other, sm90).cubin != compiled.cubin);
    recompiled_after("key mismatch",
                     [&](auto& b) { b = read_bytes(other_cache.entry_path(other, sm90)); });
  }
  SUBCASE("keys differ by options, code, name and architecture, and the entries do not mix") {
    KernelSource fast = src, edited = src, renamed = src;
    fast.options = {"--use_fast_math"};
    edited.code += " ";
    renamed.name = "kiln_cached_renamed";
    for (const fs::path& p :
         {first.entry_path(fast, sm90), first.entry_path(edited, sm90),
          first.entry_path(renamed, sm90), first.entry_path(src, JitTarget{80})})
      CHECK(p != path);
    CHECK_FALSE(KernelCache().get_or_compile(fast, sm90).from_disk);
    // (--use_fast_math need not change this kernel's CUBIN: on the H200 host it did not.)
    const CompiledKernel sm80 = KernelCache().get_or_compile(src, JitTarget{80});
    CHECK_FALSE(sm80.from_disk);
    CHECK(sm80.cubin != compiled.cubin);
    CHECK(KernelCache().get_or_compile(src, sm90).cubin == compiled.cubin);
  }
}

TEST_CASE("the misses of one request are compiled in parallel and each keeps its name") {
  TempDir dir;
  const char* exprs[] = {"tanhf(x)",          "x * x",
                         "expf(-x)",          "fmaxf(x, 0.f)",
                         "sinf(x) + cosf(x)", "1.f / (1.f + expf(-x))"};
  std::vector<KernelSource> sources;
  for (int i = 0; i < 6; ++i) {
    const std::string name = "kiln_par_" + std::to_string(i);
    sources.push_back({name,
                       "extern \"C\" __global__ void " + name +
                           "(const float* a, float* b, int n) {\n" +
                           "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i < n) { float "
                           "x = a[i]; b[i] = " +
                           exprs[i] + "; }\n}\n",
                       {}});
  }
  sources.push_back(sources[2]);  // a repeat is compiled once and returned twice

  KernelCache cache(dir.path());
  auto start = std::chrono::steady_clock::now();
  const std::vector<CompiledKernel> kernels = cache.get_or_compile(sources, JitTarget{90});
  const double parallel_ms = elapsed_ms(start);
  start = std::chrono::steady_clock::now();
  REQUIRE(kernels.size() == sources.size());
  for (std::size_t i = 0; i < sources.size(); ++i) {
    CAPTURE(i);
    CHECK(kernels[i].name == sources[i].name);
    CHECK(is_cubin(kernels[i].cubin));
    CHECK(contains(kernels[i].cubin, sources[i].name));
    CHECK_FALSE(kernels[i].from_disk);
    CHECK(kernels[i].cubin == compile_to_cubin(sources[i], JitTarget{90}));
  }
  MESSAGE("6 kernels: " << parallel_ms << " ms in parallel, " << elapsed_ms(start)
                        << " ms one by one (7, checking)");
  CHECK(kernels[6].cubin == kernels[2].cubin);
  int entries = 0, side_files = 0;  // each entry and its side file (name and source)
  for (const auto& file : fs::directory_iterator(dir.path())) {
    entries += file.path().extension() == ".kcubin";
    side_files += file.path().extension() == ".meta";
  }
  CHECK(entries == 6);
  CHECK(side_files == 6);
  for (const CompiledKernel& kernel : cache.get_or_compile(sources, JitTarget{90}))
    CHECK(kernel.from_memory);

  SUBCASE("one broken kernel fails the request with its name; the others are still cached") {
    std::vector<KernelSource> mixed = {tanh_kernel("kiln_good_a"),
                                       {"kiln_bad", "this is not CUDA", {}},
                                       tanh_kernel("kiln_good_b")};
    CHECK_THROWS_WITH_AS(cache.get_or_compile(mixed, JitTarget{90}), doctest::Contains("kiln_bad"),
                         kiln::Error);
    CHECK(cache.get_or_compile(mixed[0], JitTarget{90}).from_memory);
    CHECK(cache.get_or_compile(mixed[2], JitTarget{90}).from_memory);
  }
}

// Child of the two-process test: compiles and caches 5 kernels, then stores and reads one
// entry 100 times; any failure is an exit code, never an exception.
static int race_child(const fs::path& dir, int start_fd, char fill) {
  char byte;
  while (::read(start_fd, &byte, 1) > 0) {  // EOF: the parent released both children
  }
  try {
    for (int round = 0; round < 5; ++round) {
      KernelSource src = tanh_kernel("kiln_race");
      src.code += "// round " + std::to_string(round) + "\n";
      if (!is_cubin(KernelCache(dir).get_or_compile(src, JitTarget{90}).cubin)) return 1;
    }
    DiskCache disk(dir);
    const Digest key = sha256("race", 4);
    for (int i = 0; i < 100; ++i) {
      if (!disk.store(key, std::vector<char>(1 << 18, fill))) return 2;
      const DiskCache::Lookup lookup = disk.load(key);
      if (lookup.status != DiskCache::Status::hit || lookup.payload.size() != (1 << 18)) return 3;
      if (std::count(lookup.payload.begin(), lookup.payload.end(), lookup.payload[0]) != (1 << 18))
        return 4;
    }
    return 0;
  } catch (...) {
    return 5;
  }
}

TEST_CASE("two processes caching the same kernels at once leave only whole entries") {
  TempDir dir;
  int start[2];
  REQUIRE(::pipe(start) == 0);
  pid_t children[2];
  for (int c = 0; c < 2; ++c) {
    children[c] = ::fork();
    REQUIRE(children[c] >= 0);
    if (children[c] == 0) {
      ::close(start[1]);
      ::_exit(race_child(dir.path(), start[0], static_cast<char>('A' + c)));
    }
  }
  ::close(start[0]);
  ::close(start[1]);  // both children start now
  for (pid_t child : children) {
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  int entries = 0, side_files = 0;
  for (const auto& file : fs::directory_iterator(dir.path())) {
    const fs::path extension = file.path().extension();
    CHECK((extension == ".kcubin" || extension == ".meta"));  // no temporary file left behind
    entries += extension == ".kcubin";
    side_files += extension == ".meta";
  }
  CHECK(entries == 6);
  CHECK(side_files == 5);  // the kernels' (the entry stored through DiskCache alone has none)
  for (int round = 0; round < 5; ++round) {
    KernelSource src = tanh_kernel("kiln_race");
    src.code += "// round " + std::to_string(round) + "\n";
    const CompiledKernel kernel = KernelCache(dir.path()).get_or_compile(src, JitTarget{90});
    CHECK(kernel.from_disk);
    CHECK(is_cubin(kernel.cubin));
  }
}

TEST_CASE("an unusable cache directory leaves a working memory-only cache") {
  TempDir dir;
  write_bytes(dir.path() / "file", {'x'});
  LogCapture log;
  SUBCASE("a directory under a regular file cannot be created") {
    KernelCache cache(dir.path() / "file" / "cache");
    CHECK_FALSE(cache.disk_enabled());
    CHECK(log.has("warning", "cannot create the directory"));
    CHECK(is_cubin(cache.get_or_compile(tanh_kernel(), JitTarget{90}).cubin));
    CHECK(cache.get_or_compile(tanh_kernel(), JitTarget{90}).from_memory);
  }
  SUBCASE("the directory is replaced by a file after the cache opened it") {
    KernelCache cache(dir.path() / "gone");
    CHECK(cache.disk_enabled());
    fs::remove(dir.path() / "gone");
    write_bytes(dir.path() / "gone", {'x'});
    CHECK(is_cubin(cache.get_or_compile(tanh_kernel(), JitTarget{90}).cubin));
    CHECK(log.has("warning", "is off for the rest of this run"));
    CHECK_FALSE(cache.disk_enabled());
    CHECK(cache.get_or_compile(tanh_kernel(), JitTarget{90}).from_memory);
  }
}

// kiln-cache's operations (gpu/cache_admin.h) on a directory the cache filled.
TEST_CASE("the cache directory as a tool: list, last use, export, clear, import, trim, bound") {
  TempDir dir, elsewhere;
  const JitTarget sm90{90};
  const std::vector<KernelSource> sources = {
      tanh_kernel("kiln_admin_0"), tanh_kernel("kiln_admin_1"), tanh_kernel("kiln_admin_2")};
  const std::vector<CompiledKernel> compiled =
      KernelCache(dir.path()).get_or_compile(sources, sm90);
  std::vector<CacheEntryInfo> entries = list_cache(dir.path());
  REQUIRE(entries.size() == 3);
  for (const CacheEntryInfo& e : entries) {
    CHECK(e.sm == 90);
    CHECK(e.bytes > kEntryHeaderBytes);
    CHECK(e.code.find("void " + e.name + "(") != std::string::npos);  // the source it came from
    // Older than now: the next hit makes its entry the most recently used.
    fs::last_write_time(dir.path() / (e.key + ".kcubin"),
                        fs::file_time_type::clock::now() - std::chrono::hours(1));
  }
  REQUIRE(KernelCache(dir.path()).get_or_compile(sources[1], sm90).from_disk);
  CHECK(list_cache(dir.path()).front().name == "kiln_admin_1");

  const fs::path archive = elsewhere.path() / "warm.kcache";
  CHECK(export_cache(dir.path(), archive) == 3);
  CHECK(clear_cache(dir.path()) == 3);
  CHECK(list_cache(dir.path()).empty());
  CHECK(import_cache(dir.path(), archive) == 3);
  const CompiledKernel again = KernelCache(dir.path()).get_or_compile(sources[2], sm90);
  CHECK(again.from_disk);
  CHECK(again.cubin == compiled[2].cubin);

  // The size bound keeps the most recently used: kiln_admin_2, just read from the disk.
  const std::uintmax_t one = list_cache(dir.path()).front().bytes;
  CHECK(trim_cache(dir.path(), one) == 2);
  entries = list_cache(dir.path());
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].name == "kiln_admin_2");
  CHECK(fs::exists(dir.path() / (entries[0].key + ".meta")));  // its side file stays, the others go
  int side_files = 0;
  for (const auto& f : fs::directory_iterator(dir.path()))
    side_files += f.path().extension() == ".meta";
  CHECK(side_files == 1);
  {
    const ScopedEnv bound("KILN_CACHE_MAX_MIB", "0");  // every request that compiles trims
    KernelCache(elsewhere.path() / "bounded").get_or_compile(tanh_kernel("kiln_admin_3"), sm90);
    CHECK(list_cache(elsewhere.path() / "bounded").empty());
  }

  // An archive is checked whole before anything is written.
  const std::vector<char> good = read_bytes(archive);
  auto refused = [&](const std::vector<char>& bytes, const std::string& problem) {
    const fs::path bad = elsewhere.path() / "bad.kcache";
    write_bytes(bad, bytes);
    const TempDir target;
    CHECK_THROWS_WITH_AS(import_cache(target.path(), bad), doctest::Contains(problem.c_str()),
                         kiln::Error);
    CHECK(list_cache(target.path()).empty());
  };
  refused(std::vector<char>(good.begin(), good.begin() + 200), "truncated");
  std::vector<char> flipped = good;
  flipped[300] ^= 0x5a;  // inside the first file's CUBIN (its header ends at byte 94 + 88)
  refused(flipped, "checksum mismatch");
  refused({'n', 'o', 'p', 'e'}, "not a kiln cache archive");
  std::vector<char> escape(good.begin(), good.begin() + 11);  // the magic, then "../x.kcubin"
  const std::string name = "../" + std::string(64, 'a') + ".kcubin";
  for (int i = 0; i < 4; ++i) escape.push_back(static_cast<char>((name.size() >> (8 * i)) & 0xff));
  escape.insert(escape.end(), name.begin(), name.end());
  for (int i = 0; i < 8; ++i) escape.push_back(0);
  refused(escape, "is no kernel cache file");
}

#else  // !KILN_HAVE_CUDA

TEST_CASE("without the CUDA toolkit, compiling throws kiln::Error") {
  CHECK_THROWS_WITH_AS(compile_to_cubin(tanh_kernel(), JitTarget{90}),
                       doctest::Contains("without the CUDA toolkit"), kiln::Error);
  CHECK_THROWS_AS(KernelCache(fs::path()).get_or_compile(tanh_kernel(), JitTarget{90}),
                  kiln::Error);
}

#endif  // KILN_HAVE_CUDA

TEST_CASE("cuda_device_count never throws and without a GPU the reason is given") {
  const int count = cuda_device_count();
  CHECK(count >= 0);
  if (count == 0) {
    MESSAGE("no GPU here: " << cuda_unavailable_reason());
    CHECK(cuda_unavailable_reason().find("CUDA") != std::string::npos);
    CHECK_THROWS_AS(current_target(), kiln::Error);
    CHECK_THROWS_AS(LoadedKernel(std::vector<char>{}, "k"), kiln::Error);
  } else {
    CHECK(cuda_unavailable_reason().empty());
    CHECK(current_target().sm >= 50);
  }
}

#ifdef KILN_HAVE_CUDA

namespace {

// cudaMalloc'd bytes, freed at scope exit.
struct DeviceBuffer {
  explicit DeviceBuffer(std::size_t bytes) { KILN_CUDA_CHECK(cudaMalloc(&ptr, bytes)); }
  ~DeviceBuffer() { (void)cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* ptr = nullptr;
};

}  // namespace

TEST_CASE("gpu: the elementwise kernel matches std::tanh(x) * 0.5 on 1<<20 random floats") {
  if (cuda_device_count() == 0) {
    MESSAGE("skipped: " << cuda_unavailable_reason());
    return;
  }
  TempDir dir;
  const JitTarget target = current_target();
  LoadedKernel kernel(
      KernelCache(dir.path()).get_or_compile(tanh_kernel(), target));  // the CUBIN is a temporary
  LoadedKernel moved = std::move(kernel);

  const long long n = 1 << 20;
  std::vector<float> x(n), y(n);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-4.f, 4.f);
  for (float& v : x) v = uniform(rng);
  DeviceBuffer a(n * sizeof(float)), b(n * sizeof(float));
  KILN_CUDA_CHECK(cudaMemcpy(a.ptr, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  void* args[] = {&a.ptr, &b.ptr, const_cast<long long*>(&n)};
  moved.launch(Dim3{512}, Dim3{256}, 0, nullptr,
               args);  // 131072 threads: the grid-stride loop runs 8 times
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  KILN_CUDA_CHECK(cudaMemcpy(y.data(), b.ptr, n * sizeof(float), cudaMemcpyDeviceToHost));
  double worst = 0;
  for (long long i = 0; i < n; ++i) {
    const double want = std::tanh(static_cast<double>(x[i])) * 0.5;
    worst = std::max(worst, std::abs(y[i] - want) / std::max(std::abs(want), 1e-30));
  }
  MESSAGE("worst relative error " << worst);
  CHECK(worst <= 1e-6);

  const KernelAttributes attributes = moved.attributes();
  CHECK(attributes.registers_per_thread > 0);
  CHECK(attributes.max_threads_per_block >= 256);
  CHECK(attributes.binary_version == target.sm);
  CHECK(moved.max_active_blocks_per_sm(256, 0) > 0);
  CHECK_THROWS_WITH_AS(moved.launch(Dim3{1}, Dim3{4096}, 0, nullptr, args),
                       doctest::Contains("kiln_tanh_half"), kiln::Error);
  CHECK_THROWS_WITH_AS(LoadedKernel(compile_to_cubin(tanh_kernel(), target), "no_such_kernel"),
                       doctest::Contains("no_such_kernel"), kiln::Error);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());  // the errors above left the context usable
}

// Last: an illegal address is a sticky error that leaves this process's CUDA context unusable.
TEST_CASE("gpu: an illegal address in a kernel is a kiln::Error at the next synchronize") {
  if (cuda_device_count() == 0) {
    MESSAGE("skipped: " << cuda_unavailable_reason());
    return;
  }
  const KernelSource bad{
      "kiln_bad_store",
      "extern \"C\" __global__ void kiln_bad_store(float* p) { p[threadIdx.x] = 1.f; }",
      {}};
  LoadedKernel kernel(compile_to_cubin(bad, current_target()), bad.name);
  float* wild = reinterpret_cast<float*>(std::uintptr_t{0x10});
  void* args[] = {&wild};
  kernel.launch(Dim3{1}, Dim3{32}, 0, nullptr, args);
  CHECK_THROWS_WITH_AS(KILN_CUDA_CHECK(cudaDeviceSynchronize()),
                       doctest::Contains("cudaErrorIllegalAddress"), kiln::Error);
}

#endif  // KILN_HAVE_CUDA
