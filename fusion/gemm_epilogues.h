// fuse_gemm_epilogues: a 2-D matmul whose only reader is a fused group computing
// `product + bias` (the bias [N] read along each row, or its cast to the product's dtype:
// then a cast node), optionally then `relu`, and nothing else, becomes one matmul_bias node: the
// GEMM applies both in its epilogue (cuBLASLt's BIAS / RELU_BIAS on the GPU), so the product is
// never stored and read back.
//
// Pre: the output of fuse (and stage_reductions). Post: the same values (the product is
// rounded once, after the bias and ReLU, where the unfused ops rounded it first); every output
// and assignment refers to the same value. KILN_GEMM_EPILOGUES=0 turns it off. Without
// f32_products only bf16/f16 products are taken (the GPU's policy, compile(): in fp32
// cuBLASLt's GEMMs were slower than cuBLAS's on the zoo, H200, lenet 0.153 -> 0.167 ms; in bf16
// faster, 0.135 -> 0.131), whatever the precision option says, so a bf16 graph compiled as it
// is and the same step compiled by precision get the same kernels. The CPU takes f32 products
// only (graph/ops/matmul_ops.cpp adds the bias to each block of C while it is in cache, the
// same bits as the unfused ops; a bf16 product would be rounded once instead of twice, and the
// CPU's fused bf16 step equals its unfused one).
//
// With `convolutions`, an f32 conv2d that it takes (the CPU's policy: every one; the GPU's:
// those whose pass applies the epilogue itself, cuda::conv_node_applies_bias) read only by such
// a group over its [B, C, H, W] output, the bias [C] (any shape of C values, read along the
// channels), becomes one conv2d_bias node: on the CPU oneDNN's kernel adds the bias and applies
// ReLU as it stores (post-ops: a binary add and ReLU; Winograd's kernel its bias argument),
// kiln's direct and im2col kernels to each output plane while it is in cache; on the GPU the
// CUDA cores' passes as they store y (the direct stem kernel, the implicit GEMM); the same bits
// as the three ops (conv_epilogue_test). The GPU's bf16/f16 convolutions keep their groups.
#pragma once

#include <functional>
#include <span>

#include "graph/graph.h"

namespace kiln {

struct FusionReport;  // fusion/fuse.h: its groups follow the new node ids when given
// Whether an f32 conv2d node (inputs: its image and filter) takes conv2d_bias's epilogue.
using ConvEpilogueWanted =
    std::function<bool(const Node& conv, std::span<const TensorType> inputs)>;
struct GemmEpilogueOptions {
  bool f32_products = true;
  bool low_products = true;         // bf16 and f16 products
  ConvEpilogueWanted convolutions;  // f32 convolutions' forwards (empty: none)
};
// The CPU's choice of convolutions: every f32 forward.
bool every_convolution(const Node& conv, std::span<const TensorType> inputs);
Graph fuse_gemm_epilogues(const Graph& fused, FusionReport* report = nullptr,
                          const GemmEpilogueOptions& options = {});

}  // namespace kiln
