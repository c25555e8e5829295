// kiln-cache: the kernel cache's directory as a tool (gpu/cache_admin.h): list its entries,
// show one (what compiled it, its CUDA source), clear it, trim it to a size (least recently
// used first), export it to one file and import that file on another machine of the same GPU
// architecture, so that a first run there starts warm.
#include <CLI/CLI.hpp>
#include <fmt/chrono.h>
#include <fmt/format.h>

#include <chrono>
#include <iostream>

#include "core/error.h"
#include "gpu/cache_admin.h"
#include "gpu/disk_cache.h"
#include "tools/cli.h"
#include "tools/output_check.h"

namespace {

namespace fs = std::filesystem;

std::string when(fs::file_time_type t) {
  const auto system = std::chrono::time_point_cast<std::chrono::seconds>(
      t - fs::file_time_type::clock::now() + std::chrono::system_clock::now());
  return fmt::format("{:%Y-%m-%d %H:%M:%S}",
                     fmt::localtime(std::chrono::system_clock::to_time_t(system)));
}

int list(const fs::path& dir) {
  const std::vector<kiln::gpu::CacheEntryInfo> entries = kiln::gpu::list_cache(dir);
  std::uintmax_t total = 0;
  fmt::print("{:<14} {:>6} {:>9}  {:<19}  {}\n", "key", "arch", "bytes", "last use", "kernel");
  for (const auto& e : entries) {
    total += e.bytes;
    fmt::print("{:<14} {:>6} {:>9}  {}  {}\n", e.key.substr(0, 12),
               e.sm > 0 ? fmt::format("sm_{}", e.sm) : "?", e.bytes, when(e.last_use),
               e.name.empty() ? "(no side file)" : e.name);
  }
  fmt::print("{} entries, {:.1f} MiB in {}\n", entries.size(),
             static_cast<double>(total) / (1 << 20), dir.string());
  return 0;
}

int show(const fs::path& dir, const std::string& what) {
  for (const auto& e : kiln::gpu::list_cache(dir)) {
    if (e.key.rfind(what, 0) != 0 && e.name != what) continue;
    fmt::print(
        "key      {}\nkernel   {}\narch     sm_{}\nnvrtc    {}\noptions  {}\nbytes    {}\n"
        "last use {}\n\n{}\n",
        e.key, e.name, e.sm, e.nvrtc, fmt::join(e.options, " "), e.bytes, when(e.last_use), e.code);
    return 0;
  }
  throw kiln::Error(
      fmt::format("kiln-cache show: no entry has the key prefix or kernel name '{}' in {}", what,
                  dir.string()));
}

int run(int argc, char** argv) {
  CLI::App app{"kiln-cache: list, show, clear, trim, export and import the kernel cache"};
  std::string dir = kiln::gpu::default_cache_dir().string(), key, file;
  std::uint64_t max_mib = 0;
  app.add_option("--dir", dir,
                 "the cache directory (default: $KILN_CACHE_DIR, else "
                 "$XDG_CACHE_HOME/kiln, else ~/.cache/kiln)")
      ->capture_default_str();
  app.require_subcommand(1);
  app.add_subcommand("list", "every entry, the most recently used first");
  app.add_subcommand("show", "one entry: what compiled it and its CUDA source")
      ->add_option("key", key, "a key prefix or a kernel name")
      ->required();
  app.add_subcommand("clear", "remove every entry");
  app.add_subcommand("trim", "remove the least recently used entries down to a size")
      ->add_option("--max-mib", max_mib, "the size to keep")
      ->required();
  app.add_subcommand("export", "write every entry into one file")
      ->add_option("file", file, "the archive to write")
      ->required();
  app.add_subcommand("import", "check an archive whole, then add its entries")
      ->add_option("file", file, "the archive to read")
      ->required();
  if (const auto code = kiln::tools::parse_command_line(app, argc, argv)) return *code;
  try {
    KILN_CHECK(!dir.empty(), "kiln-cache: no cache directory (--dir, or set KILN_CACHE_DIR)");
    const std::string command = app.get_subcommands().front()->get_name();
    if (command == "list") return list(dir);
    if (command == "show") return show(dir, key);
    if (command == "clear") fmt::print("removed {} entries\n", kiln::gpu::clear_cache(dir));
    if (command == "trim")
      fmt::print("removed {} entries\n", kiln::gpu::trim_cache(dir, max_mib << 20));
    if (command == "export")
      fmt::print("exported {} entries to {}\n", kiln::gpu::export_cache(dir, file), file);
    if (command == "import")
      fmt::print("imported {} entries into {}\n", kiln::gpu::import_cache(dir, file), dir);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "kiln-cache: error: {}\n", kiln::tools::one_line(e.what()));
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  return kiln::tools::finish_output("kiln-cache", run(argc, argv));
}
