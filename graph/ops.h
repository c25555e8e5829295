// The builder API: one function per op of the table, plus operators on Values.
// Composite ops (sigmoid, log_softmax, cross_entropy, ...) are in graph/nn/functional.h.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "graph/graph.h"

namespace kiln {

// Elementwise, with NumPy broadcasting.
Value add(Value a, Value b);
Value sub(Value a, Value b);
Value mul(Value a, Value b);
Value div(Value a, Value b);
Value maximum(Value a, Value b);
Value greater(Value a, Value b);  // 1 where a > b, else 0 (same dtype as a); no gradient
Value equal(Value a, Value b);    // 1 where a == b, else 0; no gradient
// a where condition is not 0, else b (broadcast); an Inf or NaN in the value not chosen does
// not reach the result. No gradient to the condition.
Value select(Value condition, Value a, Value b);
Value neg(Value x);
Value exp(Value x);
Value log(Value x);
Value sqrt(Value x);
Value relu(Value x);
Value tanh(Value x);
// GELU, tanh approximation: x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as PyTorch's
// gelu(approximate="tanh").
Value gelu(Value x);
Value detach(Value x);  // identity whose gradient is cut
// x converted to `dtype` (a floating one), rounded to nearest even; x itself if already so.
Value cast(Value x, DType dtype);
Value broadcast_to(Value x, const Shape& shape);

Value operator+(Value a, Value b);
Value operator-(Value a, Value b);
Value operator*(Value a, Value b);
Value operator/(Value a, Value b);
Value operator-(Value x);
// A scalar operand becomes a fill constant of the other operand's dtype.
Value operator+(Value a, double b);
Value operator+(double a, Value b);
Value operator-(Value a, double b);
Value operator-(double a, Value b);
Value operator*(Value a, double b);
Value operator*(double a, Value b);
Value operator/(Value a, double b);
Value operator/(double a, Value b);
Value scalar_like(Value like, double value);

// Reductions over `axes` (negative axes count from the end).
Value sum(Value x, const std::vector<std::int64_t>& axes, bool keepdims = false);
Value max(Value x, const std::vector<std::int64_t>& axes, bool keepdims = false);
Value sum_all(Value x);

// Layer normalisation over the last axis, without affine parameters (multiply and add those
// as elementwise ops): y = (x - mean) / sqrt(var + eps), var the biased variance of the row.
Value layer_norm(Value x, double eps = 1e-5);
// The op itself: y, and the row statistics its gradient reads, mean and rstd = 1 /
// sqrt(var + eps), both [..., 1]; and the gradient op, dx from dy, x, mean and rstd.
struct LayerNorm {
  Value y, mean, rstd;
};
LayerNorm layer_norm_with_stats(Value x, double eps);
Value layer_norm_grad(Value dy, Value x, Value mean, Value rstd);

// Layout.
Value reshape(Value x, const std::vector<std::int64_t>& dims);  // one dimension may be -1
Value transpose(Value x, const std::vector<std::int64_t>& perm);
Value one_hot(Value labels, std::int64_t classes,
              DType dtype = DType::f32);  // labels: integer [N] -> [N, classes]
// Rows of table [V, N] picked by integer indices [R] -> [R, N] (matmul(one_hot(indices),
// table) without the one-hot matrix).
Value gather_rows(Value table, Value indices);
// x [R, N] -> [rows, N]: row v is the sum of the rows of x whose index is v
// (matmul(one_hot(indices), x) with trans_a).
Value scatter_add_rows(Value x, Value indices, std::int64_t rows);
// Indices [start, start + length) of `axis`; the whole axis returns x itself.
Value slice(Value x, std::int64_t axis, std::int64_t start, std::int64_t length);
// Values joined along `axis` (all other dimensions equal); one value returns itself.
Value concat(const std::vector<Value>& values, std::int64_t axis);
// x between `before` and `after` zeros along `axis` (slice's adjoint).
Value pad(Value x, std::int64_t axis, std::int64_t before, std::int64_t after);

// Linear algebra: [..., M, K] x [..., K, N] -> [..., M, N]; trans_* transposes the last two axes.
Value matmul(Value a, Value b, bool trans_a = false, bool trans_b = false);

// Convolution and pooling on NCHW tensors.
// x: [B, Cin, H, W], w: [Cout, Cin, KH, KW] -> [B, Cout, OH, OW]. channels_last: the image side
// (x; grad_input's dx) is stored [B, H, W, Cin]; y_channels_last: the output side (y; the
// gradients' dy) is stored [B, OH, OW, Cout] (below: conv_image_channels_last). input_shape is
// x's [B, C, H, W] shape either way.
Value conv2d(Value x, Value w, std::int64_t stride = 1, std::int64_t padding = 0,
             bool channels_last = false, bool y_channels_last = false);
Value conv2d_grad_input(Value dy, Value w, const Shape& input_shape, std::int64_t stride,
                        std::int64_t padding, bool y_channels_last = false,
                        bool channels_last = false);
Value conv2d_grad_weight(Value x, Value dy, const Shape& weight_shape, std::int64_t stride,
                         std::int64_t padding, bool channels_last = false,
                         bool y_channels_last = false);
// conv2d's y with, over each run of kConvMomentRun of its pixels in (image, row, column) order
// (the last run shorter), every output channel's count, mean and sum of squared deviations from
// that mean: {y, moments}, moments f32 [3, T, Cout] (counts, means, squared deviations; T =
// ceil(B OH OW / kConvMomentRun); the channels innermost, so that an epilogue's writes of
// neighbouring filters are contiguous), of y as stored (bf16/f16: rounded). Made after autograd
// for batch norm's statistics (fusion/conv_statistics.h), so no gradient.
inline constexpr std::int64_t kConvMomentRun = 64;
std::pair<Value, Value> conv2d_moments(Value x, Value w, std::int64_t stride, std::int64_t padding,
                                       bool channels_last = false);
// A convolution node's two activations: its image side (x of conv2d, conv2d_moments and
// conv2d_grad_weight; dx, the output, of conv2d_grad_input) and its output side (y of conv2d; dy
// of the two gradients). Either may be stored channels-last, [B, H, W, C]: the attribute
// "channels_last" = 1 says so of the image side, "y_channels_last" = 1 of the output side
// (conv2d, conv2d_grad_input and conv2d_grad_weight only). Shapes are checked and kernels chosen
// on both as [B, C, H, W]. Whether a node's attributes say so, and the marks that say so:
bool conv_image_channels_last(const Attrs& attrs);
void mark_conv_image_channels_last(Attrs& attrs);
bool conv_y_channels_last(const Attrs& attrs);
void mark_conv_y_channels_last(Attrs& attrs);
void unmark_conv_y_channels_last(Attrs& attrs);
// Convolution filters w [Cout, Cin, KH, KW] laid out as the GPU's channels-last tensor-core
// passes read them, by a node of their own (one launch for filters of one size, dtype, layout
// and order; made after autograd by lay_out_filters,
// graph/passes/filter_layouts.h, so that the scheduler can run it off the convolution's
// stream): filters_major [Cout, KH, KW, Cin] (the forward's), out[o][t][c] = w[o][c][taps[t]];
// channels_major [Cin, KH, KW, Cout] (the input gradient's), out[c][t][o] = w[o][c][taps[t]];
// the KH*KW taps (flattened) in the order `taps` gives, a permutation of 0..KH*KW-1 (the input
// gradient's: the filter mirrored, or grouped by classes of dx's pixels). A conv2d or
// conv2d_grad_input node that reads its filter so says so in its attributes ("w_layout",
// "w_taps": conv_filter_layout_of, mark_conv_filter_layout); shapes are checked and kernels
// chosen on the [Cout, Cin, KH, KW] filter either way (conv_filter_shape), and the CPU reads such
// a filter through a copy in that order, so the marks never change a result. No gradient.
enum class FilterLayout { nchw = 0, filters_major = 1, channels_major = 2 };
std::vector<Value> conv_filter_layout(const std::vector<Value>& filters, FilterLayout layout,
                                      const std::vector<std::int64_t>& taps);
FilterLayout conv_filter_layout_of(const Attrs& conv_attrs);
void mark_conv_filter_layout(Attrs& conv_attrs, FilterLayout layout,
                             const std::vector<std::int64_t>& taps);
// The filter's [Cout, Cin, KH, KW] shape from a convolution node's attributes and its stored one.
Shape conv_filter_shape(const Attrs& conv_attrs, const Shape& stored);
// The permutations between NCHW and NHWC (transpose's perm).
inline const std::vector<std::int64_t> kChannelsLast{0, 2, 3, 1}, kChannelsFirst{0, 3, 1, 2};
// Pooling over k x k windows, stride s (0: s = k), padding p (0 <= p <= k / 2):
// x: [B, C, H, W] -> [B, C, (H + 2p - k) / s + 1, (W + 2p - k) / s + 1]. Padded cells never
// win a max and are not counted in an average (count_include_pad=false).
Value max_pool2d(Value x, std::int64_t kernel, std::int64_t stride = 0, std::int64_t padding = 0);
// dy routed to each window's first maximum of x; relu: dy * (max_pool2d(x) > 0) routed (the
// gradient of max pooling behind a ReLU, its mask applied as the gradient is routed).
Value max_pool2d_grad(Value x, Value dy, std::int64_t kernel, std::int64_t stride,
                      std::int64_t padding = 0, bool relu = false);
// Whether a max_pool2d_grad node's attributes ask for ReLU's mask (relu=1; optional).
bool max_pool_grad_relu(const Attrs& attrs);
Value max_pool2d_select(Value x, Value g, std::int64_t kernel, std::int64_t stride,
                        std::int64_t padding = 0);
Value avg_pool2d(Value x, std::int64_t kernel, std::int64_t stride = 0, std::int64_t padding = 0);
Value avg_pool2d_grad(Value dy, const Shape& input_shape, std::int64_t kernel, std::int64_t stride,
                      std::int64_t padding = 0);

// The recurrence of one LSTM direction as one op (docs/lstm_ops.md). projected [T*B, 4H]:
// x W + b of every time step, rows time-major; u [H, 4H]: recurrent weights, gate columns
// [i | f | g | o]; h0, c0 [B, H]. Steps run t = 0 .. T-1, or T-1 .. 0 when `reverse`.
// hs, cs [T*B, H]: h and c after each time, rows in time order whatever the direction;
// acts [T*B, 4H]: the activated gates, saved for the gradient (which must not reach them).
struct LstmSequence {
  Value hs, cs, acts;
};
LstmSequence lstm_sequence(Value projected, Value u, Value h0, Value c0, std::int64_t steps,
                           bool reverse);
// lstm_sequence's backward recurrence: from the gradients at hs and cs (d_hs, d_cs [T*B, H])
// and the saved cs and acts, the gradients of projected, h0 and c0 (u's is one GEMM more).
struct LstmSequenceGrad {
  Value d_projected, dh0, dc0;
};
LstmSequenceGrad lstm_sequence_grad(Value d_hs, Value d_cs, Value u, Value c0, Value cs, Value acts,
                                    std::int64_t steps, bool reverse);

// Random numbers: `shape` uniform values in [0, 1) (24 random bits each) from Philox with
// key `seed`, at the step held in `step` (an i64 scalar, usually a variable); next_step is
// step + 1, for the caller to assign back so that the next run draws fresh values. The
// values are the same bits on the CPU and the GPU (graph/ops/random_ops.cpp).
struct RandomUniform {
  Value values, next_step;
};
RandomUniform random_uniform(Value step, const Shape& shape, std::uint64_t seed,
                             DType dtype = DType::f32);

// Data parallelism: each value replaced by its mean over the ranks of collective group
// `group` (graph/collective.h), as one op, so the ranks' gradients are averaged in one
// group of calls. Group 0 is this process alone (the identity).
std::vector<Value> all_reduce_mean(const std::vector<Value>& values, int group);

}  // namespace kiln
