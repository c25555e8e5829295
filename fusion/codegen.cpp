// Code generation: each instruction becomes one line built from its op's CUDA snippet
// ("({0} + {1})"), inputs are loaded at offsets computed from merged strides and widened to
// the compute type, and the loop is a grid-stride loop, with a vector path when every access
// allows it (codegen_vector.cpp). bf16 and f16 values are stored as their bits and rounded to
// nearest even where they are stored, and in registers where an instruction makes one.
#include "fusion/codegen.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <utility>
#include <cmath>
#include <cstring>

#include "core/env_switch.h"
#include "core/half.h"
#include "fusion/codegen_writer.h"
#include "gpu/kernel_source.h"
#include "fusion/stages.h"

namespace kiln::codegen {

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

std::string storage_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "float";
    case DType::f64:
      return "double";
    case DType::bf16:
    case DType::f16:
      return "unsigned short";
    default:
      break;
  }
  throw Error(
      fmt::format("a fused group of {} values: only floating dtypes fuse", dtype_name(dtype)));
}

std::string widen(DType dtype, const std::string& stored) {
  if (dtype == DType::bf16) return "kiln_from_bf16(" + stored + ")";
  if (dtype == DType::f16) return "kiln_from_f16(" + stored + ")";
  return stored;
}

std::string narrow(DType dtype, const std::string& value) {
  if (dtype == DType::bf16) return "kiln_to_bf16(" + value + ")";
  if (dtype == DType::f16) return "kiln_to_f16(" + value + ")";
  return value;
}

// cvt.rn rounds to nearest even as the CPU's conversions (core/half.h) do; widening is exact.
const char* low_precision_prelude() {
  return "__device__ __forceinline__ float kiln_from_bf16(unsigned short v) { return "
         "__uint_as_float(((unsigned)v) << 16); }\n"
         "__device__ __forceinline__ unsigned short kiln_to_bf16(float v) { unsigned short h; "
         "asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(v)); return h; }\n"
         "__device__ __forceinline__ float kiln_from_f16(unsigned short v) { float f; "
         "asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(v)); return f; }\n"
         "__device__ __forceinline__ unsigned short kiln_to_f16(float v) { unsigned short h; "
         "asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(v)); return h; }\n"
         "__device__ __forceinline__ float kiln_tanh_approx(float v) { float t; "
         "asm(\"tanh.approx.f32 %0, %1;\" : \"=f\"(t) : \"f\"(v)); return t; }\n"
         "__device__ __forceinline__ unsigned kiln_pack_bf16x2(float lo, float hi) { unsigned d; "
         "asm(\"cvt.rn.bf16x2.f32 %0, %1, %2;\" : \"=r\"(d) : \"f\"(hi), \"f\"(lo)); return d; "
         "}\n"
         "__device__ __forceinline__ void kiln_round_bf16x2(float a, float b, float& ra, float& "
         "rb) "
         "{ const unsigned d = kiln_pack_bf16x2(a, b); ra = __uint_as_float(d << 16); "
         "rb = __uint_as_float(d & 0xffff0000u); }\n";
}

InputPlan plan_input(const FusedGroup& g, const FusedInput& in, int width) {
  InputPlan p{Access::strided, StridedWalk(g.shape, in.strides), false, false};
  if (in.contiguous(g.shape))
    p.access = Access::contiguous;
  else if (in.scalar())
    p.access = Access::scalar;
  const std::int64_t inner = p.walk.dims.back(), inner_stride = p.walk.strides.back();
  bool outer_aligned = true;
  for (std::size_t d = 0; d + 1 < p.walk.dims.size(); ++d)
    outer_aligned = outer_aligned && p.walk.strides[d] % width == 0;
  p.vector_load =
      p.access == Access::contiguous || (inner_stride == 1 && inner % width == 0 && outer_aligned);
  p.lane_invariant = p.access == Access::scalar || (inner_stride == 0 && inner % width == 0);
  return p;
}

namespace {

bool any_low_precision_instr(const FusedGroup& g) {
  return std::any_of(g.instrs.begin(), g.instrs.end(),
                     [](const FusedInstr& i) { return is_low_precision(i.dtype); });
}

}  // namespace

