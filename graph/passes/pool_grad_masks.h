// apply_masks_before_pool_grads: two rewrites of max pooling's backward, exact in value.
//  1. mul(max_pool2d_grad(y, dy), greater(y, c)) -> max_pool2d_grad(y, dy * greater(p, c)),
//     p = max_pool2d(y) with the same window: the gradient is non-zero only at each window's
//     maximum, where y equals p, so the mask is applied to the pooled gradient (relu's mask
//     after relu -> max_pool: a pass over the small tensor instead of the large one). Where
//     c is 0 (ReLU's mask) the pool gradient applies it as it routes dy: max_pool2d_grad(y, dy)
//     relu=1, no pass over the masked dy at all (on the GPU a launch fewer on the backward's
//     critical path for each ReLU -> max pooling layer; KILN_POOL_GRAD_RELU=0 keeps the mul).
//  2. reduce_sum(max_pool2d_grad(y, g)) over axes that include both spatial axes ->
//     reduce_sum(g) over the same axes: every element of g lands on exactly one element of
//     y (a conv bias gradient behind a pooling layer sums the pooled gradient; behind a relu=1
//     gradient, g * greater(p, 0), a reduction off the critical path).
// Pre: verify(g) holds. Post: verify holds; the graph computes the same values up to the
// order of float sums; rewrite 1 applies only where the pooled forward p is in the graph
// already and the pool gradient has no other reader. Node order is kept (new nodes are
// appended where the rewritten node was); dead nodes are left to eliminate_dead_code.
#pragma once

#include "graph/graph.h"

namespace kiln {

Graph apply_masks_before_pool_grads(const Graph& g);

}  // namespace kiln
