// Code generation: each instruction becomes one line built from its op's CUDA snippet
// ("({0} + {1})"), inputs are loaded at offsets computed from merged strides, and the
// loop is a grid-stride loop, with a float4 path when every access allows it.
#include "fusion/codegen.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "fusion/strided_walk.h"

namespace kiln {
namespace {

std::string type_name(DType d) { return d == DType::f64 ? "double" : "float"; }

std::string literal(double v, DType d) {
  if (std::isnan(v))
    return d == DType::f64 ? "__longlong_as_double(0x7ff8000000000000LL)"
                           : "__int_as_float(0x7fc00000)";
  if (std::isinf(v)) {
    const std::string inf = d == DType::f64 ? "__longlong_as_double(0x7ff0000000000000LL)"
                                            : "__int_as_float(0x7f800000)";
    return v > 0 ? inf : "(-" + inf + ")";
  }
  std::string text = d == DType::f64 ? fmt::format("{:.17g}", v) : fmt::format("{:.9g}", v);
  if (text.find_first_of(".e") == std::string::npos) text += ".0";  // "0f" is not a float literal
  return d == DType::f64 ? text : text + "f";
}

// Offset into an input for element `index` (a C expression), from merged dims and strides.
std::string offset_expr(const StridedWalk& walk, const std::string& index) {
  std::string expr;
  std::int64_t inner = 1;
  for (std::size_t d = walk.dims.size(); d-- > 0;) {
    const std::int64_t stride = walk.strides[d];
    if (stride != 0 && walk.dims[d] > 1) {
      std::string coord = inner == 1 ? index : fmt::format("({} / {}LL)", index, inner);
      if (d > 0) coord = fmt::format("({} % {}LL)", coord, walk.dims[d]);
      expr += (expr.empty() ? "" : " + ") +
              (stride == 1 ? coord : fmt::format("{} * {}LL", coord, stride));
    }
    inner *= walk.dims[d];
  }
  return expr.empty() ? "0" : expr;
}

enum class Access { contiguous, scalar, strided };

struct InputPlan {
  Access access;
  StridedWalk walk;
  bool vector_load;     // float4 load at offset(i) for lanes i..i+3
  bool lane_invariant;  // the same element for lanes i..i+3
};

InputPlan plan_input(const FusedGroup& g, const FusedInput& in) {
  InputPlan p{Access::strided, StridedWalk(g.shape, in.strides), false, false};
  if (in.contiguous(g.shape))
    p.access = Access::contiguous;
  else if (in.scalar())
    p.access = Access::scalar;
  const std::int64_t inner = p.walk.dims.back(), inner_stride = p.walk.strides.back();
  bool outer_aligned = true;
  for (std::size_t d = 0; d + 1 < p.walk.dims.size(); ++d)
    outer_aligned = outer_aligned && p.walk.strides[d] % 4 == 0;
  p.vector_load =
      p.access == Access::contiguous || (inner_stride == 1 && inner % 4 == 0 && outer_aligned);
  p.lane_invariant = p.access == Access::scalar || (inner_stride == 0 && inner % 4 == 0);
  return p;
}

// Replaces {0}, {1}, ... in an op's snippet with argument expressions.
std::string expand(const std::string& snippet, const std::vector<std::string>& args) {
  std::string out;
  for (std::size_t i = 0; i < snippet.size(); ++i) {
    if (snippet[i] == '{' && i + 2 < snippet.size() && snippet[i + 2] == '}' &&
        std::isdigit(static_cast<unsigned char>(snippet[i + 1]))) {
      out += args.at(static_cast<std::size_t>(snippet[i + 1] - '0'));
      i += 2;
      continue;
    }
    out += snippet[i];
  }
  return out;
}

// The reduction's start value and its combination of an accumulator with a value, from the
// op's ReductionRule; a NaN value wins where the rule says so, as on the CPU.
std::string reduction_identity(const FusedReduction& red, DType dtype) {
  return literal(red.op->reduction.identity, dtype);
}
std::string reduction_combine(const FusedReduction& red, const std::string& acc,
                              const std::string& value) {
  const ReductionRule& rule = red.op->reduction;
  const std::string combined = expand(rule.cuda_combine, {acc, value});
  if (rule.nan == NanRule::arithmetic) return combined;
  return fmt::format("(({1}) != ({1}) ? ({1}) : {0})", combined, value);
}

class Writer {
 public:
  explicit Writer(const FusedGroup& g) : g_(g), t_(type_name(g.dtype)) {
    for (const FusedInput& in : g.inputs) plans_.push_back(plan_input(g, in));
  }

