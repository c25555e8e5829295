// compile: the pass pipeline from a recorded graph to a runnable Program.
#pragma once

#include <memory>

#include "backends/program.h"
#include "core/precision.h"
#include "fusion/gemm_epilogues.h"
#include "graph/optim.h"
#include "graph/train_step.h"

namespace kiln {

struct CompileOptions {
  Device device = Device::cpu();
  bool fuse = true;         // false: every op runs as its own kernel (the unfused reference)
  bool cuda_graphs = true;  // CUDA: capture the step as a CUDA graph after the first run
  // fp32; tf32 (CUDA: TF32 tensor-core math in GEMMs); bf16 or fp16: the autocast pass
  // (graph/passes/autocast.h) stores activations in 16 bits, fp32 master weights.
  Precision precision = Precision::fp32;
  bool tf32 = false;  // the same as precision tf32 (kept for callers that set it)
  // CUDA: 1 runs everything in order; N puts the kernels off the critical path on N - 1 side
  // streams (backends/schedule.h). 4 by measurement: inception fp32 b64 1.425 ms on 2,
  // 1.253 on 3, 1.139 on 4, no zoo model slower on 4 than on 2 (bench/README.md).
  int cuda_streams = 4;
  // Scan every op's outputs for NaN/Inf and stop at the first op that made one (also
  // KILN_CHECK_NUMERICS=1). Ops then run unfused, one kernel each, so the op is exact.
  bool check_numerics = false;
  // Bitwise-reproducible runs. The CPU backend always is (the same bits for any thread
  // count); on the GPU this also rules out cuBLAS algorithms with atomics.
  bool deterministic = false;

  // TF32 math, asked for either way.
  bool uses_tf32() const { return tf32 || precision == Precision::tf32; }
};

// The rewrites that run before fusion when fusing (constant folding, pool-gradient masks),
// each followed by dead-code elimination; `dump` tools show the graph this returns.
Graph simplify_for_fusion(const Graph& g);

// The autocast pass (graph/passes/autocast.h) for bf16 and fp16, then dead-code elimination;
// `g` itself for fp32 and tf32. compile() and the dump tool's view run it the same way.
Graph apply_precision(const Graph& g, Precision precision);

// The layout pass (graph/passes/channels_last.h) with the CUDA backend's choice of the
// convolutions that read their images channels-last, then dead-code elimination; `g` itself
// without the CUDA backend or with KILN_CHANNELS_LAST=0. compile() runs it for the GPU only
// (after simplify_for_fusion), the dump tool's view always (it shows the GPU's policy).
Graph apply_channels_last(const Graph& g);
// Batch norm's statistics into the epilogue of the convolutions they read
// (fusion/conv_statistics.h), with the CUDA backend's choice of the convolutions that compute
// them (its TMA pass) over more pixels than the stage pass's rows, then dead-code elimination,
// where KILN_CONV_MOMENTS=1 asks for it (off by default: on the H100 the resnet18 step was not
// faster with it, bench/README.md); `g` itself otherwise or without the CUDA backend.
// compile() runs it for the fused GPU step, after the layout pass.
Graph apply_conv_statistics(const Graph& g);
// The GEMM-epilogue pass's choices for a device (fusion/gemm_epilogues.h): on the CPU f32
// products and every f32 convolution; on the GPU bf16/f16 products (cuBLASLt's epilogues) and
// the f32 convolutions whose CUDA-core pass applies the bias itself with TF32 as `tf32` (the
// process's TF32 switch is set so, as the program will set it). compile() and the dump tool's
// view take it.
GemmEpilogueOptions gemm_epilogue_policy(bool cpu, bool tf32);

struct Lowering;
// Prints a lowering step's result (backends/lowering.h) to stderr when KILN_DUMP names the
// step (assign_streams, plan_memory, in_place_updates, launch_list) or is "all".
void dump_lowering(const char* step, const Graph& g, const Lowering& lowering);

// Runs the passes (verify, dead-code elimination, fusion) and builds a Program
// for the device. KILN_DUMP=<pass name>[,...] (or "all") prints the graph after a pass.
std::unique_ptr<Program> compile(const Graph& g, const CompileOptions& options = {});

// The training step in loss's graph: appends the gradients of `params` (clipped as
// `step_options` says) and the optimizer's update, names the loss output "loss", and compiles.
std::unique_ptr<Program> compile_training(Value loss, const std::vector<VariablePtr>& params,
                                          Optimizer& optimizer, const CompileOptions& options = {},
                                          const TrainStepOptions& step_options = {});

}  // namespace kiln
