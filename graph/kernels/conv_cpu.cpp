// CPU convolutions: a layer over one input channel at stride 1 directly (conv_few_channels.cpp:
// the forward and the weight gradient); otherwise float32 through oneDNN
// (conv_dnnl.cpp) unless reproducible ones are asked for, and else kiln's im2col kernels, where
// each image's patches become a [Cin*KH*KW, OH*OW] matrix, so every pass is one GEMM per image
// (threads split the batch, Eigen runs single-threaded inside the parallel region).
#include "graph/kernels/conv_cpu.h"

#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <cstring>
#include <limits>

#include "core/dispatch.h"
#include "graph/kernels/conv_dnnl.h"
#include "graph/kernels/conv_epilogue.h"
#include "graph/kernels/conv_few_channels.h"

namespace kiln::kernels {
namespace {

template <class T>
using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using MatrixMap = Eigen::Map<Matrix<T>>;
template <class T>
using ConstMatrixMap = Eigen::Map<const Matrix<T>>;

std::int64_t patch_rows(const ConvGeometry& g) { return g.in_channels * g.kernel_h * g.kernel_w; }
std::int64_t patch_cols(const ConvGeometry& g) { return g.out_h * g.out_w; }

// col[(c, kh, kw), (oh, ow)] = x[c, oh*s - p + kh, ow*s - p + kw] (0 outside the image).
template <class T>
void im2col(const T* x, T* col, const ConvGeometry& g) {
  for (std::int64_t c = 0; c < g.in_channels; ++c)
    for (std::int64_t kh = 0; kh < g.kernel_h; ++kh)
      for (std::int64_t kw = 0; kw < g.kernel_w; ++kw) {
        T* row = col + ((c * g.kernel_h + kh) * g.kernel_w + kw) * patch_cols(g);
        for (std::int64_t oh = 0; oh < g.out_h; ++oh) {
          const std::int64_t ih = oh * g.stride - g.padding + kh;
          T* out = row + oh * g.out_w;
          if (ih < 0 || ih >= g.height) {
            std::fill_n(out, g.out_w, T(0));
            continue;
          }
          const T* in = x + (c * g.height + ih) * g.width;
          for (std::int64_t ow = 0; ow < g.out_w; ++ow) {
            const std::int64_t iw = ow * g.stride - g.padding + kw;
            out[ow] = (iw >= 0 && iw < g.width) ? in[iw] : T(0);
          }
        }
      }
}

// The adjoint of im2col: x[c, ih, iw] += col[(c, kh, kw), (oh, ow)].
template <class T>
void col2im(const T* col, T* x, const ConvGeometry& g) {
  std::fill_n(x, g.in_channels * g.height * g.width, T(0));
  for (std::int64_t c = 0; c < g.in_channels; ++c)
    for (std::int64_t kh = 0; kh < g.kernel_h; ++kh)
      for (std::int64_t kw = 0; kw < g.kernel_w; ++kw) {
        const T* row = col + ((c * g.kernel_h + kh) * g.kernel_w + kw) * patch_cols(g);
        for (std::int64_t oh = 0; oh < g.out_h; ++oh) {
          const std::int64_t ih = oh * g.stride - g.padding + kh;
          if (ih < 0 || ih >= g.height) continue;
          T* out = x + (c * g.height + ih) * g.width;
          const T* in = row + oh * g.out_w;
          for (std::int64_t ow = 0; ow < g.out_w; ++ow) {
            const std::int64_t iw = ow * g.stride - g.padding + kw;
            if (iw >= 0 && iw < g.width) out[iw] += in[ow];
          }
        }
      }
}

template <class T>
void forward_typed(const Tensor& x, const Tensor& w, Tensor& y, const ConvGeometry& g,
                   const ConvEpilogue& e) {
  const std::int64_t in_size = g.in_channels * g.height * g.width;
  const std::int64_t out_size = g.out_channels * patch_cols(g);
  ConstMatrixMap<T> weight(w.data<T>(), g.out_channels, patch_rows(g));
#pragma omp parallel
  {
    std::vector<T> col(static_cast<std::size_t>(patch_rows(g) * patch_cols(g)));
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < g.batch; ++b) {
      im2col(x.data<T>() + b * in_size, col.data(), g);
      MatrixMap<T> out(y.data<T>() + b * out_size, g.out_channels, patch_cols(g));
      out.noalias() = weight * ConstMatrixMap<T>(col.data(), patch_rows(g), patch_cols(g));
      if (!e.empty())  // each channel's row while the image's output is in cache
        for (std::int64_t o = 0; o < g.out_channels; ++o)
          apply_conv_epilogue(out.row(o).data(), patch_cols(g), e, o);
    }
  }
}

template <class T>
void backward_input_typed(const Tensor& dy, const Tensor& w, Tensor& dx, const ConvGeometry& g) {
  const std::int64_t in_size = g.in_channels * g.height * g.width;
  const std::int64_t out_size = g.out_channels * patch_cols(g);
  ConstMatrixMap<T> weight(w.data<T>(), g.out_channels, patch_rows(g));
#pragma omp parallel
  {
    Matrix<T> col(patch_rows(g), patch_cols(g));
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < g.batch; ++b) {
      col.noalias() = weight.transpose() *
                      ConstMatrixMap<T>(dy.data<T>() + b * out_size, g.out_channels, patch_cols(g));
      col2im(col.data(), dx.data<T>() + b * in_size, g);
    }
  }
}

