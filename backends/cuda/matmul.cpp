// matmul as one strided-batched GEMM; see gemm.h for the row-major mapping.
#include "backends/cuda/matmul.h"

#include "backends/cuda/gemm.h"
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

}  // namespace kiln::cuda
