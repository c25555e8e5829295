// Host side of the layout kernels: permutation simplification for transpose, the
// one_hot status protocol, fill's value conversion, and block copies; the CUDA op entries of
// transpose, slice, concat, pad and one_hot at the end.
#include "backends/cuda/layout.h"

#include <cuda_runtime_api.h>
#include <fmt/ranges.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "backends/cuda/kernels/layout_params.h"
#include "backends/cuda/kernel_registry.h"
#include "backends/cuda/kernel_sources.h"
#include "backends/cuda/op_entry.h"
#include "core/env_switch.h"
#include "core/dispatch.h"
#include "core/error.h"
#include "gpu/cuda_check.h"

namespace kiln::cuda {
namespace {

// The permutation as y's dims and x's strides, with size-1 axes dropped and runs of axes
// that are adjacent and in order in x merged into one.
struct Simplified {
  std::vector<std::int64_t> dims, src_strides;
};

Simplified simplify(const Shape& x_shape, const std::vector<std::int64_t>& perm) {
  const std::size_t rank = x_shape.rank();
  std::vector<int> seen(rank, 0);
  KILN_CHECK(perm.size() == rank, "transpose: permutation [{}] for {}", fmt::join(perm, ", "),
             x_shape.str());
  for (std::int64_t p : perm)
    KILN_CHECK(
        p >= 0 && p < static_cast<std::int64_t>(rank) && !seen[static_cast<std::size_t>(p)]++,
        "transpose: [{}] is not a permutation", fmt::join(perm, ", "));
  const std::vector<std::int64_t> strides = x_shape.strides();
  std::vector<std::int64_t> rank_of(rank, -1);  // position of each kept x axis among the kept ones
  for (std::size_t a = 0, kept = 0; a < rank; ++a)
    if (x_shape[a] != 1) rank_of[a] = static_cast<std::int64_t>(kept++);
  Simplified s;
  std::int64_t previous = -2;  // kept rank of the x axis behind the last y axis
  for (std::int64_t p : perm) {
    const auto a = static_cast<std::size_t>(p);
    if (rank_of[a] < 0) continue;
    if (rank_of[a] == previous + 1) {  // continues the previous run: merge
      s.dims.back() *= x_shape[a];
      s.src_strides.back() = strides[a];
    } else {
      s.dims.push_back(x_shape[a]);
      s.src_strides.push_back(strides[a]);
    }
    previous = rank_of[a];
  }
  return s;
}

}  // namespace

void transpose(DType dtype, const Shape& x_shape, const std::vector<std::int64_t>& perm,
               const void* x, void* y, gpu::Stream stream) {
  const Simplified s = simplify(x_shape, perm);
  const std::int64_t n = x_shape.numel();
  if (n == 0) return;
  const std::size_t bytes = dtype_size(dtype);
  if (s.dims.size() <= 1) {  // the permutation moves nothing
    KILN_CUDA_CHECK(cudaMemcpyAsync(y, x, static_cast<std::size_t>(n) * bytes,
                                    cudaMemcpyDeviceToDevice, stream));
    return;
  }
  // [B][C][HW] -> [B][HW][C] of 2- or 4-byte elements (the layout pass's channels-last images):
  // the conv passes' tiled copy, 64 x 64 through shared memory.
  const bool batched = s.dims.size() == 3 && s.src_strides[0] == s.dims[1] * s.dims[2];
  const std::size_t plane = batched ? 1 : 0;  // the first axis of the [C][HW] plane's transpose
  if ((bytes == 2 || bytes == 4) && s.dims.size() == plane + 2 && s.src_strides[plane] == 1 &&
      s.src_strides[plane + 1] == s.dims[plane] && s.dims[plane + 1] % 2 == 0 &&
      s.dims[plane] * s.dims[plane + 1] < (std::int64_t{1} << 31) &&
      (batched ? s.dims[0] : 1) <= 65535) {
    nchw_to_nhwc(dtype, x, y, batched ? s.dims[0] : 1, s.dims[plane + 1], s.dims[plane], stream);
    return;
  }
  KILN_CHECK(s.dims.size() <= kMaxTransposeRank,
             "transpose: [{}] of {} moves {} separate axes; at most {} are supported on the GPU",
             fmt::join(perm, ", "), x_shape.str(), s.dims.size(), kMaxTransposeRank);
  TransposeShape shape{};
  shape.rank = static_cast<std::int32_t>(s.dims.size());
  for (std::size_t d = 0; d < s.dims.size(); ++d) {
    shape.dims[d] = s.dims[d];
    shape.src_strides[d] = s.src_strides[d];
  }
  const DeviceKernel& k = device_kernel("kiln_transpose_b" + std::to_string(bytes),
                                        [&] { return transpose_source(bytes); });
  long long count = n;
  void* args[] = {&x, &y, &shape, &count};
  launch_items(k, n, stream, args);
}

std::optional<bool>& nhwc_wide_for_testing() {
  static std::optional<bool> on;
  return on;
}

namespace {
bool nhwc_wide_on() {
  static const bool by_env = env_switch_on("KILN_NHWC_WIDE");
  return nhwc_wide_for_testing().value_or(by_env);
}

bool aligned(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}
}  // namespace

void nchw_to_nhwc(DType dtype, const void* x, void* xt, std::int64_t batch, std::int64_t channels,
                  std::int64_t hw, gpu::Stream stream) {
  if (batch == 0 || channels == 0 || hw == 0) return;
  KILN_CHECK(batch <= 65535 && channels * hw < (std::int64_t{1} << 31),
             "conv: {} images of {} x {} are too many for the channels-last copy", batch, channels,
             hw);
  KILN_CHECK(channels % 2 == 0, "conv: the channels-last copy takes an even channel count ({})",
             channels);
  const std::size_t bytes = dtype_size(dtype);
  KILN_CHECK(aligned(x, 2 * bytes) && aligned(xt, 2 * bytes),
             "conv: the channels-last copy reads and writes pairs of elements: both images must "
             "be aligned to {} bytes ({} and {})",
             2 * bytes, x, xt);
  const DeviceKernel& k =
      device_kernel(nhwc_image_name(bytes), [bytes] { return nhwc_image_source(bytes); });
  int c = static_cast<int>(channels), n = static_cast<int>(hw);
  long long pixels = batch * hw;
  // The wide form (kernels/nhwc_copy.cuh): 16-byte runs of 8 channels and of 8 pixels.
  int wide = bytes == 2 && channels % 8 == 0 && hw % 8 == 0 && aligned(x, 16) && aligned(xt, 16) &&
             nhwc_wide_on();
  void* args[] = {&x, &xt, &c, &n, &pixels, &wide};
  if (wide) {
    const std::int64_t warps = (channels + 31) / 32 * ((pixels + 63) / 64);
    k.kernel.launch({static_cast<unsigned>((warps + 7) / 8), 1, 1}, {256, 1, 1}, 0, stream, args);
    return;
  }
  const gpu::Dim3 grid{static_cast<unsigned>((hw + 63) / 64),
                       static_cast<unsigned>((channels + 63) / 64), static_cast<unsigned>(batch)};
  k.kernel.launch(grid, {256, 1, 1}, 0, stream, args);
}

void one_hot(DType label_dtype, DType out_dtype, std::int64_t rows, std::int64_t classes,
             const void* labels, void* out, void* device_status, gpu::Stream stream) {
  KILN_CHECK(label_dtype == DType::i32 || label_dtype == DType::i64 || label_dtype == DType::u8,
             "one_hot: labels must be i32, i64 or u8 but are {}", dtype_name(label_dtype));
  KILN_CHECK(is_floating(out_dtype), "one_hot: output dtype {} (f32, f64, bf16 or f16 expected)",
             dtype_name(out_dtype));
  KILN_CHECK(rows >= 0 && classes > 0, "one_hot: {} rows of {} classes", rows, classes);
  KILN_CUDA_CHECK(
      cudaMemsetAsync(device_status, 0xff, kOneHotStatusBytes, stream));  // bad_row = -1
  const std::string name =
      fmt::format("kiln_one_hot_{}_{}", dtype_name(label_dtype), dtype_name(out_dtype));
  const DeviceKernel& k =
      device_kernel(name, [&] { return one_hot_source(label_dtype, out_dtype); });
  long long r = rows, c = classes;
  void* args[] = {&labels, &out, &r, &c, &device_status};
  launch_items(k, rows * classes, stream, args);
  const std::string finish = fmt::format("kiln_one_hot_finish_{}", dtype_name(label_dtype));
  const DeviceKernel& f = device_kernel(finish, [&] { return one_hot_finish_source(label_dtype); });
  void* finish_args[] = {&labels, &device_status};
  f.kernel.launch({1, 1, 1}, {32, 1, 1}, 0, stream, finish_args);
}

OneHotStatus read_one_hot_status(const void* device_status, gpu::Stream stream) {
  OneHotStatus status;
  KILN_CUDA_CHECK(
      cudaMemcpyAsync(&status, device_status, kOneHotStatusBytes, cudaMemcpyDeviceToHost, stream));
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
  return status;
}

void check_one_hot_status(const OneHotStatus& status, std::int64_t classes) {
  KILN_CHECK(status.bad_row < 0, "one_hot: label {} at index {} is outside [0, {})",
             status.bad_label, status.bad_row, classes);
}

void copy_blocks(const void* src, std::int64_t src_pitch, void* dst, std::int64_t dst_pitch,
                 std::int64_t rows, std::int64_t bytes, gpu::Stream stream) {
  if (rows <= 0 || bytes <= 0) return;
  KILN_ASSERT(src_pitch >= bytes && dst_pitch >= bytes,
              "copy_blocks: pitches {} and {} below the block size {}", src_pitch, dst_pitch,
              bytes);
  if (rows == 1 || (src_pitch == bytes && dst_pitch == bytes)) {  // one contiguous range
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(rows * bytes),
                                    cudaMemcpyDeviceToDevice, stream));
    return;
  }
  KILN_CUDA_CHECK(cudaMemcpy2DAsync(dst, static_cast<std::size_t>(dst_pitch), src,
                                    static_cast<std::size_t>(src_pitch),
                                    static_cast<std::size_t>(bytes), static_cast<std::size_t>(rows),
                                    cudaMemcpyDeviceToDevice, stream));
}

