// Trace JSON through nlohmann::json, written atomically (core/atomic_file.h).
#include "backends/trace_writer.h"

#include <nlohmann/json.hpp>
#include <set>

#include "core/atomic_file.h"
#include "core/error.h"

namespace kiln {

void write_trace(const std::string& path, const std::vector<TraceEvent>& events,
                 const std::string& process_name) {
  nlohmann::json list = nlohmann::json::array();
  list.push_back(
      {{"name", "process_name"}, {"ph", "M"}, {"pid", 0}, {"args", {{"name", process_name}}}});
  std::set<int> tracks;
  for (const TraceEvent& e : events) tracks.insert(e.track);
  for (int t : tracks)
    list.push_back({{"name", "thread_name"},
                    {"ph", "M"},
                    {"pid", 0},
                    {"tid", t},
                    {"args", {{"name", "stream " + std::to_string(t)}}}});
  for (const TraceEvent& e : events) {
    nlohmann::json event = {{"name", e.name}, {"ph", "X"},        {"pid", 0},
                            {"tid", e.track}, {"ts", e.start_us}, {"dur", e.duration_us}};
    if (e.node >= 0) {
      event["args"] = {{"node", e.node}};
      if (e.flops > 0) event["args"]["flops"] = e.flops;
      if (e.bytes > 0) event["args"]["bytes"] = e.bytes;
    }
    list.push_back(std::move(event));
  }
  const std::string text =
      nlohmann::json{{"traceEvents", list}, {"displayTimeUnit", "ns"}}.dump(1) + "\n";
  write_file_atomically(path,
                        std::span(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
}

}  // namespace kiln