// Partial sums over a fixed split of the batch (at most 8 chunks, whatever the thread
// count), added in chunk order: the same bits for any number of threads.
template <class T>
void backward_weight_typed(const Tensor& x, const Tensor& dy, Tensor& dw, const ConvGeometry& g) {
  const std::int64_t in_size = g.in_channels * g.height * g.width;
  const std::int64_t out_size = g.out_channels * patch_cols(g);
  const std::int64_t chunks = std::min<std::int64_t>(g.batch, 8);
  std::vector<Matrix<T>> partials(static_cast<std::size_t>(chunks));
#pragma omp parallel
  {
    std::vector<T> col(static_cast<std::size_t>(patch_rows(g) * patch_cols(g)));
#pragma omp for schedule(static)
    for (std::int64_t c = 0; c < chunks; ++c) {
      Matrix<T>& partial = partials[static_cast<std::size_t>(c)];
      partial = Matrix<T>::Zero(g.out_channels, patch_rows(g));
      for (std::int64_t b = c * g.batch / chunks; b < (c + 1) * g.batch / chunks; ++b) {
        im2col(x.data<T>() + b * in_size, col.data(), g);
        partial.noalias() +=
            ConstMatrixMap<T>(dy.data<T>() + b * out_size, g.out_channels, patch_cols(g)) *
            ConstMatrixMap<T>(col.data(), patch_rows(g), patch_cols(g)).transpose();
      }
    }
  }
  MatrixMap<T> total(dw.data<T>(), g.out_channels, patch_rows(g));
  total.setZero();
  for (const Matrix<T>& partial : partials) total += partial;
}

thread_local bool reproducible_convolutions = false;
thread_local std::uint64_t kernel_serial = 0;

bool use_dnnl(DType dtype) { return !reproducible_convolutions && dtype == DType::f32; }

// The direct kernels where they were measured faster: one input channel at stride 1 (build
// machine, 2 threads, batch 64, 54 steps' worth: LeNet's 1 -> 32 3x3 layer's forward 24.4 ->
// 12.8 ms and weight gradient 21.6 -> 13.0 ms; VGG's 1 -> 16 layer 8.5 -> 7.7 and 12.8 -> 6.9
// ms). Over three channels (resnet18's 3 -> 64 layer, batch 32) they were 10-20 % slower than
// oneDNN's forward and level with im2col's weight gradient; at stride 2 (DCGAN's 4x4 layer)
// they lost to oneDNN's forward (17 -> 25 ms) and im2col's weight gradient (17 -> 19 ms).
bool use_few_channels(const ConvGeometry& g) {
  return few_channels_fits(g) && g.in_channels == 1 && g.stride == 1;
}

// oneDNN's backward passes over one to three input channels (a network's first layer) fall
// back to slow reference-like code: kiln's im2col kernels were 1.6-4x faster there (LeNet's
// and ResNet's first convolutions, batch 64, 2 threads), and 2-5x slower everywhere else.
bool use_dnnl_backward(DType dtype, const ConvGeometry& g) {
  return use_dnnl(dtype) && g.in_channels >= 4;
}

}  // namespace

