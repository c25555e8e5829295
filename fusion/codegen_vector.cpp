// The vector paths of elementwise kernels: a thread takes 4 (f32 groups: float4) or 8
// (groups that read or write bf16 or f16: one 16-byte load of 8 values, two for f32 values)
// adjacent elements when every pointer is 16-byte aligned (checked at run time).
#include <fmt/format.h>

#include "fusion/codegen_writer.h"

namespace kiln::codegen {

int Writer::vector_width() const {
  const std::int64_t n = g_.shape.numel();
  for (const InputPlan& p : plans_)
    if (!p.vector_load && !p.lane_invariant) return 1;
  if (g_.low_precision()) return n >= 8 ? 8 : 1;  // a scalar tail takes n % 8
  return g_.compute == DType::f32 && n % 4 == 0 && n >= 4 ? 4 : 1;
}

std::string Writer::vector_loop_f32() const {
  std::string aligned;
  for (std::size_t k = 0; k < plans_.size(); ++k)
    if (!plans_[k].lane_invariant) aligned += fmt::format(" | (unsigned long long)in{}", k);
  for (std::size_t o = 0; o < g_.outputs.size(); ++o)
    aligned += fmt::format(" | (unsigned long long)out{}", o);
  std::string out = fmt::format("  if (((0ULL{}) & 15ULL) == 0ULL) {{\n", aligned);
  out +=
      "    for (long long v = first; v < n / 4; v += step) {\n      const long long i = v * 4;\n";
  for (std::size_t k = 0; k < plans_.size(); ++k) {
    const InputPlan& p = plans_[k];
    if (p.access == Access::scalar) continue;
    const std::string off = p.access == Access::contiguous ? "i" : offset_expr(p.walk, "i");
    if (p.lane_invariant)
      out += fmt::format("      const T x{} = in{}[{}];\n", k, k, off);
    else
      out += fmt::format("      const float4 x{} = *reinterpret_cast<const float4*>(in{} + {});\n",
                         k, k, off);
  }
  for (std::size_t o = 0; o < g_.outputs.size(); ++o) out += fmt::format("      float4 o{};\n", o);
  for (const char* lane : {"x", "y", "z", "w"}) {
    out += "      {\n" + compute("        ", std::string(".") + lane);
    for (std::size_t o = 0; o < g_.outputs.size(); ++o) {
      const Operand& op = g_.outputs[o];
      const bool per_lane = op.kind == Operand::Kind::input &&
                            !plans_[static_cast<std::size_t>(op.index)].lane_invariant;
      out += fmt::format("        o{}.{} = {};\n", o, lane,
                         operand(op, per_lane ? std::string(".") + lane : ""));
    }
    out += "      }\n";
  }
  for (std::size_t o = 0; o < g_.outputs.size(); ++o)
    out += fmt::format("      *reinterpret_cast<float4*>(out{} + i) = o{};\n", o, o);
  out += "    }\n    return;\n  }\n";
  return out;
}

namespace {

// 16-byte chunks that hold 8 elements of `dtype`.
int chunks_of_8(DType dtype) { return static_cast<int>(dtype_size(dtype)) * 8 / 16; }

// Copies 8 elements between `to` and `from` (pointer expressions) in 16-byte chunks.
std::string copy_8(DType dtype, const std::string& to, const std::string& from, bool from_const) {
  std::string out;
  for (int c = 0; c < chunks_of_8(dtype); ++c)
    out += fmt::format("reinterpret_cast<uint4*>({})[{}] = reinterpret_cast<{}uint4*>({})[{}]; ",
                       to, c, from_const ? "const " : "", from, c);
  return out;
}

}  // namespace

// Lanes 0..7 of input k are x<k>_<lane>, widened from a 16-byte-aligned register array; the
// vectors stop at n / 8 * 8 and the scalar loop after this one takes the rest from `start`.
std::string Writer::vector_loop_wide() const {
  std::string aligned;
  for (std::size_t k = 0; k < plans_.size(); ++k)
    if (!plans_[k].lane_invariant) aligned += fmt::format(" | (unsigned long long)in{}", k);
  for (std::size_t o = 0; o < g_.outputs.size(); ++o)
    aligned += fmt::format(" | (unsigned long long)out{}", o);
  std::string out = fmt::format("  if (((0ULL{}) & 15ULL) == 0ULL) {{\n", aligned);
  out +=
      "    for (long long v = first; v < n / 8; v += step) {\n      const long long i = v * 8;\n";
  for (std::size_t k = 0; k < plans_.size(); ++k) {
    const InputPlan& p = plans_[k];
    if (p.access == Access::scalar) continue;
    const DType d = g_.inputs[k].type.dtype;
    const std::string off = p.access == Access::contiguous ? "i" : offset_expr(p.walk, "i");
    if (p.lane_invariant) {
      out += fmt::format("      const T x{} = {};\n", k, widen(d, fmt::format("in{}[{}]", k, off)));
      continue;
    }
    out += fmt::format("      __align__(16) {} s{}[8]; ", storage_name(d), k);
    out += copy_8(d, fmt::format("s{}", k), fmt::format("(in{} + {})", k, off), true) + "\n";
    for (int lane = 0; lane < 8; ++lane)
      out += fmt::format("      const T x{}_{} = {};\n", k, lane,
                         widen(d, fmt::format("s{}[{}]", k, lane)));
  }
  for (std::size_t o = 0; o < g_.outputs.size(); ++o)
    out += fmt::format("      __align__(16) {} o{}[8];\n",
                       storage_name(g_.operand_dtype(g_.outputs[o])), o);
  for (int lane = 0; lane < 8; ++lane) {
    const std::string suffix = fmt::format("_{}", lane);
    out += "      {\n" + compute("        ", suffix);
    for (std::size_t o = 0; o < g_.outputs.size(); ++o)
      out += "        " + store(o, fmt::format("o{}[{}]", o, lane), suffix);
    out += "      }\n";
  }
  for (std::size_t o = 0; o < g_.outputs.size(); ++o)
    out += "      " +
           copy_8(g_.operand_dtype(g_.outputs[o]), fmt::format("(out{} + i)", o),
                  fmt::format("o{}", o), false) +
           "\n";
  out += "    }\n    start = n / 8 * 8 + first;\n  }\n";
  return out;
}

}  // namespace kiln::codegen
