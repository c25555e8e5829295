// Host tensors averaged through the ProcessGroup: each dtype's tensors packed into one
// buffer, so a bucket is one exchange whatever its tensor count.
#include <cstring>
#include <vector>

#include "core/error.h"
#include "distributed/collectives.h"

namespace kiln::dist {
namespace {

template <class T>
void average_packed(ProcessGroup& group, std::span<Tensor> tensors, DType dtype) {
  std::vector<T> packed;
  for (const Tensor& t : tensors)
    if (t.dtype() == dtype) packed.insert(packed.end(), t.data<T>(), t.data<T>() + t.numel());
  if (packed.empty()) return;
  group.all_reduce_mean(std::span<T>(packed));
  std::size_t at = 0;
  for (Tensor& t : tensors) {
    if (t.dtype() != dtype) continue;
    std::memcpy(t.data<T>(), packed.data() + at, static_cast<std::size_t>(t.numel()) * sizeof(T));
    at += static_cast<std::size_t>(t.numel());
  }
}

class HostCollective final : public Collective {
 public:
  explicit HostCollective(ProcessGroup& group) : group_(group) {}
  int rank() const override { return group_.rank(); }
  int world_size() const override { return group_.world_size(); }
  void all_reduce_mean_host(std::span<Tensor> tensors) override {
    for (const Tensor& t : tensors)
      KILN_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64,
                 "all_reduce_mean: {} tensors cannot be averaged", dtype_name(t.dtype()));
    average_packed<float>(group_, tensors, DType::f32);
    average_packed<double>(group_, tensors, DType::f64);
  }
  void all_reduce_mean_device(std::span<const DeviceBuffer>, void*) override {
    throw Error(
        "all_reduce_mean: this job's ranks train on the CPU (TCP); its steps cannot run on a GPU");
  }

 private:
  ProcessGroup& group_;
};

}  // namespace

std::shared_ptr<Collective> make_host_collective(ProcessGroup& group) {
  return std::make_shared<HostCollective>(group);
}

}  // namespace kiln::dist
