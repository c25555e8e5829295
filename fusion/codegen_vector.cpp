// The vector paths of elementwise kernels: a thread takes 4 (f32 groups: float4) or, in
// groups that read or write bf16 or f16, 8 adjacent elements (one 16-byte load of 8 16-bit
// values, two for f32 values) or 4 where 8 would cross a row (8-byte loads), when every pointer
// is 16-byte aligned (checked at run time).
#include <fmt/format.h>

#include "fusion/codegen_writer.h"

namespace kiln::codegen {

bool Writer::vectorizable() const {
  for (const InputPlan& p : plans_)
    if (!p.vector_load && !p.lane_invariant) return false;
  return true;
}

std::string Writer::aligned() const {
  std::string pointers;
  for (std::size_t k = 0; k < plans_.size(); ++k)
    if (!plans_[k].lane_invariant) pointers += fmt::format(" | (unsigned long long)in{}", k);
  for (std::size_t o = 0; o < g_.outputs.size(); ++o)
    pointers += fmt::format(" | (unsigned long long)out{}", o);
  return fmt::format("((0ULL{}) & 15ULL) == 0ULL", pointers);
}

// The vector path's guard: every pointer it reads or writes in vectors is 16-byte aligned.
std::string Writer::alignment_test() const { return fmt::format("  if ({}) {{\n", aligned()); }

int Writer::vector_width() const {
  const std::int64_t n = g_.shape.numel();
  if (!vectorizable()) return 1;
  if (g_.low_precision()) return n >= lanes_ ? lanes_ : 1;  // a scalar tail takes the rest
  return g_.compute == DType::f32 && n % 4 == 0 && n >= 4 ? 4 : 1;
}

std::string Writer::vector_loop_f32() const {
  std::string out = alignment_test();
  out +=
      "    for (long long v = first; v < n / 4; v += step) {\n      const long long i = v * 4;\n";
  out += vector_body_f32();
  out += "    }\n    return;\n  }\n";
  return out;
}

// One vector iteration at element i: float4 loads, the four lanes' instructions, float4 stores.
std::string Writer::vector_body_f32(const LaneHook& after_lane,
                                    const std::vector<char>& preloaded) const {
  std::string out;
  for (std::size_t k = 0; k < plans_.size(); ++k)
    if (preloaded.empty() || !preloaded[k]) out += vector_input_loads(k, "i", "      ");
  for (std::size_t o = 0; o < g_.outputs.size(); ++o) out += fmt::format("      float4 o{};\n", o);
  for (int l = 0; l < 4; ++l) {
    const std::string suffix = std::string(".") + "xyzw"[l];
    out += "      {\n" + compute("        ", suffix);
    for (std::size_t o = 0; o < g_.outputs.size(); ++o)
      out += fmt::format("        o{}{} = {};\n", o, suffix, operand(g_.outputs[o], suffix));
    if (after_lane) out += after_lane(suffix, l);
    out += "      }\n";
  }
  for (std::size_t o = 0; o < g_.outputs.size(); ++o)
    out += fmt::format("      *reinterpret_cast<float4*>(out{} + i) = o{};\n", o, o);
  return out;
}

namespace {

// Copies `lanes` elements between `to` and `from` (pointer expressions) in 16-byte chunks
// (uint4), or one 8-byte chunk (uint2) for 4 16-bit values.
std::string copy_lanes(DType dtype, int lanes, const std::string& to, const std::string& from,
                       bool from_const) {
  const int bytes = static_cast<int>(dtype_size(dtype)) * lanes;
  const char* chunk = bytes >= 16 ? "uint4" : "uint2";
  std::string out;
  for (int c = 0; c < (bytes >= 16 ? bytes / 16 : 1); ++c)
    out += fmt::format("reinterpret_cast<{0}*>({1})[{2}] = reinterpret_cast<{3}{0}*>({4})[{2}]; ",
                       chunk, to, c, from_const ? "const " : "", from);
  return out;
}

}  // namespace

std::string Writer::vector_input_loads(std::size_t k, const std::string& index,
                                       const std::string& indent) const {
  const InputPlan& p = plans_[k];
  if (p.access == Access::scalar) return "";  // (hoisted_scalars)
  const DType d = g_.inputs[k].type.dtype;
  const std::string off = p.access == Access::contiguous ? index : offset_expr(p.walk, index);
  if (!g_.low_precision()) {  // float4s
    if (p.lane_invariant) return fmt::format("{}const T x{} = in{}[{}];\n", indent, k, k, off);
    return fmt::format("{}const float4 x{} = *reinterpret_cast<const float4*>(in{} + {});\n",
                       indent, k, k, off);
  }
  if (p.lane_invariant)
    return fmt::format("{}const T x{} = {};\n", indent, k,
                       widen(d, fmt::format("in{}[{}]", k, off)));
  std::string out = fmt::format("{}__align__(16) {} s{}[{}]; ", indent, storage_name(d), k, lanes_);
  out +=
      copy_lanes(d, lanes_, fmt::format("s{}", k), fmt::format("(in{} + {})", k, off), true) + "\n";
  for (int lane = 0; lane < lanes_; ++lane)
    out += fmt::format("{}const T x{}_{} = {};\n", indent, k, lane,
                       widen(d, fmt::format("s{}[{}]", k, lane)));
  return out;
}

// Lanes 0..L-1 (L = lanes_) of input k are x<k>_<lane>, widened from an aligned register array;
// the vectors stop at n / L * L and the scalar loop after this one takes the rest from `start`.
std::string Writer::vector_loop_wide() const {
  std::string out = alignment_test();
  out += fmt::format(
      "    for (long long v = first; v < n / {0}; v += step) {{\n      const long long i = v * "
      "{0};\n",
      lanes_);
  out += vector_body_wide();
  out += fmt::format("    }}\n    start = n / {0} * {0} + first;\n  }}\n", lanes_);
  return out;
}

// One vector iteration at element i: L (lanes_) elements of each input through an aligned
// register array, the lanes' instructions, the outputs stored L at a time.
std::string Writer::vector_body_wide(const LaneHook& after_lane, const std::vector<char>& preloaded,
                                     const OutputHook& channels_last_store) const {
  std::string out;
  for (std::size_t k = 0; k < plans_.size(); ++k)
    if (preloaded.empty() || !preloaded[k]) out += vector_input_loads(k, "i", "      ");
  // bf16 outputs are rounded two lanes at a time (one cvt.rn.bf16x2 for two cvt.rn.bf16: the
  // conversions bound the bf16 chain on sm_90), from the lanes' values kept in v<o>.
  auto packed = [&](std::size_t o) { return g_.operand_dtype(g_.outputs[o]) == DType::bf16; };
  for (std::size_t o = 0; o < g_.outputs.size(); ++o) {
    out += fmt::format("      __align__(16) {} o{}[{}];\n",
                       storage_name(g_.operand_dtype(g_.outputs[o])), o, lanes_);
    if (packed(o)) out += fmt::format("      T v{}[{}];\n", o, lanes_);
  }
  // Paired (pairs_rounding): lanes 2p and 2p + 1 computed side by side in one block, each
  // lane's outputs and hook in a block of its own within it.
  const bool paired = pairs_rounding() && lanes_ % 2 == 0;
  for (int lane = 0; lane < lanes_; ++lane) {
    const std::string suffix = fmt::format("_{}", lane);
    if (paired && lane % 2 == 0)
      out += "      {\n" + compute_pair("        ", suffix, fmt::format("_{}", lane + 1));
    std::string uses;  // the lane's outputs and hook, which read its instructions as r<i>
    for (std::size_t o = 0; o < g_.outputs.size(); ++o) {
      if (!packed(o)) {
        uses += "        " + store(o, fmt::format("o{}[{}]", o, lane), suffix);
        continue;
      }
      uses += fmt::format("        v{}[{}] = {};\n", o, lane, operand(g_.outputs[o], suffix));
    }
    if (after_lane) uses += after_lane(suffix, lane);
    out += "      {\n" +
           (paired ? lane_names("        ", suffix, uses) : compute("        ", suffix)) + uses +
           "      }\n";
    if (paired && lane % 2 == 1) out += "      }\n";
  }
  for (std::size_t o = 0; o < g_.outputs.size(); ++o)
    for (int pair = 0; packed(o) && pair < lanes_ / 2; ++pair)
      out += fmt::format(
          "      reinterpret_cast<unsigned*>(o{0})[{1}] = kiln_pack_bf16x2(v{0}[{2}], "
          "v{0}[{3}]);\n",
          o, pair, 2 * pair, 2 * pair + 1);
  for (std::size_t o = 0; o < g_.outputs.size(); ++o)
    out += g_.output_channels_last(o) && channels_last_store
               ? channels_last_store(o)
               : "      " +
                     copy_lanes(g_.operand_dtype(g_.outputs[o]), lanes_,
                                fmt::format("(out{} + i)", o), fmt::format("o{}", o), false) +
                     "\n";
  return out;
}

}  // namespace kiln::codegen
