// What every hand-written kernel shares: the grid-stride loop over [0, n) with 64-bit
// indices, and its 32-bit form for kernels whose host checked that n fits.
#pragma once

#define KILN_FOR_EACH_ITEM(i, n)                                                \
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
       i += (long long)gridDim.x * blockDim.x)

#define KILN_FOR_EACH_ITEM32(i, n) \
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += gridDim.x * blockDim.x)
