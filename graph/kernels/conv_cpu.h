// CPU convolution: oneDNN for float32, im2col + Eigen GEMM (threads over the batch) for the
// other dtypes and where reproducible results are asked for. Pooling: pool_cpu.h.
#pragma once

#include <string>

#include "core/tensor.h"

namespace kiln::kernels {

struct ConvGeometry {
  std::int64_t batch, in_channels, height, width;
  std::int64_t out_channels, kernel_h, kernel_w;
  std::int64_t stride, padding;
  std::int64_t out_h, out_w;
};
// x: [B, Cin, H, W], w: [Cout, Cin, KH, KW]
ConvGeometry conv_geometry(const Shape& x, const Shape& w, std::int64_t stride,
                           std::int64_t padding);

// What a forward pass applies to each output value before it stores it (conv2d_bias's
// epilogue): + bias[o] (one value per output channel, of the convolution's dtype), then ReLU
// as the relu op computes it (v > 0 ? v : 0, so NaN becomes 0). The result is the same bits as
// the convolution stored and the two ops run after it.
struct ConvEpilogue {
  const Tensor* bias = nullptr;
  bool relu = false;
  bool empty() const { return bias == nullptr && !relu; }
};

// While one lives, this thread's convolutions use kiln's own kernels, whose results are the
// same bits for any thread count (oneDNN's reductions are split by thread).
class ReproducibleConvolutions {
 public:
  explicit ReproducibleConvolutions(bool on);
  ~ReproducibleConvolutions();
  ReproducibleConvolutions(const ReproducibleConvolutions&) = delete;
  ReproducibleConvolutions& operator=(const ReproducibleConvolutions&) = delete;

 private:
  bool previous_;
};

// The CPU program calls this before each kernel it runs, and twice when a run starts: a
// convolution pass reuses the copy in oneDNN's layout of an input the pass just before it
// made (a layer's dy, read by both of its gradient passes, which run back to back) only when
// no kernel ran between them, so the memory it was copied from still holds the same value
// (a node's outputs never share its inputs' buffers).
void begin_cpu_kernel();
std::uint64_t cpu_kernel_serial();  // this thread's count of begin_cpu_kernel calls

enum class ConvPass { forward, grad_input, grad_weight };

// The kernel a pass of this dtype and geometry runs on this thread now (in its reproducible
// mode or not): "oneDNN <its implementation>", e.g. "oneDNN jit_wino_4x3:avx512_core", or
// "kiln im2col"; KILN_PROFILE=groups names it beside each convolution.
// With an epilogue (conv2d_bias): where kiln applies it after oneDNN's kernel, the name says so.
std::string conv2d_kernel_name(ConvPass pass, DType dtype, const ConvGeometry& g,
                               const ConvEpilogue& epilogue = {});

// The activations (KernelCall::blocked's bits) this pass can read or write in oneDNN's
// 16-channel blocked layout: those of an f32 pass that oneDNN runs in that layout, outside the
// reproducible mode; 0 for kiln's own kernels.
std::uint32_t conv2d_blocked(ConvPass pass, DType dtype, const ConvGeometry& g);

// `blocked`: the arguments already in that layout (a subset of conv2d_blocked's).
void conv2d_forward(const Tensor& x, const Tensor& w, Tensor& y, const ConvGeometry& g,
                    std::uint32_t blocked = 0, const ConvEpilogue& epilogue = {});
void conv2d_backward_input(const Tensor& dy, const Tensor& w, Tensor& dx, const ConvGeometry& g,
                           std::uint32_t blocked = 0);
void conv2d_backward_weight(const Tensor& x, const Tensor& dy, Tensor& dw, const ConvGeometry& g,
                            std::uint32_t blocked = 0);

}  // namespace kiln::kernels
