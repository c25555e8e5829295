// Host side of the fused LSTM recurrence: chooses a direction's kernels (lstm.h) when a
// program is compiled; for the step kernels, picks each step's time and the rows it reads
// (h_prev/c_prev in the forward; d_next/c_prev in the backward), one launch per step. Their
// grid: one block per 8 hidden units x 16 batch rows, 256 threads (lstm_kernels.cpp).
#include "backends/cuda/lstm.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <limits>

#include "backends/cuda/kernel_registry.h"
#include "backends/cuda/kernel_sources.h"
#include "backends/cuda/op_entry.h"
#include "core/error.h"
#include "gpu/cuda_check.h"

namespace kiln::cuda {
namespace {

constexpr std::int64_t kUnitsPerBlock = 8, kRowsPerBlock = 16;
constexpr unsigned kThreads = 256;

void check_shape(const LstmShape& s) {
  KILN_CHECK(is_floating(s.dtype), "lstm_sequence: dtype {} (f32, f64, bf16 or f16 expected)",
             dtype_name(s.dtype));
  KILN_CHECK(s.steps >= 1 && s.batch >= 0 && s.hidden >= 0,
             "lstm_sequence: {} steps of batch {}, hidden {}", s.steps, s.batch, s.hidden);
  constexpr std::int64_t kMaxInt = std::numeric_limits<std::int32_t>::max();
  KILN_CHECK(4 * s.hidden <= kMaxInt && s.steps * s.batch <= kMaxInt &&
                 (s.batch + kRowsPerBlock - 1) / kRowsPerBlock <= 65535,
             "lstm_sequence: {} steps of batch {}, hidden {} exceed the CUDA kernel's index range",
             s.steps, s.batch, s.hidden);
}

// The time of the `k`-th processed step.
std::int64_t time_of(const LstmShape& s, std::int64_t k) { return s.reverse ? s.steps - 1 - k : k; }

// Byte offset of time t's rows in a [T*B, width] tensor.
const char* rows_at(const void* base, const LstmShape& s, std::int64_t t, std::int64_t width) {
  return static_cast<const char*>(base) +
         static_cast<std::size_t>(t * s.batch * width) * dtype_size(s.dtype);
}

const DeviceKernel& step_kernel(bool backward, DType dtype) {
  return device_kernel(lstm_step_name(backward, dtype),
                       [&] { return lstm_step_source(backward, dtype); });
}

detail::LstmPersistent g_persistent = detail::LstmPersistent::automatic;

const DeviceKernel& persistent_kernel(DType dtype) {
  return device_kernel(lstm_persistent_name(dtype), [&] { return lstm_persistent_source(dtype); });
}

std::size_t persistent_shared_bytes(const LstmShape& s) {
  return static_cast<std::size_t>(48 * s.hidden) * wide_size(s.dtype);  // of the compute type
}

gpu::Dim3 grid_of(const LstmShape& s) {
  return {static_cast<unsigned>((s.hidden + kUnitsPerBlock - 1) / kUnitsPerBlock),
          static_cast<unsigned>((s.batch + kRowsPerBlock - 1) / kRowsPerBlock), 1};
}

}  // namespace

bool lstm_persistent_forward_fits(const LstmShape& s) {
  if (g_persistent == detail::LstmPersistent::never || s.hidden < 64 || s.hidden % 32 != 0 ||
      s.batch == 0)
    return false;
  if (persistent_shared_bytes(s) > 48 * 1024) return false;
  int device = 0, sms = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const gpu::Dim3 grid = grid_of(s);
  const std::int64_t blocks = static_cast<std::int64_t>(grid.x) * grid.y;
  const int per_sm = persistent_kernel(s.dtype).kernel.max_active_blocks_per_sm(
      static_cast<int>(kThreads), persistent_shared_bytes(s));
  const bool fills = 4 * blocks >= 3 * sms || g_persistent == detail::LstmPersistent::when_resident;
  return static_cast<std::int64_t>(per_sm) * sms >= blocks && fills;
}

std::int64_t lstm_persistent_barriers(const LstmShape& s) {
  return (s.batch + kRowsPerBlock - 1) / kRowsPerBlock;
}

void lstm_sequence_forward(const LstmShape& shape, const LstmForwardArgs& args,
                           gpu::Stream stream) {
  check_shape(shape);
  if (shape.batch == 0 || shape.hidden == 0) return;
  const gpu::Dim3 grid = grid_of(shape);
  int batch = static_cast<int>(shape.batch), hidden = static_cast<int>(shape.hidden);
  const void *projected = args.projected, *u = args.u;
  void *hs = args.hs, *cs = args.cs, *acts = args.acts;
  if (args.kernels == LstmKernels::mma) return lstm_mma_forward(shape, args, stream);
  if (args.kernels == LstmKernels::persistent) {  // all steps in one cooperative launch
    const void *h0 = args.h0, *c0 = args.c0;
    unsigned* barrier = args.barrier;
    int steps = static_cast<int>(shape.steps), reverse = shape.reverse ? 1 : 0;
    void* params[] = {&projected, &u,       &h0,    &c0,     &hs,    &cs,
                      &acts,      &barrier, &batch, &hidden, &steps, &reverse};
    persistent_kernel(shape.dtype)
        .kernel.launch_cooperative(grid, {kThreads, 1, 1}, persistent_shared_bytes(shape), stream,
                                   params);
    return;
  }
  const DeviceKernel& k = step_kernel(false, shape.dtype);
  for (std::int64_t step = 0; step < shape.steps; ++step) {
    int t = static_cast<int>(time_of(shape, step));
    const std::int64_t before = step == 0 ? -1 : time_of(shape, step - 1);
    const void* h_prev = before < 0 ? args.h0 : rows_at(hs, shape, before, shape.hidden);
    const void* c_prev = before < 0 ? args.c0 : rows_at(cs, shape, before, shape.hidden);
    void* params[] = {&projected, &u, &h_prev, &c_prev, &hs, &cs, &acts, &batch, &hidden, &t};
    k.kernel.launch(grid, {kThreads, 1, 1}, 0, stream, params);
  }
}

// Steps in the reverse of the processing order; step k's c_prev is c0 for k = 0, else the
// cs rows of step k - 1; its d_next the d_projected rows of step k + 1 (none for the last).
void lstm_sequence_backward(const LstmShape& shape, const LstmBackwardArgs& args,
                            gpu::Stream stream) {
  check_shape(shape);
  if (shape.batch == 0 || shape.hidden == 0) return;
  if (args.kernels == LstmKernels::mma) return lstm_mma_backward(shape, args, stream);
  const DeviceKernel& k = step_kernel(true, shape.dtype);
  const gpu::Dim3 grid = grid_of(shape);
  int batch = static_cast<int>(shape.batch), hidden = static_cast<int>(shape.hidden);
  const void *u = args.u, *d_hs = args.d_hs, *d_cs = args.d_cs, *cs = args.cs, *acts = args.acts;
  void *dc_carry = args.dc0, *d_projected = args.d_projected;
  for (std::int64_t step = shape.steps - 1; step >= -1; --step) {
    const bool last = step < 0;  // dh0 from the d_projected rows of step 0
    int t = last ? 0 : static_cast<int>(time_of(shape, step));
    const void* d_next =
        step + 1 < shape.steps
            ? rows_at(d_projected, shape, time_of(shape, step + 1), 4 * shape.hidden)
            : nullptr;
    const void* c_prev =
        step <= 0 ? args.c0 : rows_at(cs, shape, time_of(shape, step - 1), shape.hidden);
    void* dh0 = last ? args.dh0 : nullptr;  // non-null: the launch only writes dh0
    void* params[] = {&d_next,   &u,           &d_hs, &d_cs,  &cs,     &acts, &c_prev,
                      &dc_carry, &d_projected, &dh0,  &batch, &hidden, &t};
    k.kernel.launch(grid, {kThreads, 1, 1}, 0, stream, params);
  }
}

std::vector<gpu::KernelSource> lstm_kernel_sources(DType dtype) {
  std::vector<gpu::KernelSource> all = {
      lstm_step_source(false, dtype), lstm_step_source(true, dtype), lstm_persistent_source(dtype)};
  if (dtype == DType::bf16 || dtype == DType::f16)
    for (bool backward : {false, true}) all.push_back(lstm_mma_source(backward, dtype));
  return all;
}

namespace detail {
void set_lstm_persistent_for_testing(LstmPersistent mode) { g_persistent = mode; }
LstmPersistent lstm_persistent_mode() { return g_persistent; }
}  // namespace detail

namespace {

// The direction an lstm_sequence(_grad) node runs: u [H, 4H] and h0 or c0 [B, H] are
// inputs u_input and batch_input (docs/lstm_ops.md).
LstmShape lstm_shape(const Node& n, const InputTypes& in, std::size_t u_input,
                     std::size_t batch_input) {
  return {.dtype = in[u_input].dtype,
          .steps = n.attrs.integer("steps"),
          .batch = in[batch_input].shape[0],
          .hidden = in[u_input].shape[0],
          .reverse = n.attrs.integer("reverse") != 0};
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// The kernels of a direction: mma where the tensor-core kernels fit, then (an f32 or f64
// forward) the persistent one, else the steps. `aligned`: the rows the mma kernels copy by 16
// bytes are. (bf16 and f16 skip the persistent kernel: wherever it would fit, the mma kernels
// do, so its 16-bit forms would go untested.)
LstmKernels kernels_of(const LstmShape& shape, bool backward, bool aligned) {
  if (lstm_mma_fits(shape, backward) && aligned) return LstmKernels::mma;
  const bool wide = shape.dtype == DType::f32 || shape.dtype == DType::f64;
  if (!backward && wide && lstm_persistent_forward_fits(shape)) return LstmKernels::persistent;
  return LstmKernels::steps;
}

// Where a cooperative launch runs the direction, the node's status memory is its barrier
// counters (allocated before the buffers are known: if they turn out misaligned for the mma
// kernels, the counters go unused).
std::size_t status_bytes(const LstmShape& shape, bool backward) {
  if (kernels_of(shape, backward, true) == LstmKernels::steps) return 0;
  return 2 * sizeof(unsigned) * static_cast<std::size_t>(lstm_persistent_barriers(shape));
}

Launch prepare_forward(const LaunchSetup& s) {
  const LstmShape shape = lstm_shape(s.node, s.input_types, 1, 2);
  LstmForwardArgs args{.projected = s.inputs[0],
                       .u = s.inputs[1],
                       .h0 = s.inputs[2],
                       .c0 = s.inputs[3],
                       .hs = s.outputs[0],
                       .cs = s.outputs[1],
                       .acts = s.outputs[2],
                       .barrier = static_cast<unsigned*>(s.status)};
  if (args.barrier != nullptr)
    args.kernels = kernels_of(shape, false, aligned16(args.h0) && aligned16(args.hs));
  return [shape, args](gpu::Stream st) { lstm_sequence_forward(shape, args, st); };
}

Launch prepare_backward(const LaunchSetup& s) {
  const LstmShape shape = lstm_shape(s.node, s.input_types, 2, 3);
  LstmBackwardArgs args{.d_hs = s.inputs[0],
                        .d_cs = s.inputs[1],
                        .u = s.inputs[2],
                        .c0 = s.inputs[3],
                        .cs = s.inputs[4],
                        .acts = s.inputs[5],
                        .d_projected = s.outputs[0],
                        .dh0 = s.outputs[1],
                        .dc0 = s.outputs[2],
                        .barrier = static_cast<unsigned*>(s.status)};
  if (args.barrier != nullptr)
    args.kernels = kernels_of(shape, true, aligned16(args.u) && aligned16(args.d_projected));
  return [shape, args](gpu::Stream st) { lstm_sequence_backward(shape, args, st); };
}

// u is input 1 of the forward, input 2 of the backward.
std::function<std::vector<gpu::KernelSource>(const Node&, const InputTypes&)> sources_of(
    std::size_t u_input) {
  return [u_input](const Node&, const InputTypes& in) {
    return lstm_kernel_sources(in[u_input].dtype);
  };
}

}  // namespace

void add_lstm_ops(CudaOpTable& table) {
  table[OpId::lstm_sequence] = {
      .prepare = prepare_forward,
      .sources = sources_of(1),
      .status_bytes =
          [](const Node& n, const InputTypes& in) {
            return status_bytes(lstm_shape(n, in, 1, 2), false);
          },
      .every_source =
          [] {
            std::vector<gpu::KernelSource> all;
            for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16})
              for (auto& s : lstm_kernel_sources(t)) all.push_back(s);
            return all;
          }};
  table[OpId::lstm_sequence_grad] = {.prepare = prepare_backward,
                                     .sources = sources_of(2),
                                     .status_bytes = [](const Node& n, const InputTypes& in) {
                                       return status_bytes(lstm_shape(n, in, 2, 3), true);
                                     }};
}

}  // namespace kiln::cuda
