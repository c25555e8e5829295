// Files the user names, read and written safely. What an atomic write may replace: only a
// regular file (special files and dangling links are refused and left as they were, a symbolic
// link is written through to its target, stale temp files of killed writers are removed, a
// user's own "<name>.tmp" is never touched). What a reader opens: only a regular file, checked
// before anything can block on a FIFO; sizes bounded; a NUL inside a checkpoint header refused.
#include <doctest/doctest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "backends/numerics.h"
#include "backends/trace_writer.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/input_file.h"
#include "core/safetensors.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

struct ScratchDir {
  fs::path path;
  ScratchDir() {
    std::string pattern = (fs::temp_directory_path() / "kiln-atomic-XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~ScratchDir() { fs::remove_all(path); }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string error_writing(const fs::path& p) {
  try {
    write_file_atomically(p, std::span<const std::uint8_t>());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A pid that belonged to a process that has exited.
pid_t dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  return child;
}

}  // namespace

TEST_CASE("atomic write: a FIFO, a directory or a socket at the target is refused and kept") {
  ScratchDir dir;
  const fs::path fifo = dir.path / "ckpt.fifo", sub = dir.path / "ckpt.dir",
                 sock = dir.path / "ckpt.sock";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  fs::create_directory(sub);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", sock.c_str());
  REQUIRE(::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0);
  CHECK(error_writing(fifo) ==
        fifo.string() + ": exists and is a FIFO; refusing to replace it with a file");
  CHECK(error_writing(sub) ==
        sub.string() + ": exists and is a directory; refusing to replace it with a file");
  CHECK(error_writing(sock) ==
        sock.string() + ": exists and is a socket; refusing to replace it with a file");
  ::close(fd);
  CHECK(fs::is_fifo(fifo));
  CHECK(fs::is_directory(sub));
  CHECK(fs::is_socket(sock));
  CHECK(dir.names() == std::vector<std::string>{"ckpt.dir", "ckpt.fifo", "ckpt.sock"});
  CHECK_THROWS_WITH_AS(check_atomic_target(fifo, "--checkpoint"),
                       (fifo.string() + ": exists and is a FIFO; refusing to replace it with a "
                                        "file")
                           .c_str(),
                       Error);
}

TEST_CASE("atomic write: through a symbolic link to its target, a dangling link is refused") {
  ScratchDir dir;
  const fs::path target = dir.path / "real.bin", link = dir.path / "link.bin";
  std::ofstream(target) << "old";
  fs::create_symlink(target, link);
  const std::string text = "new contents";
  write_file_atomically(link,
                        std::span(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
  CHECK(fs::is_symlink(link));
  CHECK(read_text(target) == text);
  const fs::path dangling = dir.path / "dangling.bin";
  fs::create_symlink(dir.path / "missing.bin", dangling);
  CHECK(error_writing(dangling).starts_with(dangling.string() +
                                            ": a symbolic link to a file that does not exist"));
  CHECK(fs::is_symlink(dangling));
  CHECK_FALSE(fs::exists(dir.path / "missing.bin"));
}

TEST_CASE("atomic write: removes our dead writers' temp files, keeps live ones and others") {
  ScratchDir dir;
  const fs::path target = dir.path / "c.safetensors";
  const std::string dead = "c.safetensors.tmp." + std::to_string(dead_pid()) + ".3";
  const std::string live = "c.safetensors.tmp." + std::to_string(::getppid()) + ".0";
  for (const std::string& name :
       {dead, live, std::string("c.safetensors.tmp"), std::string("c.safetensors.tmp.x.1"),
        std::string("other.tmp.1.1")})
    std::ofstream(dir.path / name) << "x";
  write_file_atomically(target, std::span<const std::uint8_t>());
  CHECK(dir.names() == std::vector<std::string>{"c.safetensors", "c.safetensors.tmp", live,
                                                "c.safetensors.tmp.x.1", "other.tmp.1.1"});
}

TEST_CASE("the trace writer leaves a user's own <path>.tmp alone and refuses a FIFO") {
  ScratchDir dir;
  const fs::path trace = dir.path / "t.json", own = dir.path / "t.json.tmp";
  std::ofstream(own) << "my notes";
  write_trace(trace.string(), {{"k", 0, 1.0, 2.0}}, "test");
  CHECK(read_text(own) == "my notes");
  CHECK(read_text(trace).find("\"traceEvents\"") != std::string::npos);
  const fs::path fifo = dir.path / "f.json";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_AS(write_trace(fifo.string(), {}, "test"), Error);
  CHECK(fs::is_fifo(fifo));
}

// Each launch's node, FLOPs and bytes go into the event's args (bench/trace_summary.py --rates
// reads them); a launch of no node (a variable update) has none.
TEST_CASE("the trace writer gives a launch its node, FLOPs and bytes as args") {
  ScratchDir dir;
  const fs::path trace = dir.path / "t.json";
  write_trace(trace.string(), {{"conv2d", 1, 1.0, 2.0, 7, 1.5e9, 4096}, {"update w", 0, 3.0, 1.0}},
              "test");
  const nlohmann::json events = nlohmann::json::parse(read_text(trace)).at("traceEvents");
  int launches = 0;
  for (const nlohmann::json& e : events) {
    if (e.at("ph") != "X") continue;
    ++launches;
    if (e.at("name") == "conv2d") {
      CHECK(e.at("args").at("node") == 7);
      CHECK(e.at("args").at("flops") == 1.5e9);
      CHECK(e.at("args").at("bytes") == 4096);
    } else {
      CHECK_FALSE(e.contains("args"));
    }
  }
  CHECK(launches == 2);
}

TEST_CASE("check_writable_directory creates a file to find out, a missing directory is named") {
  ScratchDir dir;
  CHECK_NOTHROW(check_writable_directory(dir.path, "--checkpoint"));
  CHECK(dir.names().empty());
  CHECK_THROWS_WITH_AS(
      check_writable_directory(dir.path / "nope", "--checkpoint"),
      ("--checkpoint: the directory " + (dir.path / "nope").string() + " does not exist").c_str(),
      Error);
}

TEST_CASE("readers refuse a FIFO, a directory or a device at once instead of blocking") {
  ScratchDir dir;
  const fs::path fifo = dir.path / "in.safetensors";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // Each of these would wait forever for a writer if the FIFO were opened for a blocking read.
  CHECK_THROWS_WITH_AS(load_safetensors(fifo),
                       (fifo.string() + ": is a FIFO, not a regular file").c_str(), Error);
  CHECK_THROWS_WITH_AS(read_regular_file(fifo, 100, "--x"),
                       (fifo.string() + ": is a FIFO, not a regular file").c_str(), Error);
  CHECK_THROWS_WITH_AS(open_regular_file(dir.path),
                       (dir.path.string() + ": is a directory, not a regular file").c_str(), Error);
  CHECK_THROWS_WITH_AS(open_regular_file("/dev/zero"),
                       "/dev/zero: is a character device, not a regular file", Error);
  CHECK_THROWS_WITH_AS(
      open_regular_file(dir.path / "missing"),
      ((dir.path / "missing").string() + ": cannot open for reading (No such file or directory)")
          .c_str(),
      Error);
}

TEST_CASE("read_regular_file bounds what it reads and names the limit") {
  ScratchDir dir;
  const fs::path text = dir.path / "book.txt";
  std::ofstream(text) << std::string(1000, 'a');
  CHECK(read_regular_file(text, 1000, "--max-text-bytes").size() == 1000);
  CHECK_THROWS_WITH_AS(
      read_regular_file(text, 999, "--max-text-bytes"),
      (text.string() + ": 1000 bytes, more than the 999 that --max-text-bytes allows").c_str(),
      Error);
}

TEST_CASE("a NUL byte inside a safetensors header is refused, not read as the header's end") {
  ScratchDir dir;
  const fs::path path = dir.path / "nul.safetensors";
  // {"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}} then NUL and more JSON-ish bytes.
  std::string header = R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  header += std::string(1, '\0') + R"(,"u":1})";
  while (header.size() % 8 != 0) header += ' ';
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i)
    bytes[static_cast<std::size_t>(i)] = static_cast<char>(header.size() >> (8 * i));
  bytes += header + std::string(4, '\0');
  std::ofstream(path, std::ios::binary) << bytes;
  const std::string nul_at = std::to_string(8 + header.find('\0'));
  CHECK_THROWS_WITH_AS(load_safetensors(path),
                       (path.string() + ": the header has a NUL byte at offset " + nul_at).c_str(),
                       Error);
}

TEST_CASE("KILN_CHECK_NUMERICS is a switch: false is off and a typo is an error") {
  const auto with = [](const char* value) {
    ::setenv("KILN_CHECK_NUMERICS", value, 1);
    const bool on = check_numerics_from_environment();
    ::unsetenv("KILN_CHECK_NUMERICS");
    return on;
  };
  for (const char* on : {"1", "true", "yes", "on"}) CHECK(with(on));
  for (const char* off : {"0", "false", "no", "off", ""}) CHECK_FALSE(with(off));
  CHECK_FALSE(check_numerics_from_environment());
  ::setenv("KILN_CHECK_NUMERICS", "flase", 1);
  CHECK_THROWS_WITH_AS(check_numerics_from_environment(),
                       "KILN_CHECK_NUMERICS='flase' is not a switch (1, true, yes, on; or 0, "
                       "false, no, off)",
                       Error);
  ::unsetenv("KILN_CHECK_NUMERICS");
}

}  // namespace kiln
