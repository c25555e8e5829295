// What the TMA passes' two files share (conv_tma.cpp, conv_tma_wgrad.cpp): their switches, the
// device's SM count, and the tensor maps the copies read through.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "backends/cuda/kernels/conv_params.h"
#include "core/dtype.h"

namespace kiln::cuda {

// On unless KILN_CONV_TMA=0 or a tile is forced (conv_tiles_forced); a test may say otherwise.
bool tma_on();
// One multiply across a tile's atoms (KILN_CONV_TMA_WIDE=0: one an atom); a test may set it.
bool& wide_on();
// The largest stride the passes take (2; KILN_CONV_TMA_MAX_STRIDE=1 keeps them to stride 1).
int max_stride();
// The device's SMs, or the count dump assumes without one (gpu::plan_target).
int sm_count();

// A tiled map of `rank` dims (innermost first; strides in bytes of dims 1..), zeros outside the
// tensor, in the swizzle of `swizzle_bytes` (128, 64 or 32: the box's inner row), every
// steps[d]-th element of dim d (1 where steps is null).
CUtensorMap tiled_map(DType dtype, const void* base, int rank, const cuuint64_t* dims,
                      const cuuint64_t* strides, const cuuint32_t* box, int swizzle_bytes = 128,
                      const cuuint32_t* steps = nullptr);
// The channels-last image of `images` (a `channels`-channel NHWC copy, of the pass's img_h x
// img_w): [N][H][W][C], C innermost; boxes of a 128-byte row of channels (64 16-bit, 32 f32) x
// s_w columns x `rows` x `box_images` of the pass's output grid, every stride-th column and row
// of the image (the TMA's element strides: the box spans stride x as many).
CUtensorMap image_map(DType dtype, const ConvGemmShape& g, const void* xt, std::int64_t channels,
                      std::int64_t images, int rows, int box_images);

}  // namespace kiln::cuda
