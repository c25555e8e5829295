// The CUDA op entries of conv2d, conv2d_bias, conv2d_grad_input and conv2d_grad_weight
// (conv.h): each pass's geometry from the node, its launch, its kernels and its workspace; and
// conv_filter_layout's, the channels-last passes' copy of a filter as a node of its own.
#include <fmt/format.h>

#include <tuple>
#include <utility>

#include "backends/cuda/conv.h"
#include "backends/cuda/conv_mma.h"
#include "backends/cuda/conv_passes.h"
#include "backends/cuda/conv_tma.h"
#include "backends/cuda/conv_tuning.h"
#include "backends/cuda/kernel_registry.h"
#include "backends/cuda/kernel_sources.h"
#include "backends/cuda/layout.h"
#include "backends/cuda/op_entry.h"
#include "core/env_switch.h"
#include "graph/ops.h"

namespace kiln::cuda {
namespace {

// The convolution a node of `pass` computes a pass of: x is the input (forward, grad_weight)
// or the output (grad_input), as [B, C, H, W] (a channels-last image, graph/ops.h, is stored
// [B, H, W, C]); w the second input (as [Cout, Cin, KH, KW] where it is laid out) or, in
// grad_weight, the output.
kernels::ConvGeometry geometry_of(ConvPass pass, const Node& node, const InputTypes& in) {
  Shape x = pass == ConvPass::grad_input ? node.outputs[0].shape : in[0].shape;
  if (conv_image_channels_last(node.attrs)) x = Shape{x[0], x[3], x[1], x[2]};
  const Shape w = pass == ConvPass::grad_weight ? node.outputs[0].shape
                                                : conv_filter_shape(node.attrs, in[1].shape);
  return kernels::conv_geometry(x, w, node.attrs.integer("stride"), node.attrs.integer("padding"));
}

// A node whose output side (or grad_input's dx) is marked channels-last (graph/ops.h) on a pass
// that does not take it so (conv_node_channels_last_sides) is refused, not run on misread memory.
void check_channels_last_sides(ConvPass pass, const Node& node, const kernels::ConvGeometry& g,
                               DType dtype) {
  const bool y = conv_y_channels_last(node.attrs);
  const bool dx = pass == ConvPass::grad_input && conv_image_channels_last(node.attrs);
  const bool y_taken = pass == ConvPass::forward      ? conv_writes_channels_last(g, dtype, pass)
                       : pass == ConvPass::grad_input ? conv_runs_channels_last(g, dtype, pass)
                                                      : conv_grad_weight_reads_nhwc_dy(g, dtype);
  KILN_CHECK((!y || y_taken) && (!dx || conv_writes_channels_last(g, dtype, pass)),
             "{}: its pass ({} -> {} channels, {}x{}, {}) does not take {} stored channels-last",
             node.op->name, g.in_channels, g.out_channels, g.height, g.width, dtype_name(dtype),
             y && !y_taken ? (pass == ConvPass::forward ? "y" : "dy") : "dx");
}

// The layout of a pass's filter copy: the filters as rows (the forward) or the input channels.
FilterLayout copied_layout(ConvPass pass) {
  return pass == ConvPass::forward ? FilterLayout::filters_major : FilterLayout::channels_major;
}

// Whether a node reads its filter laid out (graph/ops.h); refused where its pass does not copy
// its filter into that layout and order itself (conv_copied_filter_taps), not run on misread
// memory.
bool filter_laid_out(ConvPass pass, const Node& node, const kernels::ConvGeometry& g, DType dtype) {
  const FilterLayout layout = conv_filter_layout_of(node.attrs);
  if (layout == FilterLayout::nchw) return false;
  const std::optional<std::vector<std::int64_t>> taps = conv_copied_filter_taps(g, dtype, pass);
  KILN_CHECK(taps && *taps == node.attrs.integers("w_taps") && layout == copied_layout(pass),
             "{}: its pass ({} -> {} channels, {}x{}, {}) does not read the filter in the layout "
             "and order the node gives it",
             node.op->name, g.in_channels, g.out_channels, g.height, g.width, dtype_name(dtype));
  return true;
}

// How a node's image reaches its pass: as stored, channels-last where the pass reads it so, or
// (a channels-last image on a pass that reads NCHW) transposed back into the front of the
// workspace first.
struct ImageRoute {
  bool channels_last = false;     // the pass reads x as stored, [B, H, W, C]
  std::size_t reorder_bytes = 0;  // else the workspace bytes of x's NCHW copy
};

ImageRoute image_route(ConvPass pass, const Node& node, const kernels::ConvGeometry& g,
                       DType dtype) {
  // grad_input's first operand is dy: read as stored (check_channels_last_sides).
  if (pass == ConvPass::grad_input) return {.channels_last = conv_y_channels_last(node.attrs)};
  if (!conv_image_channels_last(node.attrs)) return {};
  if (conv_reads_channels_last(g, dtype, pass)) return {.channels_last = true};
  const std::size_t bytes =
      static_cast<std::size_t>(g.batch * g.in_channels * g.height * g.width) * dtype_size(dtype);
  return {.reorder_bytes = (bytes + 255) / 256 * 256};
}

// Which of a pass's activations it reads or writes stored channels-last: its first operand a
// (x; grad_input's dy), its second b (grad_weight's dy), its output (y; grad_input's dx).
struct ChannelsLastOperands {
  bool a = false, b = false, out = false;
};

void launch_pass(ConvPass pass, DType dtype, const kernels::ConvGeometry& g, const void* a,
                 const void* b, void* out, ConvWorkspace ws, gpu::Stream stream,
                 ChannelsLastOperands last, float* moments, bool laid_out, ConvBias bias) {
  switch (pass) {
    case ConvPass::forward:  // x, w -> y
      return conv2d_forward(dtype, g, a, b, out, ws, stream, last.a, moments, last.out, laid_out,
                            bias);
    case ConvPass::grad_input:  // dy, w -> dx
      return conv2d_grad_input(dtype, g, a, b, out, ws, stream, last.a, last.out, laid_out);
    case ConvPass::grad_weight:  // x, dy -> dw
      return conv2d_grad_weight(dtype, g, a, b, out, ws, stream, last.a, last.b);
  }
}

// Whether conv2d_bias's epilogue is left to a kernel of its own after the pass (where the pass
// does not apply it: conv_forward_applies_bias).
bool bias_after_pass(bool bias, const kernels::ConvGeometry& g, DType dtype) {
  return bias && !conv_forward_applies_bias(g, dtype);
}

// One pass's entry; with `moments` (conv2d_moments, the forward), y's run moments into the
// node's second output: from the epilogue where the TMA pass runs (conv_forward_writes_moments,
// the conv-statistics pass's choice), else by the moments kernel after the forward. With `bias`
// (conv2d_bias, the forward): y + bias (its third input), then ReLU where its attribute says,
// applied by the pass as it stores y where it can (conv_forward_applies_bias: the CUDA cores'
// f32 passes), else by kernels/conv.cuh's epilogue over the stored y.
CudaOpEntry conv_entry(ConvPass pass, bool moments = false, bool bias = false) {
  CudaOpEntry e;
  e.prepare = [pass, moments, bias](const LaunchSetup& s) -> Launch {
    const kernels::ConvGeometry g = geometry_of(pass, s.node, s.input_types);
    const DType dtype = s.input_types[0].dtype;
    check_channels_last_sides(pass, s.node, g, dtype);
    const bool laid_out = filter_laid_out(pass, s.node, g, dtype);
    const ImageRoute route = image_route(pass, s.node, g, dtype);
    const bool y_last = conv_y_channels_last(s.node.attrs);
    const ChannelsLastOperands last{
        .a = route.channels_last,
        .b = pass == ConvPass::grad_weight && y_last,
        .out = pass == ConvPass::forward
                   ? y_last
                   : pass == ConvPass::grad_input && conv_image_channels_last(s.node.attrs)};
    auto* front = static_cast<std::uint8_t*>(s.workspace);
    const ConvWorkspace ws{front + route.reorder_bytes, s.workspace_bytes - route.reorder_bytes};
    const void *a = s.inputs[0], *b = s.inputs[1];
    void* out = s.outputs[0];
    const Shape stored = s.input_types[0].shape;
    const bool epilogue = moments && conv_forward_writes_moments(g, dtype);
    float* runs = moments ? static_cast<float*>(s.outputs[1]) : nullptr;
    const DeviceKernel* after = nullptr;
    if (moments && !epilogue) {
      const gpu::KernelSource source = conv_moments_source(dtype);
      after = &device_kernel(source.name, [&] { return source; });
    }
    const bool relu = bias && s.node.attrs.integer("relu") != 0;
    const void* bias_values = bias ? s.inputs[2] : nullptr;
    const bool bias_after = bias_after_pass(bias, g, dtype);
    const ConvBias in_pass = bias && !bias_after ? ConvBias{bias_values, relu} : ConvBias{};
    const DeviceKernel* bias_kernel =
        bias_after ? &device_kernel(fmt::format("kiln_conv_bias_{}", dtype_name(dtype)),
                                    [&] { return conv_bias_source(dtype); })
                   : nullptr;
    const Shape& y = s.node.outputs[0].shape;
    return [=](gpu::Stream st) {
      const void* x = a;
      if (route.reorder_bytes > 0) {  // [B, H, W, C] -> [B, C, H, W]
        transpose(dtype, stored, kChannelsFirst, a, front, st);
        x = front;
      }
      launch_pass(pass, dtype, g, x, b, out, ws, st, last, epilogue ? runs : nullptr, laid_out,
                  in_pass);
      if (bias_kernel != nullptr) {
        void* y_ptr = out;
        const void* bias_ptr = bias_values;
        long long plane = y[2] * y[3], channels = y[1], n = y.numel();
        int relu_v = relu ? 1 : 0;
        void* args[] = {&y_ptr, &bias_ptr, &plane, &channels, &n, &relu_v};
        launch_items(*bias_kernel, n, st, args);
      }
      if (after == nullptr) return;
      const void* y_ptr = out;
      float* runs_ptr = runs;
      long long plane = y[2] * y[3], channels = y[1], pixels = y[0] * plane;
      long long count = (pixels + 63) / 64;
      void* args[] = {&y_ptr, &runs_ptr, &plane, &channels, &pixels, &count};
      launch_items(*after, channels * count, st, args);
    };
  };
  e.sources = [pass, moments, bias](const Node& n, const InputTypes& in) {
    const kernels::ConvGeometry g = geometry_of(pass, n, in);
    // conv2d_moments: the epilogue's TMA kernel in place of the plain one, or the moments kernel.
    const bool epilogue = moments && conv_forward_writes_moments(g, in[0].dtype);
    std::vector<gpu::KernelSource> sources =
        conv_kernel_sources(g, in[0].dtype, pass, epilogue,
                            pass == ConvPass::grad_weight && conv_y_channels_last(n.attrs));
    if (moments && !epilogue) sources.push_back(conv_moments_source(in[0].dtype));
    if (bias_after_pass(bias, g, in[0].dtype)) sources.push_back(conv_bias_source(in[0].dtype));
    if (image_route(pass, n, g, in[0].dtype).reorder_bytes > 0) {  // layout.h's transpose
      sources.push_back(transpose_source(dtype_size(in[0].dtype)));
      sources.push_back(nhwc_image_source(dtype_size(in[0].dtype)));
    }
    return sources;
  };
  e.workspace_bytes = [pass](const Node& n, const InputTypes& in) {
    const kernels::ConvGeometry g = geometry_of(pass, n, in);
    const ImageRoute route = image_route(pass, n, g, in[0].dtype);
    return conv_workspace_bytes(g, in[0].dtype, pass, 0, route.channels_last,
                                conv_filter_layout_of(n.attrs) != FilterLayout::nchw) +
           route.reorder_bytes;
  };
  return e;
}

// conv_filter_layout (graph/ops.h): the channels-last passes' copies of filters of one size, as
// a node (one launch a kMaxFilterCopies filters).
CudaOpEntry filter_layout_entry() {
  CudaOpEntry e;
  e.prepare = [](const LaunchSetup& s) -> Launch {
    const Shape& first = s.input_types[0].shape;
    const DType dtype = s.input_types[0].dtype;
    const bool channels_major =
        static_cast<FilterLayout>(s.node.attrs.integer("layout")) == FilterLayout::channels_major;
    const std::vector<std::int64_t> taps = s.node.attrs.integers("taps");
    std::vector<FilterLayoutJob> jobs;
    for (std::size_t i = 0; i < s.inputs.size(); ++i)
      jobs.push_back(
          {s.inputs[i], s.outputs[i], s.input_types[i].shape[0], s.input_types[i].shape[1]});
    return [=](gpu::Stream st) {
      nhwc_weights(dtype, jobs, first[2] * first[3], channels_major, taps, st);
    };
  };
  e.sources = [](const Node& n, const InputTypes& in) {
    const bool channels_major =
        static_cast<FilterLayout>(n.attrs.integer("layout")) == FilterLayout::channels_major;
    return std::vector<gpu::KernelSource>{
        nhwc_weights_source(channels_major, dtype_size(in[0].dtype))};
  };
  return e;
}

// Every tile the choice can return for each pass and floating dtype (bf16/f16 grad_weight
// also with f32 partials), the split-K sum, the im2col fallback's kernels, and fill
// (grad_weight zeroes dW where the batch is empty).
std::vector<gpu::KernelSource> every_conv_source() {
  std::vector<gpu::KernelSource> all;
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    all.push_back(im2col_source(t));
    all.push_back(col2im_source(t));
    for (IgemmMode mode : {IgemmMode::forward, IgemmMode::grad_input, IgemmMode::grad_weight,
                           IgemmMode::grad_input_classes})
      for (IgemmTile tile : igemm_tiles(mode, t)) {
        all.push_back(conv_igemm_source(mode, tile, t));
        if (mode == IgemmMode::grad_weight && is_low_precision(t))  // f32 split-K partials
          all.push_back(conv_igemm_source(mode, tile, t, true));
      }
    all.push_back(conv_splitk_sum_source(t));
    if (is_low_precision(t) || t == DType::f32)  // the tensor-core passes (f32: TF32)
      for (int bm : {64, 128})
        for (bool vec : {false, true}) {
          if (is_low_precision(t))  // (f32's forward and grad_input: channels-last only)
            for (ConvMmaKind kind :
                 {ConvMmaKind::forward, ConvMmaKind::grad_input, ConvMmaKind::grad_input_stride2})
              all.push_back(conv_mma_source(t, bm, vec, kind));
          for (bool f32_partials : {false, true})
            for (bool runs : {false, true})
              for (WgradTile tile : kWgradCandidates)  // every tile the tuner may choose (it
                // tunes only passes whose dy arrives by cp.async: vec); f32's partials are f32
                if (tile.bm == bm && (vec || tile == conv_mma_wgrad_default_tile(bm)) &&
                    (!f32_partials || t != DType::f32))
                  all.push_back(conv_mma_wgrad_source(t, tile, vec, f32_partials, runs));
        }
    if (is_low_precision(t) || t == DType::f32) {  // every tile the tuner may choose (f32: TF32)
      for (NhwcTile tile : kNhwcCandidates)        // the channels-last passes
        for (bool dilated : {false, true}) all.push_back(conv_nhwc_source(t, tile, dilated));
      for (NhwcTile tile : kWgmmaCandidates)  // the same on wgmma (sm_90)
        for (bool dilated : {false, true}) all.push_back(conv_nhwc_source(t, tile, dilated));
      for (WgradTile tile : kWgmmaWgradCandidates)  // grad_weight on wgmma
        for (bool vec : {false, true})
          for (bool f32_partials : {false, true})
            for (bool runs : {false, true})
              if (!f32_partials || t != DType::f32)  // (f32's partials are f32 anyway)
                all.push_back(conv_mma_wgrad_source(t, tile, vec, f32_partials, runs));
    }
    if (is_low_precision(t) || t == DType::f32) {
      for (int bm : {64, 128})  // the TMA pass's tiles (conv_tma.h)
        for (int bn : {128, 256})
          for (int teams : {1, 2})    // two teams: the 64-filter tiles only (conv_tma_tile)
            for (int split : {1, 2})  // split K: the 128-filter tiles only
              if ((teams == 1 || bm == 64) && (split == 1 || (bm == 128 && teams == 1)))
                for (int kind : {0, 1, 2}) {  // plain, conv2d_moments' epilogue, 4 classes
                  if ((kind == 2 && split == 2) || (kind > 0 && t == DType::f32))
                    continue;  // classes keep K whole; TF32: the plain pass only
                  all.push_back(conv_tma_source(t, conv_tma_tile_of(bm, bn, teams, split),
                                                kind == 1, kind == 2 ? 4 : 1));
                }
    }
    if (is_low_precision(t)) {
      TmaTile halo = conv_tma_tile_of(64, 128, 2);  // the halo form (its source is one for
      halo.halo_bytes = 227 * 1024;                 // every size of its shared memory)
      all.push_back(conv_tma_source(t, halo));
      for (auto [bm, atoms, ar] : {std::tuple{64, 3, 64}, std::tuple{128, 3, 64},
                                   std::tuple{128, 4, 16}, std::tuple{64, 1, 32}})
        for (bool wide : {false, true})       // grad_weight's TMA pass, dy NCHW or (its
          for (bool dy_nhwc : {false, true})  // channels-last values) NHWC
            all.push_back(
                conv_tma_wgrad_source(t, conv_tma_wgrad_tile_of(bm, atoms, ar, wide), dy_nhwc));
      all.push_back(conv_tma_wgrad_sum_source(t));
    }
    if (t == DType::f32) {  // grad_weight's TMA pass under TF32: B's rows of 32, 16, 8 pixels
      all.push_back(tap_expand_source());  // of a row (A's of 32), or whole images of 16 or 8
      for (auto [bm, atoms, br, ar] :
           {std::tuple{64, 3, 32, 32}, std::tuple{128, 3, 16, 32}, std::tuple{128, 4, 8, 32},
            std::tuple{128, 4, 16, 16}, std::tuple{64, 3, 8, 8}})
        for (bool wide : {false, true}) {
          TmaWgradPlan plan = conv_tma_wgrad_tile_of(bm, atoms, ar, wide);
          plan.br = br;
          all.push_back(conv_tma_wgrad_source(t, plan));
        }
      all.push_back(conv_tma_wgrad_sum_source(t));
    }
  }
  for (gpu::KernelSource& source : conv_detail::conv_direct_sample_sources())
    all.push_back(std::move(source));
  for (std::size_t bytes : {2, 4}) {
    all.push_back(nhwc_image_source(bytes));
    for (bool flip : {false, true}) all.push_back(nhwc_weights_source(flip, bytes));
  }
  for (DType t :
       {DType::f32, DType::f64, DType::i32, DType::i64, DType::u8, DType::bf16, DType::f16})
    all.push_back(fill_source(t));
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16})
    all.push_back(conv_bias_source(t));
  for (DType t : {DType::f32, DType::bf16, DType::f16}) all.push_back(conv_moments_source(t));
  return all;
}

}  // namespace