void begin_cpu_kernel() { ++kernel_serial; }
std::uint64_t cpu_kernel_serial() { return kernel_serial; }

ReproducibleConvolutions::ReproducibleConvolutions(bool on) : previous_(reproducible_convolutions) {
  reproducible_convolutions = on;
}
ReproducibleConvolutions::~ReproducibleConvolutions() { reproducible_convolutions = previous_; }

ConvGeometry conv_geometry(const Shape& x, const Shape& w, std::int64_t stride,
                           std::int64_t padding) {
  ConvGeometry g{x[0], x[1], x[2], x[3], w[0], w[2], w[3], stride, padding, 0, 0};
  g.out_h = (g.height + 2 * padding - g.kernel_h) / stride + 1;
  g.out_w = (g.width + 2 * padding - g.kernel_w) / stride + 1;
  return g;
}

namespace {
bool direct(ConvPass pass, const ConvGeometry& g) {
  return pass != ConvPass::grad_input && use_few_channels(g);
}
// Whether oneDNN runs a pass of this dtype (neither kiln's direct nor its im2col kernels).
bool library(ConvPass pass, DType dtype, const ConvGeometry& g) {
  if (direct(pass, g)) return false;
  return pass == ConvPass::forward ? use_dnnl(dtype) : use_dnnl_backward(dtype, g);
}
}  // namespace

std::string conv2d_kernel_name(ConvPass pass, DType dtype, const ConvGeometry& g,
                               const ConvEpilogue& epilogue) {
  // bf16/f16 passes reach the kernels widened to f32 (backends/cpu/low_precision.cpp).
  const DType runs = is_low_precision(dtype) ? DType::f32 : dtype;
  if (direct(pass, g)) return "kiln direct";
  return library(pass, runs, g) ? "oneDNN " + dnnl_conv2d_implementation(g, pass, epilogue)
                                : "kiln im2col";
}

std::uint32_t conv2d_blocked(ConvPass pass, DType dtype, const ConvGeometry& g) {
  return dtype == DType::f32 && library(pass, dtype, g) ? dnnl_conv2d_blocked(g, pass) : 0;
}

void conv2d_forward(const Tensor& x, const Tensor& w, Tensor& y, const ConvGeometry& g,
                    std::uint32_t blocked, const ConvEpilogue& epilogue) {
  if (blocked != 0) return dnnl_conv2d_forward(x, w, y, g, blocked, epilogue);
  if (use_few_channels(g)) return few_channels_forward(x, w, y, g, epilogue);
  if (use_dnnl(x.dtype())) return dnnl_conv2d_forward(x, w, y, g, 0, epilogue);
  visit_floating(x.dtype(), "conv2d",
                 [&](auto zero) { forward_typed<decltype(zero)>(x, w, y, g, epilogue); });
}

void conv2d_backward_input(const Tensor& dy, const Tensor& w, Tensor& dx, const ConvGeometry& g,
                           std::uint32_t blocked) {
  if (blocked != 0 || use_dnnl_backward(dy.dtype(), g))
    return dnnl_conv2d_backward_input(dy, w, dx, g, blocked);
  visit_floating(dy.dtype(), "conv2d_grad_input",
                 [&](auto zero) { backward_input_typed<decltype(zero)>(dy, w, dx, g); });
}

void conv2d_backward_weight(const Tensor& x, const Tensor& dy, Tensor& dw, const ConvGeometry& g,
                            std::uint32_t blocked) {
  if (blocked != 0) return dnnl_conv2d_backward_weight(x, dy, dw, g, blocked);
  if (use_few_channels(g)) return few_channels_backward_weight(x, dy, dw, g);
  if (use_dnnl_backward(x.dtype(), g)) return dnnl_conv2d_backward_weight(x, dy, dw, g);
  visit_floating(x.dtype(), "conv2d_grad_weight",
                 [&](auto zero) { backward_weight_typed<decltype(zero)>(x, dy, dw, g); });
}

}  // namespace kiln::kernels
