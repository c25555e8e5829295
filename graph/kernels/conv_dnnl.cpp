// float32 convolutions through oneDNN in the blocked layouts it picks for this processor,
// reordered from and to kiln's NCHW/OIHW buffers: one plan per geometry and direction, made
// once and kept, run on OpenMP's threads. 3x3 stride-1 layers with enough channels take
// Winograd's F(4x4, 3x3) where oneDNN implements it (winograd_fits).
#include "graph/kernels/conv_dnnl.h"

#include "graph/kernels/conv_epilogue.h"

#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>

#include "core/storage.h"

namespace kiln::kernels {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

memory::desc src_desc(const ConvGeometry& g, Tag tag) {
  return {{g.batch, g.in_channels, g.height, g.width}, memory::data_type::f32, tag};
}
memory::desc dst_desc(const ConvGeometry& g, Tag tag) {
  return {{g.batch, g.out_channels, g.out_h, g.out_w}, memory::data_type::f32, tag};
}
memory::desc weight_desc(const ConvGeometry& g, Tag tag) {
  return {{g.out_channels, g.in_channels, g.kernel_h, g.kernel_w}, memory::data_type::f32, tag};
}

struct Window {
  memory::dims strides, padding, padding_end;
};
Window window(const ConvGeometry& g) {
  // The right/bottom padding that makes oneDNN's output size equal kiln's (floor division).
  return {{g.stride, g.stride},
          {g.padding, g.padding},
          {(g.out_h - 1) * g.stride + g.kernel_h - g.height - g.padding,
           (g.out_w - 1) * g.stride + g.kernel_w - g.width - g.padding}};
}

// The epilogues a forward plan can be made with (conv_cpu.h's ConvEpilogue): bits.
constexpr int kWithBias = 1, kWithRelu = 2;
constexpr int kKilnEpilogue = 4;  // in a plan's key: kiln applies it (DnnlWithoutPostOps)
int epilogue_bits(const ConvEpilogue& e) {
  return (e.bias != nullptr ? kWithBias : 0) | (e.relu ? kWithRelu : 0);
}

// The bias as the primitive's own bias argument (Winograd's form, make_plan_with).
memory::desc bias_argument_desc(const ConvGeometry& g) {
  return {{g.out_channels}, memory::data_type::f32, Tag::x};
}

dnnl::convolution_forward::desc forward_desc(const ConvGeometry& g, Tag tag,
                                             dnnl::algorithm algorithm, bool with_bias = false) {
  const Window s = window(g);
  if (with_bias)
    return {dnnl::prop_kind::forward_training,
            algorithm,
            src_desc(g, tag),
            weight_desc(g, tag),
            bias_argument_desc(g),
            dst_desc(g, tag),
            s.strides,
            s.padding,
            s.padding_end};
  return {dnnl::prop_kind::forward_training,
          algorithm,
          src_desc(g, tag),
          weight_desc(g, tag),
          dst_desc(g, tag),
          s.strides,
          s.padding,
          s.padding_end};
}

// The epilogue as post-ops, which oneDNN applies to the finished sums: the bias as a binary
// add of a [1, Cout, 1, 1] tensor (its bias argument was added into the first block of input
// channels' sums, which rounds differently), then ReLU, whose oneDNN form with alpha 0 is
// max(v, 0) with 0 as the second operand, so NaN becomes 0 as in kiln's relu. The same bits
// as the ops run apart, NaN included (conv_epilogue_test).
memory::desc bias_desc(const ConvGeometry& g) {
  return {{1, g.out_channels, 1, 1}, memory::data_type::f32, Tag::abcd};
}

dnnl::primitive_attr epilogue_attr(const ConvGeometry& g, int epilogue) {
  dnnl::post_ops ops;
  if (epilogue & kWithBias) ops.append_binary(dnnl::algorithm::binary_add, bias_desc(g));
  if (epilogue & kWithRelu) ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
  dnnl::primitive_attr attr;
  attr.set_post_ops(ops);
  return attr;
}

// One argument of a convolution: kiln's plain layout, the primitive's (blocked) one, and the
// reorder between them when they differ (into the primitive's for an input, out of it for
// the output).
struct Argument {
  int id;
  memory::desc plain, chosen;
  std::optional<dnnl::reorder> reorder;
};

Argument argument(int id, const memory::desc& plain, const memory::desc& chosen, bool input) {
  Argument a{id, plain, chosen, std::nullopt};
  if (plain != chosen) {
    dnnl::engine& e = cpu_engine();
    a.reorder = input ? dnnl::reorder(dnnl::reorder::primitive_desc(e, plain, e, chosen))
                      : dnnl::reorder(dnnl::reorder::primitive_desc(e, chosen, e, plain));
  }
  return a;
}

// A convolution primitive in the layouts oneDNN chose for this machine (format any), with
// its two inputs and its output.
struct Plan {
  dnnl::primitive convolution;
  std::vector<Argument> inputs;
  Argument output;
  std::string implementation;  // oneDNN's name for the kernel it chose
  int epilogue = 0;            // what the primitive applies (epilogue_bits)
  bool bias_argument = false;  // the bias as its bias argument, not a post-op
};

Plan arguments_of(dnnl::primitive convolution, const dnnl::primitive_desc_base& pd,
                  const ConvGeometry& g, ConvPass direction) {
  switch (direction) {
    case ConvPass::forward:
      return {convolution,
              {argument(DNNL_ARG_SRC, src_desc(g, Tag::nchw), pd.src_desc(), true),
               argument(DNNL_ARG_WEIGHTS, weight_desc(g, Tag::oihw), pd.weights_desc(), true)},
              argument(DNNL_ARG_DST, dst_desc(g, Tag::nchw), pd.dst_desc(), false)};
    case ConvPass::grad_input:
      return {convolution,
              {argument(DNNL_ARG_DIFF_DST, dst_desc(g, Tag::nchw), pd.diff_dst_desc(), true),
               argument(DNNL_ARG_WEIGHTS, weight_desc(g, Tag::oihw), pd.weights_desc(), true)},
              argument(DNNL_ARG_DIFF_SRC, src_desc(g, Tag::nchw), pd.diff_src_desc(), false)};
    default:
      return {convolution,
              {argument(DNNL_ARG_SRC, src_desc(g, Tag::nchw), pd.src_desc(), true),
               argument(DNNL_ARG_DIFF_DST, dst_desc(g, Tag::nchw), pd.diff_dst_desc(), true)},
              argument(DNNL_ARG_DIFF_WEIGHTS, weight_desc(g, Tag::oihw), pd.diff_weights_desc(),
                       false)};
  }
}

Plan plan_of(dnnl::primitive convolution, const dnnl::primitive_desc_base& pd,
             const ConvGeometry& g, ConvPass direction) {
  Plan plan = arguments_of(convolution, pd, g, direction);
  plan.implementation = pd.impl_info_str();
  return plan;
}

// Winograd's F(4x4, 3x3) does 2.25x fewer multiplies than the direct convolution but
// transforms each input and output tile, a cost per element rather than per product. Side by
// side (2 threads, AMD EPYC with AVX-512, oneDNN 2.6's jit_wino_4x3) it ran resnet18's 3x3
// passes in 0.45-0.85x the direct time with 64-512 channels, and 1.1-1.5x with 16-32; the
// measure that separates them is c * k / (c + k), half the harmonic mean of the channel counts.
constexpr double kWinogradMinChannels = 24;
// Transforming the weights costs the same at any batch; the savings grow with the output's
// 4x4 tiles. With 16 tiles a pass (resnet18's 4x4 stage at batch 16, its 8x8 stage at
// batch 4) Winograd lost in all three passes, by 5-50 %; with 32 (the 4x4 stage at batch 32,
// the 8x8 one at batch 8) it won.
constexpr std::int64_t kWinogradMinTiles = 32;

// KILN_CPU_WINOGRAD=0: never; 1: every 3x3 stride-1 pass; unset: by the rule above.
int winograd_setting() {
  static const int setting = [] {
    const char* v = std::getenv("KILN_CPU_WINOGRAD");
    if (v == nullptr || *v == '\0') return -1;
    KILN_CHECK(std::strcmp(v, "0") == 0 || std::strcmp(v, "1") == 0,
               "KILN_CPU_WINOGRAD='{}' is not 0 (never) or 1 (every 3x3 stride-1 layer); unset "
               "it for the default rule",
               v);
    return std::strcmp(v, "0") == 0 ? 0 : 1;
  }();
  return setting;
}

bool winograd_fits(const ConvGeometry& g, ConvPass direction) {
  if (g.kernel_h != 3 || g.kernel_w != 3 || g.stride != 1) return false;
  const int setting = winograd_setting();
  if (setting >= 0) return setting == 1;
  // Images of one 4x4 tile: the input gradient's Winograd kernel lost to the direct one there
  // (resnet18's 512-channel stage, 9 passes: 62-72 against 52-62 ms), the other two passes won.
  if (direction == ConvPass::grad_input && g.height <= 4 && g.width <= 4) return false;
  if (g.batch * ((g.out_h + 3) / 4) * ((g.out_w + 3) / 4) < kWinogradMinTiles) return false;
  const double c = static_cast<double>(g.in_channels), k = static_cast<double>(g.out_channels);
  return c * k / (c + k) >= kWinogradMinChannels;
}

Plan make_plan_with(const ConvGeometry& g, ConvPass direction, dnnl::algorithm algorithm,
                    int epilogue) {
  dnnl::engine& engine = cpu_engine();
  const dnnl::convolution_forward::primitive_desc forward(forward_desc(g, Tag::any, algorithm),
                                                          engine);
  if (direction == ConvPass::forward && epilogue != 0) {
    // Winograd's kernel takes no binary post-op; its bias argument is added to each output
    // tile's finished transform, one rounding as the add op's.
    const bool bias_argument =
        algorithm == dnnl::algorithm::convolution_winograd && (epilogue & kWithBias);
    const dnnl::convolution_forward::primitive_desc fused(
        bias_argument ? forward_desc(g, Tag::any, algorithm, true)
                      : forward_desc(g, Tag::any, algorithm),
        epilogue_attr(g, bias_argument ? epilogue & ~kWithBias : epilogue), engine);
    Plan plan = plan_of(dnnl::convolution_forward(fused), fused, g, direction);
    plan.epilogue = epilogue;
    plan.bias_argument = bias_argument;
    return plan;
  }
  if (direction == ConvPass::forward)
    return plan_of(dnnl::convolution_forward(forward), forward, g, direction);
  const Window s = window(g);
  if (direction == ConvPass::grad_input) {
    const dnnl::convolution_backward_data::desc desc(
        algorithm, src_desc(g, Tag::any), weight_desc(g, Tag::any), dst_desc(g, Tag::any),
        s.strides, s.padding, s.padding_end);
    const dnnl::convolution_backward_data::primitive_desc pd(desc, engine, forward);
    return plan_of(dnnl::convolution_backward_data(pd), pd, g, direction);
  }
  const dnnl::convolution_backward_weights::desc desc(
      algorithm, src_desc(g, Tag::any), weight_desc(g, Tag::any), dst_desc(g, Tag::any), s.strides,
      s.padding, s.padding_end);
  const dnnl::convolution_backward_weights::primitive_desc pd(desc, engine, forward);
  return plan_of(dnnl::convolution_backward_weights(pd), pd, g, direction);
}

// Winograd where it fits and this processor has it (oneDNN reports "unimplemented"
// otherwise, e.g. without AVX-512), else the direct convolution.
Plan make_plan(const ConvGeometry& g, ConvPass direction, int epilogue) {
  if (winograd_fits(g, direction)) {
    try {
      return make_plan_with(g, direction, dnnl::algorithm::convolution_winograd, epilogue);
    } catch (const dnnl::error& e) {
      if (e.status != dnnl_unimplemented) throw;
    }
  }
  return make_plan_with(g, direction, dnnl::algorithm::convolution_direct, epilogue);
}

auto geometry_key(const ConvGeometry& g, ConvPass direction, int epilogue) {
  return std::make_tuple(g.batch, g.in_channels, g.height, g.width, g.out_channels, g.kernel_h,
                         g.kernel_w, g.stride, g.padding, static_cast<int>(direction), epilogue);
}

const Plan& make_cached_plan(const ConvGeometry& g, ConvPass direction, int epilogue);

// A forward plan with its epilogue where oneDNN runs it in the kernel and layouts the plain
// convolution runs in (one that takes no post-op, or a slower kernel chosen for it, would cost more
// than the pass over the output it saves); else the plain plan (epilogue 0: execute applies it).
Plan plan_with_epilogue(const ConvGeometry& g, int epilogue) {
  const Plan& plain = make_cached_plan(g, ConvPass::forward, 0);
  if (epilogue & kKilnEpilogue) return plain;
  try {
    Plan fused = make_plan(g, ConvPass::forward, epilogue);
    bool same =
        fused.implementation == plain.implementation && fused.output.chosen == plain.output.chosen;
    for (std::size_t i = 0; i < 2; ++i)
      same = same && fused.inputs[i].chosen == plain.inputs[i].chosen;
    if (same) return fused;  // and so the same layouts (conv2d_blocked's bits hold for both)
  } catch (const dnnl::error& e) {
    if (e.status != dnnl_unimplemented) throw;
  }
  return plain;
}

// Plans are made once per geometry (making one JIT-compiles its code) and shared by every
// program of the process; a primitive may run on several threads at once.
const Plan& make_cached_plan(const ConvGeometry& g, ConvPass direction, int epilogue) {
  static std::recursive_mutex mutex;  // a fused plan looks up the plain one
  static std::map<decltype(geometry_key(g, direction, epilogue)), Plan> cache;
  const std::lock_guard<std::recursive_mutex> lock(mutex);
  auto key = geometry_key(g, direction, epilogue);
  auto it = cache.find(key);
  if (it == cache.end())
    it = cache
             .emplace(key,
                      epilogue != 0 ? plan_with_epilogue(g, epilogue) : make_plan(g, direction, 0))
             .first;
  return it->second;
}

thread_local bool post_ops_allowed = true;  // DnnlWithoutPostOps

const Plan& cached_plan(const ConvGeometry& g, ConvPass direction, int epilogue = 0) {
  if (direction != ConvPass::forward) epilogue = 0;
  if (epilogue != 0 && !post_ops_allowed) epilogue |= kKilnEpilogue;
  return make_cached_plan(g, direction, epilogue);
}

// This thread's buffers in the primitives' layouts, one per argument (kept between calls, so
// a step allocates nothing once warm), and the last pass's dy in its primitive's layout,
// kept for the layer's other gradient pass (conv_cpu.h, begin_cpu_kernel). They are
// Storage's 64-byte aligned memory: oneDNN's JIT kernels may store with aligned (and
// non-temporal) vector instructions, as Winograd's do, which fault on std::vector's 16 bytes.
struct Scratch {
  std::shared_ptr<Storage> slots[3];
  std::shared_ptr<Storage> kept;
  const void* kept_from = nullptr;  // the plain tensor it was reordered from
  // That tensor's storage, held so that no new buffer (a widened bf16 input's) takes its
  // address while the copy is kept.
  std::shared_ptr<Storage> kept_storage;
  memory::desc kept_desc;
  std::uint64_t kept_serial = 0;  // cpu_kernel_serial() of the pass that made it
};
thread_local Scratch scratch;

// The memory an argument runs in: the tensor itself, or this thread's buffer for `slot`.
memory working_memory(const Argument& a, const Tensor& t, std::size_t slot) {
  if (!a.reorder) return memory(a.plain, cpu_engine(), const_cast<void*>(t.raw()));
  std::shared_ptr<Storage>& buffer = scratch.slots[slot];
  if (!buffer || buffer->bytes() < a.chosen.get_size())
    buffer = Storage::allocate_cpu(a.chosen.get_size());
  return memory(a.chosen, cpu_engine(), buffer->data());
}

// A reorder of at most 256 KiB (a layer's weights) runs on the calling thread alone: copying
// it takes about as long as waking a sleeping team, which oneDNN would do for any size.
void run_reorder(const dnnl::reorder& reorder, dnnl::stream& stream, memory& from, memory& to) {
  constexpr std::size_t kAloneBytes = std::size_t{256} << 10;
  const bool alone = from.get_desc().get_size() <= kAloneBytes;
  const int threads = omp_get_max_threads();
  if (alone) omp_set_num_threads(1);
  reorder.execute(stream, from, to);
  if (alone) omp_set_num_threads(threads);
}

// Whether `a` runs in aBcd16b after a reorder from (or, for the output, to) kiln's NCHW.
bool blocked16(const Argument& a) {
  return a.reorder &&
         a.chosen == memory::desc(a.plain.dims(), memory::data_type::f32, Tag::aBcd16b);
}

// The epilogue by kiln over the output the primitive stored, where the plan could not take it:
// NCHW planes, or blocked [B, C/16, H, W, 16] (lane l of block cb is channel 16 cb + l).
void apply_epilogue(const ConvGeometry& g, const Tensor& out, bool blocked, const ConvEpilogue& e) {
  const std::int64_t plane = g.out_h * g.out_w;
  float* y = static_cast<float*>(out.raw());
  const bool parallel = g.batch * g.out_channels * plane > 16384;  // else one thread is quicker
  if (!blocked) {
#pragma omp parallel for schedule(static) if (parallel)
    for (std::int64_t i = 0; i < g.batch * g.out_channels; ++i)
      apply_conv_epilogue(y + i * plane, plane, e, i % g.out_channels);
    return;
  }
  const std::int64_t blocks = (g.out_channels + 15) / 16;
  const float* bias = e.bias != nullptr ? e.bias->data<float>() : nullptr;
#pragma omp parallel for schedule(static) if (parallel)
  for (std::int64_t i = 0; i < g.batch * blocks; ++i) {
    float lanes[16] = {};
    const std::int64_t cb = i % blocks;
    for (std::int64_t l = 0; l < 16 && bias != nullptr; ++l)
      lanes[l] = cb * 16 + l < g.out_channels ? bias[cb * 16 + l] : 0.0f;
    float* block = y + i * plane * 16;
    for (std::int64_t p = 0; p < plane; ++p)
#pragma omp simd
      for (std::int64_t l = 0; l < 16; ++l) {
        const float v = bias != nullptr ? block[p * 16 + l] + lanes[l] : block[p * 16 + l];
        block[p * 16 + l] = e.relu ? (v > 0.0f ? v : 0.0f) : v;
      }
  }
}

void execute(const ConvGeometry& g, ConvPass direction, const Tensor& in0, const Tensor& in1,
             const Tensor& out, std::uint32_t blocked, const ConvEpilogue& epilogue = {}) {
  const Plan& plan = cached_plan(g, direction, epilogue_bits(epilogue));
  dnnl::stream stream(cpu_engine());
  std::unordered_map<int, memory> args;
  const Tensor* inputs[] = {&in0, &in1};
  const std::uint64_t serial = cpu_kernel_serial();
  bool reused[2] = {false, false};
  for (std::size_t i = 0; i < 2; ++i) {
    const Argument& a = plan.inputs[i];
    if (blocked & (1u << i)) {  // already in the primitive's layout: read in place
      KILN_ASSERT(blocked16(a), "conv2d: argument {} given blocked, not the pass's layout", i);
      reused[i] = true;  // nothing to keep
      args.emplace(a.id, memory(a.chosen, cpu_engine(), const_cast<void*>(inputs[i]->raw())));
      continue;
    }
    reused[i] = a.reorder && a.id == DNNL_ARG_DIFF_DST && scratch.kept_from == inputs[i]->raw() &&
                scratch.kept_serial + 1 == serial && scratch.kept_desc == a.chosen;
    if (reused[i]) {
      args.emplace(a.id, memory(a.chosen, cpu_engine(), scratch.kept->data()));
      continue;
    }
    memory working = working_memory(a, *inputs[i], i);
    if (a.reorder) {
      memory plain(a.plain, cpu_engine(), const_cast<void*>(inputs[i]->raw()));
      run_reorder(*a.reorder, stream, plain, working);
    }
    args.emplace(a.id, working);
  }
  const bool blocked_out = (blocked & (1u << kBlockedOutputs)) != 0;
  KILN_ASSERT(!blocked_out || blocked16(plan.output),
              "conv2d: output given blocked, not the pass's layout");
  memory result = blocked_out ? memory(plan.output.chosen, cpu_engine(), out.raw())
                              : working_memory(plan.output, out, 2);
  args.emplace(plan.output.id, result);
  if (plan.epilogue & kWithBias) {  // the first post-op's second operand, or the bias argument
    const memory bias(plan.bias_argument ? bias_argument_desc(g) : bias_desc(g), cpu_engine(),
                      const_cast<void*>(epilogue.bias->raw()));
    args.emplace(
        plan.bias_argument ? DNNL_ARG_BIAS : DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1,
        bias);
  }
  plan.convolution.execute(stream, args);
  if (plan.output.reorder && !blocked_out) {
    memory plain(plan.output.plain, cpu_engine(), out.raw());
    run_reorder(*plan.output.reorder, stream, result, plain);
  }
  stream.wait();
  if (plan.epilogue != epilogue_bits(epilogue)) apply_epilogue(g, out, blocked_out, epilogue);
  // A reordered dy is kept (its buffer swapped out of its slot) for the pass right after.
  scratch.kept_from = nullptr;
  scratch.kept_storage.reset();
  for (std::size_t i = 0; i < 2; ++i) {
    const Argument& a = plan.inputs[i];
    if (a.id != DNNL_ARG_DIFF_DST || !a.reorder || reused[i]) continue;
    std::swap(scratch.kept, scratch.slots[i]);
    scratch.kept_from = inputs[i]->raw();
    scratch.kept_storage = inputs[i]->storage();
    scratch.kept_desc = a.chosen;
    scratch.kept_serial = serial;
  }
}

}  // namespace

