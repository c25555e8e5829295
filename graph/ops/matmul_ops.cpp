// matmul: [..., M, K] x [..., K, N] -> [..., M, N] (leading axes equal), optional
// transposes of either operand's last two axes; on the CPU oneDNN's sgemm for float32 (about
// a fifth faster than Eigen's on the zoo's shapes), Eigen's GEMM for float64. matmul_bias:
// the same plus a bias [N] on every row, then ReLU when `relu` is 1: the GEMM with its
// epilogue (fusion/gemm_epilogues.h makes it from a matmul and its bias group; no gradient).
#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <oneapi/dnnl/dnnl.h>
#include <type_traits>

#include "core/dispatch.h"
#include "graph/ops.h"
#include "graph/ops/register.h"

namespace kiln {
namespace {

struct MatmulDims {
  std::int64_t batch, m, k, n;
};

MatmulDims matmul_dims(const Shape& a, const Shape& b, bool trans_a, bool trans_b) {
  const std::size_t r = a.rank();
  const std::int64_t m = trans_a ? a[r - 1] : a[r - 2];
  const std::int64_t k = trans_a ? a[r - 2] : a[r - 1];
  const std::int64_t n = trans_b ? b[r - 2] : b[r - 1];
  return {a.numel() / std::max<std::int64_t>(a[r - 1] * a[r - 2], 1), m, k, n};
}

std::vector<TensorType> infer_matmul(std::span<const TensorType> in, const Attrs& attrs) {
  ops::check_floating_inputs("matmul", in);
  const Shape& a = in[0].shape;
  const Shape& b = in[1].shape;
  KILN_CHECK(a.rank() >= 2 && a.rank() == b.rank(),
             "matmul: lhs is {} but rhs is {} (equal ranks >= 2 needed)", a.str(), b.str());
  const bool ta = attrs.integer("trans_a") != 0;
  const bool tb = attrs.integer("trans_b") != 0;
  const std::size_t r = a.rank();
  const std::int64_t k_b = tb ? b[r - 1] : b[r - 2];
  const MatmulDims d = matmul_dims(a, b, ta, tb);
  KILN_CHECK(d.k == k_b, "matmul: lhs is {}{} but rhs is {}{} (inner dimensions {} and {} differ)",
             a.str(), ta ? "^T" : "", b.str(), tb ? "^T" : "", d.k, k_b);
  std::vector<std::int64_t> dims(a.dims().begin(), a.dims().end() - 2);
  for (std::size_t i = 0; i + 2 < r; ++i)
    KILN_CHECK(a[i] == b[i], "matmul: batch axes differ: lhs is {} but rhs is {}", a.str(),
               b.str());
  dims.push_back(d.m);
  dims.push_back(d.n);
  return {{Shape(dims), in[0].dtype}};
}

struct MatmulBlocks {
  std::int64_t row_size, column_size, rows, columns;  // block sizes and counts
};

// Halves the blocks (the longer side first) until there are 16 of them, enough for 8-16
// threads, while each keeps at least 2^21 multiply-adds (about 40 us on one core; a weight
// gradient's [64 x 4096] x [4096 x 1024] had 4 blocks, so 8 threads ran it at half speed).
// Shapes only decide, never the thread count.
void split_for_threads(const MatmulDims& d, MatmulBlocks& b) {
  constexpr std::int64_t kWanted = 16, kMinWork = std::int64_t{1} << 21;
  auto count = [](std::int64_t extent, std::int64_t size) { return (extent + size - 1) / size; };
  while (d.batch * b.rows * b.columns < kWanted) {
    const std::int64_t h = std::min(b.row_size, d.m), w = std::min(b.column_size, d.n);
    if (h * w * d.k / 2 < kMinWork) return;
    const bool rows_split = h >= 64 && count(d.m, b.row_size / 2) > b.rows;
    const bool columns_split = w >= 32 && count(d.n, b.column_size / 2) > b.columns;
    if (rows_split && (h >= w || !columns_split)) {
      b.row_size /= 2;
      b.rows = count(d.m, b.row_size);
    } else if (columns_split) {
      b.column_size /= 2;
      b.columns = count(d.n, b.column_size);
    } else {
      return;
    }
  }
}

// Columns in blocks 64 wide, up to 256 where there are 4 such blocks (wider blocks repack
// the left operand less often: about 10% faster on an LSTM's GEMMs); rows in blocks of 256.
// Where that leaves one block (few rows, at most 64 columns: a one-hot embedding's weight
// gradient), columns 16 wide instead.
MatmulBlocks matmul_blocks(const MatmulDims& d) {
  constexpr std::int64_t kRows = 256;
  std::int64_t columns = 64 * std::clamp<std::int64_t>(d.n / 256, 1, 4);
  const std::int64_t row_blocks = std::max<std::int64_t>((d.m + kRows - 1) / kRows, 1);
  if (row_blocks == 1 && d.n <= columns) columns = 16;
  MatmulBlocks blocks{kRows, columns, row_blocks,
                      std::max<std::int64_t>((d.n + columns - 1) / columns, 1)};
  split_for_threads(d, blocks);
  return blocks;
}

// Rows [r0, r0 + h) and columns [c0, c0 + w) of one batch entry's C = op(A) op(B) through
// oneDNN's row-major sgemm, on the calling thread alone (see matmul_kernel_typed).
void sgemm_block(bool ta, bool tb, const float* a, const float* b, float* c, const MatmulDims& d,
                 std::int64_t r0, std::int64_t h, std::int64_t c0, std::int64_t w) {
  const float* pa = ta ? a + r0 : a + r0 * d.k;
  const float* pb = tb ? b + c0 * d.k : b + c0;
  const dnnl_status_t status =
      dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', h, w, d.k, 1.0f, pa, ta ? d.m : d.k, pb,
                 tb ? d.k : d.n, 0.0f, c + r0 * d.n + c0, d.n);
  KILN_CHECK(status == dnnl_success, "matmul: oneDNN's sgemm failed ({})",
             static_cast<int>(status));
}

// Each row of block [r0, r0 + h) x [c0, c0 + w) of C plus the bias's columns, then ReLU if
// asked: the GEMM's epilogue, on the block while it is in cache.
template <class T>
void add_bias_to_block(T* c, std::int64_t ldc, const T* bias, bool relu, std::int64_t r0,
                       std::int64_t h, std::int64_t c0, std::int64_t w) {
  for (std::int64_t r = r0; r < r0 + h; ++r) {
    T* row = c + r * ldc + c0;
    const T* b = bias + c0;
    for (std::int64_t j = 0; j < w; ++j) {
      const T v = row[j] + b[j];
      row[j] = relu && !(v > T(0)) ? T(0) : v;
    }
  }
}

// C = op(A) op(B), then (bias non-null) each row plus the bias, then ReLU if `relu`.
template <class T>
void matmul_kernel_typed(const KernelCall& call, const T* bias = nullptr, bool relu = false) {
  using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Map = Eigen::Map<const Matrix>;
  const bool ta = call.node.attrs.integer("trans_a") != 0;
  const bool tb = call.node.attrs.integer("trans_b") != 0;
  const Tensor& a = call.inputs[0];
  const Tensor& b = call.inputs[1];
  const MatmulDims d = matmul_dims(a.shape(), b.shape(), ta, tb);
  const std::size_t r = a.shape().rank();
  if (d.k == 0) {  // an empty sum: Eigen would leave the output untouched
    std::fill_n(call.outputs[0].data<T>(), call.outputs[0].numel(), T(0));
    if (bias != nullptr)
      for (std::int64_t i = 0; i < d.batch; ++i)
        add_bias_to_block(call.outputs[0].data<T>() + i * d.m * d.n, d.n, bias, relu, 0, d.m, 0,
                          d.n);
    return;
  }
  // Threads share fixed blocks of output rows and columns, each a single-threaded Eigen GEMM
  // (Eigen does not thread inside an active parallel region): every element is summed in the
  // same order whatever the thread count, so results are the same bits on any machine. The
  // block sizes depend on the shapes only (matmul_blocks). A lone task would run inside an
  // inactive region, where Eigen starts a nested team of fresh threads: far slower.
  // oneDNN's sgemm, like Eigen, runs on the calling thread inside an active parallel region;
  // outside one it would thread itself (its own split), so it is then limited to one thread.
  const MatmulBlocks blocks = matmul_blocks(d);
  const std::int64_t tasks = d.batch * blocks.rows * blocks.columns;
  const bool parallel = tasks > 1 && d.m * d.n * d.k > 32768;
  const int threads = omp_get_max_threads();
  if (!parallel) omp_set_num_threads(1);
#pragma omp parallel for schedule(static) if (parallel)
  for (std::int64_t task = 0; task < tasks; ++task) {
    const std::int64_t i = task / (blocks.rows * blocks.columns),
                       rest = task % (blocks.rows * blocks.columns);
    const std::int64_t r0 = rest / blocks.columns * blocks.row_size,
                       h = std::min(blocks.row_size, d.m - r0);
    const std::int64_t c0 = rest % blocks.columns * blocks.column_size,
                       w = std::min(blocks.column_size, d.n - c0);
    T* const c = call.outputs[0].data<T>() + i * d.m * d.n;
    if constexpr (std::is_same_v<T, float>) {
      sgemm_block(ta, tb, a.data<float>() + i * d.m * d.k, b.data<float>() + i * d.k * d.n, c, d,
                  r0, h, c0, w);
    } else {
      Map ma(a.data<T>() + i * d.m * d.k, a.shape()[r - 2], a.shape()[r - 1]);
      Map mb(b.data<T>() + i * d.k * d.n, b.shape()[r - 2], b.shape()[r - 1]);
      Eigen::Map<Matrix> mc(c, d.m, d.n);
      auto out = mc.block(r0, c0, h, w);
      if (!ta && !tb) out.noalias() = ma.middleRows(r0, h) * mb.middleCols(c0, w);
      if (ta && !tb) out.noalias() = ma.middleCols(r0, h).transpose() * mb.middleCols(c0, w);
      if (!ta && tb) out.noalias() = ma.middleRows(r0, h) * mb.middleRows(c0, w).transpose();
      if (ta && tb)
        out.noalias() = ma.middleCols(r0, h).transpose() * mb.middleRows(c0, w).transpose();
    }
    if (bias != nullptr) add_bias_to_block(c, d.n, bias, relu, r0, h, c0, w);
  }
  if (!parallel) omp_set_num_threads(threads);
}

// C = op(A) op(B): dA and dB as matmuls of dC with the other operand, transposes chosen so
// that no transpose is ever materialised.
std::vector<Value> matmul_grad(const GradContext& c) {
  const bool ta = c.node.attrs.integer("trans_a") != 0;
  const bool tb = c.node.attrs.integer("trans_b") != 0;
  const Value& a = c.inputs[0];
  const Value& b = c.inputs[1];
  const Value& dc = c.output_grads[0];
  Value da, db;
  if (c.needs_grad[0]) da = ta ? matmul(b, dc, tb, true) : matmul(dc, b, false, !tb);
  if (c.needs_grad[1]) db = tb ? matmul(dc, a, true, ta) : matmul(a, dc, !ta, false);
  return {da, db};
}

}  // namespace

