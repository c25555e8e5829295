// Gradient sums: disjoint padded slices become a concat, a sum of products one GEMM.
#include "graph/grad_sum.h"

#include <algorithm>
#include <map>
#include <optional>

#include "graph/op.h"
#include "graph/ops.h"

namespace kiln {
namespace {

// An existing concat along `axis` of exactly `values` (in any order, each once): the
// positions of values in it, or nothing. Joined gradients share such a concat rather than
// copying the same pieces again.
std::optional<std::pair<Value, std::vector<std::size_t>>> existing_concat(
    Graph& g, const std::vector<Value>& values, std::int64_t axis) {
  std::map<ValueRef, std::size_t> index;
  for (std::size_t i = 0; i < values.size(); ++i)
    if (!index.emplace(values[i].ref(), i).second) return std::nullopt;
  for (std::int32_t id = static_cast<std::int32_t>(g.nodes().size()) - 1; id >= 0; --id) {
    const Node& n = g.node(id);
    if (n.op->id != OpId::concat || n.inputs.size() != values.size() ||
        n.attrs.integer("axis") != axis)
      continue;
    std::vector<std::size_t> order;
    for (const ValueRef& in : n.inputs) {
      auto it = index.find(in);
      if (it == index.end()) break;
      order.push_back(it->second);
    }
    if (order.size() == values.size()) return std::make_pair(g.value({id, 0}), order);
  }
  return std::nullopt;
}

// Terms that are all pad nodes along one axis: terms of the same range are added
// unpadded, and disjoint ranges are joined by one concat (zeros in the gaps).
std::optional<Value> join_padded(const std::vector<Value>& terms) {
  struct Range {
    std::int64_t before, length;
    Value inner;
  };
  Graph& g = terms[0].graph();
  std::int64_t axis = -1;
  std::vector<Range> ranges;  // in order of first appearance
  for (const Value& t : terms) {
    const Node& n = g.node(t.ref().node);
    if (n.op->id != OpId::pad || (axis >= 0 && n.attrs.integer("axis") != axis))
      return std::nullopt;
    axis = n.attrs.integer("axis");
    const std::int64_t before = n.attrs.integer("before");
    const Value inner = g.value(n.inputs[0]);  // n is not used past here: adding nodes moves it
    const std::int64_t length = inner.shape()[static_cast<std::size_t>(axis)];
    auto same = std::find_if(ranges.begin(), ranges.end(), [&](const Range& r) {
      return r.before == before && r.length == length;
    });
    if (same == ranges.end())
      ranges.push_back({before, length, inner});
    else
      same->inner = same->inner + inner;
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.before < b.before; });
  for (std::size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i - 1].before + ranges[i - 1].length > ranges[i].before) return std::nullopt;
  const Shape full = terms[0].shape();
  const std::int64_t size = full[static_cast<std::size_t>(axis)];
  const auto zeros = [&](std::int64_t length) {
    Shape gap = full;
    gap[static_cast<std::size_t>(axis)] = length;
    return g.fill(0.0, gap, terms[0].dtype());
  };
  std::vector<Value> pieces;
  std::int64_t at = 0;
  for (const Range& r : ranges) {
    if (r.before > at) pieces.push_back(zeros(r.before - at));
    pieces.push_back(r.inner);
    at = r.before + r.length;
  }
  if (at < size) pieces.push_back(zeros(size - at));
  const auto shared = existing_concat(g, pieces, axis);  // the same pieces joined for another value
  if (shared && std::is_sorted(shared->second.begin(), shared->second.end())) return shared->first;
  return concat(pieces, axis);
}

// Terms that are all rank-2 matmuls with the same transposes: sum_t op(A_t) op(B_t) =
// op([A_1 .. A_k]) op([B_1; ..; B_k]), the operands joined along the contraction axis.
std::optional<Value> join_products(const std::vector<Value>& terms) {
  Graph& g = terms[0].graph();
  std::vector<Value> lhs, rhs;
  std::int64_t trans_a = -1, trans_b = -1, copied = 0;
  for (const Value& t : terms) {
    const Node& n = g.node(t.ref().node);
    if (n.op->id != OpId::matmul || t.shape().rank() != 2) return std::nullopt;
    if (trans_a >= 0 &&
        (n.attrs.integer("trans_a") != trans_a || n.attrs.integer("trans_b") != trans_b))
      return std::nullopt;
    trans_a = n.attrs.integer("trans_a");
    trans_b = n.attrs.integer("trans_b");
    lhs.push_back(g.value(n.inputs[0]));
    rhs.push_back(g.value(n.inputs[1]));
    copied += lhs.back().shape().numel() + rhs.back().shape().numel();
  }
  // The k - 1 extra outputs are each written once and read once by the additions.
  const std::int64_t saved =
      2 * static_cast<std::int64_t>(terms.size() - 1) * terms[0].shape().numel();
  if (copied > saved) return std::nullopt;
  const std::int64_t lhs_axis = trans_a ? 0 : 1, rhs_axis = trans_b ? 1 : 0;
  Value rhs_joined;
  if (auto shared = existing_concat(g, rhs, rhs_axis)) {  // e.g. an RNN's projection gradient
    std::vector<Value> reordered;
    for (std::size_t i : shared->second) reordered.push_back(lhs[i]);
    lhs = reordered;
    rhs_joined = shared->first;
  } else {
    rhs_joined = concat(rhs, rhs_axis);
  }
  return matmul(concat(lhs, lhs_axis), rhs_joined, trans_a != 0, trans_b != 0);
}

}  // namespace

Value sum_gradient_terms(const std::vector<Value>& terms) {
  KILN_ASSERT(!terms.empty(), "sum_gradient_terms: no terms");
  if (terms.size() == 1) return terms[0];
  if (std::optional<Value> joined = join_padded(terms)) return *joined;
  if (std::optional<Value> joined = join_products(terms)) return *joined;
  Value total = terms[0];
  for (std::size_t i = 1; i < terms.size(); ++i) total = total + terms[i];
  return total;
}

}  // namespace kiln
