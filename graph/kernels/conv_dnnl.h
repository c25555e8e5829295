// float32 convolutions through oneDNN (the library PyTorch's CPU convolutions use), on the
// same NCHW/OIHW buffers and geometry as conv_cpu.h's own kernels.
#pragma once

#include "graph/kernels/conv_cpu.h"
#include "graph/op.h"

namespace kiln::kernels {

// The oneDNN implementation that pass runs for this geometry, e.g. "jit:avx512_core", or
// "jit_wino_4x3:avx512_core" where it takes Winograd's F(4x4, 3x3).
// With an epilogue (a forward pass): "... with its epilogue" where oneDNN's kernel applies it,
// "... + kiln's epilogue" where kiln does after it (a kernel with no such post-op).
std::string dnnl_conv2d_implementation(const ConvGeometry& g, ConvPass pass,
                                       const ConvEpilogue& epilogue = {});

// The pass's activations that oneDNN runs in the 16-channel blocked layout (aBcd16b) and
// would reorder from and to NCHW: those it can take blocked (KernelCall::blocked's bits: input
// 0, input 1, kBlockedOutputs for the output).
std::uint32_t dnnl_conv2d_blocked(const ConvGeometry& g, ConvPass pass);

// While one lives, this thread's forward passes with an epilogue run oneDNN's plain kernel and
// kiln's epilogue after it, as where oneDNN's kernel takes no such post-op (for tests).
class DnnlWithoutPostOps {
 public:
  DnnlWithoutPostOps();
  ~DnnlWithoutPostOps();
  DnnlWithoutPostOps(const DnnlWithoutPostOps&) = delete;
  DnnlWithoutPostOps& operator=(const DnnlWithoutPostOps&) = delete;

 private:
  bool previous_;
};

// `blocked`: the arguments (bits as above) already in that layout, read and written in place.
void dnnl_conv2d_forward(const Tensor& x, const Tensor& w, Tensor& y, const ConvGeometry& g,
                         std::uint32_t blocked = 0, const ConvEpilogue& epilogue = {});
void dnnl_conv2d_backward_input(const Tensor& dy, const Tensor& w, Tensor& dx,
                                const ConvGeometry& g, std::uint32_t blocked = 0);
void dnnl_conv2d_backward_weight(const Tensor& x, const Tensor& dy, Tensor& dw,
                                 const ConvGeometry& g, std::uint32_t blocked = 0);

}  // namespace kiln::kernels
