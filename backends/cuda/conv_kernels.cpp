// CUDA C of the convolution's data-movement kernels: im2col (one thread per patch-matrix
// element) and col2im as a gather (one thread per input element, no atomics).
#include <fmt/format.h>

#include "backends/cuda/kernel_params.h"
#include "backends/cuda/kernel_sources.h"

namespace kiln::cuda {

// col[(c, kh, kw), (oh, ow)] of image b = x[b, c, oh*s - p + kh, ow*s - p + kw], 0 outside.
jit::KernelSource im2col_source(DType dtype) {
  const std::string name = fmt::format("kiln_im2col_{}", dtype_name(dtype));
  std::string code = fmt::format("typedef {} T;\n{}", cuda_type_name(dtype), kConvShapeStruct);
  code += fmt::format(R"(
extern "C" __global__ void {0}(const T* __restrict__ x, T* __restrict__ col, ConvShape g) {{
  const long long cols = g.out_h * g.out_w;
  const long long rows = g.channels * g.kernel_h * g.kernel_w;
  const long long n = g.images * rows * cols;
  {1} {{
    const long long ohw = i % cols;
    const long long row = (i / cols) % rows;
    const long long b = i / (cols * rows);
    const long long kw = row % g.kernel_w;
    const long long kh = (row / g.kernel_w) % g.kernel_h;
    const long long c = row / (g.kernel_w * g.kernel_h);
    const long long ih = (ohw / g.out_w) * g.stride - g.padding + kh;
    const long long iw = (ohw % g.out_w) * g.stride - g.padding + kw;
    const bool inside = ih >= 0 && ih < g.height && iw >= 0 && iw < g.width;
    col[b * g.image_stride + row * g.row_stride + ohw] =
        inside ? x[((b * g.channels + c) * g.height + ih) * g.width + iw] : T(0);
  }}
}}
)",
                      name, kGridStrideLoop);
  return {name, code, {}};
}

// The adjoint of im2col: x[b, c, ih, iw] = sum over (kh, kw) of the col element that read
// it, in the CPU col2im's order of (kh, kw), so each element's sum is deterministic.
jit::KernelSource col2im_source(DType dtype) {
  const std::string name = fmt::format("kiln_col2im_{}", dtype_name(dtype));
  std::string code = fmt::format("typedef {} T;\n{}", cuda_type_name(dtype), kConvShapeStruct);
  code += fmt::format(R"(
extern "C" __global__ void {0}(const T* __restrict__ col, T* __restrict__ x, ConvShape g) {{
  const long long n = g.images * g.channels * g.height * g.width;
  {1} {{
    const long long iw = i % g.width;
    const long long ih = (i / g.width) % g.height;
    const long long c = (i / (g.width * g.height)) % g.channels;
    const long long b = i / (g.width * g.height * g.channels);
    const T* image = col + b * g.image_stride;
    T sum = T(0);
    for (long long kh = 0; kh < g.kernel_h; ++kh) {{
      const long long oh_s = ih + g.padding - kh;  // oh * stride
      if (oh_s < 0 || oh_s % g.stride != 0 || oh_s / g.stride >= g.out_h) continue;
      for (long long kw = 0; kw < g.kernel_w; ++kw) {{
        const long long ow_s = iw + g.padding - kw;
        if (ow_s < 0 || ow_s % g.stride != 0 || ow_s / g.stride >= g.out_w) continue;
        const long long row = (c * g.kernel_h + kh) * g.kernel_w + kw;
        sum += image[row * g.row_stride + (oh_s / g.stride) * g.out_w + ow_s / g.stride];
      }}
    }}
    x[i] = sum;
  }}
}}
)",
                      name, kGridStrideLoop);
  return {name, code, {}};
}

}  // namespace kiln::cuda
