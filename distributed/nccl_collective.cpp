// The NCCL collective: rank 0's unique id reaches the others through the ProcessGroup, each
// rank opens its communicator on its current device, and a bucket of gradients is one
// ncclGroupStart/End of ncclAllReduce(ncclAvg) calls on the stream it is given.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "distributed/collectives.h"

namespace kiln::dist {
namespace {

void check_nccl(ncclResult_t result, ncclComm_t comm, const char* what) {
  if (result == ncclSuccess) return;
  const char* detail = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  throw Error(fmt::format("NCCL {} failed: {}{}{}", what, ncclGetErrorString(result),
                          detail && *detail ? ": " : "", detail ? detail : ""));
}

// bf16 and f16 buffers are averaged by NCCL in their own type (its ring rounds each partial
// sum, unlike the CPU's f32 mean, which rounds once).
ncclDataType_t nccl_type(DType dtype) {
  if (dtype == DType::f32) return ncclFloat32;
  if (dtype == DType::f64) return ncclFloat64;
  if (dtype == DType::bf16) return ncclBfloat16;
  if (dtype == DType::f16) return ncclFloat16;
  throw Error(fmt::format("all_reduce_mean: NCCL cannot average {} buffers", dtype_name(dtype)));
}

// The communicator, shared with the ProcessGroup's failure hook, which may outlive the
// collective: the hook aborts it (unblocking any NCCL call), the collective destroys it.
struct Communicator {
  std::mutex mutex;
  ncclComm_t comm = nullptr;
  void abort() {
    std::lock_guard lock(mutex);
    if (comm != nullptr) ncclCommAbort(comm);
    comm = nullptr;
  }
};

class NcclCollective final : public Collective {
 public:
  explicit NcclCollective(ProcessGroup& group)
      : group_(group),
        host_(make_host_collective(group)),
        state_(std::make_shared<Communicator>()) {
    setenv("NCCL_NVLS_ENABLE", "0",
           1);  // NVLink multicast stays off (the device machines require it)
    ncclUniqueId id{};
    if (group.rank() == 0) check_nccl(ncclGetUniqueId(&id), nullptr, "ncclGetUniqueId");
    const std::string blob = group.broadcast(std::string(id.internal, sizeof id.internal));
    KILN_ASSERT(blob.size() == sizeof id.internal, "NCCL id of {} bytes", blob.size());
    std::memcpy(id.internal, blob.data(), sizeof id.internal);
    check_nccl(ncclCommInitRank(&comm_, group.world_size(), id, group.rank()), nullptr,
               "ncclCommInitRank");
    state_->comm = comm_;
    group.on_peer_failure(
        [state = state_](const std::string&) {  // the process exits after this: at most 3 s
          auto done = std::make_shared<std::atomic<bool>>(false);
          std::thread([state, done] {
            state->abort();
            *done = true;
          }).detach();
          for (int i = 0; i < 30 && !*done; ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        });
    int device = 0;
    cudaGetDevice(&device);
    log().info("rank {}: NCCL communicator of {} ranks on CUDA device {}", group.rank(),
               group.world_size(), device);
  }
  ~NcclCollective() override {
    std::lock_guard lock(state_->mutex);
    if (state_->comm != nullptr) ncclCommDestroy(state_->comm);
    state_->comm = nullptr;
  }

  int rank() const override { return group_.rank(); }
  int world_size() const override { return group_.world_size(); }
  void all_reduce_mean_host(std::span<Tensor> tensors) override {
    host_->all_reduce_mean_host(tensors);
  }
  void all_reduce_mean_device(std::span<const DeviceBuffer> buffers, void* stream) override {
    check_nccl(ncclGroupStart(), comm_, "ncclGroupStart");
    for (const DeviceBuffer& b : buffers)
      check_nccl(ncclAllReduce(b.in, b.out, static_cast<std::size_t>(b.count), nccl_type(b.dtype),
                               ncclAvg, comm_, static_cast<cudaStream_t>(stream)),
                 comm_, "ncclAllReduce");
    check_nccl(ncclGroupEnd(), comm_, "ncclGroupEnd");
  }

 private:
  ProcessGroup& group_;
  std::shared_ptr<Collective> host_;
  std::shared_ptr<Communicator> state_;
  ncclComm_t comm_ = nullptr;  // the calls' handle (the state's copy is the one the hook aborts)
};

}  // namespace

bool have_nccl() { return true; }

std::shared_ptr<Collective> make_nccl_collective(ProcessGroup& group) {
  return std::make_shared<NcclCollective>(group);
}

}  // namespace kiln::dist
