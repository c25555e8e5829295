// Autotuning decisions as the kernel cache keeps them (gpu/autotune.h times the candidates):
// for one problem (a convolution pass's shape, say) and its candidate kernels, which was the
// fastest on this architecture and driver, with each one's time. Kept in memory and as an
// entry of the kernel cache's directory, keyed like a kernel, so a warm start times nothing and
// `kiln-cache list|show|export` carry the decisions with the kernels.
#pragma once

#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "gpu/disk_cache.h"
#include "gpu/sha256.h"

namespace kiln::gpu {

struct TuningRecord {
  std::string problem;                  // "conv_nhwc fwd bf16 m64 n131072 k576 ..."
  std::vector<std::string> candidates;  // labels, in the tuner's order
  std::vector<double> us;               // each candidate's median microseconds; < 0: failed
  int chosen = 0;                       // the fastest, an index into candidates
  bool from_disk = false;               // read from the cache directory, not timed here
  const std::string& choice() const { return candidates.at(static_cast<std::size_t>(chosen)); }
};

// The record's key: the problem, the candidates in order, the architecture and the driver (a
// new driver or another GPU times again).
Digest tuning_key(const std::string& problem, const std::vector<std::string>& candidates, int sm,
                  int driver);
// The stored text: "kiln-tuning 1\nproblem ...\nchosen LABEL\nLABEL US\n..." and back; nullopt
// when the text is not a whole record of exactly these candidates.
std::string encode_tuning(const TuningRecord& record);
std::optional<TuningRecord> decode_tuning(const std::string& text, const std::string& problem,
                                          const std::vector<std::string>& candidates);

// Records in memory, then on disk in `dir` (entry files beside the kernels; no directory:
// memory only). Thread-safe.
class TuningTable {
 public:
  explicit TuningTable(std::filesystem::path dir);
  // The record of `problem` over `candidates` on (sm, driver), if known.
  std::optional<TuningRecord> find(const std::string& problem,
                                   const std::vector<std::string>& candidates, int sm, int driver);
  // Keeps `record` (in memory, and on disk with its side file for kiln-cache).
  void store(const TuningRecord& record, int sm, int driver);
  // Every record found or stored by this table, in order of first use.
  std::vector<TuningRecord> used() const;

 private:
  DiskCache disk_;
  mutable std::mutex mutex_;
  std::map<Digest, TuningRecord> memory_;
  std::vector<Digest> order_;
};

}  // namespace kiln::gpu
