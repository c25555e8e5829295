// DataParallel: this process's place in a data-parallel job. It joins the ProcessGroup,
// opens the collective the steps average gradients through (NCCL on a GPU, TCP on the
// CPU), registers it for all_reduce_mean, and checks that the replicas stay identical.
#pragma once

#include <memory>
#include <vector>

#include "core/device.h"
#include "distributed/process_group.h"
#include "graph/graph.h"

namespace kiln::dist {

class DataParallel {
 public:
  // On a GPU, rank r of a host with several visible GPUs uses GPU r % count.
  DataParallel(const ProcessGroupOptions& options, Device device);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int rank() const { return group_->rank(); }
  int world_size() const { return group_->world_size(); }
  // The collective group id for TrainStepOptions::data_parallel_group.
  int collective_group() const { return collective_id_; }
  ProcessGroup& group() { return *group_; }

  // Compares a checksum of every variable's bytes across the ranks; on a difference, every
  // rank throws kiln::Error naming the first variable (in `vars` order) that differs, the
  // ranks and the step.
  void check_replicas(const std::vector<VariablePtr>& vars, std::int64_t step);
  // This rank failed: the others are told `message` (they end with it).
  void report_error(const std::string& message) { group_->report_error(message); }
  // The job ended normally on this rank (waits for the others).
  void finish() { group_->finish(); }

 private:
  std::unique_ptr<ProcessGroup> group_;
  int collective_id_ = -1;
};

// FNV-1a over a tensor's bytes as 64-bit words (a host copy where it lives on a GPU).
std::uint64_t tensor_checksum(const Tensor& t);

}  // namespace kiln::dist