  CudaKernelSource generate() {
    KILN_CHECK(!is_low_precision(g_.dtype),
               "a fused group of {} values: the CUDA code generator does not handle bf16 or f16 "
               "yet (the CPU runs them; on the GPU only cast converts them)",
               dtype_name(g_.dtype));
    CudaKernelSource k;
    k.reduction = g_.reduction.has_value();
    k.work_items = g_.shape.numel();
    std::string body, extra;
    if (k.reduction) {
      k.reduced_outputs = g_.reduction->type.shape.numel();
      const std::int64_t per_output =
          g_.shape.numel() / std::max<std::int64_t>(1, k.reduced_outputs);
      if (columns_reduced()) {  // blocks of 32 adjacent outputs, so that a warp's loads are one row
                                // segment
        const std::int64_t tiles = (k.reduced_outputs + 31) / 32;
        k.splits = reduction_splits(tiles, per_output * 32, 1024, 2048);
        k.work_items = tiles * k.splits;
        body = column_reduction_body(k.splits);
      } else {
        k.splits = reduction_splits(k.reduced_outputs, per_output, 2048, 512);
        k.work_items = k.reduced_outputs * k.splits;
        body = reduction_body(k.splits);
      }
      if (k.splits > 1) extra = finish_kernel(k.reduced_outputs, k.splits);
    } else {
      body = elementwise_body(k.vector_width);
    }
    const std::string text =
        fmt::format("typedef {} T;\nextern \"C\" __global__ void KERNEL({}) {{\n{}{}}}\n{}", t_,
                    parameters(), offsets(), body, extra);
    k.name = fmt::format("kiln_{:016x}", std::hash<std::string>{}(text));
    if (k.splits > 1) k.finish_name = k.name + "_finish";
    k.source = "// generated by kiln: " + g_.summary() + "\n" + text;
    for (std::size_t at = k.source.find("KERNEL"); at != std::string::npos;
         at = k.source.find("KERNEL", at))
      k.source.replace(at, 6, k.name);
    return k;
  }

  // Few outputs over many elements would leave most SMs idle with one block per output:
  // aim at about `blocks` blocks, each reducing at least `least` elements (the row body:
  // 2048 and 512, so that a per-channel sum over [64, 32, 14, 14] runs 32 x 25 blocks, not
  // 32 x 7 of 1792 elements each; the column body: 1024 and 2048).
  static std::int64_t reduction_splits(std::int64_t outputs, std::int64_t per_output,
                                       std::int64_t blocks, std::int64_t least) {
    const std::int64_t by_blocks = (blocks + outputs - 1) / outputs;
    const std::int64_t by_size = (per_output + least - 1) / least;
    return std::max<std::int64_t>(1, std::min(by_blocks, by_size));
  }

 private:
  std::string parameters() const {
    std::string p;
    for (std::size_t k = 0; k < g_.inputs.size(); ++k)
      p += fmt::format("{}const T* __restrict__ in{}", p.empty() ? "" : ", ", k);
    for (std::size_t k = 0; k < g_.outputs.size(); ++k)
      p += fmt::format("{}T* __restrict__ out{}", p.empty() ? "" : ", ", k);
    if (g_.reduction) p += fmt::format("{}T* __restrict__ reduced", p.empty() ? "" : ", ");
    return p;
  }

