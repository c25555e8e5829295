// Transposes between 16 NCHW planes and oneDNN's 16-channel blocked layout ([pixel][16]), a
// block of channels at a time: the fused groups' lane views (fusion/cpu_lanes.h) and the
// blocked pooling kernels (pool_blocked.h) read and write NCHW values through them.
#pragma once

#include <cstdint>

namespace kiln::kernels {

constexpr std::int64_t kBlockLanes = 16;  // channels in a block

// `pixels` pixels of 16 planes `stride` apart into [pixels][16], and back.
void planes_to_lanes(const float* planes, std::int64_t stride, std::int64_t pixels, float* lanes);
void lanes_to_planes(const float* lanes, std::int64_t pixels, float* planes, std::int64_t stride);

}  // namespace kiln::kernels
