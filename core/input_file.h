// Opening the user's input files (checkpoints, datasets, configs, text) safely: the file kind
// is checked before anything blocks (a FIFO or a device never hangs the reader) and every
// error names the file.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

namespace kiln {

using FilePtr = std::unique_ptr<std::FILE, int (*)(std::FILE*)>;

// What a file of this st_mode is, for messages: "a directory", "a FIFO", "a character device",
// "a block device", "a socket", or "not a regular file".
const char* file_kind_name(unsigned mode);

// Opens `path` for binary reading if it is a regular file (after following symbolic links);
// otherwise throws kiln::Error "<path>: is a FIFO, not a regular file" (a directory, a device,
// ...) or "<path>: cannot open for reading (<reason>)". Never blocks on a FIFO.
FilePtr open_regular_file(const std::filesystem::path& path);

// A file descriptor variant of open_regular_file, for readers such as zlib's gzdopen. The
// caller owns the descriptor.
int open_regular_fd(const std::filesystem::path& path);

// Reads a regular file whole. One larger than `max_bytes` is refused without being read:
// "<path>: <n> bytes, more than the <max_bytes> that <limit_name> allows".
std::string read_regular_file(const std::filesystem::path& path, std::uint64_t max_bytes,
                              const std::string& limit_name);

}  // namespace kiln