  // Inputs read from an offset (slices in place) start there: every access below, and
  // the float4 path's alignment test, see the shifted pointer.
  std::string offsets() const {
    std::string out;
    for (std::size_t k = 0; k < g_.inputs.size(); ++k)
      if (g_.inputs[k].offset != 0)
        out += fmt::format("  in{} += {}LL;  // a slice read in place\n", k, g_.inputs[k].offset);
    return out;
  }

  std::string operand(const Operand& op, const std::string& lane) const {
    switch (op.kind) {
      case Operand::Kind::input:
        return fmt::format("x{}{}", op.index, lane);
      case Operand::Kind::instr:
        return fmt::format("r{}", op.index);
      case Operand::Kind::constant:
        return literal(op.constant, g_.dtype);
    }
    return "?";
  }

  // The instruction lines; `lane` selects a float4 component of vector-loaded inputs.
  std::string compute(const std::string& indent, const std::string& lane) const {
    std::string out;
    for (std::size_t i = 0; i < g_.instrs.size(); ++i) {
      std::vector<std::string> args;
      for (const Operand& a : g_.instrs[i].args) {
        const bool per_lane = a.kind == Operand::Kind::input &&
                              !plans_[static_cast<std::size_t>(a.index)].lane_invariant;
        args.push_back(operand(a, per_lane ? lane : ""));
      }
      out += fmt::format("{}const T r{} = {};  // {}\n", indent, i,
                         expand(g_.instrs[i].op->cuda, args), g_.instrs[i].op->name);
    }
    return out;
  }

  std::string scalar_loads(const std::string& indent, const std::string& index) const {
    std::string out;
    for (std::size_t k = 0; k < plans_.size(); ++k) {
      if (plans_[k].access == Access::scalar) continue;  // hoisted
      const std::string off =
          plans_[k].access == Access::contiguous ? index : offset_expr(plans_[k].walk, index);
      out += fmt::format("{}const T x{} = in{}[{}];\n", indent, k, k, off);
    }
    return out;
  }

  std::string hoisted_scalars() const {
    std::string out;
    for (std::size_t k = 0; k < plans_.size(); ++k)
      if (plans_[k].access == Access::scalar)
        out += fmt::format("  const T x{} = in{}[0];\n", k, k);
    return out;
  }

  std::string elementwise_body(int& vector_width) const {
    const std::int64_t n = g_.shape.numel();
    std::string out = fmt::format("  const long long n = {}LL;\n", n);
    out += "  const long long step = (long long)gridDim.x * blockDim.x;\n";
    out += "  const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n";
    out += hoisted_scalars();
    if (vector_path_possible()) {
      vector_width = 4;
      out += vector_loop();
    }
    out += "  for (long long i = first; i < n; i += step) {\n";
    out += scalar_loads("    ", "i");
    out += compute("    ", "");
    for (std::size_t o = 0; o < g_.outputs.size(); ++o)
      out += fmt::format("    out{}[i] = {};\n", o, operand(g_.outputs[o], ""));
    out += "  }\n";
    return out;
  }

  bool vector_path_possible() const {
    if (g_.dtype != DType::f32 || g_.shape.numel() % 4 != 0 || g_.shape.numel() < 4) return false;
    for (const InputPlan& p : plans_)
      if (!p.vector_load && !p.lane_invariant) return false;
    return true;
  }

  // float4 loads and stores when every pointer is 16-byte aligned (checked at run time).
  std::string vector_loop() const {
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
        out += fmt::format(
            "      const float4 x{} = *reinterpret_cast<const float4*>(in{} + {});\n", k, k, off);
    }
    for (std::size_t o = 0; o < g_.outputs.size(); ++o)
      out += fmt::format("      float4 o{};\n", o);
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

  std::string reduction_body(std::int64_t splits) const;
  std::string column_reduction_body(std::int64_t splits) const;
  std::string finish_kernel(std::int64_t outputs, std::int64_t splits) const;
  bool columns_reduced() const;

