// Joining a job, its collective, and the replica check.
#include "distributed/data_parallel.h"

#include <cstring>

#ifdef KILN_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "backends/host_copy.h"
#include "core/error.h"
#include "core/log.h"
#include "distributed/collectives.h"

namespace kiln::dist {
namespace {

// Rank r of a host with several visible GPUs takes GPU r % count (the local launcher shows
// each rank only its own GPU, so there it is always GPU 0).
void pick_gpu(int rank) {
#ifdef KILN_HAVE_CUDA
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  KILN_CHECK(status == cudaSuccess && count > 0,
             "rank {}: no CUDA device for data-parallel training on the GPU: {}", rank,
             status == cudaSuccess ? "none visible" : cudaGetErrorString(status));
  KILN_CHECK(cudaSetDevice(rank % count) == cudaSuccess, "rank {}: cannot use CUDA device {}", rank,
             rank % count);
#else
  throw Error(
      fmt::format("rank {}: data-parallel training on the GPU needs a kiln built with CUDA", rank));
#endif
}

std::string pack_checksums(const std::vector<VariablePtr>& vars) {
  std::string packed;
  for (const VariablePtr& v : vars) {
    const std::uint64_t sum = tensor_checksum(v->value);
    packed.append(reinterpret_cast<const char*>(&sum), sizeof sum);
  }
  return packed;
}

std::uint64_t checksum_at(const std::string& packed, std::size_t i) {
  std::uint64_t sum = 0;
  std::memcpy(&sum, packed.data() + i * sizeof sum, sizeof sum);
  return sum;
}

}  // namespace

std::uint64_t tensor_checksum(const Tensor& t) {
  const Tensor host = t.device().is_cpu() ? t : to_host(t);
  const auto* bytes = static_cast<const unsigned char*>(host.raw());
  const std::size_t n = host.nbytes();
  std::uint64_t h = 1469598103934665603ull;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {  // FNV-1a over 64-bit words, then the tail bytes
    std::uint64_t word = 0;
    std::memcpy(&word, bytes + i, 8);
    h = (h ^ word) * 1099511628211ull;
  }
  for (; i < n; ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  return h;
}

DataParallel::DataParallel(const ProcessGroupOptions& options, Device device) {
  if (!device.is_cpu()) pick_gpu(options.rank);
  group_ = ProcessGroup::join(options);
  std::shared_ptr<Collective> collective =
      device.is_cpu() ? make_host_collective(*group_) : make_nccl_collective(*group_);
  collective_id_ = register_collective(std::move(collective));
  log().info("rank {} of {} joined at {} ({})", rank(), world_size(), options.address,
             device.is_cpu() ? "CPU, TCP" : "GPU, NCCL");
}

DataParallel::~DataParallel() {
  if (collective_id_ >= 0) unregister_collective(collective_id_);
}

void DataParallel::check_replicas(const std::vector<VariablePtr>& vars, std::int64_t step) {
  const std::vector<std::string> all = group_->all_gather(pack_checksums(vars));
  for (std::size_t i = 0; i < vars.size(); ++i)
    for (std::size_t r = 1; r < all.size(); ++r) {
      KILN_CHECK(all[r].size() == all[0].size(),
                 "replica check at step {}: rank {} has {} variables but rank 0 has {}", step, r,
                 all[r].size() / 8, all[0].size() / 8);
      const std::uint64_t mine = checksum_at(all[r], i), first = checksum_at(all[0], i);
      KILN_CHECK(mine == first,
                 "replica check at step {}: '{}' differs between rank 0 (checksum {:016x}) and "
                 "rank {} ({:016x})",
                 step, vars[i]->name, first, r, mine);
    }
  log().debug("rank {}: replica check at step {}: {} variables identical", rank(), step,
              vars.size());
}

}  // namespace kiln::dist