std::vector<TensorType> infer_matmul_bias(std::span<const TensorType> in, const Attrs& attrs) {
  KILN_CHECK(in.size() == 3, "matmul_bias: {} inputs (a, b, bias expected)", in.size());
  std::vector<TensorType> out = infer_matmul(in.subspan(0, 2), attrs);
  const Shape& c = out[0].shape;
  KILN_CHECK(in[2].shape.numel() == c[c.rank() - 1] && is_floating(in[2].dtype),
             "matmul_bias: the bias is {} but the product is {} (a float bias of {} expected)",
             in[2].str(), out[0].str(), c[c.rank() - 1]);
  return out;
}

// The product, then each row plus the bias (and ReLU), block by block inside the GEMM's
// parallel loop, in the compute type: one rounding where the output is stored (the CPU
// program rounds low-precision outputs).
template <class T>
void matmul_bias_kernel_typed(const KernelCall& call) {
  matmul_kernel_typed<T>(call, call.inputs[2].data<T>(), call.node.attrs.integer("relu") != 0);
}

namespace {

// 2 x (output values) x K, K a's columns (rows where it is transposed).
double matmul_flops(const Node& n, std::span<const TensorType> in) {
  const Shape& a = in[0].shape;
  const std::int64_t k = n.attrs.integer("trans_a") != 0 ? a[a.rank() - 2] : a[a.rank() - 1];
  return 2.0 * static_cast<double>(n.outputs[0].shape.numel()) * static_cast<double>(k);
}

}  // namespace