DnnlWithoutPostOps::DnnlWithoutPostOps() : previous_(post_ops_allowed) { post_ops_allowed = false; }
DnnlWithoutPostOps::~DnnlWithoutPostOps() { post_ops_allowed = previous_; }

std::string dnnl_conv2d_implementation(const ConvGeometry& g, ConvPass pass,
                                       const ConvEpilogue& epilogue) {
  const Plan& plan = cached_plan(g, pass, epilogue_bits(epilogue));
  if (pass != ConvPass::forward || epilogue.empty()) return plan.implementation;
  return plan.implementation + (plan.epilogue != 0 ? " with its epilogue" : " + kiln's epilogue");
}

std::uint32_t dnnl_conv2d_blocked(const ConvGeometry& g, ConvPass pass) {
  const Plan& plan = cached_plan(g, pass);
  // The activations: the image and the result, or for the weight gradient x and dy.
  std::uint32_t bits = 0;
  for (std::size_t i = 0; i < 2; ++i) {
    const bool activation = plan.inputs[i].id != DNNL_ARG_WEIGHTS;
    if (activation && blocked16(plan.inputs[i])) bits |= 1u << i;
  }
  if (pass != ConvPass::grad_weight && blocked16(plan.output)) bits |= 1u << kBlockedOutputs;
  return bits;
}

void dnnl_conv2d_forward(const Tensor& x, const Tensor& w, Tensor& y, const ConvGeometry& g,
                         std::uint32_t blocked, const ConvEpilogue& epilogue) {
  execute(g, ConvPass::forward, x, w, y, blocked, epilogue);
}

void dnnl_conv2d_backward_input(const Tensor& dy, const Tensor& w, Tensor& dx,
                                const ConvGeometry& g, std::uint32_t blocked) {
  execute(g, ConvPass::grad_input, dy, w, dx, blocked);
}

void dnnl_conv2d_backward_weight(const Tensor& x, const Tensor& dy, Tensor& dw,
                                 const ConvGeometry& g, std::uint32_t blocked) {
  execute(g, ConvPass::grad_weight, x, dy, dw, blocked);
}

}  // namespace kiln::kernels
