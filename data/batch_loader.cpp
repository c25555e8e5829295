// BatchLoader: a queue of batch indices, worker threads that fill them, slots by index.
#include "data/batch_loader.h"

#include <algorithm>
#include <chrono>

namespace kiln {

LoaderOptions resolved_loader_options(LoaderOptions o) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (o.threads <= 0) o.threads = std::clamp(cores / 4, 1, 8);
  if (o.depth <= 0) o.depth = 2 * o.threads;
  return o;
}

BatchLoader::BatchLoader(Batcher& batcher, const Shape& batch_images, LoaderOptions options)
    : batcher_(batcher), batch_images_(batch_images), options_(resolved_loader_options(options)) {
  for (int t = 0; t < options_.threads; ++t) workers_.emplace_back([this] { work(); });
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    queue_.clear();
  }
  work_ready_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void BatchLoader::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    const std::int64_t index = queue_.front();
    queue_.pop_front();
    ++busy_;
    Tensor images = Tensor::empty(batch_images_, DType::f32);
    Tensor labels = Tensor::empty({batch_images_[0]}, DType::i64);
    lock.unlock();
    std::string error;
    try {
      batcher_.fill(index, images, labels);
    } catch (const std::exception& e) {
      error = e.what();
    }
    lock.lock();
    --busy_;
    Slot& slot = slots_[index];
    slot = {std::move(images), std::move(labels), true, std::move(error)};
    slot_done_.notify_all();
  }
}

// Queues the indices after the last queued one through `last` (within the epoch).
void BatchLoader::queue_through(std::int64_t last) {
  last = std::min(last, batcher_.batches_per_epoch() - 1);
  for (std::int64_t i = queued_through_ + 1; i <= last; ++i) {
    slots_[i];
    queue_.push_back(i);
  }
  queued_through_ = std::max(queued_through_, last);
  work_ready_.notify_all();
}

// Waits until no worker reads the batcher, then forgets every batch.
void BatchLoader::drain(std::unique_lock<std::mutex>& lock) {
  queue_.clear();
  slot_done_.wait(lock, [&] { return busy_ == 0; });
  slots_.clear();
  queued_through_ = -1;
}

void BatchLoader::start_epoch(std::int64_t epoch) {
  std::unique_lock<std::mutex> lock(mutex_);
  drain(lock);
  batcher_.start_epoch(epoch);
}

BatchLoader::Batch BatchLoader::take(std::int64_t index) {
  KILN_CHECK(index >= 0 && index < batcher_.batches_per_epoch(),
             "batch {} is outside the epoch's {} batches", index, batcher_.batches_per_epoch());
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  if (slots_.count(index) == 0) {  // not queued: a jump (a resumed epoch), or behind us
    drain(lock);
    queued_through_ = index - 1;
  }
  queue_through(index + options_.depth);
  slot_done_.wait(lock, [&] { return slots_[index].done; });
  Slot slot = std::move(slots_[index]);
  slots_.erase(index);
  for (auto it = slots_.begin(); it != slots_.end() && it->first < index;)  // skipped ones
    it = it->second.done ? slots_.erase(it) : std::next(it);
  lock.unlock();
  KILN_CHECK(slot.error.empty(), "{}", slot.error);
  return {std::move(slot.images), std::move(slot.labels),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
}

}  // namespace kiln
