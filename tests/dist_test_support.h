// dist tests: runs each rank of a job in a forked child of the test process and collects
// its exit code and what it wrote to stderr (the log), with a deadline so no test hangs.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "distributed/process_group.h"

namespace kiln::dist::testing {

struct ChildOutcome {
  int code = -1;       // exit code, 128 + signal, or -2 when killed at the deadline
  std::string log;     // the child's stderr
  double seconds = 0;  // from the start of all children to this one's end
};

// Forks `count` children; child i runs body(i, port) and exits with its return value
// (kiln::Error and other exceptions: printed, exit 90). All children share one free loopback
// port. Children still running after `kill_after` are killed (code -2).
std::vector<ChildOutcome> run_children(
    int count, const std::function<int(int index, int port)>& body,
    std::chrono::milliseconds kill_after = std::chrono::seconds(15));

// Test options: rank 0 on 127.0.0.1:port, short heartbeat and peer timeout.
ProcessGroupOptions test_options(int rank, int world_size, int port);

// For a child: prints `what` to stderr and returns `code` (a failed expectation).
int fail(int code, const std::string& what);

// "rank 1: code 3, log: ..." for every child: a check's context.
std::string describe(const std::vector<ChildOutcome>& outcomes);

}  // namespace kiln::dist::testing
