// The pipeline, one line per pass (DESIGN.md convention 3).
#include "backends/compile.h"

#include <cstdlib>
#include <iostream>
#include <string>

#include "backends/cpu/cpu_program.h"
#include "backends/lowering.h"
#include "backends/numerics.h"
#ifdef KILN_HAVE_CUDA
#include "backends/cuda/conv.h"
#include "backends/cuda/cublas_handle.h"
#include "backends/cuda/cuda_program.h"
#endif
#include "core/env_switch.h"
#include "core/log.h"
#include "fusion/channels_last_outputs.h"
#include "fusion/fuse.h"
#include "fusion/conv_statistics.h"
#include "fusion/gemm_epilogues.h"
#include "fusion/recompute.h"
#include "fusion/rematerialize.h"
#include "fusion/stages.h"
#include "graph/train_step.h"
#include "graph/op.h"
#include "graph/passes/autocast.h"
#include "graph/passes/channels_last.h"
#include "graph/passes/channels_last_values.h"
#include "graph/passes/dead_code.h"
#include "graph/passes/filter_layouts.h"
#include "graph/passes/fold_constants.h"
#include "graph/passes/hoist_collectives.h"
#include "graph/passes/one_hot_products.h"
#include "graph/passes/pool_grad_masks.h"
#include "graph/passes/verify.h"
#include "graph/passes/weight_copies.h"