void concat(std::size_t element_bytes, const std::vector<const void*>& pieces,
            const std::vector<std::int64_t>& widths, std::int64_t outer, void* out,
            gpu::Stream stream) {
  KILN_ASSERT(pieces.size() == widths.size(), "concat: {} pieces, {} widths", pieces.size(),
              widths.size());
  long long row = 0;
  for (std::int64_t w : widths) row += w;
  const DeviceKernel& k = device_kernel("kiln_concat_b" + std::to_string(element_bytes),
                                        [&] { return concat_source(element_bytes); });
  long long rows = outer, base = 0;
  for (std::size_t first = 0; first < pieces.size(); first += kConcatPieces) {
    ConcatPieces p{};
    long long width = 0;
    for (std::size_t j = first; j < pieces.size() && j < first + kConcatPieces; ++j) {
      p.src[p.count] = pieces[j];
      width += widths[j];
      p.end[p.count++] = width;
    }
    void* args[] = {&p, &out, &rows, &row, &base, &width};
    launch_items(k, rows * width, stream, args);
    base += width;
  }
}

void zero_bytes(void* out, std::int64_t bytes, gpu::Stream stream) {
  if (bytes > 0) KILN_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<std::size_t>(bytes), stream));
}

void fill(DType dtype, double value, std::int64_t n, void* out, gpu::Stream stream) {
  if (n <= 0) return;
  const DeviceKernel& k = device_kernel(fmt::format("kiln_fill_{}", dtype_name(dtype)),
                                        [&] { return fill_source(dtype); });
  visit_dtype(dtype, [&](auto zero) {
    auto typed = static_cast<decltype(zero)>(value);
    long long count = n;
    void* args[] = {&out, &typed, &count};
    launch_items(k, n, stream, args);
  });
}

