// The tap columns of f32's TF32 weight gradient by TMA (conv_tap_columns.cpp, tf32_tap_expand):
// x3[p][t][r][j] = x[p][r + row0][stride j + kw - pad] for each of `planes` (B C) planes of x's
// H x W, r < rows (H, row0 0; or, for whole-image steps, H + 2 pad rows from row0 = -pad), j < OW
// (x3's width, the output's), zero where the row or column leaves x; t counts the taps kw but
// `skip` (the centre tap the pass boxes from x itself, tf32_centre_from_x; -1: none). The TMA
// pass boxes each tap's pixels from x3 at the output row's own columns, which start on a 16-byte
// boundary: over x, the taps left and right of a 3x3's centre start one f32 off it, which the
// tensor memory accelerator refuses (an illegal instruction on the H100), and stride 2 would
// take every other one. 32-bit elements, OW a multiple of 4 and fewer than 2^31 quads (the
// host's checks): a thread writes 4 adjacent elements of x3 as one 16-byte store, its reads
// served KW times by the L2.
#pragma once

#include "backends/cuda/kernels/common.cuh"

#ifdef KILN_TAP_EXPAND
extern "C" __global__ void KILN_TAP_EXPAND(const unsigned* __restrict__ x,
                                           unsigned* __restrict__ x3, int planes, int h, int w,
                                           int ow, int kw, int pad, int stride, int rows, int row0,
                                           int skip) {
  KILN_AFTER_PRIOR_GRIDS();
  const int taps_kept = skip >= 0 ? kw - 1 : kw;
  const int quads = ow / 4, n = planes * taps_kept * rows * quads;
  KILN_FOR_EACH_ITEM32(i, n) {
    const int lines = i / quads, col = 4 * (i - lines * quads);  // lines: (plane, tap, row)
    const int taps = lines / rows, row = lines - taps * rows + row0;
    const int plane = taps / taps_kept, kept = taps - plane * taps_kept;
    const int tap = skip >= 0 && kept >= skip ? kept + 1 : kept;
    const unsigned* source = x + (static_cast<long long>(plane) * h + row) * w;
    const bool inside = row >= 0 && row < h;
    unsigned v[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int from = stride * (col + e) + tap - pad;
      v[e] = inside && from >= 0 && from < w ? source[from] : 0u;
    }
    reinterpret_cast<uint4*>(x3)[i] = make_uint4(v[0], v[1], v[2], v[3]);
  }
}
#endif
