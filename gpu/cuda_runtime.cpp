// Device discovery and kernel loading/launching through the CUDA runtime's library
// management API (cudaLibraryLoadData, cudaLibraryGetKernel; CUDA 12+).
#include "gpu/cuda_runtime.h"

#include <atomic>
#include <utility>

#include "core/env_switch.h"
#include "core/error.h"
#include "core/log.h"
#include "gpu/cuda_check.h"

namespace kiln::gpu {
namespace {

const void* as_func(CUkern_st* kernel) { return static_cast<const void*>(kernel); }

dim3 to_dim3(Dim3 d) { return dim3(d.x, d.y, d.z); }

}  // namespace

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line,
                      const std::string& context) {
  (void)cudaGetLastError();  // clears a non-sticky error so that later checks do not see it again
  throw Error(fmt::format("{}{}CUDA error {} ({}) in `{}` at {}:{}", context,
                          context.empty() ? "" : ": ", cudaGetErrorName(status),
                          cudaGetErrorString(status), call, file, line));
}

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

std::string cuda_unavailable_reason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    return fmt::format("no CUDA driver/GPU: {} ({})", cudaGetErrorString(status),
                       cudaGetErrorName(status));
  }
  return count == 0 ? "no CUDA driver/GPU: the driver reports no CUDA device" : "";
}

namespace {
std::optional<PlanTarget>& assumed_target() {
  static std::optional<PlanTarget> target;
  return target;
}
}  // namespace

std::optional<PlanTarget> plan_target() {
  if (cuda_device_count() == 0) return assumed_target();
  int device = 0, sms = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return PlanTarget{current_target().sm, sms};
}

void assume_plan_target(int sm, int sms) { assumed_target() = PlanTarget{sm, sms}; }

JitTarget current_target() {
  KILN_CHECK(cuda_device_count() > 0, "current_target: {}", cuda_unavailable_reason());
  int device = 0, major = 0, minor = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return JitTarget{10 * major + minor};
}

namespace {
std::atomic<bool>& programmatic_switch() {
  static std::atomic<bool> on{env_switch_on("KILN_PROGRAMMATIC_LAUNCH")};
  return on;
}
}  // namespace

bool programmatic_launches() { return programmatic_switch().load(std::memory_order_relaxed); }
void set_programmatic_launches(bool on) { programmatic_switch().store(on); }

