// dist: the one-host launcher: rank arguments and environment, exit codes, the grace before
// killing, forwarded signals, and a real job of this test binary started as its ranks.
#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "core/error.h"
#include "distributed/launch.h"
#include "distributed/process_group.h"
#include "dist_test_support.h"

namespace kiln::dist {

using namespace std::chrono_literals;

namespace {

// This binary started by launch_local as a rank (KILN_DIST_TEST_AS_RANK=ok|fail): the value
// after `flag` on its command line.
std::string argument_after(const std::string& flag) {
  std::ifstream in("/proc/self/cmdline");
  std::string arg;
  while (std::getline(in, arg, '\0'))
    if (arg == flag && std::getline(in, arg, '\0')) return arg;
  return {};
}

// One rank of a small job: the mean of the ranks, checked; or rank 1 fails (mode "fail").
int run_as_rank(const std::string& mode) {
  ProcessGroupOptions options;
  options.rank = std::stoi(argument_after("--rank"));
  options.world_size = std::stoi(argument_after("--world-size"));
  options.address = argument_after("--init");
  options.connect_timeout = 5s;
  options.heartbeat = 100ms;
  options.peer_timeout = 1s;
  const auto group = ProcessGroup::join(options);
  if (mode == "fail" && options.rank == 1) {
    group->report_error("rank 1 gives up");
    return 6;
  }
  std::vector<double> data{static_cast<double>(options.rank)};
  group->all_reduce_mean(std::span<double>(data));
  const double expected = (options.world_size - 1) / 2.0;
  group->finish();
  const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
  return data[0] == expected && nvls && std::string(nvls) == "0" ? 0 : 8;
}

const int g_ran_as_rank = [] {
  const char* mode = std::getenv("KILN_DIST_TEST_AS_RANK");
  if (mode == nullptr) return 0;
  int code = 9;
  try {
    code = run_as_rank(mode);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank failed: %s\n", e.what());
  }
  std::_Exit(code);
}();

LaunchOptions options_for(int world_size, std::chrono::milliseconds grace = 5s) {
  LaunchOptions options;
  options.world_size = world_size;
  options.grace = grace;
  return options;
}

int launch_sh(const std::string& script, const LaunchOptions& options) {
  // sh -c SCRIPT then the launcher's arguments: $0=--rank $1=R $2=--world-size $3=N $4=--init
  // $5=ADDR
  return launch_local("/bin/sh", {"-c", script}, options);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

TEST_CASE(
    "dist: launch_local gives each rank its arguments and environment and returns the failed "
    "rank's code") {
  CHECK(launch_sh("exit 0", options_for(2)) == 0);
  CHECK(launch_sh("if [ \"$1\" = 1 ]; then exit 5; fi; exit 0", options_for(2)) == 5);
  const std::string checks =
      "[ \"$0\" = --rank ] && [ \"$2\" = --world-size ] && [ \"$3\" = 3 ] && [ \"$4\" = --init ] "
      "&& "
      "[ \"${5%:*}\" = 127.0.0.1 ] && [ \"$NCCL_NVLS_ENABLE\" = 0 ] && [ \"$CUDA_VISIBLE_DEVICES\" "
      "= \"$1\" ] || exit 9";
  CHECK(launch_sh(checks, options_for(3)) == 0);
  LaunchOptions all_gpus = options_for(2);
  all_gpus.one_gpu_per_rank = false;
  ::setenv("CUDA_VISIBLE_DEVICES", "4,5", 1);
  CHECK(launch_sh("[ \"$CUDA_VISIBLE_DEVICES\" = 4,5 ] || exit 9", all_gpus) == 0);
  CHECK(launch_sh("[ \"$CUDA_VISIBLE_DEVICES\" = $(($1 + 4)) ] || exit 9", options_for(2)) == 0);
  ::unsetenv("CUDA_VISIBLE_DEVICES");
}

TEST_CASE(
    "dist: launch_local kills the ranks still running after the grace and reports the first "
    "failure") {
  const auto start = std::chrono::steady_clock::now();
  CHECK(launch_sh("if [ \"$1\" = 1 ]; then kill -9 $$; fi; exec sleep 30", options_for(2, 300ms)) ==
        128 + SIGKILL);
  CHECK(seconds_since(start) < 3.0);
  // Rank 0 ends first with kPeerFailedExitCode (a consequence); rank 1's own failure is the code.
  CHECK(launch_sh("if [ \"$1\" = 0 ]; then exit 3; fi; sleep 0.3; exit 4", options_for(2)) == 4);
  CHECK(launch_sh("exit 3", options_for(2)) == kPeerFailedExitCode);
}

TEST_CASE("dist: launch_local throws kiln::Error for an executable it cannot start") {
  CHECK_THROWS_WITH_AS(launch_local("/nonexistent/trainer", {}, options_for(2)),
                       doctest::Contains("cannot start rank 0 as '/nonexistent/trainer'"), Error);
}

TEST_CASE("dist: SIGTERM sent to the launcher reaches every rank") {
  const auto outcomes = testing::run_children(1, [](int, int) {
    std::thread([] {
      std::this_thread::sleep_for(300ms);
      ::kill(::getpid(), SIGTERM);
    }).detach();
    return launch_sh("exec sleep 30", options_for(2));
  });
  INFO(testing::describe(outcomes));
  CHECK(outcomes[0].code == 128 + SIGTERM);
  CHECK(outcomes[0].seconds < 3.0);
}

TEST_CASE("dist: launch_local runs a real job of this binary through the process group") {
  CHECK(self_executable().ends_with("dist_tests"));
  const int port = free_local_port();
  CHECK(port >= 1);
  CHECK(port <= 65535);
  ::setenv("KILN_DIST_TEST_AS_RANK", "ok", 1);
  CHECK(launch_local(self_executable(), {}, options_for(3)) == 0);
  ::setenv("KILN_DIST_TEST_AS_RANK", "fail", 1);
  CHECK(launch_local(self_executable(), {}, options_for(3)) == 6);
  ::unsetenv("KILN_DIST_TEST_AS_RANK");
  CHECK(g_ran_as_rank == 0);
}

}  // namespace kiln::dist
