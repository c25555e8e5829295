// Listing, trimming, exporting and importing the kernel cache's directory (cache_admin.h).
// The archive: "KILNCACHE1\n", then per file a u32 name length, the name, a u64 size and
// the bytes (little-endian), the files in name order.
#include "gpu/cache_admin.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <regex>

#include "core/error.h"
#include "core/input_file.h"
#include "gpu/cache_entry.h"

namespace kiln::gpu {
namespace {

constexpr char kMagic[] = "KILNCACHE1\n";
constexpr std::size_t kMagicBytes = sizeof(kMagic) - 1;
constexpr std::uint64_t kMaxFileBytes = std::uint64_t{1} << 30;     // an entry or side file
constexpr std::uint64_t kMaxArchiveBytes = std::uint64_t{1} << 36;  // 64 GiB

// A file of kiln's cache: the key of an entry (.kcubin) or side file (.meta), else "".
std::string key_of(const std::filesystem::path& file, const char* extension) {
  static const std::regex name("[0-9a-f]{64}");
  if (file.extension() != extension) return "";
  const std::string stem = file.stem().string();
  return std::regex_match(stem, name) ? stem : "";
}

Digest digest_of(const std::string& hex) {
  Digest d{};
  for (std::size_t i = 0; i < d.size(); ++i)
    d[i] = static_cast<std::uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return d;
}

// A regular file whole (core/input_file.h: a FIFO or a device is refused, never read).
std::vector<char> read_all(const std::filesystem::path& path, std::uint64_t max_bytes) {
  try {
    const std::string text = read_regular_file(path, max_bytes, "the kernel cache");
    return {text.begin(), text.end()};
  } catch (const Error& e) {
    throw Error(fmt::format("kernel cache: cannot read {} ({})", path.string(), e.what()));
  }
}

void read_meta(const std::filesystem::path& path, CacheEntryInfo& info) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) return;
  const std::vector<char> bytes = read_all(path, kMaxFileBytes);
  const nlohmann::json j = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, false);
  if (!j.is_object()) return;
  info.name = j.value("name", "");
  info.nvrtc = j.value("nvrtc", "");
  info.code = j.value("code", "");
  info.sm = j.value("sm", 0);
  if (j.contains("options") && j["options"].is_array())
    for (const auto& o : j["options"])
      if (o.is_string()) info.options.push_back(o.get<std::string>());
}

// The cache's own files, in name order.
std::vector<std::filesystem::path> cache_files(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> files;
  std::error_code error;
  for (const auto& e : std::filesystem::directory_iterator(dir, error))
    if (e.is_regular_file(error) &&
        (!key_of(e.path(), ".kcubin").empty() || !key_of(e.path(), ".meta").empty()))
      files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

std::filesystem::path meta_path(const std::filesystem::path& dir, const Digest& key) {
  return dir / (to_hex(key) + ".meta");
}

std::string cache_meta_text(const std::string& name, int sm, const std::string& nvrtc,
                            const std::vector<std::string>& options, const std::string& code) {
  return nlohmann::json{
      {"name", name}, {"sm", sm}, {"nvrtc", nvrtc}, {"options", options}, {"code", code}}
      .dump(1);
}

std::vector<CacheEntryInfo> list_cache(const std::filesystem::path& dir) {
  std::vector<CacheEntryInfo> entries;
  for (const std::filesystem::path& file : cache_files(dir)) {
    CacheEntryInfo info;
    info.key = key_of(file, ".kcubin");
    if (info.key.empty()) continue;
    std::error_code error;
    info.bytes = std::filesystem::file_size(file, error);
    info.last_use = std::filesystem::last_write_time(file, error);
    read_meta(dir / (info.key + ".meta"), info);
    entries.push_back(std::move(info));
  }
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return a.last_use > b.last_use; });
  return entries;
}

std::size_t clear_cache(const std::filesystem::path& dir) {
  std::size_t removed = 0;
  for (const std::filesystem::path& file : cache_files(dir)) {
    std::error_code error;
    removed += std::filesystem::remove(file, error) && file.extension() == ".kcubin";
  }
  return removed;
}

