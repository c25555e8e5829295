// A compiled step: run(feeds) -> outputs, updating variables in place.
#pragma once

#include <map>
#include <memory>
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

class Program {
 public:
  virtual ~Program() = default;
  // Runs the step. Every input of the graph must be fed, with its exact shape and dtype;
  // outputs are fresh tensors the caller owns; assigned variables are overwritten.
  virtual Outputs run(const std::vector<Feed>& feeds) = 0;
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