 private:
  const FusedGroup& g_;
  std::string t_;
  std::vector<InputPlan> plans_;
};

// Merged axes of the iteration space, split into kept and reduced ones.
struct ReductionAxes {
  std::vector<std::int64_t> kept_sizes, kept_strides, red_sizes,
      red_strides;  // strides: dense, in elements
};

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

// sum_k ((index / inner_k) % size_k) * stride_k as C code, its constants with `suffix`
// ("LL": 64-bit arithmetic; "": 32-bit, when every index fits, for cheaper divisions).
std::string coordinate_sum(const std::vector<std::int64_t>& sizes,
                           const std::vector<std::int64_t>& strides, const std::string& index,
                           const char* suffix = "LL") {
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

}  // namespace

std::string Writer::reduction_body(std::int64_t splits) const {
  const FusedReduction& red = *g_.reduction;
  const ReductionAxes axes = split_axes(g_.shape, red.axes);
  std::int64_t n_red = 1;
  for (std::int64_t s : axes.red_sizes) n_red *= s;
  const std::string init = reduction_identity(red, g_.dtype);
  auto combine = [&](const std::string& a, const std::string& b) {
    return reduction_combine(red, a, b);
  };
  const std::int64_t chunk = (n_red + splits - 1) / splits;
  std::string out =
      fmt::format("  const long long n_out = {}LL;\n  const long long n_red = {}LL;\n",
                  red.type.shape.numel(), n_red);
  out += fmt::format("  const long long splits = {}LL;\n  const long long chunk = {}LL;\n", splits,
                     chunk);
  out += "  __shared__ T warp_acc[32];\n";
  out += hoisted_scalars();
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
  out += fmt::format("    T acc = {};\n", init);
  out += fmt::format(
      "#pragma unroll 4\n    for ({0} r = ({0})r_first + ({0})threadIdx.x; r < ({0})r_end; r += "
      "({0})blockDim.x) {{\n",
      ix);
  out += fmt::format("      const {} i = base + {};\n", ix,
                     coordinate_sum(axes.red_sizes, axes.red_strides, "r", suffix));
  out += scalar_loads("      ", "i");
  out += compute("      ", "");
  for (std::size_t o = 0; o < g_.outputs.size(); ++o)
    out += fmt::format("      out{}[i] = {};\n", o, operand(g_.outputs[o], ""));
  out += fmt::format("      acc = {};\n    }}\n", combine("acc", operand(red.value, "")));
  const std::string shuffle = fmt::format(
      "for (int off = 16; off > 0; off >>= 1) {{ const T other = __shfl_down_sync(0xffffffffu, "
      "acc, off); acc = {}; }}",
      combine("acc", "other"));
  out += "    " + shuffle + "\n";
  out +=
      "    if ((threadIdx.x & 31u) == 0u) warp_acc[threadIdx.x >> 5] = acc;\n    "
      "__syncthreads();\n";
  out += fmt::format(
      "    if (threadIdx.x < 32u) {{\n      acc = threadIdx.x < (blockDim.x >> 5) ? "
      "warp_acc[threadIdx.x] : {};\n",
      init);
  out += "      " + shuffle +
         "\n      if (threadIdx.x == 0u) reduced[job] = acc;\n    }\n    __syncthreads();\n  }\n";
  return out;
}

// The reduced axes lead and the kept ones trail (a bias gradient: the sum of a [rows, n]
// value over its rows): element (r, o) is at r * n + o, so threads of a warp that take
// adjacent outputs read adjacent elements, where the row-by-row body reads them n apart.
// Only for long columns: over a few rows (a batch of 64) the row-by-row body's block per
// output keeps more SMs busy (MLP GAN step 0.134 -> 0.150 ms with the column body there).
bool Writer::columns_reduced() const {
  const ReductionAxes axes = split_axes(g_.shape, g_.reduction->axes);
  return axes.kept_sizes.size() == 1 && axes.red_sizes.size() == 1 && axes.kept_strides[0] == 1 &&
         axes.red_strides[0] == axes.kept_sizes[0] && axes.kept_sizes[0] >= 32 &&
         axes.red_sizes[0] >= 512;
}

// One block per (tile of 32 outputs, split of the rows): lane x takes output tile * 32 + x,
// the block's warps take every (blockDim.x / 32)-th row of the split; the warps' sums are
// then added in warp order (deterministic). Partial results land where the finisher of
// the row-by-row body expects them: reduced[o * splits + split].
std::string Writer::column_reduction_body(std::int64_t splits) const {
  const FusedReduction& red = *g_.reduction;
  const ReductionAxes axes = split_axes(g_.shape, red.axes);
  const std::int64_t n_out = axes.kept_sizes[0], n_red = axes.red_sizes[0],
                     chunk = (n_red + splits - 1) / splits;
  const std::string init = reduction_identity(red, g_.dtype);
  auto combine = [&](const std::string& a, const std::string& b) {
    return reduction_combine(red, a, b);
  };
  std::string out = fmt::format(
      "  const long long n_out = {}LL;\n  const long long n_red = {}LL;\n", n_out, n_red);
  out += fmt::format("  const long long splits = {}LL;\n  const long long chunk = {}LL;\n", splits,
                     chunk);
  out +=
      "  __shared__ T warp_acc[32][33];\n  const unsigned lane = threadIdx.x & 31u, warp = "
      "threadIdx.x >> 5, warps = blockDim.x >> 5;\n";
  out += hoisted_scalars();
  out +=
      "  for (long long job = blockIdx.x; job < ((n_out + 31) / 32) * splits; job += gridDim.x) "
      "{\n";
  out += "    const long long o = (job / splits) * 32 + lane;\n";
  out += "    const long long r_first = (job % splits) * chunk;\n";
  out += "    const long long r_end = r_first + chunk < n_red ? r_first + chunk : n_red;\n";
  out += fmt::format("    T acc = {};\n", init);
  out +=
      "    if (o < n_out) {\n      for (long long r = r_first + warp; r < r_end; r += warps) {\n";
  out += "        const long long i = r * n_out + o;\n";
  out += scalar_loads("        ", "i");
  out += compute("        ", "");
  for (std::size_t k = 0; k < g_.outputs.size(); ++k)
    out += fmt::format("        out{}[i] = {};\n", k, operand(g_.outputs[k], ""));
  out +=
      fmt::format("        acc = {};\n      }}\n    }}\n", combine("acc", operand(red.value, "")));
  out += "    warp_acc[warp][lane] = acc;\n    __syncthreads();\n";
  out += "    if (warp == 0u && o < n_out) {\n";
  out += fmt::format("      for (unsigned w = 1; w < warps; ++w) acc = {};\n",
                     combine("acc", "warp_acc[w][lane]"));
  out += "      reduced[o * splits + job % splits] = acc;\n    }\n    __syncthreads();\n  }\n";
  return out;
}

// Combines each output's partial results in split order (deterministic: no atomics).
std::string Writer::finish_kernel(std::int64_t outputs, std::int64_t splits) const {
  const std::string combine = reduction_combine(*g_.reduction, "acc", "v");
  std::string out =
      "extern \"C\" __global__ void KERNEL_finish(const T* __restrict__ partial, T* __restrict__ "
      "reduced) {\n";
  out += fmt::format("  const long long n_out = {}LL;\n  const long long splits = {}LL;\n", outputs,
                     splits);
  out +=
      "  for (long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x; o < n_out; o += "
      "(long long)gridDim.x * blockDim.x) {\n";
  out += "    T acc = partial[o * splits];\n";
  out += fmt::format(
      "    for (long long c = 1; c < splits; ++c) {{ const T v = partial[o * splits + c]; acc = "
      "{}; }}\n",
      combine);
  out += "    reduced[o] = acc;\n  }\n}\n";
  return out;
}

CudaKernelSource generate_cuda(const FusedGroup& group) { return Writer(group).generate(); }

}  // namespace kiln
