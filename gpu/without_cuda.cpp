// kiln_gpu when kiln is built without the CUDA toolkit: the same API, where everything that
// needs NVRTC or a GPU throws kiln::Error and cuda_device_count() is 0.
#include "core/error.h"
#include "gpu/autotune.h"
#include "gpu/cuda_runtime.h"
#include "gpu/nvrtc_compiler.h"

namespace kiln::gpu {
namespace {

constexpr const char* kNoCuda = "kiln was built without the CUDA toolkit (KILN_HAVE_CUDA is off)";

[[noreturn]] void throw_no_cuda(const std::string& what) {
  throw Error(fmt::format("{}: {}", what, kNoCuda));
}

}  // namespace

std::vector<char> compile_to_cubin(const KernelSource& src, const JitTarget&) {
  throw_no_cuda(fmt::format("cannot compile kernel '{}'", src.name));
}
std::string nvrtc_version() { throw_no_cuda("no NVRTC"); }

int cuda_device_count() { return 0; }
std::string cuda_unavailable_reason() { return kNoCuda; }
JitTarget current_target() { throw_no_cuda("no CUDA device"); }

namespace {
std::optional<PlanTarget>& assumed_target() {
  static std::optional<PlanTarget> target;
  return target;
}
}  // namespace
std::optional<PlanTarget> plan_target() { return assumed_target(); }
void assume_plan_target(int sm, int sms) { assumed_target() = PlanTarget{sm, sms}; }

bool autotune_enabled() { return false; }
bool autotune_flushes_l2(std::size_t) { return true; }
TuningRecord autotune(const std::string& problem, const std::vector<std::string>&,
                      const std::function<void(std::size_t, Stream)>&, bool) {
  throw_no_cuda(fmt::format("cannot time the candidates of '{}'", problem));
}
std::optional<TuningRecord> find_tuning(const std::string&, const std::vector<std::string>&) {
  return std::nullopt;
}
std::vector<TuningRecord> tuning_decisions() { return {}; }
bool programmatic_launches() { return false; }
void set_programmatic_launches(bool) {}

LoadedKernel::LoadedKernel(const std::vector<char>&, const std::string& name, bool) : name_(name) {
  throw_no_cuda(fmt::format("cannot load kernel '{}'", name));
}
LoadedKernel::~LoadedKernel() = default;
LoadedKernel::LoadedKernel(LoadedKernel&& other) noexcept = default;
LoadedKernel& LoadedKernel::operator=(LoadedKernel&& other) noexcept = default;
void LoadedKernel::unload() noexcept {}
void LoadedKernel::launch(Dim3, Dim3, std::size_t, Stream, void**) const {
  throw_no_cuda("cannot launch " + name_);
}
void LoadedKernel::launch_cooperative(Dim3, Dim3, std::size_t, Stream, void**) const {
  throw_no_cuda("cannot launch " + name_);
}
void LoadedKernel::set_max_dynamic_shared_bytes(int) { throw_no_cuda("cannot configure " + name_); }
int LoadedKernel::max_active_blocks_per_sm(int, std::size_t) const {
  throw_no_cuda("no occupancy for " + name_);
}
KernelAttributes LoadedKernel::attributes() const { throw_no_cuda("no attributes for " + name_); }

}  // namespace kiln::gpu
