// How autograd adds up the gradient terms of a value with several consumers. Two sums
// have a cheaper form than a chain of full-size additions, both common in a recurrent
// network unrolled over time.
#pragma once

#include <vector>

#include "graph/graph.h"

namespace kiln {

// The sum of `terms` (equal shapes, at least one), as graph ops:
// - zero-padded slices of one axis (slice gradients, e.g. an LSTM's four gates) whose
//   ranges do not overlap: one concat of the unpadded pieces (zeros in the gaps), or an
//   existing concat of the same pieces (an LSTM step's gate gradients, for the projection's
//   rows and for the recurrent GEMM);
// - products matmul(A_t, B_t) with the same transposes (the per-step gradients of a
//   weight shared across time steps): one matmul of A_t and B_t concatenated along the
//   contraction axis, when copying them costs less than the extra outputs it saves
//   (where a concat of exactly the B_t exists already, it is read instead of a copy);
// - anything else: additions in order.
Value sum_gradient_terms(const std::vector<Value>& terms);

}  // namespace kiln
