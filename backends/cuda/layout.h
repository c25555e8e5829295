// Layout kernels on the GPU: transpose (graph/ops/layout_ops.cpp), one_hot with a device
// status the caller checks after a sync, fill, and the block copies of slice/concat/pad.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"
#include "gpu/cuda_runtime.h"

namespace kiln::cuda {

// y = x with its axes permuted: y's axis d is x's axis perm[d] (x contiguous, shape `x_shape`).
// Any dtype. Axes of size 1 are dropped and axes that stay adjacent are merged first; what
// remains must have rank <= 8. An identity permutation is a device-to-device copy.
void transpose(DType dtype, const Shape& x_shape, const std::vector<std::int64_t>& perm,
               const void* x, void* y, gpu::Stream stream);

// xt[b, pix, c] = x[b, c, pix] of elements of `dtype`'s size (batch <= 65535, channels even);
// the convolutions' channels-last copies and transpose's [B][C][HW] planes
// (kernels/nhwc_copy.cuh): 16-bit images of channels and planes a multiple of 8 at 16-byte
// aligned addresses by 8 x 8 blocks in registers (the wide form), any other by 64 x 64 tiles
// through shared memory.
void nchw_to_nhwc(DType dtype, const void* x, void* xt, std::int64_t batch, std::int64_t channels,
                  std::int64_t hw, gpu::Stream stream);
// Whether nchw_to_nhwc takes the wide form where it applies (nullopt: unless KILN_NHWC_WIDE=0).
std::optional<bool>& nhwc_wide_for_testing();

// The device-side report of one_hot: the first row whose label is outside [0, classes)
// and that label, or bad_row = -1. Allocate kOneHotStatusBytes of device memory for it.
struct OneHotStatus {
  std::int64_t bad_row = -1;
  std::int64_t bad_label = -1;
};
inline constexpr std::size_t kOneHotStatusBytes = sizeof(OneHotStatus);

// out[r, c] = (labels[r] == c) for labels of `label_dtype` (i32, i64, u8) into rows of
// `out_dtype` (f32, f64, bf16, f16). An out-of-range label leaves its row zero (nothing is written
// outside out) and is reported in `device_status` (a device OneHotStatus, overwritten).
void one_hot(DType label_dtype, DType out_dtype, std::int64_t rows, std::int64_t classes,
             const void* labels, void* out, void* device_status, gpu::Stream stream);
// Copies the status to the host and waits for `stream` (a synchronisation point).
OneHotStatus read_one_hot_status(const void* device_status, gpu::Stream stream);
// Throws the CPU kernel's kiln::Error ("one_hot: label L at index I is outside [0, C)")
// when `status` reports a bad row.
void check_one_hot_status(const OneHotStatus& status, std::int64_t classes);

// Strided block copy (slice, concat, pad): `rows` blocks of `bytes` bytes, from src every
// `src_pitch` bytes to dst every `dst_pitch` bytes; one cudaMemcpy2DAsync, no kernel.
void copy_blocks(const void* src, std::int64_t src_pitch, void* dst, std::int64_t dst_pitch,
                 std::int64_t rows, std::int64_t bytes, gpu::Stream stream);
// concat: `outer` rows of `row` elements in out, each the pieces' rows side by side; piece k
// is [outer, widths[k]] (widths in elements, sum = row). One kernel launch per 32 pieces.
void concat(std::size_t element_bytes, const std::vector<const void*>& pieces,
            const std::vector<std::int64_t>& widths, std::int64_t outer, void* out,
            gpu::Stream stream);
// out[0, bytes) = 0 (zero bits: 0 in every dtype).
void zero_bytes(void* out, std::int64_t bytes, gpu::Stream stream);

// out[0, n) = value converted to `dtype`.
void fill(DType dtype, double value, std::int64_t n, void* out, gpu::Stream stream);

}  // namespace kiln::cuda
