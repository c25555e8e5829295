// Forked children as the ranks of a test job (see dist_test_support.h).
#include "dist_test_support.h"

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "distributed/launch.h"

namespace kiln::dist::testing {

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void run_child(int index, int port, const std::string& log_path,
                            const std::function<int(int, int)>& body) {
  std::FILE* log = std::freopen(log_path.c_str(), "w", stderr);
  if (log == nullptr) ::_exit(92);
  std::setvbuf(stderr, nullptr, _IONBF, 0);
  int code = 90;
  try {
    code = body(index, port);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "exception: %s\n", e.what());
  }
  std::fflush(stderr);
  ::_exit(code);
}

int exit_code(int status) {
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

std::vector<ChildOutcome> run_children(int count, const std::function<int(int, int)>& body,
                                       std::chrono::milliseconds kill_after) {
  const int port = free_local_port();
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  std::fflush(stdout);
  std::fflush(stderr);
  const auto start = Clock::now();
  for (int i = 0; i < count; ++i) {
    logs.push_back(fmt::format("/tmp/kiln_dist_test_{}_{}.log", ::getpid(), i));
    const pid_t pid = ::fork();
    KILN_ASSERT(pid >= 0, "fork failed");
    if (pid == 0) run_child(i, port, logs.back(), body);
    pids.push_back(pid);
  }
  std::vector<ChildOutcome> outcomes(static_cast<std::size_t>(count));
  for (int left = count; left > 0;) {
    for (int i = 0; i < count; ++i) {
      int status = 0;
      if (pids[i] == 0 || ::waitpid(pids[i], &status, WNOHANG) != pids[i]) continue;
      outcomes[i].code = exit_code(status);
      outcomes[i].seconds = std::chrono::duration<double>(Clock::now() - start).count();
      pids[i] = 0;
      --left;
    }
    if (left > 0 && Clock::now() - start > kill_after) {
      for (int i = 0; i < count; ++i) {
        if (pids[i] == 0) continue;
        ::kill(pids[i], SIGKILL);
        ::waitpid(pids[i], nullptr, 0);
        outcomes[i].code = -2;
        pids[i] = 0;
        --left;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int i = 0; i < count; ++i) {
    outcomes[i].log = read_file(logs[i]);
    std::remove(logs[i].c_str());
  }
  return outcomes;
}

ProcessGroupOptions test_options(int rank, int world_size, int port) {
  ProcessGroupOptions options;
  options.rank = rank;
  options.world_size = world_size;
  options.address = fmt::format("127.0.0.1:{}", port);
  options.connect_timeout = std::chrono::seconds(5);
  options.heartbeat = std::chrono::milliseconds(100);
  options.peer_timeout = std::chrono::milliseconds(1000);
  options.collective_timeout = std::chrono::seconds(10);
  return options;
}

int fail(int code, const std::string& what) {
  std::fprintf(stderr, "FAILED: %s\n", what.c_str());
  return code;
}

std::string describe(const std::vector<ChildOutcome>& outcomes) {
  std::string text;
  for (std::size_t i = 0; i < outcomes.size(); ++i)
    text += fmt::format("child {}: code {} after {:.2f} s, log:\n{}\n", i, outcomes[i].code,
                        outcomes[i].seconds, outcomes[i].log);
  return text;
}

}  // namespace kiln::dist::testing
