// The OpenMP wait policy of kiln's executables that train (trainer, bench).
#pragma once

namespace kiln::tools {

// Between parallel regions libgomp's idle threads spin 300,000 rounds by default (5-10 ms)
// before they sleep, taking cores from other processes while the trainer waits; with
// OMP_WAIT_POLICY=passive they sleep at once, and waking them costs a futex call at each of the
// several hundred parallel regions of a CPU step. kiln's default is a bounded spin, 10,000
// rounds (about 0.2 ms), then sleep: most of the spin's gain (bench/README.md). libgomp reads
// GOMP_SPINCOUNT only when it loads, before main, so when the user set neither variable this
// sets it and executes the program again (/proc/self/exe, the same arguments and process id);
// if that fails the program goes on with libgomp's default. Call first in main.
void use_openmp_defaults(char** argv);

}  // namespace kiln::tools
