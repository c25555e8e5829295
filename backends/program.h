// A compiled step: run(feeds) -> outputs, updating variables in place.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace kiln {

// One input of a run, by the input's name (or by the Value the input was created as).
struct Feed {
  Feed(std::string input_name, Tensor t) : name(std::move(input_name)), tensor(std::move(t)) {}
  Feed(Value input, Tensor t);
  std::string name;
  Tensor tensor;
};

using Outputs = std::map<std::string, Tensor>;

// A run queued on the device (Program::enqueue): wait() blocks until the step has finished
// and returns its outputs. Copies share one run; complete() finishes it without taking the
// outputs (the program does so before it queues its next run).
class PendingRun {
 public:
  PendingRun() = default;
  explicit PendingRun(Outputs done) : state_(std::make_shared<State>()) {
    state_->outputs = std::move(done);
  }
  explicit PendingRun(std::function<Outputs()> finish) : state_(std::make_shared<State>()) {
    state_->finish = std::move(finish);
  }
  bool valid() const { return state_ != nullptr; }
  void complete() {
    if (!state_ || state_->outputs) return;
    const std::function<Outputs()> finish = std::move(state_->finish);
    state_->outputs.emplace();  // a finish that throws is not retried
    *state_->outputs = finish();
  }
  Outputs wait() {
    complete();
    return std::move(*state_->outputs);  // once: a second wait gets empty tensors
  }

 private:
  struct State {
    std::function<Outputs()> finish;
    std::optional<Outputs> outputs;
  };
  std::shared_ptr<State> state_;
};

class Program {
 public:
  virtual ~Program() = default;
  // Runs the step. Every input of the graph must be fed, with its exact shape and dtype;
  // outputs are fresh tensors the caller owns; assigned variables are overwritten.
  virtual Outputs run(const std::vector<Feed>& feeds) = 0;
  // Queues the same run and returns before it finishes where the backend can (CUDA): runs
  // queued on one device, by any programs, execute in the order they were queued, so a step
  // queued after another sees its updates, and the host waits once for several. The feeds
  // may change as soon as this returns; the program must outlive the wait. A program's
  // next enqueue or run completes its pending one first. The CPU runs at once.
  virtual PendingRun enqueue(const std::vector<Feed>& feeds) { return PendingRun(run(feeds)); }
  // The graph as compiled (after all passes).
  virtual const Graph& graph() const = 0;
  virtual Device device() const = 0;
  // Bytes of the buffers the memory plan reuses across nodes.
  virtual std::size_t planned_bytes() const = 0;
  // The next run writes a Chrome/Perfetto trace (JSON) of its kernels, per stream, to `path`.
  virtual void trace_next_run(const std::string& path) = 0;
  // Announces the feeds of the run after the next: the next run copies them to the device
  // while it computes (CUDA), and the run given these same tensors then starts at once. The
  // tensors must not change until that run. Backends with nothing to overlap ignore it.
  virtual void prefetch(const std::vector<Feed>& next) { (void)next; }
  // Device time of the last run's step in milliseconds, measured with events around the
  // kernels (input copies and output reads excluded); negative where not measured (CPU).
  virtual double last_step_device_ms() const { return -1; }
};

}  // namespace kiln