namespace {

Launch prepare_transpose(const LaunchSetup& s) {
  const DType d = s.input_types[0].dtype;
  const Shape shape = s.input_types[0].shape;
  const std::vector<std::int64_t> perm = s.node.attrs.integers("perm");
  const void* x = s.inputs[0];
  void* y = s.outputs[0];
  return [=](gpu::Stream st) { transpose(d, shape, perm, x, y, st); };
}

// A shape seen as [outer, dim, inner] around `axis`, inner in bytes (slice, concat, pad).
struct AxisBlocks {
  std::int64_t outer = 1, dim = 1, inner_bytes = 1;
};

AxisBlocks axis_blocks(const TensorType& t, std::int64_t axis) {
  AxisBlocks b{1, t.shape[static_cast<std::size_t>(axis)],
               static_cast<std::int64_t>(dtype_size(t.dtype))};
  for (std::size_t d = 0; d < t.shape.rank(); ++d) {
    if (static_cast<std::int64_t>(d) < axis) b.outer *= t.shape[d];
    if (static_cast<std::int64_t>(d) > axis) b.inner_bytes *= t.shape[d];
  }
  return b;
}

Launch prepare_slice(const LaunchSetup& s) {
  const AxisBlocks in = axis_blocks(s.input_types[0], s.node.attrs.integer("axis"));
  const std::int64_t bytes = s.node.attrs.integer("length") * in.inner_bytes;
  const char* x =
      static_cast<const char*>(s.inputs[0]) + s.node.attrs.integer("start") * in.inner_bytes;
  void* y = s.outputs[0];
  return [=](gpu::Stream st) {
    copy_blocks(x, in.dim * in.inner_bytes, y, bytes, in.outer, bytes, st);
  };
}

// One kernel per 32 pieces (a concat of an LSTM's per-step values has 64).
Launch prepare_concat(const LaunchSetup& s) {
  const std::int64_t axis = s.node.attrs.integer("axis");
  const AxisBlocks out = axis_blocks(s.node.outputs[0], axis);
  const std::size_t element = dtype_size(s.node.outputs[0].dtype);
  const std::int64_t inner = out.inner_bytes / static_cast<std::int64_t>(element);  // elements
  std::vector<std::int64_t> widths;
  for (const TensorType& t : s.input_types)
    widths.push_back(t.shape[static_cast<std::size_t>(axis)] * inner);
  const std::vector<const void*> pieces = s.inputs;
  void* y = s.outputs[0];
  const std::int64_t rows = out.outer;
  return [=](gpu::Stream st) { concat(element, pieces, widths, rows, y, st); };
}

Launch prepare_pad(const LaunchSetup& s) {
  const std::int64_t axis = s.node.attrs.integer("axis");
  const AxisBlocks out = axis_blocks(s.node.outputs[0], axis);
  const std::int64_t bytes =
      s.input_types[0].shape[static_cast<std::size_t>(axis)] * out.inner_bytes;
  const std::int64_t total = out.outer * out.dim * out.inner_bytes;
  const void* x = s.inputs[0];
  void* y = s.outputs[0];
  char* at = static_cast<char*>(y) + s.node.attrs.integer("before") * out.inner_bytes;
  return [=](gpu::Stream st) {
    zero_bytes(y, total, st);
    copy_blocks(x, bytes, at, out.dim * out.inner_bytes, out.outer, bytes, st);
  };
}

Launch prepare_one_hot(const LaunchSetup& s) {
  const DType label = s.input_types[0].dtype, out_dtype = s.node.outputs[0].dtype;
  const std::int64_t rows = s.input_types[0].shape[0], classes = s.node.attrs.integer("classes");
  const void* labels = s.inputs[0];
  void *out = s.outputs[0], *status = s.status;
  return [=](gpu::Stream st) { one_hot(label, out_dtype, rows, classes, labels, out, status, st); };
}

// A kernel per element size, 1 to 8 bytes (transpose, concat move bits).
std::vector<gpu::KernelSource> by_element_size(gpu::KernelSource (*source)(std::size_t)) {
  std::vector<gpu::KernelSource> all;
  for (std::size_t bytes : {1, 2, 4, 8}) all.push_back(source(bytes));
  return all;
}

CudaOpEntry one_hot_entry() {
  CudaOpEntry e{.prepare = prepare_one_hot};
  e.sources = [](const Node& n, const InputTypes& in) {
    return std::vector<gpu::KernelSource>{one_hot_source(in[0].dtype, n.outputs[0].dtype),
                                          one_hot_finish_source(in[0].dtype)};
  };
  e.status_bytes = [](const Node&, const InputTypes&) { return kOneHotStatusBytes; };
  e.every_source = [] {
    std::vector<gpu::KernelSource> all;
    for (DType label : {DType::i32, DType::i64, DType::u8}) {
      for (DType out : {DType::f32, DType::f64, DType::bf16, DType::f16})
        all.push_back(one_hot_source(label, out));
      all.push_back(one_hot_finish_source(label));
    }
    return all;
  };
  e.check_status = [](const Node& n, const void* status, gpu::Stream st) {
    check_one_hot_status(read_one_hot_status(status, st), n.attrs.integer("classes"));
  };
  return e;
}

}  // namespace

