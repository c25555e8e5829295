// The reduction bodies of generated kernels: one block per output (or per tile of 32 adjacent
// outputs of a column sum), a shuffle reduction in the compute type, and a finisher that
// combines split partial results in order (deterministic: no atomics).
#include <fmt/format.h>

#include <algorithm>

#include "core/env_switch.h"
#include "fusion/codegen_writer.h"
#include "graph/passes/channels_last_values.h"

namespace kiln::codegen {

std::string reduction_identity(const FusedReduction& red, DType compute) {
  return literal(red.op->reduction.identity, compute);
}
std::string reduction_combine(const FusedReduction& red, const std::string& acc,
                              const std::string& value) {
  const ReductionRule& rule = red.op->reduction;
  const std::string combined = expand(rule.cuda_combine, {acc, value});
  if (rule.nan == NanRule::arithmetic) return combined;
  return fmt::format("(({1}) != ({1}) ? ({1}) : {0})", combined, value);
}

std::string warp_butterfly(const FusedReduction& red, const std::string& acc, int first_mask) {
  return fmt::format(
      "for (int mask = {2}; mask > 0; mask >>= 1) {{ const T other = __shfl_xor_sync(0xffffffffu, "
      "{0}, mask); {0} = {1}; }}",
      acc, reduction_combine(red, acc, "other"), first_mask);
}

std::int64_t ReductionAxes::reduced_count() const {
  std::int64_t n = 1;
  for (std::int64_t s : red_sizes) n *= s;
  return n;
}

ReductionAxes split_axes(const Shape& shape, const std::vector<std::int64_t>& axes) {
  ReductionAxes r;
  const std::vector<std::int64_t> dense = shape.strides();
  int last = -1;  // 0 kept, 1 reduced
  for (std::size_t d = 0; d < shape.rank(); ++d) {
    if (shape[d] == 1) continue;
    const int kind =
        std::find(axes.begin(), axes.end(), static_cast<std::int64_t>(d)) != axes.end() ? 1 : 0;
    auto& sizes = kind ? r.red_sizes : r.kept_sizes;
    auto& strides = kind ? r.red_strides : r.kept_strides;
    if (kind == last) {
      sizes.back() *= shape[d];
      strides.back() = dense[d];
    } else {
      sizes.push_back(shape[d]);
      strides.push_back(dense[d]);
    }
    last = kind;
  }
  return r;
}

std::string coordinate_sum(const std::vector<std::int64_t>& sizes,
                           const std::vector<std::int64_t>& strides, const std::string& index,
                           const char* suffix) {
  std::string expr;
  std::int64_t inner = 1;
  for (std::size_t k = sizes.size(); k-- > 0;) {
    std::string coord = inner == 1 ? index : fmt::format("({} / {}{})", index, inner, suffix);
    if (k > 0) coord = fmt::format("({} % {}{})", coord, sizes[k], suffix);
    expr += (expr.empty() ? "" : " + ") + fmt::format("{} * {}{}", coord, strides[k], suffix);
    inner *= sizes[k];
  }
  return expr.empty() ? fmt::format("0{}", suffix) : expr;
}

std::string reduction_name(const char* base, std::size_t r) {
  return r == 0 ? std::string(base) : fmt::format("{}{}", base, r);
}

// reduced[index] = value: the output rounded to its storage, or a partial result of the
// compute type when the reduction is split.
std::string Writer::store_reduced(const std::string& index, const std::string& value,
                                  std::int64_t splits, std::size_t r) const {
  return fmt::format("{}[{}] = {};", reduction_name("reduced", r), index,
                     splits > 1 ? value : narrow(g_.reductions()[r]->type.dtype, value));
}

std::string Writer::reduction_body(std::int64_t splits, bool finish_in_kernel) const {
  const std::vector<const FusedReduction*> reds = g_.reductions();
  const FusedReduction& red = *reds[0];
  const ReductionAxes axes = split_axes(g_.shape, red.axes);
  const std::int64_t n_red = axes.reduced_count();
  const int lanes = reduction_lanes();
  // A split's range starts at a multiple of the lanes (so that each vector is one run).
  const std::int64_t chunk = ((n_red + splits - 1) / splits + lanes - 1) / lanes * lanes;
  std::string out =
      fmt::format("  const long long n_out = {}LL;\n  const long long n_red = {}LL;\n",
                  red.type.shape.numel(), n_red);
  out += fmt::format("  const long long splits = {}LL;\n  const long long chunk = {}LL;\n", splits,
                     chunk);
  for (std::size_t r = 0; r < reds.size(); ++r)
    out += fmt::format("  __shared__ T {}[32];\n", reduction_name("warp_acc", r));
  out += hoisted_scalars();
  if (lanes > 1) out += fmt::format("  const bool vec = {};\n", aligned());
  out += "  for (long long job = blockIdx.x; job < n_out * splits; job += gridDim.x) {\n";
  out += "    const long long o = job / splits;\n";
  out += "    const long long r_first = (job % splits) * chunk;\n";
  out += "    const long long r_end = r_first + chunk < n_red ? r_first + chunk : n_red;\n";
  // Indices in 32 bits when they fit: the coordinates' divisions are the inner loop's cost.
  const bool narrow = g_.shape.numel() < (std::int64_t{1} << 31);
  const char* ix = narrow ? "int" : "long long";
  const char* suffix = narrow ? "" : "LL";
  out += fmt::format(
      "    const {} base = {};\n", ix,
      coordinate_sum(axes.kept_sizes, axes.kept_strides, fmt::format("(({})o)", ix), suffix));
  // Inputs the same for every element of the job's output (batch norm's per-channel mean and
  // scale in its sums over NCHW): loaded once, at its first element (in the vector loop only
  // where one value serves the lanes).
  std::vector<char> hoisted = row_invariant_inputs("KILN_REDUCTION_HOIST");
  for (std::size_t k = 0; k < plans_.size(); ++k) {
    if (lanes > 1 && !plans_[k].lane_invariant) hoisted[k] = 0;
    if (!hoisted[k]) continue;
    const std::string off =
        plans_[k].access == Access::contiguous ? "base" : offset_expr(plans_[k].walk, "base");
    out += fmt::format("    const T x{} = {};\n", k,
                       widen(g_.inputs[k].type.dtype, fmt::format("in{}[{}]", k, off)));
  }
  for (std::size_t r = 0; r < reds.size(); ++r)
    out += fmt::format("    T {} = {};\n", reduction_name("acc", r),
                       reduction_identity(*reds[r], g_.compute));
  // Each reduction's value at `lane` combined into its accumulator.
  auto accumulate = [&](const std::string& indent, const std::string& lane) {
    std::string lines;
    for (std::size_t r = 0; r < reds.size(); ++r) {
      const std::string acc = reduction_name("acc", r);
      lines += fmt::format("{}{} = {};\n", indent, acc,
                           reduction_combine(*reds[r], acc, operand(reds[r]->value, lane)));
    }
    return lines;
  };
  if (lanes > 1) {  // `lanes` adjacent elements a thread, each input one vector load
    // (KILN_REDUCTION_UNROLL=N: N vectors in flight, for measuring.)
    const std::int64_t unroll = env_integer("KILN_REDUCTION_UNROLL", 2, 1, 16, "vectors");
    out += fmt::format(
        "    if (vec) {{\n#pragma unroll {2}\n    for ({0} r = ({0})r_first + ({0})threadIdx.x * "
        "{1}; "
        "r < ({0})r_end; r += ({0})blockDim.x * {1}) {{\n",
        ix, lanes, unroll);
    out += fmt::format("      const {} i = base + {};\n", ix,
                       coordinate_sum(axes.red_sizes, axes.red_strides, "r", suffix));
    auto per_lane = [&](const std::string& suffix, int) { return accumulate("        ", suffix); };
    out += g_.low_precision() ? vector_body_wide(per_lane, hoisted)
                              : vector_body_f32(per_lane, hoisted);
    out += "    }\n    } else\n";
  }
  out += fmt::format(
      "#pragma unroll 4\n    for ({0} r = ({0})r_first + ({0})threadIdx.x; r < ({0})r_end; r += "
      "({0})blockDim.x) {{\n",
      ix);
  out += fmt::format("      const {} i = base + {};\n", ix,
                     coordinate_sum(axes.red_sizes, axes.red_strides, "r", suffix));
  out += scalar_loads("      ", "i", hoisted);
  out += compute("      ", "");
  for (std::size_t o = 0; o < g_.outputs.size(); ++o)
    out += "      " + store(o, fmt::format("out{}[i]", o), "");
  out += accumulate("      ", "") + "    }\n";
  auto shuffle = [&](std::size_t r) {
    const std::string acc = reduction_name("acc", r);
    return fmt::format(
        "for (int off = 16; off > 0; off >>= 1) {{ const T other = __shfl_down_sync(0xffffffffu, "
        "{}, off); {} = {}; }}",
        acc, acc, reduction_combine(*reds[r], acc, "other"));
  };
  for (std::size_t r = 0; r < reds.size(); ++r) out += "    " + shuffle(r) + "\n";
  for (std::size_t r = 0; r < reds.size(); ++r)
    out += fmt::format("    if ((threadIdx.x & 31u) == 0u) {}[threadIdx.x >> 5] = {};\n",
                       reduction_name("warp_acc", r), reduction_name("acc", r));
  out += "    __syncthreads();\n    if (threadIdx.x < 32u) {\n";
  for (std::size_t r = 0; r < reds.size(); ++r)
    out += fmt::format("      {} = threadIdx.x < (blockDim.x >> 5) ? {}[threadIdx.x] : {};\n",
                       reduction_name("acc", r), reduction_name("warp_acc", r),
                       reduction_identity(*reds[r], g_.compute));
  for (std::size_t r = 0; r < reds.size(); ++r) out += "      " + shuffle(r) + "\n";
  for (std::size_t r = 0; r < reds.size(); ++r)
    out += "      if (threadIdx.x == 0u) " +
           store_reduced("job", reduction_name("acc", r), splits, r) + "\n";
  if (splits == 1 && !g_.row_outputs.empty()) {  // else the finisher computes them
    std::vector<std::string> finals;
    for (std::size_t r = 0; r < reds.size(); ++r) finals.push_back(reduction_name("acc", r));
    out += "      if (threadIdx.x == 0u) {\n" +
           row_outputs_code("        ", "job", "base", finals) + "      }\n";
  }
  if (finish_in_kernel) out += last_block_finish();
  out += "    }\n    __syncthreads();\n  }\n";
  return out;
}

// In warp 0 of a row-by-row job, once lane 0 has stored the split's partials: lane 0 counts
// the split in (after a fence, so that a block that sees the count sees the partials), and the
// block that brings output o's count to `splits` combines o's partials as the finisher would
// (lane l takes partials l, l + 32, ... through L2, then a butterfly: the same order whichever
// block is last), stores the reduced outputs and the row outputs, and sets the count back to 0
// for the next launch.
std::string Writer::last_block_finish() const {
  const std::vector<const FusedReduction*> reds = g_.reductions();
  std::string out =
      "      unsigned last = 0u;\n      if (threadIdx.x == 0u) {\n        __threadfence();\n"
      "        last = atomicAdd(arrivals + o, 1u) == (unsigned)(splits - 1);\n      }\n"
      "      if (__shfl_sync(0xffffffffu, last, 0) != 0u) {\n        __threadfence();\n";
  std::vector<std::string> finals;
  for (std::size_t r = 0; r < reds.size(); ++r) {
    const std::string fin = reduction_name("fin", r);
    out += fmt::format("        T {} = {};\n", fin, reduction_identity(*reds[r], g_.compute));
    out += fmt::format(
        "        for (long long c = threadIdx.x; c < splits; c += 32) {{ const T v = "
        "__ldcg({} + o * splits + c); {} = {}; }}\n",
        reduction_name("reduced", r), fin, reduction_combine(*reds[r], fin, "v"));
    out += "        " + warp_butterfly(*reds[r], fin) + "\n";
    finals.push_back(fin);
  }
  out += "        if (threadIdx.x == 0u) {\n";
  for (std::size_t r = 0; r < reds.size(); ++r)
    out += fmt::format("          {}[o] = {};\n", reduction_name("result", r),
                       narrow(reds[r]->type.dtype, finals[r]));
  if (!g_.row_outputs.empty()) out += row_outputs_code("          ", "o", "base", finals);
  out += "          arrivals[o] = 0u;\n        }\n      }\n";
  return out;
}

std::string Writer::row_outputs_code(const std::string& indent, const std::string& row,
                                     const std::string& element,
                                     const std::vector<std::string>& finals) const {
  const std::vector<const FusedReduction*> reds = g_.reductions();
  std::string out;
  for (std::size_t r = 0; r < reds.size(); ++r)  // rounded as stored, as a staged group keeps it
    out += fmt::format("{}const T row{} = {};\n", indent, r,
                       widen(reds[r]->type.dtype, narrow(reds[r]->type.dtype, finals[r])));
  const std::vector<char> needed = g_.row_output_instrs();
  std::vector<char> read(g_.inputs.size(), 0);
  auto mark = [&](const Operand& o) {
    if (o.kind == Operand::Kind::input) read[static_cast<std::size_t>(o.index)] = 1;
  };
  for (std::size_t i = 0; i < g_.instrs.size(); ++i)
    if (needed[i])
      for (const Operand& a : g_.instrs[i].args) mark(a);
  for (const RowOutput& w : g_.row_outputs) mark(w.value);
  for (std::size_t k = 0; k < g_.inputs.size(); ++k) {
    if (!read[k] || plans_[k].access == Access::scalar) continue;  // scalars: hoisted
    const std::string off =
        plans_[k].access == Access::contiguous ? element : offset_expr(plans_[k].walk, element);
    out += fmt::format("{}const T x{} = {};\n", indent, k,
                       widen(g_.inputs[k].type.dtype, fmt::format("in{}[{}]", k, off)));
  }
  out += compute(indent, "", &needed);
  for (std::size_t w = 0; w < g_.row_outputs.size(); ++w)
    out += fmt::format("{}row_out{}[{}] = {};\n", indent, w, row,
                       narrow(g_.row_outputs[w].type.dtype, operand(g_.row_outputs[w].value, "")));
  return out;
}

int Writer::reduction_lanes() const {
  const ReductionAxes axes = split_axes(g_.shape, g_.reduction->axes);
  if (!vectorizable() || axes.red_strides.empty() || axes.red_strides.back() != 1) return 1;
  const int lanes = g_.low_precision() ? lanes_ : (g_.compute == DType::f32 ? 4 : 1);
  return lanes > 1 && axes.red_sizes.back() % lanes == 0 ? lanes : 1;
}

// Combines each output's partial results in a fixed order (deterministic: no atomics): a warp
// an output, or with `threads` 256 a block an output; with several reductions, reduction r's
// partials follow at partial + r * outputs * splits. A group with row outputs also takes its
// inputs and computes those once an output's sums are final. (A thread an output, adding its
// partials one after another, took 5-7 us for batch norm's 64 channels x 32 splits on the
// H200, ncu: one block, each load waiting on L2.)
std::string Writer::finish_kernel(std::int64_t outputs, std::int64_t splits, int threads,
                                  bool launched) const {
  const std::vector<const FusedReduction*> reds = g_.reductions();
  const bool rows = !g_.row_outputs.empty();
  const bool block = threads > 32;
  std::string params;
  for (std::size_t r = 0; r < reds.size(); ++r)
    params += fmt::format(", {}* __restrict__ {}", pointer_type(reds[r]->type.dtype),
                          reduction_name("reduced", r));
  if (rows) {
    params += ", " + input_parameters();
    for (std::size_t w = 0; w < g_.row_outputs.size(); ++w)
      params += fmt::format(", {}* __restrict__ row_out{}",
                            pointer_type(g_.row_outputs[w].type.dtype), w);
  }
  std::string out = fmt::format(
      "extern \"C\" __global__ void KERNEL_finish(const T* __restrict__ partial{}{}) {{\n"
      "  KILN_AFTER_PRIOR_GRIDS();\n",
      launched ? ", const long long splits" : "", params);
  out += fmt::format("  const long long n_out = {}LL;\n", outputs);
  if (!launched) out += fmt::format("  const long long splits = {}LL;\n", splits);
  if (rows) out += offsets() + hoisted_scalars();
  // Lane (thread) l combines partials l, l + 32 (+ threads), ... in order, then a butterfly
  // combines the lanes (each pair in a fixed order: every lane ends with the same bits), and
  // in a block the warps' results are combined in warp order.
  const std::string first = block ? "threadIdx.x" : "lane";
  const std::string leader = block ? "threadIdx.x == 0u" : "lane == 0u";
  out += "  const unsigned lane = threadIdx.x & 31u;\n";
  if (block) {
    out += "  const unsigned warp = threadIdx.x >> 5;\n";
    for (std::size_t r = 0; r < reds.size(); ++r)
      out += fmt::format("  __shared__ T {}[{}];\n", reduction_name("warp_acc", r), threads / 32);
    out += "  for (long long o = blockIdx.x; o < n_out; o += gridDim.x) {\n";
  } else {
    out += "  const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;\n";
    out +=
        "  for (long long o = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; o < n_out; "
        "o += warps) {\n";
  }
  std::vector<std::string> finals;
  for (std::size_t r = 0; r < reds.size(); ++r) {
    // (Reduction r's partials start r x outputs x the most splits in: the allocation's.)
    const std::string part =
        r == 0 ? "partial"
               : fmt::format("(partial + {}LL * n_out * {})", r,
                             launched ? fmt::format("{}LL", splits) : std::string("splits"));
    const std::string acc = reduction_name("acc", r);
    out += fmt::format("    T {} = {};\n", acc, reduction_identity(*reds[r], g_.compute));
    out += fmt::format(
        "    for (long long c = {}; c < splits; c += {}) {{ const T v = {}[o * splits + c]; {} = "
        "{}; }}\n",
        first, block ? threads : 32, part, acc, reduction_combine(*reds[r], acc, "v"));
    out += "    " + warp_butterfly(*reds[r], acc) + "\n";
    if (block)
      out +=
          fmt::format("    if (lane == 0u) {}[warp] = {};\n", reduction_name("warp_acc", r), acc);
    finals.push_back(acc);
  }
  if (block) {
    out += "    __syncthreads();\n";
    for (std::size_t r = 0; r < reds.size(); ++r) {
      const std::string acc = reduction_name("acc", r), shared = reduction_name("warp_acc", r);
      out += fmt::format("    {} = {}[0];\n", acc, shared);
      out += fmt::format("    for (int w = 1; w < {}; ++w) {} = {};\n", threads / 32, acc,
                         reduction_combine(*reds[r], acc, shared + "[w]"));
    }
  }
  for (std::size_t r = 0; r < reds.size(); ++r)
    out += "    if (" + leader + ") " + store_reduced("o", finals[r], 1, r) + "\n";
  if (rows) {
    const ReductionAxes axes = split_axes(g_.shape, g_.reduction->axes);
    out += "    if (" + leader + ") {\n";
    out += fmt::format("      const long long base = {};\n",
                       coordinate_sum(axes.kept_sizes, axes.kept_strides, "o"));
    out += row_outputs_code("      ", "o", "base", finals) + "    }\n";
  }
  if (block) out += "    __syncthreads();\n";  // (the shared results are read before reuse)
  out += "  }\n}\n";
  return out;
}

}  // namespace kiln::codegen
