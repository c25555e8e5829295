// Internal: each ops file adds its entries to the one table, and shared type rules.
#pragma once

#include <vector>

#include "graph/op.h"

namespace kiln::ops {

void register_source_ops(std::vector<OpDef>& table);
void register_elementwise_ops(std::vector<OpDef>& table);
void register_reduce_ops(std::vector<OpDef>& table);
void register_layout_ops(std::vector<OpDef>& table);
void register_slice_ops(std::vector<OpDef>& table);
void register_gather_ops(std::vector<OpDef>& table);
void register_matmul_ops(std::vector<OpDef>& table);
void register_conv_ops(std::vector<OpDef>& table);
void register_pool_ops(std::vector<OpDef>& table);
void register_random_ops(std::vector<OpDef>& table);
void register_collective_ops(std::vector<OpDef>& table);
void register_recurrent_ops(std::vector<OpDef>& table);
void register_cast_ops(std::vector<OpDef>& table);

// Checks that every input has a floating dtype and the same dtype as input 0.
void check_floating_inputs(const char* op, std::span<const TensorType> inputs);
// Checks an input's rank.
void check_rank(const char* op, const char* what, const TensorType& type, std::size_t rank);

}  // namespace kiln::ops