void ops::register_matmul_ops(std::vector<OpDef>& table) {
  OpDef op{.id = OpId::matmul, .kind = OpKind::matmul, .arity = 2, .attrs = {"trans_a", "trans_b"}};
  op.flops = matmul_flops;
  op.infer = infer_matmul;
  op.grad = matmul_grad;
  op.cpu = [](const KernelCall& call) {
    visit_floating(call.inputs[0].dtype(), "matmul",
                   [&](auto zero) { matmul_kernel_typed<decltype(zero)>(call); });
  };
  op.autocast = AutocastPolicy::low;
  table.push_back(std::move(op));
  OpDef with_bias{.id = OpId::matmul_bias,
                  .kind = OpKind::matmul,
                  .arity = 3,
                  .attrs = {"trans_a", "trans_b", "relu"}};
  with_bias.infer = infer_matmul_bias;
  with_bias.flops = matmul_flops;
  with_bias.cpu = [](const KernelCall& call) {
    visit_floating(call.inputs[0].dtype(), "matmul_bias",
                   [&](auto zero) { matmul_bias_kernel_typed<decltype(zero)>(call); });
  };
  with_bias.autocast = AutocastPolicy::keep;
  table.push_back(std::move(with_bias));
}

Value matmul(Value a, Value b, bool trans_a, bool trans_b) {
  return a.graph().apply1(OpId::matmul, {a, b},
                          {{"trans_a", std::int64_t{trans_a}}, {"trans_b", std::int64_t{trans_b}}});
}

}  // namespace kiln
