// op name -> launch preparation. Each entry reads the node's attributes once and captures
// its pointers; the returned closure only launches.
#include "backends/cuda/cuda_ops.h"

#include <map>

#include "backends/cuda/conv.h"
#include "backends/cuda/kernel_sources.h"
#include "backends/cuda/layout.h"
#include "backends/cuda/matmul.h"
#include "backends/cuda/pool.h"
#include "backends/cuda/random.h"
#include "graph/kernels/conv_cpu.h"

namespace kiln::cuda {
namespace {

using Preparer = std::function<Launch(const LaunchSetup&)>;

kernels::ConvGeometry geometry(const LaunchSetup& s, const Shape& x, const Shape& w) {
  return kernels::conv_geometry(x, w, s.node.attrs.integer("stride"), s.node.attrs.integer("padding"));
}

kernels::PoolGeometry pool_geometry(const LaunchSetup& s) {
  return kernels::pool_geometry(s.input_types[0].shape, s.node.attrs.integer("kernel"), s.node.attrs.integer("stride"));
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
  return [args](jit::Stream stream) { matmul(args, stream); };
}

const std::map<std::string, Preparer>& preparers() {
  static const std::map<std::string, Preparer> table = {
      {"matmul", prepare_matmul},
      {"conv2d", [](const LaunchSetup& s) -> Launch {
         const auto g = geometry(s, s.input_types[0].shape, s.input_types[1].shape);
         const DType d = s.input_types[0].dtype;
         const ConvWorkspace ws{s.workspace, s.workspace_bytes};
         const void *x = s.inputs[0], *w = s.inputs[1];
         void* y = s.outputs[0];
         return [=](jit::Stream st) { conv2d_forward(d, g, x, w, y, ws, st); };
       }},
      {"conv2d_grad_input", [](const LaunchSetup& s) -> Launch {
         const auto g = geometry(s, s.node.outputs[0].shape, s.input_types[1].shape);
         const DType d = s.input_types[0].dtype;
         const ConvWorkspace ws{s.workspace, s.workspace_bytes};
         const void *dy = s.inputs[0], *w = s.inputs[1];
         void* dx = s.outputs[0];
         return [=](jit::Stream st) { conv2d_grad_input(d, g, dy, w, dx, ws, st); };
       }},
      {"conv2d_grad_weight", [](const LaunchSetup& s) -> Launch {
         const auto g = geometry(s, s.input_types[0].shape, s.node.outputs[0].shape);
         const DType d = s.input_types[0].dtype;
         const ConvWorkspace ws{s.workspace, s.workspace_bytes};
         const void *x = s.inputs[0], *dy = s.inputs[1];
         void* dw = s.outputs[0];
         return [=](jit::Stream st) { conv2d_grad_weight(d, g, x, dy, dw, ws, st); };
       }},
      {"max_pool2d", [](const LaunchSetup& s) -> Launch {
         const auto g = pool_geometry(s);
         const DType d = s.input_types[0].dtype;
         const void* x = s.inputs[0];
         void* y = s.outputs[0];
         return [=](jit::Stream st) { max_pool2d_forward(d, g, x, y, st); };
       }},
      {"max_pool2d_grad", [](const LaunchSetup& s) -> Launch {
         const auto g = pool_geometry(s);
         const DType d = s.input_types[0].dtype;
         const void *x = s.inputs[0], *dy = s.inputs[1];
         void* dx = s.outputs[0];
         return [=](jit::Stream st) { max_pool2d_grad(d, g, x, dy, dx, st); };
       }},
      {"max_pool2d_select", [](const LaunchSetup& s) -> Launch {
         const auto g = pool_geometry(s);
         const DType d = s.input_types[0].dtype;
         const void *x = s.inputs[0], *gi = s.inputs[1];
         void* out = s.outputs[0];
         return [=](jit::Stream st) { max_pool2d_select(d, g, x, gi, out, st); };
       }},
      {"transpose", [](const LaunchSetup& s) -> Launch {
         const DType d = s.input_types[0].dtype;
         const Shape shape = s.input_types[0].shape;
         const std::vector<std::int64_t> perm = s.node.attrs.integers("perm");
         const void* x = s.inputs[0];
         void* y = s.outputs[0];
         return [=](jit::Stream st) { transpose(d, shape, perm, x, y, st); };
       }},
      {"one_hot", [](const LaunchSetup& s) -> Launch {
         const DType label = s.input_types[0].dtype, out_dtype = s.node.outputs[0].dtype;
         const std::int64_t rows = s.input_types[0].shape[0], classes = s.node.attrs.integer("classes");
         const void* labels = s.inputs[0];
         void *out = s.outputs[0], *status = s.status;
         return [=](jit::Stream st) { one_hot(label, out_dtype, rows, classes, labels, out, status, st); };
       }},
      {"random_uniform", [](const LaunchSetup& s) -> Launch {
         const DType d = s.node.outputs[0].dtype;
         const auto seed = static_cast<std::uint64_t>(s.node.attrs.integer("seed"));
         const std::int64_t n = s.node.outputs[0].shape.numel();
         const void* step = s.inputs[0];
         void *out = s.outputs[0], *next = s.outputs[1];
         return [=](jit::Stream st) { random_uniform(d, seed, n, step, out, next, st); };
       }},
  };
  return table;
}

}  // namespace

Launch prepare_launch(const LaunchSetup& setup) {
  auto it = preparers().find(setup.node.op->name);
  KILN_CHECK(it != preparers().end(), "the CUDA backend has no kernel for op '{}'", setup.node.op->name);
  return it->second(setup);
}

namespace {

using SourceList = std::function<std::vector<jit::KernelSource>(const Node&, const std::vector<TensorType>&)>;

std::vector<jit::KernelSource> conv_sources(IgemmMode mode, DType dtype) {
  std::vector<jit::KernelSource> all = {im2col_source(dtype), col2im_source(dtype), conv_splitk_sum_source(dtype)};
  for (IgemmTile tile : igemm_tiles(mode, dtype)) all.push_back(conv_igemm_source(mode, tile, dtype));
  return all;
}

std::vector<jit::KernelSource> pool_sources(DType dtype) {
  std::vector<jit::KernelSource> all;
  for (PoolKernel p : {PoolKernel::forward, PoolKernel::grad, PoolKernel::select}) all.push_back(max_pool_source(p, dtype));
  for (PoolFast p : {PoolFast::forward_k2, PoolFast::forward_any, PoolFast::select_k2, PoolFast::select_any, PoolFast::grad_cells2,
                     PoolFast::grad_cells, PoolFast::grad_overlap})
    all.push_back(max_pool_fast_source(p, dtype));
  return all;
}

const std::map<std::string, SourceList>& source_lists() {
  static const std::map<std::string, SourceList> table = {
      {"conv2d", [](const Node&, const std::vector<TensorType>& in) { return conv_sources(IgemmMode::forward, in[0].dtype); }},
      {"conv2d_grad_input", [](const Node&, const std::vector<TensorType>& in) { return conv_sources(IgemmMode::grad_input, in[0].dtype); }},
      {"conv2d_grad_weight", [](const Node&, const std::vector<TensorType>& in) { return conv_sources(IgemmMode::grad_weight, in[0].dtype); }},
      {"max_pool2d", [](const Node&, const std::vector<TensorType>& in) { return pool_sources(in[0].dtype); }},
      {"max_pool2d_grad", [](const Node&, const std::vector<TensorType>& in) { return pool_sources(in[0].dtype); }},
      {"max_pool2d_select", [](const Node&, const std::vector<TensorType>& in) { return pool_sources(in[0].dtype); }},
      {"transpose", [](const Node&, const std::vector<TensorType>& in) {
         return std::vector<jit::KernelSource>{transpose_source(dtype_size(in[0].dtype))};
       }},
      {"one_hot", [](const Node& n, const std::vector<TensorType>& in) {
         return std::vector<jit::KernelSource>{one_hot_source(in[0].dtype, n.outputs[0].dtype), one_hot_finish_source(in[0].dtype)};
       }},
      {"random_uniform", [](const Node& n, const std::vector<TensorType>&) {
         return std::vector<jit::KernelSource>{random_uniform_source(n.outputs[0].dtype)};
       }},
  };
  return table;
}

}  // namespace

std::vector<jit::KernelSource> kernel_sources_for(const Node& node, const std::vector<TensorType>& input_types) {
  auto it = source_lists().find(node.op->name);
  return it == source_lists().end() ? std::vector<jit::KernelSource>{} : it->second(node, input_types);
}

bool has_cuda_launcher(const std::string& op_name) { return preparers().count(op_name) != 0; }

std::size_t workspace_bytes_for(const Node& node, const std::vector<TensorType>& in) {
  const std::string& op = node.op->name;
  if (op != "conv2d" && op != "conv2d_grad_input" && op != "conv2d_grad_weight") return 0;
  const std::int64_t stride = node.attrs.integer("stride"), padding = node.attrs.integer("padding");
  const Shape& x = op == "conv2d_grad_input" ? node.outputs[0].shape : in[0].shape;
  const Shape& w = op == "conv2d" ? in[1].shape : op == "conv2d_grad_input" ? in[1].shape : node.outputs[0].shape;
  const ConvPass pass = op == "conv2d" ? ConvPass::forward : op == "conv2d_grad_input" ? ConvPass::grad_input : ConvPass::grad_weight;
  return conv_workspace_bytes(kernels::conv_geometry(x, w, stride, padding), in[0].dtype, pass);
}

}  // namespace kiln::cuda
