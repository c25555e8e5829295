// The OpenMP wait policy of kiln's executables (tools/openmp_defaults.h), checked in a process
// that starts like them. `openmp_defaults_probe default`: with neither OMP_WAIT_POLICY nor
// GOMP_SPINCOUNT set, GOMP_SPINCOUNT=10000 is set and libgomp took it: an idle worker sleeps
// within about a millisecond (libgomp's own default spins 5-10 ms). `openmp_defaults_probe
// kept`: the user's OMP_WAIT_POLICY stays and no spin count is added. Exit 0 when it holds.
#include <omp.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "tools/openmp_defaults.h"

namespace {

double thread_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
}

// The CPU time a worker thread spends between two parallel regions 100 ms apart: its spin.
double idle_worker_cpu_ms() {
  omp_set_num_threads(2);
  double end_first = 0, start_second = 0;
#pragma omp parallel
  if (omp_get_thread_num() == 1) end_first = thread_cpu_ms();
  usleep(100000);
#pragma omp parallel
  if (omp_get_thread_num() == 1) start_second = thread_cpu_ms();
  return start_second - end_first;
}

}  // namespace

int main(int, char** argv) {
  kiln::tools::use_openmp_defaults(argv);
  const char* mode = argv[1] != nullptr ? argv[1] : "";
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const double idle_ms = idle_worker_cpu_ms();
  std::printf(
      "GOMP_SPINCOUNT=%s OMP_WAIT_POLICY=%s; an idle worker used %.3f ms of CPU in 100 ms\n",
      spin != nullptr ? spin : "(unset)", policy != nullptr ? policy : "(unset)", idle_ms);
  if (std::strcmp(mode, "default") == 0) {
    if (spin == nullptr || std::strcmp(spin, "10000") != 0 || policy != nullptr) {
      std::printf("expected GOMP_SPINCOUNT=10000 and no OMP_WAIT_POLICY\n");
      return 1;
    }
    // 10,000 rounds take about 0.2 ms (18 ns a round on the build machine), 300,000 about 5.
    if (idle_ms > 2.5) {
      std::printf("the idle worker spun %.3f ms: libgomp did not take the spin count\n", idle_ms);
      return 1;
    }
    return 0;
  }
  if (std::strcmp(mode, "kept") == 0) {
    if (spin != nullptr || policy == nullptr) {
      std::printf("expected the user's OMP_WAIT_POLICY and no GOMP_SPINCOUNT\n");
      return 1;
    }
    return 0;
  }
  std::printf("usage: openmp_defaults_probe default|kept\n");
  return 1;
}
