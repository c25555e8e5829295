// op name -> launch preparation. Each entry reads the node's attributes once and captures
// its pointers; the returned closure only launches.
#include "backends/cuda/cuda_ops.h"

#include <cuda_runtime_api.h>

#include <map>
#include <memory>

#include "backends/cuda/conv.h"
#include "backends/cuda/device_allocator.h"
#include "backends/cuda/kernel_sources.h"
#include "backends/cuda/layout.h"
#include "backends/cuda/lstm.h"
#include "backends/cuda/matmul.h"
#include "backends/cuda/pool.h"
#include "backends/cuda/random.h"
#include "gpu/cuda_check.h"
#include "graph/collective.h"
#include "graph/kernels/conv_cpu.h"
#include "graph/kernels/pool_cpu.h"

namespace kiln::cuda {
namespace {

using Preparer = std::function<Launch(const LaunchSetup&)>;

kernels::ConvGeometry geometry(const LaunchSetup& s, const Shape& x, const Shape& w) {
  return kernels::conv_geometry(x, w, s.node.attrs.integer("stride"),
                                s.node.attrs.integer("padding"));
}

// The geometry of a pooling node whose pooled tensor has shape x.
kernels::PoolGeometry pool_geometry(const LaunchSetup& s, const Shape& x) {
  const Attrs& a = s.node.attrs;
  return kernels::pool_geometry(x, a.integer("kernel"), a.integer("stride"), a.integer("padding"));
}
kernels::PoolGeometry pool_geometry(const LaunchSetup& s) {
  return pool_geometry(s, s.input_types[0].shape);
}

Launch prepare_matmul(const LaunchSetup& s) {
  const Shape& a = s.input_types[0].shape;
  const Shape& c = s.node.outputs[0].shape;
  const std::size_t r = a.rank();
  const bool ta = s.node.attrs.integer("trans_a") != 0;
  MatmulArgs args{.dtype = s.input_types[0].dtype,
                  .batch = c.numel() / std::max<std::int64_t>(1, c[r - 2] * c[r - 1]),
                  .m = c[r - 2],
                  .n = c[r - 1],
                  .k = ta ? a[r - 2] : a[r - 1],
                  .trans_a = ta,
                  .trans_b = s.node.attrs.integer("trans_b") != 0,
                  .a = s.inputs[0],
                  .b = s.inputs[1],
                  .c = s.outputs[0]};
  return [args](gpu::Stream stream) { matmul(args, stream); };
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

// The group's device path (NCCL) on the step's stream; group 0 (this process) only copies.
Launch prepare_all_reduce(const LaunchSetup& s) {
  const int id = static_cast<int>(s.node.attrs.integer("group"));
  Collective& group = collective(id);
  std::vector<Collective::DeviceBuffer> buffers;
  for (std::size_t i = 0; i < s.inputs.size(); ++i)
    buffers.push_back(
        {s.inputs[i], s.outputs[i], s.input_types[i].shape.numel(), s.input_types[i].dtype});
  if (id == 0)
    return [buffers](gpu::Stream st) {
      for (const Collective::DeviceBuffer& b : buffers)
        if (b.in != b.out && b.count > 0)
          KILN_CUDA_CHECK(cudaMemcpyAsync(b.out, b.in,
                                          static_cast<std::size_t>(b.count) * dtype_size(b.dtype),
                                          cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(st)));
    };
  return [&group, buffers](gpu::Stream st) { group.all_reduce_mean_device(buffers, st); };
}

// The direction an lstm_sequence(_grad) node runs: u [H, 4H] and h0 or c0 [B, H] are
// inputs u_input and batch_input (docs/lstm_ops.md).
LstmShape lstm_shape(const LaunchSetup& s, std::size_t u_input, std::size_t batch_input) {
  return {.dtype = s.input_types[u_input].dtype,
          .steps = s.node.attrs.integer("steps"),
          .batch = s.input_types[batch_input].shape[0],
          .hidden = s.input_types[u_input].shape[0],
          .reverse = s.node.attrs.integer("reverse") != 0};
}

// Where the persistent forward fits, the node gets its own zeroed barrier counters.
Launch prepare_lstm_sequence(const LaunchSetup& s) {
  const LstmShape shape = lstm_shape(s, 1, 2);
  LstmForwardArgs args{.projected = s.inputs[0],
                       .u = s.inputs[1],
                       .h0 = s.inputs[2],
                       .c0 = s.inputs[3],
                       .hs = s.outputs[0],
                       .cs = s.outputs[1],
                       .acts = s.outputs[2]};
  std::shared_ptr<Storage> barrier;
  if (lstm_persistent_forward_fits(shape)) {
    const std::size_t bytes =
        2 * sizeof(unsigned) * static_cast<std::size_t>(lstm_persistent_barriers(shape));
    barrier = device_allocator().allocate(bytes);
    KILN_CUDA_CHECK(cudaMemset(barrier->data(), 0, bytes));
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    args.barrier = static_cast<unsigned*>(barrier->data());
  }
  return [shape, args, barrier](gpu::Stream st) { lstm_sequence_forward(shape, args, st); };
}

Launch prepare_lstm_sequence_grad(const LaunchSetup& s) {
  const LstmShape shape = lstm_shape(s, 2, 3);
  const LstmBackwardArgs args{.d_hs = s.inputs[0],
                              .d_cs = s.inputs[1],
                              .u = s.inputs[2],
                              .c0 = s.inputs[3],
                              .cs = s.inputs[4],
                              .acts = s.inputs[5],
                              .d_projected = s.outputs[0],
                              .dh0 = s.outputs[1],
                              .dc0 = s.outputs[2]};
  return [shape, args](gpu::Stream st) { lstm_sequence_backward(shape, args, st); };
}

const std::map<std::string, Preparer>& preparers() {
  static const std::map<std::string, Preparer> table = {
      {"matmul", prepare_matmul},
      {"conv2d",
       [](const LaunchSetup& s) -> Launch {
         const auto g = geometry(s, s.input_types[0].shape, s.input_types[1].shape);
         const DType d = s.input_types[0].dtype;
         const ConvWorkspace ws{s.workspace, s.workspace_bytes};
         const void *x = s.inputs[0], *w = s.inputs[1];
         void* y = s.outputs[0];
         return [=](gpu::Stream st) { conv2d_forward(d, g, x, w, y, ws, st); };
       }},
      {"conv2d_grad_input",
       [](const LaunchSetup& s) -> Launch {
         const auto g = geometry(s, s.node.outputs[0].shape, s.input_types[1].shape);
         const DType d = s.input_types[0].dtype;
         const ConvWorkspace ws{s.workspace, s.workspace_bytes};
         const void *dy = s.inputs[0], *w = s.inputs[1];
         void* dx = s.outputs[0];
         return [=](gpu::Stream st) { conv2d_grad_input(d, g, dy, w, dx, ws, st); };
       }},
      {"conv2d_grad_weight",
       [](const LaunchSetup& s) -> Launch {
         const auto g = geometry(s, s.input_types[0].shape, s.node.outputs[0].shape);
         const DType d = s.input_types[0].dtype;
         const ConvWorkspace ws{s.workspace, s.workspace_bytes};
         const void *x = s.inputs[0], *dy = s.inputs[1];
         void* dw = s.outputs[0];
         return [=](gpu::Stream st) { conv2d_grad_weight(d, g, x, dy, dw, ws, st); };
       }},
      {"max_pool2d",
       [](const LaunchSetup& s) -> Launch {
         const auto g = pool_geometry(s);
         const DType d = s.input_types[0].dtype;
         const void* x = s.inputs[0];
         void* y = s.outputs[0];
         return [=](gpu::Stream st) { max_pool2d_forward(d, g, x, y, st); };
       }},
      {"max_pool2d_grad",
       [](const LaunchSetup& s) -> Launch {
         const auto g = pool_geometry(s);
         const DType d = s.input_types[0].dtype;
         const void *x = s.inputs[0], *dy = s.inputs[1];
         void* dx = s.outputs[0];
         return [=](gpu::Stream st) { max_pool2d_grad(d, g, x, dy, dx, st); };
       }},
      {"max_pool2d_select",
       [](const LaunchSetup& s) -> Launch {
         const auto g = pool_geometry(s);
         const DType d = s.input_types[0].dtype;
         const void *x = s.inputs[0], *gi = s.inputs[1];
         void* out = s.outputs[0];
         return [=](gpu::Stream st) { max_pool2d_select(d, g, x, gi, out, st); };
       }},
      {"avg_pool2d",
       [](const LaunchSetup& s) -> Launch {
         const auto g = pool_geometry(s);
         const DType d = s.input_types[0].dtype;
         const void* x = s.inputs[0];
         void* y = s.outputs[0];
         return [=](gpu::Stream st) { avg_pool2d_forward(d, g, x, y, st); };
       }},
      {"avg_pool2d_grad",
       [](const LaunchSetup& s) -> Launch {
         const auto g = pool_geometry(s, s.node.outputs[0].shape);
         const DType d = s.input_types[0].dtype;
         const void* dy = s.inputs[0];
         void* dx = s.outputs[0];
         return [=](gpu::Stream st) { avg_pool2d_grad(d, g, dy, dx, st); };
       }},
      {"transpose",
       [](const LaunchSetup& s) -> Launch {
         const DType d = s.input_types[0].dtype;
         const Shape shape = s.input_types[0].shape;
         const std::vector<std::int64_t> perm = s.node.attrs.integers("perm");
         const void* x = s.inputs[0];
         void* y = s.outputs[0];
         return [=](gpu::Stream st) { transpose(d, shape, perm, x, y, st); };
       }},
      {"slice", prepare_slice},
      {"concat", prepare_concat},
      {"pad", prepare_pad},
      {"one_hot",
       [](const LaunchSetup& s) -> Launch {
         const DType label = s.input_types[0].dtype, out_dtype = s.node.outputs[0].dtype;
         const std::int64_t rows = s.input_types[0].shape[0],
                            classes = s.node.attrs.integer("classes");
         const void* labels = s.inputs[0];
         void *out = s.outputs[0], *status = s.status;
         return [=](gpu::Stream st) {
           one_hot(label, out_dtype, rows, classes, labels, out, status, st);
         };
       }},
      {"random_uniform",
       [](const LaunchSetup& s) -> Launch {
         const DType d = s.node.outputs[0].dtype;
         const auto seed = static_cast<std::uint64_t>(s.node.attrs.integer("seed"));
         const std::int64_t n = s.node.outputs[0].shape.numel();
         const void* step = s.inputs[0];
         void *out = s.outputs[0], *next = s.outputs[1];
         return [=](gpu::Stream st) { random_uniform(d, seed, n, step, out, next, st); };
       }},
      {"all_reduce_mean", prepare_all_reduce},
      {"lstm_sequence", prepare_lstm_sequence},
      {"lstm_sequence_grad", prepare_lstm_sequence_grad},
  };
  return table;
}

}  // namespace

Launch prepare_launch(const LaunchSetup& setup) {
  auto it = preparers().find(setup.node.op->name);
  KILN_CHECK(it != preparers().end(), "the CUDA backend has no kernel for op '{}'",
             setup.node.op->name);
  return it->second(setup);
}

namespace {

using SourceList =
    std::function<std::vector<gpu::KernelSource>(const Node&, const std::vector<TensorType>&)>;

// The convolution a conv2d, conv2d_grad_input or conv2d_grad_weight node computes a pass of.
kernels::ConvGeometry conv_geometry_of(const Node& node, const std::vector<TensorType>& in) {
  const std::string& op = node.op->name;
  const Shape& x = op == "conv2d_grad_input" ? node.outputs[0].shape : in[0].shape;
  const Shape& w = op == "conv2d_grad_weight" ? node.outputs[0].shape : in[1].shape;
  return kernels::conv_geometry(x, w, node.attrs.integer("stride"), node.attrs.integer("padding"));
}

ConvPass conv_pass_of(const std::string& op) {
  return op == "conv2d"              ? ConvPass::forward
         : op == "conv2d_grad_input" ? ConvPass::grad_input
                                     : ConvPass::grad_weight;
}

std::vector<gpu::KernelSource> pool_sources(DType dtype) {
  std::vector<gpu::KernelSource> all;
  for (PoolKernel p : {PoolKernel::forward, PoolKernel::grad, PoolKernel::select})
    all.push_back(max_pool_source(p, dtype));
  for (PoolFast p :
       {PoolFast::forward_k2, PoolFast::forward_any, PoolFast::select_k2, PoolFast::select_any,
        PoolFast::grad_cells2, PoolFast::grad_cells, PoolFast::grad_overlap})
    all.push_back(max_pool_fast_source(p, dtype));
  return all;
}

std::vector<gpu::KernelSource> conv_sources(const Node& n, const std::vector<TensorType>& in) {
  return conv_kernel_sources(conv_geometry_of(n, in), in[0].dtype, conv_pass_of(n.op->name));
}

const std::map<std::string, SourceList>& source_lists() {
  static const std::map<std::string, SourceList> table = {
      {"conv2d", conv_sources},
      {"conv2d_grad_input", conv_sources},
      {"conv2d_grad_weight", conv_sources},
      {"max_pool2d",
       [](const Node&, const std::vector<TensorType>& in) { return pool_sources(in[0].dtype); }},
      {"max_pool2d_grad",
       [](const Node&, const std::vector<TensorType>& in) { return pool_sources(in[0].dtype); }},
      {"max_pool2d_select",
       [](const Node&, const std::vector<TensorType>& in) { return pool_sources(in[0].dtype); }},
      {"avg_pool2d",
       [](const Node&, const std::vector<TensorType>& in) {
         return std::vector<gpu::KernelSource>{avg_pool_source(false, in[0].dtype)};
       }},
      {"avg_pool2d_grad",
       [](const Node&, const std::vector<TensorType>& in) {
         return std::vector<gpu::KernelSource>{avg_pool_source(true, in[0].dtype)};
       }},
      {"transpose",
       [](const Node&, const std::vector<TensorType>& in) {
         return std::vector<gpu::KernelSource>{transpose_source(dtype_size(in[0].dtype))};
       }},
      {"concat",
       [](const Node& n, const std::vector<TensorType>&) {
         return std::vector<gpu::KernelSource>{concat_source(dtype_size(n.outputs[0].dtype))};
       }},
      {"one_hot",
       [](const Node& n, const std::vector<TensorType>& in) {
         return std::vector<gpu::KernelSource>{one_hot_source(in[0].dtype, n.outputs[0].dtype),
                                               one_hot_finish_source(in[0].dtype)};
       }},
      {"random_uniform",
       [](const Node& n, const std::vector<TensorType>&) {
         return std::vector<gpu::KernelSource>{random_uniform_source(n.outputs[0].dtype)};
       }},
      {"lstm_sequence",
       [](const Node&, const std::vector<TensorType>& in) {
         return lstm_kernel_sources(in[1].dtype);
       }},
      {"lstm_sequence_grad",
       [](const Node&, const std::vector<TensorType>& in) {
         return lstm_kernel_sources(in[2].dtype);
       }},
  };
  return table;
}

}  // namespace

std::vector<gpu::KernelSource> kernel_sources_for(const Node& node,
                                                  const std::vector<TensorType>& input_types) {
  auto it = source_lists().find(node.op->name);
  return it == source_lists().end() ? std::vector<gpu::KernelSource>{}
                                    : it->second(node, input_types);
}

bool has_cuda_launcher(const std::string& op_name) { return preparers().count(op_name) != 0; }

std::size_t workspace_bytes_for(const Node& node, const std::vector<TensorType>& in) {
  const std::string& op = node.op->name;
  if (op != "conv2d" && op != "conv2d_grad_input" && op != "conv2d_grad_weight") return 0;
  return conv_workspace_bytes(conv_geometry_of(node, in), in[0].dtype, conv_pass_of(op));
}

}  // namespace kiln::cuda
