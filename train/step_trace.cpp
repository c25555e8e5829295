// StepTrace: the programs' trace files (backends/trace_writer.h) merged with nlohmann::json.
#include "train/step_trace.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"

namespace kiln {
namespace {

nlohmann::json read_part(const std::string& part) {
  std::ifstream in(part);
  KILN_CHECK(in.good(), "{}: the step's trace was not written", part);
  try {
    return nlohmann::json::parse(in).at("traceEvents");
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: not a trace ({})", part, e.what()));
  }
}

}  // namespace

StepTrace::StepTrace(const std::string& path, const std::vector<StepProgram>& programs)
    : path_(path) {
  for (std::size_t i = 0; i < programs.size(); ++i) {
    names_.push_back(programs[i].name);
    parts_.push_back(programs.size() == 1 ? path : fmt::format("{}.part{}", path, i));
    programs[i].program->trace_next_run(parts_.back());
  }
}

void StepTrace::finish() {
  if (parts_.size() == 1) return;  // the one program wrote the trace itself
  nlohmann::json events = nlohmann::json::array();
  double offset_us = 0;  // each program starts where the previous one ended
  for (std::size_t i = 0; i < parts_.size(); ++i) {
    double end_us = 0;
    for (nlohmann::json event : read_part(parts_[i])) {
      event["pid"] = static_cast<int>(i);
      if (event.value("name", "") == "process_name") event["args"]["name"] = names_[i];
      if (event.contains("ts")) {
        end_us = std::max(end_us, event["ts"].get<double>() + event.value("dur", 0.0));
        event["ts"] = event["ts"].get<double>() + offset_us;
      }
      events.push_back(std::move(event));
    }
    offset_us += end_us;
    std::filesystem::remove(parts_[i]);
  }
  const std::string text =
      nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ns"}}.dump(1) + "\n";
  write_file_atomically(path_,
                        std::span(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
}

}  // namespace kiln
