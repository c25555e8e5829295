// The identity of every op in the table (DESIGN.md convention 1): code that treats one op
// specially compares `node.op->id == OpId::relu`, which the compiler checks, never the name.
// Adding an op adds its line here and its entry in graph/ops/.
#pragma once

#include <cstdint>

namespace kiln {

// One line per family of ops, in the op table's order: X(identifier); the op's name is the
// identifier.
// clang-format off
#define KILN_OP_IDS(X)                                                                      \
  X(input) X(variable) X(fill) X(tensor_constant) X(fused)                                  \
  X(add) X(sub) X(mul) X(div) X(maximum) X(greater) X(equal) X(select)                      \
  X(neg) X(exp) X(log) X(sqrt)                                                              \
  X(relu) X(tanh) X(gelu) X(broadcast_to) X(detach)                                         \
  X(reduce_sum) X(reduce_max)                                                               \
  X(reshape) X(transpose) X(one_hot) X(slice) X(concat) X(pad)                              \
  X(gather_rows) X(scatter_add_rows)                                                        \
  X(matmul) X(matmul_bias) X(conv2d) X(conv2d_bias) X(conv2d_grad_input)                    \
  X(conv2d_grad_weight) X(conv2d_moments) X(conv_filter_layout)                              \
  X(max_pool2d) X(max_pool2d_grad) X(max_pool2d_select) X(avg_pool2d) X(avg_pool2d_grad)    \
  X(random_uniform) X(all_reduce_mean) X(lstm_sequence) X(lstm_sequence_grad)               \
  X(layer_norm) X(layer_norm_grad) X(cast)
// clang-format on

enum class OpId : std::uint8_t {
#define KILN_OP_ID_ENUM(name) name,
  KILN_OP_IDS(KILN_OP_ID_ENUM)
#undef KILN_OP_ID_ENUM
};

inline constexpr int kOpIdCount = 0
#define KILN_OP_ID_COUNT(name) +1
    KILN_OP_IDS(KILN_OP_ID_COUNT)
#undef KILN_OP_ID_COUNT
    ;

// The op's name ("conv2d_grad_input"), as printed and parsed.
const char* op_id_name(OpId id);

}  // namespace kiln