Writer::Writer(const FusedGroup& g) : g_(g), t_(g.compute == DType::f64 ? "double" : "float") {
  // 16-bit groups take 8 lanes (one 16-byte load of 16-bit values per input), else 4 (8-byte
  // loads: per-channel values over 14x14 or 7x7 maps), whichever every access allows; f32
  // groups take 4 (float4). 16 lanes (two loads per thread) was measured slower on the H200:
  // the bf16 chain at 3.55 TB/s against 3.66.
  for (int lanes : g.low_precision() ? std::vector<int>{8, 4} : std::vector<int>{4})
    if (plan_lanes(lanes)) break;
  // Long rows with row outputs: the pass over the elements computes what the outputs and the
  // reductions read, the finisher (row_outputs_code) the rest.
  if (g.rows_finish_only() &&
      g.shape.numel() / std::max<std::int64_t>(1, g.reduction->type.shape.numel()) >
          cuda_stage_options().max_row_elements) {
    std::vector<Operand> values(g.outputs.begin(), g.outputs.end());
    for (const FusedReduction* r : g.reductions()) values.push_back(r->value);
    pass_instrs_ = g.instrs_read_by(std::move(values));
  }
}

bool Writer::plan_lanes(int lanes) {
  lanes_ = lanes;
  plans_.clear();
  for (const FusedInput& in : g_.inputs) plans_.push_back(plan_input(g_, in, lanes_));
  return vectorizable();
}

CudaKernelSource Writer::generate() {
  CudaKernelSource k;
  k.reduction = g_.reduction.has_value();
  k.work_items = g_.shape.numel();
  std::string body, extra;
  // A staged group takes a warp per row, every pass in it (codegen_stages.cpp); rows longer
  // than the stage pass allows reach here only with row outputs its finisher computes.
  k.row_outputs = static_cast<int>(g_.row_outputs.size());
  if (g_.staged() && pass_instrs_.empty()) {
    k.reduced_outputs = g_.reduction->type.shape.numel();
    k.work_items = (k.reduced_outputs * row_lanes() + 31) / 32;  // warps' jobs: rows a warp
    k.reductions = static_cast<int>(g_.reductions().size());
    k.warp_jobs = true;
    body = staged_body();
  } else if (k.reduction) {
    k.reduced_outputs = g_.reduction->type.shape.numel();
    k.reductions = static_cast<int>(g_.reductions().size());
    const std::int64_t per_output = g_.shape.numel() / std::max<std::int64_t>(1, k.reduced_outputs);
    if (const ColumnShape cs = column_shape(); cs.outer > 0) {  // a warp's loads: row segments
      if (g_.low_precision() && lanes_ == 8 && column_lanes() == 4) plan_lanes(4);
      column_kernel(cs, k, body);
    } else {
      // (KILN_REDUCTION_BLOCKS=N aims at N blocks instead, for measuring.)
      const std::int64_t blocks = env_integer("KILN_REDUCTION_BLOCKS", 2048, 1, 1 << 20, "blocks");
      k.splits = reduction_splits(k.reduced_outputs, per_output, blocks, 512);
      k.work_items = k.reduced_outputs * k.splits;
      // Long splits (batch norm's statistics over NCHW: 16384 elements a split at [512, 64,
      // 32, 32]) in blocks of up to 256 that their vectors keep busy, a block a job: in blocks
      // of 64 they ran at 1.93 TB/s on an H100 (ncu: 43 % of the warps resident).
      const std::int64_t threads = (per_output + k.splits - 1) / k.splits / reduction_lanes();
      if (threads > 64) k.block_threads = threads >= 256 ? 256 : 128;
      // (KILN_REDUCTION_THREADS=N: blocks of N threads, a block a job, for measuring.)
      const std::int64_t forced = env_integer("KILN_REDUCTION_THREADS", 0, 0, 1024,
                                              "0, or threads a block from 32 to 1024");
      KILN_CHECK(forced % 32 == 0, "KILN_REDUCTION_THREADS='{}': expected a multiple of 32",
                 forced);
      if (forced > 0) {
        k.block_threads = static_cast<int>(forced);
        k.block_forced = true;
      }
      k.finish_in_kernel = k.splits > 1 && env_switch_set("KILN_LAST_BLOCK_FINISH");
      body = reduction_body(k.splits, k.finish_in_kernel);
    }
    // Many partials an output: a block of 256 combines each (a warp's 32 lanes would wait on
    // L2 once per 32 partials: 7 us for 64 channels x 1024 splits on an H100).
    if (k.splits >= 128) k.finish_threads = 256;
    if (k.splits > 1 && !k.finish_in_kernel)
      extra = finish_kernel(k.reduced_outputs, k.splits, k.finish_threads, k.split_jobs > 0);
  } else if (g_.any_channels_last()) {
    body = channels_last_body(k);
  } else {
    body = elementwise_body(k.vector_width);
  }
  const bool low = g_.low_precision() || any_low_precision_instr(g_);
  const std::string text = fmt::format(
      "{}typedef {} T;\n{}extern \"C\" __global__ void KERNEL({}) {{\n  "
      "KILN_AFTER_PRIOR_GRIDS();\n{}{}}}\n{}",
      gpu::after_prior_grids_definition(), t_, low ? low_precision_prelude() : "",
      parameters(k.splits, k.finish_in_kernel), offsets(), body, extra);
  k.name = fmt::format("kiln_{:016x}", std::hash<std::string>{}(text));
  if (k.splits > 1 && !k.finish_in_kernel) k.finish_name = k.name + "_finish";
  k.source = "// generated by kiln: " + g_.summary() + "\n" + text;
  for (std::size_t at = k.source.find("KERNEL"); at != std::string::npos;
       at = k.source.find("KERNEL", at))
    k.source.replace(at, 6, k.name);
  return k;
}

