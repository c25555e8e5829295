// The CUDA op entries of conv2d, conv2d_grad_input and conv2d_grad_weight (conv.h): each
// pass's geometry from the node, its launch, its kernels and its workspace.
#include <tuple>

#include "backends/cuda/conv.h"
#include "backends/cuda/conv_tma.h"
#include "backends/cuda/conv_tuning.h"
#include "backends/cuda/kernel_sources.h"
#include "backends/cuda/op_entry.h"

namespace kiln::cuda {
namespace {

// The convolution a node of `pass` computes a pass of: x is the input (forward, grad_weight)
// or the output (grad_input); w the second input or, in grad_weight, the output.
kernels::ConvGeometry geometry_of(ConvPass pass, const Node& node, const InputTypes& in) {
  const Shape& x = pass == ConvPass::grad_input ? node.outputs[0].shape : in[0].shape;
  const Shape& w = pass == ConvPass::grad_weight ? node.outputs[0].shape : in[1].shape;
  return kernels::conv_geometry(x, w, node.attrs.integer("stride"), node.attrs.integer("padding"));
}

using ConvLaunch = void (*)(DType, const kernels::ConvGeometry&, const void*, const void*, void*,
                            ConvWorkspace, gpu::Stream);

ConvLaunch launcher_of(ConvPass pass) {
  switch (pass) {
    case ConvPass::forward:
      return conv2d_forward;  // x, w -> y
    case ConvPass::grad_input:
      return conv2d_grad_input;  // dy, w -> dx
    case ConvPass::grad_weight:
      return conv2d_grad_weight;  // x, dy -> dw
  }
  return nullptr;
}

CudaOpEntry conv_entry(ConvPass pass) {
  CudaOpEntry e;
  e.prepare = [pass](const LaunchSetup& s) -> Launch {
    const kernels::ConvGeometry g = geometry_of(pass, s.node, s.input_types);
    const DType dtype = s.input_types[0].dtype;
    const ConvWorkspace ws{s.workspace, s.workspace_bytes};
    const void *a = s.inputs[0], *b = s.inputs[1];
    void* out = s.outputs[0];
    const ConvLaunch launch = launcher_of(pass);
    return [=](gpu::Stream st) { launch(dtype, g, a, b, out, ws, st); };
  };
  e.sources = [pass](const Node& n, const InputTypes& in) {
    return conv_kernel_sources(geometry_of(pass, n, in), in[0].dtype, pass);
  };
  e.workspace_bytes = [pass](const Node& n, const InputTypes& in) {
    return conv_workspace_bytes(geometry_of(pass, n, in), in[0].dtype, pass);
  };
  return e;
}

// Every tile the choice can return for each pass and floating dtype (bf16/f16 grad_weight
// also with f32 partials), the split-K sum, the im2col fallback's kernels, and fill
// (grad_weight zeroes dW where the batch is empty).
std::vector<gpu::KernelSource> every_conv_source() {
  std::vector<gpu::KernelSource> all;
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    all.push_back(im2col_source(t));
    all.push_back(col2im_source(t));
    for (IgemmMode mode : {IgemmMode::forward, IgemmMode::grad_input, IgemmMode::grad_weight})
      for (IgemmTile tile : igemm_tiles(mode, t)) {
        all.push_back(conv_igemm_source(mode, tile, t));
        if (mode == IgemmMode::grad_weight && is_low_precision(t))  // f32 split-K partials
          all.push_back(conv_igemm_source(mode, tile, t, true));
      }
    all.push_back(conv_splitk_sum_source(t));
    if (is_low_precision(t))  // the tensor-core passes
      for (int bm : {64, 128})
        for (bool vec : {false, true}) {
          for (ConvMmaKind kind :
               {ConvMmaKind::forward, ConvMmaKind::grad_input, ConvMmaKind::grad_input_stride2})
            all.push_back(conv_mma_source(t, bm, vec, kind));
          for (bool f32_partials : {false, true})
            for (bool runs : {false, true})
              for (WgradTile tile : kWgradCandidates)  // every tile the tuner may choose (it
                // tunes only passes whose dy arrives by cp.async: vec)
                if (tile.bm == bm && (vec || tile == conv_mma_wgrad_default_tile(bm)))
                  all.push_back(conv_mma_wgrad_source(t, tile, vec, f32_partials, runs));
        }
    if (is_low_precision(t) || t == DType::f32)  // the channels-last passes (f32: TF32)
      for (NhwcTile tile : kNhwcCandidates)      // every tile the tuner may choose
        for (bool dilated : {false, true}) all.push_back(conv_nhwc_source(t, tile, dilated));
    if (is_low_precision(t)) {  // the wgmma tiles (sm_90)
      for (NhwcTile tile : kWgmmaCandidates)
        for (bool dilated : {false, true}) all.push_back(conv_nhwc_source(t, tile, dilated));
      for (int bm : {64, 128})  // the TMA pass's tiles (conv_tma.h)
        for (int bn : {128, 256})
          for (int teams : {1, 2})  // two teams: the 64-filter tiles only (conv_tma_tile)
            if (teams == 1 || bm == 64)
              all.push_back(conv_tma_source(t, conv_tma_tile_of(bm, bn, teams)));
      for (auto [bm, atoms, ar] : {std::tuple{64, 3, 64}, std::tuple{128, 3, 64},
                                   std::tuple{128, 4, 16}, std::tuple{64, 1, 32}})
        for (bool wide : {false, true})  // grad_weight's TMA pass
          all.push_back(conv_tma_wgrad_source(t, conv_tma_wgrad_tile_of(bm, atoms, ar, wide)));
      all.push_back(conv_tma_wgrad_sum_source(t));
      for (WgradTile tile : kWgmmaWgradCandidates)
        for (bool vec : {false, true})
          for (bool f32_partials : {false, true})
            for (bool runs : {false, true})
              all.push_back(conv_mma_wgrad_source(t, tile, vec, f32_partials, runs));
    }
  }
  for (std::size_t bytes : {2, 4}) {
    all.push_back(nhwc_image_source(bytes));
    for (bool flip : {false, true}) all.push_back(nhwc_weights_source(flip, bytes));
  }
  for (DType t :
       {DType::f32, DType::f64, DType::i32, DType::i64, DType::u8, DType::bf16, DType::f16})
    all.push_back(fill_source(t));
  return all;
}

}  // namespace

void add_conv_ops(CudaOpTable& table) {
  table[OpId::conv2d] = conv_entry(ConvPass::forward);
  table[OpId::conv2d].every_source = every_conv_source;
  table[OpId::conv2d_grad_input] = conv_entry(ConvPass::grad_input);
  table[OpId::conv2d_grad_weight] = conv_entry(ConvPass::grad_weight);
}

}  // namespace kiln::cuda
