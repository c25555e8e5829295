// The body of a staged group (fusion/stages.h): a warp per row (rows are at most 1024
// elements: cuda_stage_options). Each pass over the row's elements accumulates that stage's
// reductions, which butterfly shuffles combine so that every lane holds the result; lane 0
// stores it and every lane keeps it as `rowR`, rounded as stored, for the passes after it. The
// last pass computes and stores the outputs, and lane 0 the row outputs. No shared memory and
// no block barrier: a short row (softmax over 10 classes) costs a warp, not a block.
//
// Rows of at most 64 elements take fewer lanes (row_lanes: L, a power of two, at most 4
// elements a lane) and a warp 32 / L rows at once, its lanes' elements in one unrolled loop, so
// that the warp has that many more loads in flight (resnet18's global average pool over 4 x 4
// planes: a warp per row of 16 kept 32 bytes of each input in flight a warp, 0.47 TB/s on an
// H100). Every lane of the warp runs every pass and shuffle; a group past the last row (`live`
// false) repeats the last row's loads and stores nothing.
#include <fmt/format.h>

#include "core/env_switch.h"
#include "fusion/codegen_writer.h"

namespace kiln::codegen {
namespace {

// Indices in 32 bits when every one fits: the coordinates' divisions are the loops' cost.
struct IndexType {
  const char* name;
  const char* suffix;
};

IndexType index_type(const FusedGroup& g) {
  return g.shape.numel() < (std::int64_t{1} << 31) ? IndexType{"int", ""}
                                                   : IndexType{"long long", "LL"};
}

}  // namespace

int Writer::row_lanes() const {
  const std::int64_t n_red = split_axes(g_.shape, g_.reduction->axes).reduced_count();
  static const bool on = env_switch_on("KILN_ROW_LANES");  // =0: a warp a row, for measuring
  int lanes = 32;
  while (on && lanes > 1 && (lanes / 2) * 4 >= n_red) lanes /= 2;
  return lanes;
}

std::string Writer::staged_body() const {
  const ReductionAxes axes = split_axes(g_.shape, g_.reduction->axes);
  const IndexType ix = index_type(g_);
  const std::int64_t n_red = axes.reduced_count();
  const int lanes = row_lanes();
  std::string out =
      fmt::format("  const long long n_rows = {}LL;\n", g_.reduction->type.shape.numel());
  out += fmt::format("  const {} n_red = {}{};\n", ix.name, n_red, ix.suffix);
  out += fmt::format("  const unsigned lane = threadIdx.x & {}u;\n", lanes - 1);
  out += "  const long long warps = (long long)gridDim.x * (blockDim.x >> 5);\n";
  out += hoisted_scalars();
  if (lanes == 32) {
    out +=
        "  for (long long job = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); "
        "job < n_rows; job += warps) {\n";
  } else {
    const int rows = 32 / lanes;
    out += fmt::format(
        "  for (long long first = ((long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> "
        "5)) * {0}; first < n_rows; first += warps * {0}) {{\n",
        rows);
    const std::string row = fmt::format("first + (long long)((threadIdx.x & 31u) / {}u)", lanes);
    out += fmt::format("    const bool live = {} < n_rows;\n", row);
    out += fmt::format("    const long long job = live ? {} : n_rows - 1;\n", row);
  }
  out += fmt::format("    const {} base = {};\n", ix.name,
                     coordinate_sum(axes.kept_sizes, axes.kept_strides,
                                    fmt::format("(({})job)", ix.name), ix.suffix));
  for (std::size_t r = 0; r < g_.reductions().size(); ++r) out += fmt::format("    T row{};\n", r);
  for (int s = 0; s < g_.stage_count(); ++s) out += stage_pass(s);
  out += last_pass();
  out += "  }\n";
  return out;
}

// The loop over a lane's elements e of its row, each at i: every 32nd from the lane, or (rows
// a warp) an unrolled loop of at most 4.
std::string Writer::row_loop(const std::string& body) const {
  const ReductionAxes axes = split_axes(g_.shape, g_.reduction->axes);
  const IndexType ix = index_type(g_);
  const std::int64_t n_red = axes.reduced_count();
  const int lanes = row_lanes();
  const std::string index =
      fmt::format("        const {} i = base + {};\n", ix.name,
                  coordinate_sum(axes.red_sizes, axes.red_strides, "e", ix.suffix));
  if (lanes == 32)
    return fmt::format("      for ({0} e = ({0})lane; e < n_red; e += 32) {{\n", ix.name) + index +
           body + "      }\n";
  const std::int64_t per = (n_red + lanes - 1) / lanes;
  return fmt::format(
             "#pragma unroll\n      for (int k = 0; k < {1}; ++k) {{\n        const {0} e = "
             "({0})lane + "
             "k * {2};\n        if (!live || e >= n_red) continue;\n",
             ix.name, per, lanes) +
         index + body + "      }\n";
}

// One pass: the stage's reductions over the row, each combined across the row's lanes.
std::string Writer::stage_pass(int stage) const {
  const std::vector<const FusedReduction*> reds = g_.reductions();
  const std::vector<char> needed = g_.stage_instrs(stage);
  const int lanes = row_lanes();
  std::string out = fmt::format("    {{  // pass {}\n", stage);
  for (std::size_t r = 0; r < reds.size(); ++r)
    if (reds[r]->stage == stage)
      out += fmt::format("      T acc{} = {};\n", r, reduction_identity(*reds[r], g_.compute));
  std::string body = scalar_loads("        ", "i");
  body += compute("        ", "", &needed);
  for (std::size_t r = 0; r < reds.size(); ++r)
    if (reds[r]->stage == stage)
      body += fmt::format(
          "        acc{0} = {1};\n", r,
          reduction_combine(*reds[r], fmt::format("acc{}", r), operand(reds[r]->value, "")));
  out += row_loop(body);
  for (std::size_t r = 0; r < reds.size(); ++r) {
    if (reds[r]->stage != stage) continue;
    const std::string acc = fmt::format("acc{}", r);
    const DType stored = reds[r]->type.dtype;
    out += "      " + warp_butterfly(*reds[r], acc, lanes / 2) + "\n";
    out +=
        fmt::format("      if (lane == 0u{}) reduced{}[job] = {};\n", lanes == 32 ? "" : " && live",
                    r == 0 ? std::string() : std::to_string(r), narrow(stored, acc));
    out += fmt::format("      row{} = {};\n", r, widen(stored, narrow(stored, acc)));
  }
  return out + "    }\n";
}

// The outputs at every element of the row; the row outputs once, by lane 0 at its first.
std::string Writer::last_pass() const {
  if (g_.outputs.empty() && g_.row_outputs.empty()) return "";
  std::string body = scalar_loads("        ", "i");
  body += compute("        ", "");
  for (std::size_t o = 0; o < g_.outputs.size(); ++o)
    body += "        " + store(o, fmt::format("out{}[i]", o), "");
  if (!g_.row_outputs.empty()) {
    body += "        if (e == 0) {\n";
    for (std::size_t w = 0; w < g_.row_outputs.size(); ++w)
      body +=
          fmt::format("          row_out{}[job] = {};\n", w,
                      narrow(g_.row_outputs[w].type.dtype, operand(g_.row_outputs[w].value, "")));
    body += "        }\n";
  }
  return "    {  // the outputs\n" + row_loop(body) + "    }\n";
}

}  // namespace kiln::codegen