std::int64_t Writer::reduction_splits(std::int64_t outputs, std::int64_t per_output,
                                      std::int64_t blocks, std::int64_t least) {
  const std::int64_t by_blocks = (blocks + outputs - 1) / outputs;
  const std::int64_t by_size = (per_output + least - 1) / least;
  return std::max<std::int64_t>(1, std::min(by_blocks, by_size));
}

// A split reduction's main kernel writes partial results of the compute type into scratch.
std::string Writer::pointer_type(DType stored) const {
  return stored == g_.compute ? std::string("T") : storage_name(stored);
}

std::string Writer::parameters(std::int64_t splits, bool finish_in_kernel) const {
  std::string p = input_parameters();
  for (std::size_t k = 0; k < g_.outputs.size(); ++k)
    p += fmt::format("{}{}* __restrict__ out{}", p.empty() ? "" : ", ",
                     pointer_type(g_.operand_dtype(g_.outputs[k])), k);
  const std::vector<const FusedReduction*> reds = g_.reductions();
  for (std::size_t r = 0; r < reds.size(); ++r)
    p += fmt::format("{}{}* __restrict__ reduced{}", p.empty() ? "" : ", ",
                     splits > 1 ? std::string("T") : pointer_type(reds[r]->type.dtype),
                     r == 0 ? std::string() : std::to_string(r));
  for (std::size_t w = 0; w < g_.row_outputs.size(); ++w)
    p += fmt::format(", {}* __restrict__ row_out{}", pointer_type(g_.row_outputs[w].type.dtype), w);
  if (!finish_in_kernel) return p;
  p += ", unsigned* __restrict__ arrivals";
  for (std::size_t r = 0; r < reds.size(); ++r)
    p += fmt::format(", {}* __restrict__ {}", pointer_type(reds[r]->type.dtype),
                     reduction_name("result", r));
  return p;
}

std::string Writer::input_parameters() const {
  std::string p;
  for (std::size_t k = 0; k < g_.inputs.size(); ++k) {
    p += fmt::format("{}const {}* __restrict__ in{}", p.empty() ? "" : ", ",
                     pointer_type(g_.inputs[k].type.dtype), k);
  }
  return p;
}

// Inputs read from an offset (slices in place) start there: every access below, and
// the vector path's alignment test, see the shifted pointer.
std::string Writer::offsets() const {
  std::string out;
  for (std::size_t k = 0; k < g_.inputs.size(); ++k)
    if (g_.inputs[k].offset != 0)
      out += fmt::format("  in{} += {}LL;  // a slice read in place\n", k, g_.inputs[k].offset);
  return out;
}