std::size_t trim_cache(const std::filesystem::path& dir, std::uintmax_t max_bytes) {
  std::vector<CacheEntryInfo> entries = list_cache(dir);
  std::uintmax_t total = 0;
  for (const CacheEntryInfo& e : entries) total += e.bytes;
  std::size_t removed = 0;
  while (total > max_bytes && !entries.empty()) {  // the least recently used is last
    const CacheEntryInfo& victim = entries.back();
    std::error_code error;
    std::filesystem::remove(dir / (victim.key + ".kcubin"), error);
    std::filesystem::remove(dir / (victim.key + ".meta"), error);
    total -= victim.bytes;
    entries.pop_back();
    ++removed;
  }
  return removed;
}

std::size_t export_cache(const std::filesystem::path& dir, const std::filesystem::path& archive) {
  std::vector<char> out(kMagic, kMagic + kMagicBytes);
  std::size_t entries = 0;
  for (const std::filesystem::path& file : cache_files(dir)) {
    const std::vector<char> bytes = read_all(file, kMaxFileBytes);
    const std::string name = file.filename().string();
    put_le(out, name.size(), 4);
    out.insert(out.end(), name.begin(), name.end());
    put_le(out, bytes.size(), 8);
    out.insert(out.end(), bytes.begin(), bytes.end());
    entries += file.extension() == ".kcubin";
  }
  const std::string problem = write_file_atomically(archive, out);
  KILN_CHECK(problem.empty(), "kiln-cache export {}: {}", archive.string(), problem);
  return entries;
}

std::size_t import_cache(const std::filesystem::path& dir, const std::filesystem::path& archive) {
  const std::vector<char> in = read_all(archive, kMaxArchiveBytes);
  const std::string where = "kiln-cache import " + archive.string();
  KILN_CHECK(in.size() >= kMagicBytes && std::equal(kMagic, kMagic + kMagicBytes, in.begin()),
             "{}: not a kiln cache archive (it does not start with KILNCACHE1)", where);
  std::vector<std::pair<std::string, std::vector<char>>> files;
  for (std::size_t at = kMagicBytes; at < in.size();) {
    KILN_CHECK(in.size() - at >= 4, "{}: truncated at byte {}", where, at);
    const std::uint64_t name_bytes = get_le(in, at, 4);
    KILN_CHECK(name_bytes <= 80 && in.size() - at - 4 >= name_bytes + 8,
               "{}: truncated or corrupt at byte {}", where, at);
    std::string name(in.begin() + static_cast<std::ptrdiff_t>(at + 4),
                     in.begin() + static_cast<std::ptrdiff_t>(at + 4 + name_bytes));
    at += 4 + name_bytes;
    const std::uint64_t size = get_le(in, at, 8);
    at += 8;
    KILN_CHECK(size <= kMaxFileBytes && in.size() - at >= size, "{}: {} is truncated", where, name);
    std::vector<char> bytes(in.begin() + static_cast<std::ptrdiff_t>(at),
                            in.begin() + static_cast<std::ptrdiff_t>(at + size));
    at += size;
    const bool bare = !std::filesystem::path(name).has_parent_path();  // no way out of `dir`
    const std::string entry_key = bare ? key_of(name, ".kcubin") : "";
    const std::string side_key = bare ? key_of(name, ".meta") : "";
    KILN_CHECK(!entry_key.empty() || !side_key.empty(), "{}: '{}' is no kernel cache file", where,
               name);
    if (!entry_key.empty()) {
      const DecodedEntry decoded = decode_entry(bytes, digest_of(entry_key));
      KILN_CHECK(decoded.problem.empty(), "{}: entry {}: {}", where, name, decoded.problem);
    } else {
      KILN_CHECK(nlohmann::json::accept(bytes.begin(), bytes.end()), "{}: {} is not JSON", where,
                 name);
    }
    files.emplace_back(std::move(name), std::move(bytes));
  }
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  std::size_t entries = 0;
  for (const auto& [name, bytes] : files) {
    const std::string problem = write_file_atomically(dir / name, bytes);
    KILN_CHECK(problem.empty(), "{}: {}", where, problem);
    entries += !key_of(name, ".kcubin").empty();
  }
  return entries;
}

}  // namespace kiln::gpu
