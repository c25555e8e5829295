// dist: how a job ends: a rank killed, silent or reporting an error ends every other rank
// with kPeerFailedExitCode and a message naming it; finish() is a normal end.
#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "dist_test_support.h"

namespace kiln::dist {

using namespace std::chrono_literals;
using testing::fail;
using testing::run_children;
using testing::test_options;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Waits for the watcher to end this process; returns 40 if it does not within `limit`.
int wait_to_be_ended(std::chrono::milliseconds limit = 8s) {
  std::this_thread::sleep_for(limit);
  return fail(40, "still running: nothing ended this rank");
}

}  // namespace

TEST_CASE(
    "dist: a rank killed with SIGKILL ends every other rank with kPeerFailedExitCode and names "
    "it") {
  const auto outcomes = run_children(3, [](int rank, int port) {
    const auto group = ProcessGroup::join(test_options(rank, 3, port));
    group->barrier();
    if (rank == 1) ::raise(SIGKILL);
    return wait_to_be_ended();
  });
  INFO(testing::describe(outcomes));
  CHECK(outcomes[1].code == 128 + SIGKILL);
  for (int rank : {0, 2}) {
    CHECK(outcomes[rank].code == kPeerFailedExitCode);
    CHECK(outcomes[rank].seconds < 5.0);
    CHECK(contains(outcomes[rank].log,
                   fmt::format("rank {}: ending the job: rank 1 failed: closed its connection "
                               "without finishing (the process died or was killed)",
                               rank)));
  }
}

TEST_CASE("dist: a collective blocked on a rank that dies throws kiln::Error naming that rank") {
  const auto outcomes = run_children(2, [](int rank, int port) {
    const auto group = ProcessGroup::join(test_options(rank, 2, port));
    // The hook holds the watcher back (longer than a collective waits for its verdict), so
    // this thread throws for the closed data connection.
    group->on_peer_failure([](const std::string&) { std::this_thread::sleep_for(3s); });
    if (rank == 0) {
      std::this_thread::sleep_for(200ms);
      ::raise(SIGKILL);
    }
    std::vector<float> data(10, 1.0f);
    try {
      group->all_reduce_mean(std::span<float>(data));
    } catch (const Error& e) {
      std::fprintf(stderr, "caught: %s\n", e.what());
      return 7;  // the group's destructor then waits for the watcher, which ends the process
    }
    return fail(42, "all_reduce_mean returned");
  });
  INFO(testing::describe(outcomes));
  CHECK(outcomes[0].code == 128 + SIGKILL);
  CHECK(outcomes[1].code == kPeerFailedExitCode);
  CHECK(contains(outcomes[1].log, "caught: rank 1: all_reduce_mean: rank 0 closed the connection"));
  CHECK(outcomes[1].seconds < 5.0);
}

TEST_CASE("dist: a rank that falls silent for peer_timeout is a failure") {
  const auto outcomes = run_children(
      2,
      [](int rank, int port) {
        const auto group = ProcessGroup::join(test_options(rank, 2, port));
        if (rank == 1) ::raise(SIGSTOP);  // stops its watcher too: no more pings
        return wait_to_be_ended();
      },
      3s);
  INFO(testing::describe(outcomes));
  CHECK(outcomes[0].code == kPeerFailedExitCode);
  CHECK(contains(outcomes[0].log, "rank 0: ending the job: rank 1 failed: sent nothing for 1 s"));
  CHECK(outcomes[0].seconds < 4.0);
  CHECK(outcomes[1].code == -2);  // stopped until the test killed it
}

TEST_CASE(
    "dist: report_error's message reaches every other rank and its failure hooks before it exits") {
  for (int reporter : {0, 2}) {
    const auto outcomes = run_children(3, [reporter](int rank, int port) {
      const auto group = ProcessGroup::join(test_options(rank, 3, port));
      group->on_peer_failure(
          [](const std::string& message) { std::fprintf(stderr, "hook: %s\n", message.c_str()); });
      // Every rank's hook is in place before the report: a notice that arrives before a rank has
      // added its hook ends that rank without it (CI saw this once).
      group->barrier();
      if (rank == reporter) {
        group->report_error("data file /data/x is corrupt");
        std::this_thread::sleep_for(300ms);  // the others' ends must not end this rank
        return 1;
      }
      group->barrier();  // blocks: the reporter never arrives
      return fail(43, "the barrier returned");
    });
    INFO(testing::describe(outcomes));
    for (int rank = 0; rank < 3; ++rank) {
      if (rank == reporter) {
        CHECK(outcomes[rank].code == 1);
        continue;
      }
      CHECK(outcomes[rank].code == kPeerFailedExitCode);
      CHECK(contains(outcomes[rank].log,
                     fmt::format("rank {}: ending the job: rank {} failed: data file /data/x is "
                                 "corrupt",
                                 rank, reporter)));
      CHECK(contains(outcomes[rank].log,
                     fmt::format("hook: rank {} failed: data file /data/x is corrupt", reporter)));
    }
  }
}

TEST_CASE(
    "dist: finish() then exit is a normal end on every rank whatever the order of the exits") {
  const auto outcomes = run_children(3, [](int rank, int port) {
    const auto group = ProcessGroup::join(test_options(rank, 3, port));
    std::vector<double> data(5, rank);
    group->all_reduce_mean(std::span<double>(data));
    if (rank == 1) std::this_thread::sleep_for(300ms);  // the others wait in finish()
    group->finish();
    if (rank == 2)
      std::this_thread::sleep_for(1500ms);  // longer than peer_timeout after the others left
    if (rank == 0) std::this_thread::sleep_for(200ms);
    try {
      group->barrier();
      return fail(44, "a collective after finish() did not throw");
    } catch (const Error& e) {
      if (!contains(e.what(), "barrier called after finish()")) return fail(45, e.what());
    }
    return data[0] == 1.0 ? 0 : fail(46, "mean");
  });
  INFO(testing::describe(outcomes));
  for (const auto& outcome : outcomes) {
    CHECK(outcome.code == 0);
    CHECK(!contains(outcome.log, "ending the job"));
  }
}

TEST_CASE(
    "dist: a group destroyed without finish() (an exception unwinding) does not hang and the "
    "others end") {
  const auto outcomes = run_children(2, [](int rank, int port) {
    try {
      const auto group = ProcessGroup::join(test_options(rank, 2, port));
      if (rank == 1) throw Error("out of memory at step 3");
      group->barrier();
    } catch (const Error& e) {
      std::this_thread::sleep_for(
          300ms);  // this rank's end comes from the exception, not from its watcher
      return contains(e.what(), "out of memory") ? 5 : fail(47, e.what());
    }
    return fail(48, "the barrier returned");
  });
  INFO(testing::describe(outcomes));
  CHECK(outcomes[1].code == 5);
  CHECK(outcomes[1].seconds < 2.0);
  // Rank 0's blocked barrier leaves the end to its watcher, which names the cause.
  CHECK(outcomes[0].code == kPeerFailedExitCode);
  CHECK(contains(outcomes[0].log,
                 "rank 0: ending the job: rank 1 failed: closed its connection without finishing"));
  CHECK(outcomes[0].seconds < 3.0);
}

}  // namespace kiln::dist