std::string Writer::operand(const Operand& op, const std::string& lane, bool lane_instrs) const {
  switch (op.kind) {
    case Operand::Kind::input:  // a lane-invariant input has one register for all lanes
      return fmt::format("x{}{}", op.index,
                         plans_[static_cast<std::size_t>(op.index)].lane_invariant ? "" : lane);
    case Operand::Kind::instr:
      return fmt::format("r{}{}", op.index, lane_instrs ? lane : std::string());
    case Operand::Kind::constant:
      return literal(op.constant, g_.compute);
    case Operand::Kind::reduced:  // the row's value of an earlier stage (codegen_stages.cpp)
      return fmt::format("row{}", op.index);
  }
  return "?";
}

namespace {

// Whether `v` is a value of `dtype` exactly (bf16/f16; every value is an f32 or f64 one).
bool representable(double v, DType dtype) {
  const auto f = static_cast<float>(v);
  if (dtype == DType::bf16) return bf16_bits_to_float(float_to_bf16_bits(f)) == v;
  if (dtype == DType::f16) return f16_bits_to_float(float_to_f16_bits(f)) == v;
  return true;
}

}  // namespace

// Whether instruction i's value needs no rounding to its 16-bit dtype: an exact op (OpDef::exact)
// of operands that are values of that dtype already.
bool Writer::exact_in_dtype(std::size_t i) const {
  const FusedInstr& instr = g_.instrs[i];
  if (!instr.op->exact) return false;
  for (const Operand& a : instr.args) {
    switch (a.kind) {
      case Operand::Kind::input:
        if (g_.inputs[static_cast<std::size_t>(a.index)].type.dtype != instr.dtype) return false;
        break;
      case Operand::Kind::instr:
        if (g_.instrs[static_cast<std::size_t>(a.index)].dtype != instr.dtype) return false;
        break;
      case Operand::Kind::constant:
        if (!representable(a.constant, instr.dtype)) return false;
        break;
      case Operand::Kind::reduced:
        if (g_.operand_dtype(a) != instr.dtype) return false;
        break;
    }
  }
  return true;
}

bool Writer::rounds(std::size_t i) const {
  return is_low_precision(g_.instrs[i].dtype) && !exact_in_dtype(i);
}

bool Writer::computed(std::size_t i, const std::vector<char>* needed) const {
  if (needed == nullptr && !pass_instrs_.empty()) needed = &pass_instrs_;
  return needed == nullptr || (*needed)[i];
}

std::string Writer::instr_value(std::size_t i, const std::string& lane, bool lane_instrs) const {
  std::vector<std::string> args;
  for (const Operand& a : g_.instrs[i].args) args.push_back(operand(a, lane, lane_instrs));
  const OpDef& op = *g_.instrs[i].op;
  const bool fast =
      g_.instrs[i].dtype == DType::bf16 && g_.compute == DType::f32 && !op.cuda_bf16.empty();
  return expand(fast ? op.cuda_bf16 : op.cuda, args);
}

// The instruction lines; `lane` selects a vector lane of vector-loaded inputs.
std::string Writer::compute(const std::string& indent, const std::string& lane,
                            const std::vector<char>* needed) const {
  std::string out;
  for (std::size_t i = 0; i < g_.instrs.size(); ++i) {
    if (!computed(i, needed)) continue;
    const DType d = g_.instrs[i].dtype;
    std::string value = instr_value(i, lane, false);
    // What the op would store (cvt, a quarter-rate instruction on sm_90: bound the bf16 chain).
    if (rounds(i)) value = widen(d, narrow(d, value));
    out += fmt::format("{}const T r{} = {};  // {}\n", indent, i, value, g_.instrs[i].op->name);
  }
  return out;
}

bool Writer::pairs_rounding() const {
  if (env_integer("KILN_PAIRED_ROUNDING", 1, 0, 1, "0 or 1") == 0 || g_.compute != DType::f32)
    return false;
  for (std::size_t i = 0; i < g_.instrs.size(); ++i)
    if (g_.instrs[i].dtype == DType::bf16 && rounds(i)) return true;
  return false;
}

