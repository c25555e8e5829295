// How the CPU runs nodes that store bf16 or f16 values (DESIGN.md, Precision): it computes in
// f32 and rounds where the GPU stores. Low-precision inputs are widened to f32, the op's f32
// kernel runs into f32 temporaries, and each low-precision output is rounded to nearest even
// once, as a GPU kernel does when it writes its result.
#pragma once

#include <span>

#include "graph/op.h"

namespace kiln {

// Runs `node`'s CPU kernel on `inputs` into `outputs` (planned tensors of the node's types),
// through f32 where any of them is bf16 or f16; cast converts by itself.
// `blocked`: KernelCall::blocked (backends/cpu/blocked_layout.h).
void run_cpu_kernel(const Node& node, std::span<const Tensor> inputs, std::span<Tensor> outputs,
                    std::uint32_t blocked = 0);

}  // namespace kiln
