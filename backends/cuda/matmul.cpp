// matmul as one strided-batched GEMM (see gemm.h for the row-major mapping), and its CUDA op
// entry.
#include "backends/cuda/matmul.h"

#include <algorithm>
#include <memory>

#include "backends/cuda/gemm.h"
#include "backends/cuda/gemm_epilogue.h"
#include "backends/cuda/op_entry.h"
#include "core/error.h"

namespace kiln::cuda {

void matmul(const MatmulArgs& args, gpu::Stream stream) {
  KILN_CHECK(args.batch >= 0 && args.m >= 0 && args.n >= 0 && args.k >= 0,
             "matmul: negative size (batch {}, M {}, N {}, K {})", args.batch, args.m, args.n,
             args.k);
  RowMajorGemm g;
  g.trans_a = args.trans_a;
  g.trans_b = args.trans_b;
  g.m = args.m;
  g.n = args.n;
  g.k = args.k;
  g.batch = args.batch;
  g.a = args.a;
  g.ld_a = args.trans_a ? args.m : args.k;  // stored row length
  g.stride_a = args.m * args.k;
  g.b = args.b;
  g.ld_b = args.trans_b ? args.k : args.n;
  g.stride_b = args.k * args.n;
  g.c = args.c;
  g.ld_c = args.n;
  g.stride_c = args.m * args.n;
  g.alpha = args.alpha;
  g.beta = args.beta;
  gemm(args.dtype, g, stream);
}

namespace {

// a, b: [..., M, K] x [..., K, N] (transposed as the attributes say) -> c: [..., M, N].
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

// a, b as matmul's (2-D), bias [N] -> c = a b + bias (relu): one cuBLASLt call, its plan made
// here once.
Launch prepare_matmul_bias(const LaunchSetup& s) {
  const Shape& a = s.input_types[0].shape;
  const Shape& c = s.node.outputs[0].shape;
  const bool ta = s.node.attrs.integer("trans_a") != 0;
  KILN_CHECK(c.rank() == 2, "matmul_bias: the product is {} (2-D expected)", c.str());
  auto plan =
      std::make_shared<BiasGemmPlan>(BiasGemm{.dtype = s.input_types[0].dtype,
                                              .bias_dtype = s.input_types[2].dtype,
                                              .trans_a = ta,
                                              .trans_b = s.node.attrs.integer("trans_b") != 0,
                                              .relu = s.node.attrs.integer("relu") != 0,
                                              .m = c[0],
                                              .n = c[1],
                                              .k = ta ? a[0] : a[1],
                                              .a = s.inputs[0],
                                              .b = s.inputs[1],
                                              .bias = s.inputs[2],
                                              .c = s.outputs[0]});
  return [plan](gpu::Stream stream) { plan->launch(stream); };
}

}  // namespace

void add_matmul_ops(CudaOpTable& table) {
  table[OpId::matmul] = {.prepare = prepare_matmul};
  table[OpId::matmul_bias] = {.prepare = prepare_matmul_bias};
}

}  // namespace kiln::cuda