// cvt.rn.bf16x2 rounds two values as two cvt.rn.bf16 would, in one conversion: sm_90 converts
// 16 values a clock an SM, and a bf16 group of many rounded ops was bound by them (ncu: batch
// norm's 29-op backward sums over [512, 64, 32, 32] on an H100, 84 % of the SM's issue
// throughput, mio_throttle its largest stall).
std::string Writer::compute_pair(const std::string& indent, const std::string& a,
                                 const std::string& b) const {
  std::string out;
  for (std::size_t i = 0; i < g_.instrs.size(); ++i) {
    if (!computed(i, nullptr)) continue;
    const DType d = g_.instrs[i].dtype;
    std::string va = instr_value(i, a, true), vb = instr_value(i, b, true);
    const std::string name = g_.instrs[i].op->name;
    if (rounds(i) && d == DType::bf16) {
      out += fmt::format(
          "{0}T r{1}{2}, r{1}{3}; kiln_round_bf16x2({4}, {5}, r{1}{2}, r{1}{3});  // {6}\n", indent,
          i, a, b, va, vb, name);
      continue;
    }
    if (rounds(i)) {
      va = widen(d, narrow(d, va));
      vb = widen(d, narrow(d, vb));
    }
    out += fmt::format("{0}const T r{1}{2} = {3}, r{1}{4} = {5};  // {6}\n", indent, i, a, va, b,
                       vb, name);
  }
  return out;
}

std::string Writer::lane_names(const std::string& indent, const std::string& lane,
                               const std::string& uses) const {
  auto read = [&](const std::string& name) {  // as a whole identifier
    auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
    for (std::size_t at = uses.find(name); at != std::string::npos; at = uses.find(name, at + 1))
      if ((at == 0 || !word(uses[at - 1])) &&
          (at + name.size() == uses.size() || !word(uses[at + name.size()])))
        return true;
    return false;
  };
  std::string out;
  for (std::size_t i = 0; i < g_.instrs.size(); ++i)
    if (computed(i, nullptr) && read(fmt::format("r{}", i)))
      out += fmt::format("{}const T r{} = r{}{};\n", indent, i, i, lane);
  return out;
}

std::string Writer::scalar_loads(const std::string& indent, const std::string& index,
                                 const std::vector<char>& preloaded) const {
  std::string out;
  for (std::size_t k = 0; k < plans_.size(); ++k) {
    if (plans_[k].access == Access::scalar) continue;  // hoisted
    if (!preloaded.empty() && preloaded[k]) continue;
    const std::string off =
        plans_[k].access == Access::contiguous ? index : offset_expr(plans_[k].walk, index);
    out += fmt::format("{}const T x{} = {};\n", indent, k,
                       widen(g_.inputs[k].type.dtype, fmt::format("in{}[{}]", k, off)));
  }
  return out;
}

std::string Writer::hoisted_scalars() const {
  std::string out;
  for (std::size_t k = 0; k < plans_.size(); ++k)
    if (plans_[k].access == Access::scalar)
      out += fmt::format("  const T x{} = {};\n", k,
                         widen(g_.inputs[k].type.dtype, fmt::format("in{}[0]", k)));
  return out;
}

// `target` = output o's value, rounded to its storage.
std::string Writer::store(std::size_t o, const std::string& target, const std::string& lane) const {
  const Operand& op = g_.outputs[o];
  return fmt::format("{} = {};\n", target, narrow(g_.operand_dtype(op), operand(op, lane)));
}

std::string Writer::elementwise_body(int& vector_width) const {
  const std::int64_t n = g_.shape.numel();
  std::string out = fmt::format("  const long long n = {}LL;\n", n);
  out += "  const long long step = (long long)gridDim.x * blockDim.x;\n";
  out += "  const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n";
  out += hoisted_scalars();
  vector_width = this->vector_width();
  std::string start = "first";
  const bool wide = vector_width > 1 && g_.low_precision();
  if (vector_width == 4 && !wide) out += vector_loop_f32();
  if (wide) {
    out += "  long long start = first;\n" + vector_loop_wide();
    start = "start";
  }
  out += fmt::format("  for (long long i = {}; i < n; i += step) {{\n", start);
  out += scalar_loads("    ", "i");
  out += compute("    ", "");
  for (std::size_t o = 0; o < g_.outputs.size(); ++o)
    out += "    " + store(o, fmt::format("out{}[i]", o), "");
  out += "  }\n";
  return out;
}

}  // namespace kiln::codegen

namespace kiln {

CudaKernelSource generate_cuda(const FusedGroup& group) {
  return codegen::Writer(group).generate();
}

}  // namespace kiln