LoadedKernel::LoadedKernel(const std::vector<char>& cubin, const std::string& name,
                           bool after_prior_grids)
    : name_(name), after_prior_grids_(after_prior_grids && current_target().sm >= 90) {
  KILN_CHECK(!cubin.empty(), "cannot load kernel '{}': its CUBIN is empty", name);
  cudaLibrary_t library = nullptr;
  cudaError_t status =
      cudaLibraryLoadData(&library, cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
  if (status != cudaSuccess)
    throw_cuda_error(status, "cudaLibraryLoadData", __FILE__, __LINE__,
                     fmt::format("loading kernel '{}' from {} bytes of CUBIN", name, cubin.size()));
  library_ = library;
  cudaKernel_t kernel = nullptr;
  status = cudaLibraryGetKernel(&kernel, library, name.c_str());
  if (status != cudaSuccess) {
    unload();
    throw_cuda_error(
        status, "cudaLibraryGetKernel", __FILE__, __LINE__,
        fmt::format("kernel '{}' is not in its CUBIN (is it declared extern \"C\"?)", name));
  }
  kernel_ = kernel;
}

LoadedKernel::~LoadedKernel() { unload(); }

LoadedKernel::LoadedKernel(LoadedKernel&& other) noexcept
    : name_(std::move(other.name_)),
      after_prior_grids_(other.after_prior_grids_),
      library_(std::exchange(other.library_, nullptr)),
      kernel_(std::exchange(other.kernel_, nullptr)) {}

LoadedKernel& LoadedKernel::operator=(LoadedKernel&& other) noexcept {
  if (this == &other) return *this;
  unload();
  name_ = std::move(other.name_);
  after_prior_grids_ = other.after_prior_grids_;
  library_ = std::exchange(other.library_, nullptr);
  kernel_ = std::exchange(other.kernel_, nullptr);
  return *this;
}

void LoadedKernel::unload() noexcept {
  kernel_ = nullptr;
  if (library_ == nullptr) return;
  const cudaError_t status = cudaLibraryUnload(std::exchange(library_, nullptr));
  if (status == cudaSuccess || status == cudaErrorCudartUnloading) return;
  (void)cudaGetLastError();
  try {
    log().warn("unloading kernel '{}': {} ({})", name_, cudaGetErrorName(status),
               cudaGetErrorString(status));
  } catch (...) {  // logging must not take down a destructor
  }
}

bool LoadedKernel::programmatic() const { return after_prior_grids_ && programmatic_launches(); }

void LoadedKernel::launch(Dim3 grid, Dim3 block, std::size_t shared_bytes, Stream stream,
                          void** args) const {
  KILN_CHECK(kernel_ != nullptr, "launch of kernel '{}', which was moved from", name_);
  if (programmatic()) {
    launch_with(grid, block, shared_bytes, stream, args, nullptr, "programmatic");
    return;
  }
  const cudaError_t status =
      cudaLaunchKernel(as_func(kernel_), to_dim3(grid), to_dim3(block), args, shared_bytes, stream);
  if (status != cudaSuccess)
    throw_cuda_error(
        status, "cudaLaunchKernel", __FILE__, __LINE__,
        fmt::format(
            "launching kernel '{}' with grid [{}, {}, {}], block [{}, {}, {}] and {} bytes of "
            "dynamic shared memory",
            name_, grid.x, grid.y, grid.z, block.x, block.y, block.z, shared_bytes));
}

void LoadedKernel::launch_with(Dim3 grid, Dim3 block, std::size_t shared_bytes, Stream stream,
                               void** args, const cudaLaunchAttribute_st* attribute,
                               const char* what) const {
  KILN_CHECK(kernel_ != nullptr, "launch of kernel '{}', which was moved from", name_);
  cudaLaunchConfig_t config{};
  config.gridDim = to_dim3(grid);
  config.blockDim = to_dim3(block);
  config.dynamicSmemBytes = shared_bytes;
  config.stream = static_cast<cudaStream_t>(stream);
  cudaLaunchAttribute attributes[2]{};
  unsigned count = 0;
  if (attribute != nullptr) attributes[count++] = *attribute;
  if (programmatic() && (attribute == nullptr || attribute->id != cudaLaunchAttributeCooperative)) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  config.attrs = attributes;
  config.numAttrs = count;
  const cudaError_t status = cudaLaunchKernelExC(&config, as_func(kernel_), args);
  if (status != cudaSuccess)
    throw_cuda_error(
        status, fmt::format("cudaLaunchKernelExC ({})", what).c_str(), __FILE__, __LINE__,
        fmt::format(
            "launching kernel '{}' with grid [{}, {}, {}], block [{}, {}, {}] and {} bytes of "
            "dynamic shared memory",
            name_, grid.x, grid.y, grid.z, block.x, block.y, block.z, shared_bytes));
}

void LoadedKernel::launch_cooperative(Dim3 grid, Dim3 block, std::size_t shared_bytes,
                                      Stream stream, void** args) const {
  cudaLaunchAttribute cooperative{};
  cooperative.id = cudaLaunchAttributeCooperative;
  cooperative.val.cooperative = 1;
  launch_with(grid, block, shared_bytes, stream, args, &cooperative, "cooperative");
}

void LoadedKernel::launch_clusters(Dim3 grid, Dim3 block, std::size_t shared_bytes, Stream stream,
                                   void** args, unsigned cluster_x) const {
  KILN_CHECK(cluster_x >= 1 && grid.x % cluster_x == 0,
             "kernel '{}': a grid of {} blocks is not whole clusters of {}", name_, grid.x,
             cluster_x);
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = cluster_x;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  launch_with(grid, block, shared_bytes, stream, args, &cluster, "clusters");
}

void LoadedKernel::set_max_dynamic_shared_bytes(int bytes) {
  KILN_CHECK(kernel_ != nullptr, "kernel '{}' was moved from", name_);
  KILN_CUDA_CHECK(
      cudaFuncSetAttribute(as_func(kernel_), cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

int LoadedKernel::max_active_blocks_per_sm(int block_size, std::size_t shared_bytes) const {
  KILN_CHECK(kernel_ != nullptr, "kernel '{}' was moved from", name_);
  int blocks = 0;
  KILN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, as_func(kernel_),
                                                                block_size, shared_bytes));
  return blocks;
}

KernelAttributes LoadedKernel::attributes() const {
  KILN_CHECK(kernel_ != nullptr, "kernel '{}' was moved from", name_);
  cudaFuncAttributes a{};
  KILN_CUDA_CHECK(cudaFuncGetAttributes(&a, as_func(kernel_)));
  return {.registers_per_thread = a.numRegs,
          .local_bytes_per_thread = a.localSizeBytes,
          .static_shared_bytes = a.sharedSizeBytes,
          .const_bytes = a.constSizeBytes,
          .max_threads_per_block = a.maxThreadsPerBlock,
          .max_dynamic_shared_bytes = a.maxDynamicSharedSizeBytes,
          .binary_version = a.binaryVersion};
}

}  // namespace kiln::gpu
