// CUDA C of the layout kernels: transpose (by element size, any permutation of rank <= 8),
// concat (by element size, up to 32 pieces a launch), one_hot with an out-of-range report,
// and fill.
#include <fmt/format.h>

#include "backends/cuda/kernel_params.h"
#include "backends/cuda/kernel_sources.h"
#include "core/error.h"

namespace kiln::cuda {
namespace {

const char* unsigned_of_size(std::size_t bytes) {
  switch (bytes) {
    case 1:
      return "unsigned char";
    case 2:
      return "unsigned short";
    case 4:
      return "unsigned int";
    case 8:
      return "unsigned long long";
    default:
      break;
  }
  KILN_ASSERT(false, "no transpose kernel for {}-byte elements", bytes);
}

}  // namespace

// One thread per output element: coalesced writes, gathered reads.
gpu::KernelSource transpose_source(std::size_t element_bytes) {
  const std::string name = fmt::format("kiln_transpose_b{}", element_bytes);
  std::string code =
      fmt::format("typedef {} U;\n{}", unsigned_of_size(element_bytes), kTransposeShapeStruct);
  code += fmt::format(R"(
extern "C" __global__ void {0}(const U* __restrict__ x, U* __restrict__ y, TransposeShape s, long long n) {{
  {1} {{
    long long offset = 0, rest = i;
    for (int d = s.rank - 1; d >= 0; --d) {{
      offset += (rest % s.dims[d]) * s.src_strides[d];
      rest /= s.dims[d];
    }}
    y[i] = x[offset];
  }}
}}
)",
                      name, kGridStrideLoop);
  return {name, code, {}};
}

// One thread per output element of the launch's columns [base, base + width) of each of
// `outer` rows of `row` elements; the piece is found by binary search over the ends.
gpu::KernelSource concat_source(std::size_t element_bytes) {
  const std::string name = fmt::format("kiln_concat_b{}", element_bytes);
  std::string code =
      fmt::format("typedef {} U;\n{}", unsigned_of_size(element_bytes), kConcatPiecesStruct);
  code += fmt::format(R"(
extern "C" __global__ void {0}(ConcatPieces p, U* __restrict__ out, long long outer, long long row, long long base,
                               long long width) {{
  const long long n = outer * width;
  {1} {{
    const long long r = i / width, col = i - r * width;
    int lo = 0, hi = p.count - 1;
    while (lo < hi) {{
      const int mid = (lo + hi) / 2;
      if (col < p.end[mid]) hi = mid; else lo = mid + 1;
    }}
    const long long start = lo > 0 ? p.end[lo - 1] : 0;
    const U* src = (const U*)p.src[lo];
    out[r * row + base + col] = src[r * (p.end[lo] - start) + (col - start)];
  }}
}}
)",
                      name, kGridStrideLoop);
  return {name, code, {}};
}

// out: [rows, classes]; a row whose label is outside [0, classes) stays all zero and the
// smallest such row index goes to status[0] (which the host set to all ones beforehand).
gpu::KernelSource one_hot_source(DType label, DType out) {
  const std::string name = fmt::format("kiln_one_hot_{}_{}", dtype_name(label), dtype_name(out));
  const std::string code =
      fmt::format(R"(typedef {0} L;
typedef {1} T;
extern "C" __global__ void {2}(const L* __restrict__ labels, T* __restrict__ out, long long rows, long long classes,
                               unsigned long long* __restrict__ status) {{
  const long long n = rows * classes;
  {3} {{
    const long long row = i / classes;
    const long long column = i - row * classes;
    const long long label = (long long)labels[row];
    out[i] = label == column ? T(1) : T(0);
    if (column == 0 && (label < 0 || label >= classes)) atomicMin(status, (unsigned long long)row);
  }}
}}
)",
                  cuda_type_name(label), cuda_type_name(out), name, kGridStrideLoop);
  return {name, code, {}};
}

// One thread: status[1] = the label at the bad row status[0], if there is one.
gpu::KernelSource one_hot_finish_source(DType label) {
  const std::string name = fmt::format("kiln_one_hot_finish_{}", dtype_name(label));
  const std::string code = fmt::format(R"(typedef {0} L;
extern "C" __global__ void {1}(const L* __restrict__ labels, unsigned long long* __restrict__ status) {{
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const unsigned long long row = status[0];
  if (row != ~0ull) status[1] = (unsigned long long)(long long)labels[row];
}}
)",
                                       cuda_type_name(label), name);
  return {name, code, {}};
}

gpu::KernelSource fill_source(DType dtype) {
  const std::string name = fmt::format("kiln_fill_{}", dtype_name(dtype));
  const std::string code = fmt::format(R"(typedef {0} T;
extern "C" __global__ void {1}(T* __restrict__ out, T value, long long n) {{
  {2} out[i] = value;
}}
)",
                                       cuda_type_name(dtype), name, kGridStrideLoop);
  return {name, code, {}};
}

}  // namespace kiln::cuda
