// A loader that runs ahead: worker threads fill (decode, augment) the next batches of an
// epoch while the step runs, so the step's thread only waits when the workers fall behind.
// A batch's content is the batcher's for its index alone, so it does not depend on the
// number of threads, the depth, or the order in which the workers finish.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "data/dataset.h"

namespace kiln {

struct LoaderOptions {
  int threads = 0;  // worker threads; 0: the default from the core count, below
  int depth = 0;    // batches filled ahead of the one taken; 0: 2 per thread
};

// The defaults: a quarter of the cores (at least 1, at most 8) and 2 batches per thread.
LoaderOptions resolved_loader_options(LoaderOptions options);

class BatchLoader {
 public:
  // Fills batches of `batcher` (which it starts epochs of) as images f32 [B, example...]
  // and labels i64 [B].
  BatchLoader(Batcher& batcher, const Shape& batch_images, LoaderOptions options);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // Drops the batches filled ahead and starts epoch `epoch` of the batcher.
  void start_epoch(std::int64_t epoch);
  // Batch `index` of the epoch (fresh tensors), waiting until it is filled; the following
  // `depth` batches are queued behind it. Indices beyond the epoch are an error.
  struct Batch {
    Tensor images, labels;
    double wait_seconds = 0;  // how long this call waited for the workers
  };
  Batch take(std::int64_t index);
  const LoaderOptions& options() const { return options_; }

 private:
  struct Slot {
    Tensor images, labels;
    bool done = false;
    std::string error;  // a worker's kiln::Error, rethrown by take
  };
  void work();
  void queue_through(std::int64_t last);
  void drain(std::unique_lock<std::mutex>& lock);

  Batcher& batcher_;
  Shape batch_images_;
  LoaderOptions options_;
  std::mutex mutex_;
  std::condition_variable work_ready_, slot_done_;
  std::deque<std::int64_t> queue_;      // indices waiting for a worker
  std::map<std::int64_t, Slot> slots_;  // queued, in progress or filled, by index
  std::int64_t queued_through_ = -1;    // the last index queued this epoch
  std::int64_t busy_ = 0;               // workers filling a batch now
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace kiln
