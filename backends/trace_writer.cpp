// Trace JSON through nlohmann::json, written to a temp file and renamed into place.
#include "backends/trace_writer.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

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
  for (const TraceEvent& e : events)
    list.push_back({{"name", e.name},
                    {"ph", "X"},
                    {"pid", 0},
                    {"tid", e.track},
                    {"ts", e.start_us},
                    {"dur", e.duration_us}});
  const std::string temp = path + ".tmp";
  {
    std::ofstream out(temp);
    KILN_CHECK(out.good(), "{}: cannot write the trace", path);
    out << nlohmann::json{{"traceEvents", list}, {"displayTimeUnit", "ns"}}.dump(1) << "\n";
    KILN_CHECK(out.good(), "{}: writing the trace failed", path);
  }
  KILN_CHECK(std::rename(temp.c_str(), path.c_str()) == 0, "{}: cannot move the trace into place",
             path);
}

}  // namespace kiln
