// The body of a staged group (fusion/stages.h): a warp per row (rows are at most 1024
// elements: cuda_stage_options). Each pass over the row's elements accumulates that stage's
// reductions, which butterfly shuffles combine so that every lane holds the result; lane 0
// stores it and every lane keeps it as `rowR`, rounded as stored, for the passes after it. The
// last pass computes and stores the outputs, and lane 0 the row outputs. No shared memory and
// no block barrier: a short row (softmax over 10 classes) costs a warp, not a block.
#include <fmt/format.h>

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

std::string Writer::staged_body() const {
  const ReductionAxes axes = split_axes(g_.shape, g_.reduction->axes);
  const IndexType ix = index_type(g_);
  std::int64_t n_red = 1;
  for (std::int64_t s : axes.red_sizes) n_red *= s;
  std::string out =
      fmt::format("  const long long n_rows = {}LL;\n", g_.reduction->type.shape.numel());
  out += fmt::format("  const {} n_red = {}{};\n", ix.name, n_red, ix.suffix);
  out += "  const unsigned lane = threadIdx.x & 31u;\n";
  out += "  const long long warps = (long long)gridDim.x * (blockDim.x >> 5);\n";
  out += hoisted_scalars();
  out +=
      "  for (long long job = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); "
      "job < n_rows; job += warps) {\n";
  out += fmt::format("    const {} base = {};\n", ix.name,
                     coordinate_sum(axes.kept_sizes, axes.kept_strides,
                                    fmt::format("(({})job)", ix.name), ix.suffix));
  for (std::size_t r = 0; r < g_.reductions().size(); ++r) out += fmt::format("    T row{};\n", r);
  for (int s = 0; s < g_.stage_count(); ++s) out += stage_pass(s);
  out += last_pass();
  out += "  }\n";
  return out;
}

// One pass: the stage's reductions over the row, each combined across the warp.
std::string Writer::stage_pass(int stage) const {
  const ReductionAxes axes = split_axes(g_.shape, g_.reduction->axes);
  const IndexType ix = index_type(g_);
  const std::vector<const FusedReduction*> reds = g_.reductions();
  const std::vector<char> needed = g_.stage_instrs(stage);
  std::string out = fmt::format("    {{  // pass {}\n", stage);
  for (std::size_t r = 0; r < reds.size(); ++r)
    if (reds[r]->stage == stage)
      out += fmt::format("      T acc{} = {};\n", r, reduction_identity(*reds[r], g_.compute));
  out += fmt::format("      for ({0} e = ({0})lane; e < n_red; e += 32) {{\n", ix.name);
  out += fmt::format("        const {} i = base + {};\n", ix.name,
                     coordinate_sum(axes.red_sizes, axes.red_strides, "e", ix.suffix));
  out += scalar_loads("        ", "i");
  out += compute("        ", "", &needed);
  for (std::size_t r = 0; r < reds.size(); ++r)
    if (reds[r]->stage == stage)
      out += fmt::format(
          "        acc{0} = {1};\n", r,
          reduction_combine(*reds[r], fmt::format("acc{}", r), operand(reds[r]->value, "")));
  out += "      }\n";
  for (std::size_t r = 0; r < reds.size(); ++r) {
    if (reds[r]->stage != stage) continue;
    const std::string acc = fmt::format("acc{}", r);
    const DType stored = reds[r]->type.dtype;
    out += "      " + warp_butterfly(*reds[r], acc) + "\n";
    out += fmt::format("      if (lane == 0u) reduced{}[job] = {};\n",
                       r == 0 ? std::string() : std::to_string(r), narrow(stored, acc));
    out += fmt::format("      row{} = {};\n", r, widen(stored, narrow(stored, acc)));
  }
  return out + "    }\n";
}

// The outputs at every element of the row; the row outputs once, by lane 0 at its first.
std::string Writer::last_pass() const {
  if (g_.outputs.empty() && g_.row_outputs.empty()) return "";
  const ReductionAxes axes = split_axes(g_.shape, g_.reduction->axes);
  const IndexType ix = index_type(g_);
  std::string out = "    {  // the outputs\n";
  out += fmt::format("      for ({0} e = ({0})lane; e < n_red; e += 32) {{\n", ix.name);
  out += fmt::format("        const {} i = base + {};\n", ix.name,
                     coordinate_sum(axes.red_sizes, axes.red_strides, "e", ix.suffix));
  out += scalar_loads("        ", "i");
  out += compute("        ", "");
  for (std::size_t o = 0; o < g_.outputs.size(); ++o)
    out += "        " + store(o, fmt::format("out{}[i]", o), "");
  if (!g_.row_outputs.empty()) {
    out += "        if (e == 0) {\n";
    for (std::size_t w = 0; w < g_.row_outputs.size(); ++w)
      out +=
          fmt::format("          row_out{}[job] = {};\n", w,
                      narrow(g_.row_outputs[w].type.dtype, operand(g_.row_outputs[w].value, "")));
    out += "        }\n";
  }
  return out + "      }\n    }\n";
}

}  // namespace kiln::codegen
