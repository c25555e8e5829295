// dist: ProcessGroup with real processes on loopback: collectives, rendezvous errors,
// a rank that dies or reports an error, and the normal end.
#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "distributed/launch.h"
#include "dist_test_support.h"

namespace kiln::dist {

using namespace std::chrono_literals;
using testing::fail;
using testing::run_children;
using testing::test_options;

namespace {

// Rank `rank`'s values: magnitudes from 1e-3 to 1e3, so the summation order shows in the bits.
template <typename T>
std::vector<T> rank_values(int rank, std::size_t n) {
  std::vector<T> values(n);
  for (std::size_t i = 0; i < n; ++i)
    values[i] = static_cast<T>(std::sin(0.37 * static_cast<double>(i) + 1.3 * rank) *
                               std::pow(10.0, (i + rank) % 7 - 3.0));
  return values;
}

// The mean as the group defines it: summed in rank order in T, then divided by the world size.
template <typename T>
std::vector<T> expected_mean(int world, std::size_t n) {
  std::vector<T> sum = rank_values<T>(0, n);
  for (int r = 1; r < world; ++r) {
    const std::vector<T> part = rank_values<T>(r, n);
    for (std::size_t i = 0; i < n; ++i) sum[i] += part[i];
  }
  for (T& x : sum) x /= static_cast<T>(world);
  return sum;
}

template <typename T>
bool reduce_matches(ProcessGroup& group, std::size_t n) {
  std::vector<T> data = rank_values<T>(group.rank(), n);
  group.all_reduce_mean(std::span<T>(data));
  const std::vector<T> expected = expected_mean<T>(group.world_size(), n);
  return std::memcmp(data.data(), expected.data(), n * sizeof(T)) == 0;
}

// One rank of the collectives test: exit 0 when every result is right.
int run_collectives(int rank, int world, int port) {
  const auto group = ProcessGroup::join(test_options(rank, world, port));
  if (group->rank() != rank || group->world_size() != world) return fail(10, "rank or world size");
  const std::string id =
      group->broadcast(rank == 0 ? std::string("unique-id\0bytes", 15) : "ignored");
  if (id != std::string("unique-id\0bytes", 15)) return fail(11, "broadcast gave '" + id + "'");
  const std::vector<std::string> blobs =
      group->all_gather(std::string(static_cast<std::size_t>(rank) * 3, 'a' + rank));
  for (int r = 0; r < world; ++r)
    if (blobs.at(r) != std::string(static_cast<std::size_t>(r) * 3, 'a' + r))
      return fail(12, "all_gather");
  if (!reduce_matches<float>(*group, 1000)) return fail(13, "float mean differs");
  if (!reduce_matches<double>(*group, 777)) return fail(14, "double mean differs");
  if (!reduce_matches<float>(*group, 3'000'000)) return fail(15, "large float mean differs");
  if (!reduce_matches<float>(*group, 0)) return fail(16, "empty mean");
  group->barrier();
  group->finish();
  return 0;
}

}  // namespace

TEST_CASE(
    "dist: broadcast / all_gather / all_reduce_mean give every rank the same rank-order bits (2 "
    "and 3 ranks)") {
  for (int world : {2, 3}) {
    const auto outcomes = run_children(
        world, [world](int rank, int port) { return run_collectives(rank, world, port); });
    INFO(testing::describe(outcomes));
    for (const auto& outcome : outcomes) CHECK(outcome.code == 0);
  }
}

TEST_CASE("dist: the expected mean depends on the summation order (the bitwise check can fail)") {
  std::vector<float> reversed = rank_values<float>(2, 1000);
  for (int r = 1; r >= 0; --r) {
    const std::vector<float> part = rank_values<float>(r, 1000);
    for (std::size_t i = 0; i < reversed.size(); ++i) reversed[i] += part[i];
  }
  for (float& x : reversed) x /= 3.0f;
  CHECK(std::memcmp(reversed.data(), expected_mean<float>(3, 1000).data(), 1000 * sizeof(float)) !=
        0);
}

TEST_CASE("dist: a world of one opens no socket and its collectives are identities") {
  ProcessGroupOptions options;
  options.address = "no-such-host.invalid:1";
  const auto group = ProcessGroup::join(options);
  std::vector<float> data = rank_values<float>(0, 10);
  const std::vector<float> before = data;
  group->all_reduce_mean(std::span<float>(data));
  CHECK(data == before);
  CHECK(group->broadcast("x") == "x");
  CHECK(group->all_gather("y") == std::vector<std::string>{"y"});
  group->barrier();
  group->finish();
}

TEST_CASE("dist: bad options are kiln::Errors that say what is wrong") {
  ProcessGroupOptions options;
  options.world_size = 2;
  options.rank = 2;
  CHECK_THROWS_WITH_AS(ProcessGroup::join(options),
                       doctest::Contains("rank 2 is out of range for world size 2"), Error);
  options.rank = 0;
  options.world_size = 0;
  CHECK_THROWS_WITH_AS(ProcessGroup::join(options), doctest::Contains("world size is 0"), Error);
  options.world_size = 2;
  options.address = "localhost";
  CHECK_THROWS_WITH_AS(ProcessGroup::join(options), doctest::Contains("expected HOST:PORT"), Error);
  options.address = "localhost:70000";
  CHECK_THROWS_WITH_AS(ProcessGroup::join(options),
                       doctest::Contains("'70000' is not a number in 1..65535"), Error);
}

TEST_CASE(
    "dist: mismatched sizes or collectives throw kiln::Error on every rank and leave the group "
    "usable") {
  const auto outcomes = run_children(3, [](int rank, int port) {
    const auto group = ProcessGroup::join(test_options(rank, 3, port));
    std::vector<float> data(4 + (rank == 1 ? 1 : 0), 1.0f + rank);
    try {
      group->all_reduce_mean(std::span<float>(data));
      return fail(20, "no error for mismatched sizes");
    } catch (const Error& e) {
      if (!std::strstr(e.what(), "rank 1 passed 5 float32 elements, rank 0 passed 4"))
        return fail(21, e.what());
    }
    if (data[0] != 1.0f + rank) return fail(25, "a failed all_reduce_mean changed the data");
    try {
      if (rank == 2)
        group->broadcast("x");
      else
        group->barrier();
      return fail(22, "no error for mismatched collectives");
    } catch (const Error& e) {
      if (!std::strstr(e.what(), "rank 2 called broadcast while rank 0 called barrier"))
        return fail(23, e.what());
    }
    return reduce_matches<double>(*group, 100) ? (group->finish(), 0)
                                               : fail(24, "mean after the errors");
  });
  INFO(testing::describe(outcomes));
  for (const auto& outcome : outcomes) CHECK(outcome.code == 0);
}

TEST_CASE(
    "dist: joining fails within the connect timeout when nobody answers and names the address and "
    "missing ranks") {
  const int port = free_local_port();
  ProcessGroupOptions options = test_options(1, 3, port);
  options.connect_timeout = 500ms;
  auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(
      ProcessGroup::join(options),
      doctest::Contains(
          fmt::format("rank 1: cannot connect to rank 0 at '127.0.0.1:{}'", port).c_str()),
      Error);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(seconds >= 0.4);
  CHECK(seconds < 2.0);
  options.rank = 0;
  start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(
      ProcessGroup::join(options),
      doctest::Contains("timed out after 0.5 s waiting for rank(s) 1, 2 to connect"), Error);
  seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(seconds < 2.0);
}

TEST_CASE(
    "dist: a duplicate rank or a different world size is rejected on every rank with the reason") {
  // Children: rank 0, rank 1, rank 1 again.
  auto outcomes = run_children(3, [](int index, int port) {
    ProcessGroup::join(test_options(index == 0 ? 0 : 1, 3, port));
    return 0;
  });
  INFO(testing::describe(outcomes));
  for (const auto& outcome : outcomes) CHECK(outcome.code == 90);
  CHECK(outcomes[0].log.find("rank 1 connected twice: two processes were started with --rank 1") !=
        std::string::npos);
  CHECK((outcomes[1].log + outcomes[2].log).find("rank 1: rank 0 at '127.0.0.1:") !=
        std::string::npos);
  CHECK((outcomes[1].log + outcomes[2].log).find("refused the job: rank 1 connected twice") !=
        std::string::npos);

  outcomes = run_children(2, [](int rank, int port) {
    ProcessGroup::join(test_options(rank, rank == 0 ? 2 : 3, port));
    return 0;
  });
  INFO(testing::describe(outcomes));
  CHECK(outcomes[0].code == 90);
  CHECK(outcomes[1].code == 90);
  CHECK(outcomes[1].log.find(
            "refused the job: rank 1 was started with world size 3, rank 0 with 2") !=
        std::string::npos);
}

}  // namespace kiln::dist
