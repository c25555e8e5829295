// The column bodies of generated reductions: the reduced axes lead and the kept ones trail
// (a bias gradient, the sum of a [rows, n] value over its rows; batch norm's sums over a
// [B, H, W, C] value stored channels-last, graph/passes/channels_last_values.h). A warp's lanes
// take adjacent outputs of a row, one each (the scalar form) or 8 (4 for f32, and for 16-bit
// groups that hoist many inputs) each through vector loads (the vector form), and the rows are
// split among warps and blocks; partial results land where the row-by-row body's finisher
// (codegen_reduction.cpp) expects them.
#include <fmt/format.h>

#include <algorithm>

#include "core/env_switch.h"
#include "core/error.h"
#include "fusion/codegen_writer.h"
#include "graph/passes/channels_last_values.h"

namespace kiln::codegen {

namespace {

// The column bodies' constants: columns, rows, tiles of adjacent columns a block of rows, splits
// of the rows and rows a split. Split bodies take their splits from the grid, which the launch
// sizes to the resident blocks (CudaKernelSource::split_jobs): at most `splits`.
std::string column_constants(const ColumnShape& cs, std::int64_t splits, std::int64_t tile) {
  std::string out = fmt::format(
      "  const long long n_out = {}LL;\n  const long long n_red = {}LL;\n  const long long tiles = "
      "{}LL;\n",
      cs.n_out, cs.rows, (cs.n_out + tile - 1) / tile);
  if (splits > 1)
    return out + fmt::format(
                     "  const long long splits = (long long)gridDim.x / ({}LL * tiles);  // <= {}\n"
                     "  const long long chunk = (n_red + splits - 1) / splits;\n",
                     cs.outer, splits);
  return out + "  const long long splits = 1LL;\n  const long long chunk = n_red;\n";
}

// A job's place: its block of rows b (of cs.outer), tile of columns and split of the rows, the
// element offset of b's first row, and the rows of its split.
std::string column_job() {
  return "    const long long b = job / splits / tiles, tile = job / splits % tiles;\n"
         "    const long long first = b * n_red * n_out;\n"
         "    const long long r_first = (job % splits) * chunk;\n"
         "    const long long r_end = r_first + chunk < n_red ? r_first + chunk : n_red;\n";
}

}  // namespace

// The reduced axes lie between an outer kept axis (or none) and an inner kept one that is
// contiguous (a bias gradient: the sum of a [rows, n] value over its rows; batch norm's sums
// over a [B, H, W, C] value stored channels-last, graph/passes/channels_last_values.h; the
// global average pool of such a value, over H W rows for each of B): element (b, r, c) is at
// (b * rows + r) * n + c, so threads of a warp that take adjacent outputs read adjacent
// elements, where the row-by-row body reads them n apart. Without an outer axis only for long
// columns: over a few rows (a batch of 64) the row-by-row body's block per output keeps more
// SMs busy (MLP GAN step 0.134 -> 0.150 ms with the column body there); with one, the jobs are
// many whatever the rows. Sibling reductions each keep their accumulators; row outputs come
// from the finisher (the body is then always split). Not yet run on a GPU, those two take the
// column body only while the channels-last values are asked for
// (graph/passes/channels_last_values.h).
ColumnShape Writer::column_shape() const {
  if ((!g_.more_reductions.empty() || !g_.row_outputs.empty()) &&
      channels_last_values_mode() == ChannelsLastValues::off)
    return {};
  const ReductionAxes axes = split_axes(g_.shape, g_.reduction->axes);
  const std::size_t kept = axes.kept_sizes.size();
  if (axes.red_sizes.size() != 1 || kept < 1 || kept > 2 || axes.kept_strides.back() != 1 ||
      axes.red_strides[0] != axes.kept_sizes.back() || axes.kept_sizes.back() < 32)
    return {};
  const ColumnShape cs{kept == 2 ? axes.kept_sizes[0] : 1, axes.red_sizes[0],
                       axes.kept_sizes.back()};
  if (kept == 2 && axes.kept_strides[0] != cs.rows * cs.n_out) return {};  // rows, then columns
  if (kept == 1 && cs.rows < 512) return {};
  return cs;
}

// Splits of the rows for about 1024 jobs (each at least 2048 elements), a block of as many
// warps as a split's rows keep busy (at most 8), and as many bytes in flight a thread as its
// registers allow: an H100's batch norm statistics over [512, 32, 32, 64] in blocks of 2 warps
// and 2 loads a thread in flight ran at 1.37 TB/s (ncu: 23 % of the warps resident).
void Writer::column_kernel(const ColumnShape& cs, CudaKernelSource& k, std::string& body) const {
  const ColumnVectors cv = column_vectors(cs.n_out);
  const std::int64_t tiles = cs.outer * ((cs.n_out + cv.tile() - 1) / cv.tile());
  k.splits = reduction_splits(tiles, cs.rows * cv.tile(), 1024, 2048);
  if (!g_.row_outputs.empty()) k.splits = std::max<std::int64_t>(k.splits, 2);  // finisher's
  k.work_items = tiles * k.splits;
  if (k.splits > 1) k.split_jobs = tiles;  // the launch picks the splits
  const std::int64_t chunk = (cs.rows + k.splits - 1) / k.splits;
  const std::int64_t warps = std::min<std::int64_t>(8, (chunk + cv.rows() - 1) / cv.rows());
  k.block_threads = 64;
  while (k.block_threads < 32 * warps) k.block_threads *= 2;
  body = cv.lanes > 1 ? column_vector_body(cs, cv, k.splits) : column_reduction_body(cs, k.splits);
}

// One block per (tile of 32 columns, split of the rows): lane x takes column tile * 32 + x,
// the block's warps take every (blockDim.x / 32)-th row of the split; the warps' sums are
// then added in warp order (deterministic). Partial results land where the finisher of
// the row-by-row body expects them: reduced[o * splits + split] for output o = b * n_out + c.
std::string Writer::column_reduction_body(const ColumnShape& cs, std::int64_t splits) const {
  const std::vector<const FusedReduction*> reds = g_.reductions();
  std::string out = column_constants(cs, splits, 32);
  for (std::size_t r = 0; r < reds.size(); ++r)
    out += fmt::format("  __shared__ T {}[32][33];\n", reduction_name("warp_acc", r));
  out +=
      "  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, warps = blockDim.x >> "
      "5;\n";
  out += hoisted_scalars();
  out += "  for (long long job = blockIdx.x; job < " + std::to_string(cs.outer) +
         "LL * tiles * splits; job += gridDim.x) {\n";
  out += column_job();
  out += "    const long long c = tile * 32 + lane, o = b * n_out + c;\n";
  for (std::size_t r = 0; r < reds.size(); ++r)
    out += fmt::format("    T {} = {};\n", reduction_name("acc", r),
                       reduction_identity(*reds[r], g_.compute));
  // (Batch norm's sums over [B, H, W, C]: a lane's 2-byte loads, so four rows' loads in flight.)
  const bool several = reds.size() > 1 || !g_.row_outputs.empty();
  out += several ? "    if (c < n_out) {\n#pragma unroll 4\n" : "    if (c < n_out) {\n";
  out += "      for (long long r = r_first + warp; r < r_end; r += warps) {\n";
  out += "        const long long i = first + r * n_out + c;\n";
  out += scalar_loads("        ", "i");
  out += compute("        ", "");
  for (std::size_t k = 0; k < g_.outputs.size(); ++k)
    out += "        " + store(k, fmt::format("out{}[i]", k), "");
  for (std::size_t r = 0; r < reds.size(); ++r) {
    const std::string acc = reduction_name("acc", r);
    out += fmt::format("        {} = {};\n", acc,
                       reduction_combine(*reds[r], acc, operand(reds[r]->value, "")));
  }
  out += "      }\n    }\n";
  for (std::size_t r = 0; r < reds.size(); ++r)
    out += fmt::format("    {}[warp][lane] = {};\n", reduction_name("warp_acc", r),
                       reduction_name("acc", r));
  out += "    __syncthreads();\n    if (warp == 0u && c < n_out) {\n";
  for (std::size_t r = 0; r < reds.size(); ++r) {
    const std::string acc = reduction_name("acc", r);
    out +=
        fmt::format("      for (unsigned w = 1; w < warps; ++w) {} = {};\n", acc,
                    reduction_combine(*reds[r], acc,
                                      fmt::format("{}[w][lane]", reduction_name("warp_acc", r))));
    out += "      " + store_reduced("o * splits + job % splits", acc, splits, r) + "\n";
  }
  out += "    }\n    __syncthreads();\n  }\n";
  return out;
}

// The vector form's lanes a thread (8 for groups of 16-bit values, or 4 where their hoisted
// inputs would take too many registers, column_lanes; 4 for f32 ones, as the row-by-row body's
// vector loop) and its channel groups a warp, G: lanes l and l + G take the
// same outputs in other rows. A tile (a job's outputs) is T = G L <= 64 adjacent outputs, so
// that one shared array of 32 warps x T values (8 KiB, whatever block the occupancy choice
// gives) combines the warps. 1 lane: the scalar form. Taken where the column body with
// several sums is (the channels-last values), and KILN_COLUMN_VECTORS=0 keeps the scalar form
// there (for measuring).
ColumnVectors Writer::column_vectors(std::int64_t n_out) const {
  const bool on = env_switch_on("KILN_COLUMN_VECTORS");
  const int lanes = g_.low_precision() ? lanes_ : (g_.compute == DType::f32 ? 4 : 1);
  if (!on || channels_last_values_mode() == ChannelsLastValues::off || !vectorizable() ||
      lanes == 1 || n_out % lanes != 0)
    return {};
  int groups = 64 / lanes;
  while (n_out % (groups * lanes) != 0) groups /= 2;
  return {lanes, groups};
}

// At 8 lanes stage 1's 29-op backward group over [512, 32, 32, 64] (8 hoisted per-channel
// inputs: 64 registers of them) took 96 registers a thread, so two blocks of 256 an SM (ncu on
// an H100: 25 % occupancy, 9.5 cycles between a warp's instructions, 60 % of the DRAM's rate);
// ptxas puts it at 56 at 4 lanes. Measured, that barely moved it (96.5 against 97.1 us a
// launch, bench/README.md): its occupancy is not what bounds it.
int Writer::column_lanes() const {
  const auto forced = env_integer("KILN_COLUMN_LANES", 0, 0, 8, "4 or 8");
  KILN_CHECK(forced == 0 || forced == 4 || forced == 8, "KILN_COLUMN_LANES='{}': expected 4 or 8",
             forced);
  if (forced != 0) return static_cast<int>(forced);
  const std::vector<char> invariant = row_invariant_inputs("KILN_COLUMN_HOIST");
  int registers = 0;
  for (std::size_t k = 0; k < plans_.size(); ++k)
    if (invariant[k] && !plans_[k].lane_invariant) registers += lanes_;
  return registers > 32 ? 4 : 8;
}

std::vector<char> Writer::row_invariant_inputs(const char* off_switch) const {
  std::vector<char> invariant(plans_.size(), 0);
  if (!env_switch_on(off_switch)) return invariant;  // (=0: loaded every element)
  for (std::size_t k = 0; k < plans_.size(); ++k) {
    if (plans_[k].access == Access::scalar) continue;  // (hoisted_scalars)
    invariant[k] =
        std::all_of(g_.reduction->axes.begin(), g_.reduction->axes.end(), [&](std::int64_t a) {
          const auto d = static_cast<std::size_t>(a);
          return g_.shape[d] == 1 || g_.inputs[k].strides[d] == 0;
        });
  }
  return invariant;
}

// One block per (tile of T columns, split of the rows): lane l takes columns tile * T + (l % G)
// * L .. + L - 1 of rows r_first + warp * (32 / G) + l / G, stepping by the block's rows. A
// warp's rows are then combined by a butterfly over the lanes of a channel group, the block's
// warps through shared memory in warp order (deterministic), one reduction after another.
// Four rows' loads in flight a thread where at most two inputs stream (batch norm's
// statistics), else two (its gradient's groups: up to 128 registers already).
std::string Writer::column_vector_body(const ColumnShape& cs, const ColumnVectors& cv,
                                       std::int64_t splits) const {
  const std::vector<const FusedReduction*> reds = g_.reductions();
  const int lanes = cv.lanes, tile = cv.lanes * cv.groups, rows = cv.rows();
  std::string out = column_constants(cs, splits, tile);
  out += fmt::format("  __shared__ T warp_acc[32][{}];\n", tile);
  out += fmt::format(
      "  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, warps = blockDim.x >> "
      "5;\n  const unsigned group = lane % {0}u, row_lane = lane / {0}u;\n",
      cv.groups);
  out += hoisted_scalars();
  out += fmt::format("  const bool vec = {};\n", aligned());
  out += "  for (long long job = blockIdx.x; job < " + std::to_string(cs.outer) +
         "LL * tiles * splits; job += gridDim.x) {\n";
  out += column_job();
  out += fmt::format("    const long long c = tile * {} + group * {};\n", tile, lanes);
  for (std::size_t r = 0; r < reds.size(); ++r)
    out += fmt::format("    T {}[{}];\n    for (int l = 0; l < {}; ++l) {}[l] = {};\n",
                       reduction_name("acc", r), lanes, lanes, reduction_name("acc", r),
                       reduction_identity(*reds[r], g_.compute));
  // Lane `l`'s value of each reduction combined into its accumulator.
  auto accumulate = [&](const std::string& indent, int l, const std::string& suffix) {
    std::string lines;
    for (std::size_t r = 0; r < reds.size(); ++r) {
      const std::string acc = fmt::format("{}[{}]", reduction_name("acc", r), l);
      lines += fmt::format("{}{} = {};\n", indent, acc,
                           reduction_combine(*reds[r], acc, operand(reds[r]->value, suffix)));
    }
    return lines;
  };
  const std::string rows_loop = fmt::format(
      "      for (long long r = r_first + warp * {0} + row_lane; r < r_end; r += warps * {0}) {{\n",
      rows);
  const std::vector<char> invariant = row_invariant_inputs("KILN_COLUMN_HOIST");
  const auto streamed = std::count_if(plans_.begin(), plans_.end(), [](const InputPlan& p) {
    return p.access == Access::contiguous;
  });
  out += "    if (vec) {\n";
  for (std::size_t k = 0; k < plans_.size(); ++k)
    if (invariant[k]) out += vector_input_loads(k, "(first + c)", "      ");
  out += fmt::format("#pragma unroll {}\n", streamed <= 2 ? 4 : 2) + rows_loop;
  out += "        const long long i = first + r * n_out + c;\n";
  auto per_lane = [&](const std::string& suffix, int l) {
    return accumulate("          ", l, suffix);
  };
  out += g_.low_precision() ? vector_body_wide(per_lane, invariant)
                            : vector_body_f32(per_lane, invariant);
  out += "      }\n    } else {\n" + rows_loop;  // (an operand not 16-byte aligned)
  for (int l = 0; l < lanes; ++l) {
    out +=
        fmt::format("        {{\n          const long long i = first + r * n_out + c + {};\n", l);
    out += scalar_loads("          ", "i") + compute("          ", "");
    for (std::size_t k = 0; k < g_.outputs.size(); ++k)
      out += "          " + store(k, fmt::format("out{}[i]", k), "");
    out += accumulate("          ", l, "") + "        }\n";
  }
  out += "      }\n    }\n";
  for (std::size_t r = 0; r < reds.size(); ++r) {
    const std::string acc = reduction_name("acc", r);
    out += fmt::format(
        "    for (int mask = 16; mask >= {}; mask >>= 1)\n      for (int l = 0; l < {}; ++l) {{ "
        "const T other = __shfl_xor_sync(0xffffffffu, {}[l], mask); {}[l] = {}; }}\n",
        cv.groups, lanes, acc, acc, reduction_combine(*reds[r], acc + "[l]", "other"));
  }
  for (std::size_t r = 0; r < reds.size(); ++r) {
    const std::string acc = reduction_name("acc", r);
    out += fmt::format(
        "    if (row_lane == 0u)\n      for (int l = 0; l < {}; ++l) warp_acc[warp][group * {} + "
        "l] = {}[l];\n",
        lanes, lanes, acc);
    out += fmt::format(
        "    __syncthreads();\n    for (unsigned t = threadIdx.x; t < {}u; t += "
        "blockDim.x) {{\n      T total = warp_acc[0][t];\n",
        tile);
    out += fmt::format("      for (unsigned w = 1; w < warps; ++w) total = {};\n",
                       reduction_combine(*reds[r], "total", "warp_acc[w][t]"));
    out += "      " +
           store_reduced(fmt::format("(b * n_out + tile * {} + t) * splits + job % splits", tile),
                         "total", splits, r) +
           "\n    }\n    __syncthreads();\n";
  }
  out += "  }\n";
  return out;
}

}  // namespace kiln::codegen
