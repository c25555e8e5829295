// Chrome/Perfetto trace files (the JSON "traceEvents" format): one complete event per
// kernel, one track per stream; chrome://tracing and ui.perfetto.dev open them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

struct TraceEvent {
  std::string name;
  int track = 0;        // the stream (or thread)
  double start_us = 0;  // from the start of the step
  double duration_us = 0;
  std::int32_t node = -1;  // the graph's node (args "node"); -1: none (a variable update)
  double flops = 0;        // its floating-point operations (args "flops"; Graph::node_flops)
  double bytes = 0;        // its operands' bytes (args "bytes"; Graph::node_bytes)
};

// Writes the events; kiln::Error naming the file if it cannot be written.
void write_trace(const std::string& path, const std::vector<TraceEvent>& events,
                 const std::string& process_name);

}  // namespace kiln
