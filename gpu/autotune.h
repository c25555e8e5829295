// Autotuning: where several kernels compute the same result for one problem (the tiles of a
// convolution pass, say), each is timed once on the device and the fastest is kept; the
// decision lives in the kernel cache's directory (gpu/tuning_record.h), so a warm start times
// nothing. Callers keep a default of their own for when tuning is off (KILN_AUTOTUNE=0).
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "gpu/cuda_runtime.h"
#include "gpu/tuning_record.h"

namespace kiln::gpu {

// False when KILN_AUTOTUNE=0 (read once): callers then take their defaults and time nothing.
bool autotune_enabled();

// Whether a problem whose operands take `bytes` is timed with the L2 overwritten before each run
// (the operands then come from memory, as a step's large ones do) or warm (left in the L2 by the
// run before, as a step's small ones are, fresh from the kernel that wrote them):
// KILN_AUTOTUNE_L2=flush or warm, else (auto) flushed where the operands pass half the L2.
// Callers name the choice in the problem (l2_state), so decisions of either kind are kept apart.
bool autotune_flushes_l2(std::size_t bytes);
inline const char* l2_state(bool flush) { return flush ? "l2-cold" : "l2-warm"; }

// The decision for `problem` among `candidates` (labels without spaces): the table's (memory,
// then disk) if it has one, else each candidate timed now on a stream of the tuner's own and the
// fastest stored. launch(i, stream) runs candidate i once on `stream`; each gets a warm-up run,
// then the median of 7 runs, each after the L2 cache is overwritten where flush_l2. A candidate
// whose warm-up throws kiln::Error is left out (time -1); if all fail, the first error is
// thrown. Must not be called while a stream is being captured. Thread-safe (one tuning at a time).
TuningRecord autotune(const std::string& problem, const std::vector<std::string>& candidates,
                      const std::function<void(std::size_t, Stream)>& launch, bool flush_l2);
// The table's decision, timing nothing.
std::optional<TuningRecord> find_tuning(const std::string& problem,
                                        const std::vector<std::string>& candidates);
// Every decision this process found or made, in order of first use (dump shows them).
std::vector<TuningRecord> tuning_decisions();

}  // namespace kiln::gpu