void add_layout_ops(CudaOpTable& table) {
  table[OpId::transpose] = {.prepare = prepare_transpose,
                            .sources =
                                [](const Node&, const InputTypes& in) {
                                  const std::size_t bytes = dtype_size(in[0].dtype);
                                  std::vector<gpu::KernelSource> sources{transpose_source(bytes)};
                                  if (bytes == 2 || bytes == 4)
                                    sources.push_back(nhwc_image_source(bytes));  // planes
                                  return sources;
                                },
                            .every_source =
                                [] {
                                  std::vector<gpu::KernelSource> all =
                                      by_element_size(transpose_source);
                                  for (std::size_t bytes : {2, 4})
                                    all.push_back(nhwc_image_source(bytes));
                                  return all;
                                }};
  table[OpId::slice] = {.prepare = prepare_slice};
  table[OpId::concat] = {
      .prepare = prepare_concat,
      .sources =
          [](const Node& n, const InputTypes&) {
            return std::vector<gpu::KernelSource>{concat_source(dtype_size(n.outputs[0].dtype))};
          },
      .every_source = [] { return by_element_size(concat_source); }};
  table[OpId::pad] = {.prepare = prepare_pad};
  table[OpId::one_hot] = one_hot_entry();
}

}  // namespace kiln::cuda