bool conv_node_writes_moments(const Node& conv, std::span<const TensorType> inputs) {
  const DType dtype = inputs[0].dtype;
  if (!is_low_precision(dtype)) return false;
  const InputTypes in(inputs.begin(), inputs.end());
  return conv_forward_writes_moments(geometry_of(ConvPass::forward, conv, in), dtype);
}

bool conv_node_applies_bias(const Node& conv, std::span<const TensorType> inputs) {
  const DType dtype = inputs[0].dtype;
  if (conv.op->id != OpId::conv2d || dtype != DType::f32 || conv_image_channels_last(conv.attrs) ||
      conv_filter_layout_of(conv.attrs) != FilterLayout::nchw)
    return false;
  const InputTypes in(inputs.begin(), inputs.end());
  return conv_forward_applies_bias(geometry_of(ConvPass::forward, conv, in), dtype);
}

std::optional<FilterOrder> conv_node_filter_order(const Node& conv,
                                                  std::span<const TensorType> inputs) {
  const DType dtype = inputs[0].dtype;
  if (!is_low_precision(dtype) || !env_switch_on("KILN_FILTER_LAYOUTS")) return std::nullopt;
  const ConvPass pass = conv.op->id == OpId::conv2d ? ConvPass::forward : ConvPass::grad_input;
  const InputTypes in(inputs.begin(), inputs.end());
  std::optional<std::vector<std::int64_t>> taps =
      conv_copied_filter_taps(geometry_of(pass, conv, in), dtype, pass);
  if (!taps) return std::nullopt;
  return FilterOrder{copied_layout(pass), std::move(*taps)};
}

