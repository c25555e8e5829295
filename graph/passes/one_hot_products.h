// rewrite_one_hot_products: products with a one-hot matrix O = one_hot(t) [R, V] as row
// gathers and scatters, reassociated where that skips a product over all R rows. An embedding
// is matmul(O, E) and an LSTM's input projection multiplies it by W [D, N]; with V < R
// (char-lstm: 96 tokens, 4096 rows) the projection is a table of V rows:
//  1. matmul(matmul(O, E), W)           -> gather_rows(matmul(E, W), t)
//     and its bias, add(that, b [N])     -> gather_rows(add(matmul(E, W), b), t)
//  2. matmul(matmul(O, E), dP, trans_a) -> matmul(E, S, trans_a), S = scatter_add_rows(dP, t)
//  3. matmul(O, matmul(dP, W, trans_b), trans_a) -> matmul(S, W, trans_b)
//  4. reduce_sum(dP, axes [0]), where S is made   -> reduce_sum(S, axes [0])
//  5. any other matmul(O, X) -> gather_rows(X, t); with trans_a -> scatter_add_rows(X, t)
// (the weight gradient, the embedding's gradient and the bias gradient of 1 share one S).
// Reshapes that keep the last axis are looked through. Both backends run it (compile.cpp).
// Values are the same up to the order of float sums; an index outside [0, V) is still an
// error that names it. f32 and f64 only.
// Pre: verify(g) holds. Post: verify holds; node order is kept (new nodes are appended where
// the rewritten node was); dead nodes are left to eliminate_dead_code.
#pragma once

#include "graph/graph.h"

namespace kiln {

Graph rewrite_one_hot_products(const Graph& g);

}  // namespace kiln