namespace kiln {
namespace {

// Whether KILN_DUMP names `pass` (comma-separated) or is "all".
bool dump_wanted(const char* pass) {
  const char* wanted = std::getenv("KILN_DUMP");
  if (wanted == nullptr) return false;
  const std::string list = std::string(",") + wanted + ",";
  return list == ",all," || list.find(std::string(",") + pass + ",") != std::string::npos;
}

// Whether the one-hot products pass runs (KILN_ONE_HOT_PRODUCTS=0 turns it off).
bool one_hot_products_enabled() { return env_switch_on("KILN_ONE_HOT_PRODUCTS"); }

// Prints the graph after `pass` when KILN_DUMP asks for it.
void dump_after(const char* pass, const Graph& g) {
  if (!dump_wanted(pass)) return;
  std::cerr << "=== graph after " << pass << " (" << g.nodes().size() << " nodes) ===\n" << g.str();
}

}  // namespace

void dump_lowering(const char* step, const Graph& g, const Lowering& lowering) {
  if (!dump_wanted(step)) return;
  std::cerr << "=== lowering after " << step << " ===\n" << lowering_text(step, g, lowering);
}

Graph simplify_for_fusion(const Graph& recorded) {
  Graph g = eliminate_dead_code(fold_constants(recorded));
  dump_after("fold_constants", g);
  g = eliminate_dead_code(apply_masks_before_pool_grads(g));
  dump_after("pool_grad_masks", g);
  if (env_switch_on("KILN_RECOMPUTE")) {
    g = eliminate_dead_code(recompute_in_readers(g));
    dump_after("recompute_in_readers", g);
  }
  return g;
}

Graph apply_precision(const Graph& g, Precision precision) {
  const std::optional<DType> low = low_precision_dtype(precision);
  return low ? eliminate_dead_code(add_weight_copies(autocast(g, *low))) : g;
}

Graph apply_channels_last(const Graph& g) {
#ifdef KILN_HAVE_CUDA
  if (env_switch_on("KILN_CHANNELS_LAST")) {
    // dy's copies as nodes, for the fusion pass to fold into dy's producer (the channels-last
    // values store dy NHWC instead; KILN_NHWC_DY=0: the input gradients copy it themselves).
    const bool values = channels_last_values_mode() != ChannelsLastValues::off;
    const Graph images = eliminate_dead_code(channels_last_images(
        g, cuda::conv_node_reads_channels_last,
        !values && env_switch_on("KILN_NHWC_DY") ? ChannelsLastWanted(cuda::conv_node_reads_nhwc_dy)
                                                 : ChannelsLastWanted()));
    if (!values) return images;
    return eliminate_dead_code(channels_last_values(images, cuda::conv_node_channels_last_sides));
  }
#endif
  return g;
}

// Each filter that a channels-last tensor-core pass would copy every step laid out by a node of
// its own, which the streams run off the critical path (graph/passes/filter_layouts.h).
Graph apply_filter_layouts(const Graph& g) {
#ifdef KILN_HAVE_CUDA
  return eliminate_dead_code(lay_out_filters(g, cuda::conv_node_filter_order));
#else
  return g;
#endif
}

Graph apply_conv_statistics(const Graph& g) {
  if (!env_switch_set("KILN_CONV_MOMENTS")) return g;
#ifdef KILN_HAVE_CUDA
  return eliminate_dead_code(fuse_conv_statistics(g, cuda::conv_node_writes_moments,
                                                  cuda_stage_options().max_row_elements));
#else
  return g;
#endif
}

GemmEpilogueOptions gemm_epilogue_policy(bool cpu, bool tf32) {
  if (cpu) return {.f32_products = true, .low_products = false, .convolutions = every_convolution};
  GemmEpilogueOptions gpu{.f32_products = false, .low_products = true};
#ifdef KILN_HAVE_CUDA
  cuda::set_allow_tf32(tf32);
  gpu.convolutions = cuda::conv_node_applies_bias;
#else
  (void)tf32;
#endif
  return gpu;
}

Feed::Feed(Value input, Tensor t) : tensor(std::move(t)) {
  const Node& n = input.graph().node(input.ref().node);
  KILN_CHECK(n.op->id == OpId::input, "feed: {} is not a graph input", input.str());
  name = n.name;
}

std::unique_ptr<Program> compile(const Graph& recorded, const CompileOptions& requested) {
  CompileOptions options = requested;
  options.check_numerics = options.check_numerics || check_numerics_from_environment();
  if (options.check_numerics) options.fuse = false;  // one op per kernel: the culprit is exact
  verify(recorded);
  Graph g = recorded;
  dump_after("record", g);
  g = eliminate_dead_code(g);
  verify(g);
  dump_after("dead_code", g);
  if (low_precision_dtype(options.precision)) {
    g = apply_precision(g, options.precision);
    verify(g);
    dump_after("autocast", g);
  }
  if (options.fuse) {  // the unfused baseline and check-numerics keep every op
    g = simplify_for_fusion(g);
    verify(g);
  }
  // One-hot products as row gathers and scatters (graph/passes/one_hot_products.h).
  if (options.fuse && one_hot_products_enabled()) {
    g = eliminate_dead_code(rewrite_one_hot_products(g));
    verify(g);
    dump_after("one_hot_products", g);
  }
  if (!options.device.is_cpu() && !options.check_numerics) {  // one transpose per image
    g = apply_channels_last(g);
    verify(g);
    dump_after("channels_last", g);
  }
  if (options.fuse && !options.device.is_cpu() && !options.check_numerics) {
    g = apply_conv_statistics(g);
    verify(g);
    dump_after("conv_statistics", g);
  }
  if (!options.device.is_cpu() && !options.check_numerics) {
    g = apply_filter_layouts(g);
    verify(g);
    dump_after("filter_layouts", g);
  }
  // The CPU runs unfused ops with their own kernels; the GPU runs elementwise math only as
  // generated kernels, so its unfused baseline is one group per op.
  if (options.fuse || !options.device.is_cpu()) {
    g = fuse(g, nullptr, {.single_ops = !options.fuse});
    g = eliminate_dead_code(g);  // fills folded into groups as literals
    verify(g);
    dump_after("fuse", g);
    if (options.fuse) {
      g = eliminate_dead_code(stage_reductions(
          g, options.device.is_cpu() ? cpu_stage_options() : cuda_stage_options()));
      verify(g);
      dump_after("stage_reductions", g);
    }
    // The GEMMs' bias and ReLU epilogues (fusion/gemm_epilogues.h): on the GPU cuBLASLt's,
    // for bf16/f16 products, and the f32 convolutions' on the CUDA cores; on the CPU f32
    // products', each block's rows while in cache, and f32 convolutions' (oneDNN's post-ops,
    // kiln's kernels per output plane).
    if (options.fuse) {
      g = eliminate_dead_code(fuse_gemm_epilogues(
          g, nullptr, gemm_epilogue_policy(options.device.is_cpu(), options.uses_tf32())));
      verify(g);
      dump_after("gemm_epilogues", g);
    }
    // The layout pass's copies to channels-last made by their producers' kernels, and outputs
    // that a reader can make from what it loads anyway.
    if (options.fuse && !options.device.is_cpu()) {
      g = eliminate_dead_code(fold_channels_last_outputs(g));
      verify(g);
      dump_after("channels_last_outputs", g);
      g = eliminate_dead_code(rematerialize_outputs(g));
      verify(g);
      dump_after("rematerialize_outputs", g);
    }
  }
  // The GPU's launch list and streams follow node order: each collective as early as its
  // inputs allow, so the communication stream takes them as they become ready.
  if (!options.device.is_cpu()) {
    g = hoist_collectives(g);
    verify(g);
    dump_after("hoist_collectives", g);
  }
  log().debug("compile: {} nodes after the passes", g.nodes().size());

  if (options.device.is_cpu())
    return make_cpu_program(g, options.check_numerics, options.deterministic);
#ifdef KILN_HAVE_CUDA
  const int streams = options.check_numerics ? 1 : options.cuda_streams;
  const bool tf32 = options.uses_tf32();
  const Lowering lowering = lower_for_device(g, streams, dump_lowering, !options.check_numerics,
                                             cuda_scratch_bytes(g, tf32));
  return make_cuda_program(g, lowering,
                           {.graphs = options.cuda_graphs && !options.check_numerics,
                            .tf32 = tf32,
                            .streams = streams,
                            .check_numerics = options.check_numerics,
                            .deterministic = options.deterministic});
#else
  throw Error(
      fmt::format("device {}: this build of kiln has no CUDA backend (the CUDA toolkit was not "
                  "found at build time)",
                  options.device.str()));
#endif
}

std::unique_ptr<Program> compile_training(Value loss, const std::vector<VariablePtr>& params,
                                          Optimizer& optimizer, const CompileOptions& options,
                                          const TrainStepOptions& requested) {
  TrainStepOptions step_options = requested;
  if (options.precision == Precision::fp16 && !step_options.loss_scale)
    step_options.loss_scale = LossScaleOptions{};
  append_training_step(loss, params, optimizer, step_options);
  return compile(loss.graph(), options);
}

}  // namespace kiln