bool conv_node_reads_channels_last(const Node& conv, std::span<const TensorType> inputs) {
  const DType dtype = inputs[0].dtype;
  if (!is_low_precision(dtype)) return false;
  const ConvPass pass =
      conv.op->id == OpId::conv2d_grad_weight ? ConvPass::grad_weight : ConvPass::forward;
  const InputTypes in(inputs.begin(), inputs.end());
  return conv_reads_channels_last(geometry_of(pass, conv, in), dtype, pass);
}

bool conv_node_reads_nhwc_dy(const Node& conv, std::span<const TensorType> inputs) {
  const DType dtype = inputs[0].dtype;
  if (!is_low_precision(dtype)) return false;
  const InputTypes in(inputs.begin(), inputs.end());
  if (conv.op->id == OpId::conv2d_grad_input)
    return conv_runs_channels_last(geometry_of(ConvPass::grad_input, conv, in), dtype,
                                   ConvPass::grad_input);
  return conv.op->id == OpId::conv2d_grad_weight && env_switch_on("KILN_WGRAD_NHWC_DY") &&
         conv_grad_weight_reads_nhwc_dy(geometry_of(ConvPass::grad_weight, conv, in), dtype);
}

ChannelsLastSides conv_node_channels_last_sides(const Node& conv,
                                                std::span<const TensorType> inputs) {
  const DType dtype = inputs[0].dtype;
  const ChannelsLastValues mode = channels_last_values_mode();
  if (mode == ChannelsLastValues::off || !is_low_precision(dtype)) return {};
  const ConvPass pass = conv.op->id == OpId::conv2d_grad_weight  ? ConvPass::grad_weight
                        : conv.op->id == OpId::conv2d_grad_input ? ConvPass::grad_input
                                                                 : ConvPass::forward;
  const InputTypes in(inputs.begin(), inputs.end());
  const kernels::ConvGeometry g = geometry_of(pass, conv, in);
  if (mode == ChannelsLastValues::projected) {  // every pass on the channels-last tensor cores
    const bool runs = conv_runs_channels_last(g, dtype, pass);
    const bool grad_input = pass == ConvPass::grad_input;
    return {.y = runs, .image = runs && grad_input, .copies_nchw_dy = runs && grad_input};
  }
  if (pass == ConvPass::grad_weight) return {.y = conv_grad_weight_reads_nhwc_dy(g, dtype)};
  if (pass == ConvPass::forward) return {.y = conv_writes_channels_last(g, dtype, pass)};
  const bool tensor_cores = conv_runs_channels_last(g, dtype, pass);
  return {.y = tensor_cores,
          .image = conv_writes_channels_last(g, dtype, pass),
          .copies_nchw_dy = tensor_cores};
}

void add_conv_ops(CudaOpTable& table) {
  table[OpId::conv2d] = conv_entry(ConvPass::forward);
  table[OpId::conv2d].every_source = every_conv_source;
  table[OpId::conv2d_bias] = conv_entry(ConvPass::forward, false, true);
  table[OpId::conv2d_grad_input] = conv_entry(ConvPass::grad_input);
  table[OpId::conv2d_grad_weight] = conv_entry(ConvPass::grad_weight);
  table[OpId::conv2d_moments] = conv_entry(ConvPass::forward, true);
  table[OpId::conv_filter_layout] = filter_layout_entry();
}

}  // namespace kiln::cuda
