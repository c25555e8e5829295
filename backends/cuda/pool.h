// Pooling on the GPU with the CPU's semantics (graph/kernels/pool_cpu.cpp): square windows
// clipped to the plane (padded cells never win a max and are not counted in an average);
// max pooling takes each window's first maximum (a NaN wins). Deterministic, no atomics.
#pragma once

#include "core/dtype.h"
#include "gpu/cuda_runtime.h"
#include "graph/kernels/pool_cpu.h"

namespace kiln::cuda {

// x: [planes, H, W] -> y: [planes, OH, OW]; f32, f64, or bf16/f16 (compared and summed in
// float, each output rounded once).
void max_pool2d_forward(DType dtype, const kernels::PoolGeometry& g, const void* x, void* y,
                        gpu::Stream stream);
// dx (x-shaped) = dy (y-shaped) routed to each window's maximum; overlapping windows sum. relu:
// dy masked by the window's maximum > 0 first (max_pool2d_grad relu=1).
void max_pool2d_grad(DType dtype, const kernels::PoolGeometry& g, const void* x, const void* dy,
                     void* dx, gpu::Stream stream, bool relu = false);
// out (y-shaped) = g_in (x-shaped) at each window's maximum.
void max_pool2d_select(DType dtype, const kernels::PoolGeometry& g, const void* x, const void* g_in,
                       void* out, gpu::Stream stream);

// y[window] = mean of x over the window's cells in the plane.
void avg_pool2d_forward(DType dtype, const kernels::PoolGeometry& g, const void* x, void* y,
                        gpu::Stream stream);
// dx (x-shaped) = the adjoint of avg_pool2d_forward applied to dy (y-shaped).
void avg_pool2d_grad(DType dtype, const kernels::PoolGeometry& g, const void* dy, void* dx,
                     gpu::Stream stream);

}  // namespace kiln::cuda
