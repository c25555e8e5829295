// One walk over the nodes in order (after a scan that finds which scatters rewrites 2 and 3
// make, so that rewrite 4 can reuse them), copying each node into a new graph or its rewrite.
#include "graph/passes/one_hot_products.h"

#include <map>
#include <optional>

#include "graph/op.h"
#include "graph/ops.h"

namespace kiln {
namespace {

// The value `ref` is a view of, through reshapes that keep its last axis (the rows of a
// [R, N] matrix viewed as [T, B, N] and back).
ValueRef through_row_reshapes(const Graph& g, ValueRef ref) {
  for (;;) {
    const Node& n = g.node(ref.node);
    if (n.op->id != OpId::reshape) return ref;
    const Shape &from = g.type(n.inputs[0]).shape, &to = g.type(ref).shape;
    if (from.rank() == 0 || to.rank() == 0 || from[from.rank() - 1] != to[to.rank() - 1])
      return ref;
    ref = n.inputs[0];
  }
}

bool is_float_matrix(const TensorType& t) {
  return t.shape.rank() == 2 && (t.dtype == DType::f32 || t.dtype == DType::f64);
}

struct OneHot {
  ValueRef labels;
  std::int64_t classes = 0;
};
std::optional<OneHot> one_hot_at(const Graph& g, ValueRef ref) {
  const Node& n = g.node(ref.node);
  if (n.op->id != OpId::one_hot) return std::nullopt;
  return OneHot{n.inputs[0], n.attrs.integer("classes")};
}

struct Product {
  ValueRef a, b;
  bool ta = false, tb = false;
};
std::optional<Product> product_at(const Graph& g, ValueRef ref) {
  const Node& n = g.node(ref.node);
  if (n.op->id != OpId::matmul || !is_float_matrix(n.outputs[0])) return std::nullopt;
  return Product{n.inputs[0], n.inputs[1], n.attrs.integer("trans_a") != 0,
                 n.attrs.integer("trans_b") != 0};
}

// An embedding's output: matmul(one_hot(t), E) with fewer table rows than one-hot rows.
struct Embedding {
  OneHot one_hot;
  ValueRef table;
};
std::optional<Embedding> embedding_at(const Graph& g, ValueRef ref) {
  const std::optional<Product> p = product_at(g, through_row_reshapes(g, ref));
  if (!p || p->ta || p->tb) return std::nullopt;
  const std::optional<OneHot> o = one_hot_at(g, p->a);
  if (!o || o->classes >= g.type(p->a).shape[0]) return std::nullopt;
  return Embedding{*o, p->b};
}

enum class Rewrite { none, projection, weight_grad, input_grad, gather, scatter };
struct Match {
  Rewrite rewrite = Rewrite::none;
  OneHot one_hot;
  ValueRef table, other;  // E and W (1), E and dP (2), dP and W (3), X (5)
};

Match match_product(const Graph& g, std::int32_t id) {
  const std::optional<Product> p = product_at(g, {id, 0});
  if (!p) return {};
  if (!p->ta && !p->tb) {
    if (const auto e = embedding_at(g, p->a))
      return {Rewrite::projection, e->one_hot, e->table, p->b};
    if (const auto o = one_hot_at(g, p->a)) return {Rewrite::gather, *o, {}, p->b};
    return {};
  }
  if (!p->ta || p->tb) return {};
  if (const auto e = embedding_at(g, p->a))
    return {Rewrite::weight_grad, e->one_hot, e->table, p->b};
  const std::optional<OneHot> o = one_hot_at(g, p->a);
  if (!o) return {};
  const std::optional<Product> dx = product_at(g, through_row_reshapes(g, p->b));
  if (dx && !dx->ta && dx->tb && g.type(dx->a).shape[0] == g.type(p->a).shape[0])
    return {Rewrite::input_grad, *o, dx->a, dx->b};
  return {Rewrite::scatter, *o, {}, p->b};
}

using ScatterKey = std::pair<ValueRef, ValueRef>;  // (labels, rows summed), old ids
ScatterKey scatter_key(const Match& m) {
  return {m.one_hot.labels, m.rewrite == Rewrite::weight_grad ? m.other : m.table};
}

// reduce_sum(x [R, N]) over axis 0 alone.
bool sums_rows(const Graph& g, const Node& n) {
  if (n.op->id != OpId::reduce_sum || !is_float_matrix(g.type(n.inputs[0]))) return false;
  const std::vector<std::int64_t>& axes = n.attrs.integers("axes");
  return axes.size() == 1 && (axes[0] == 0 || axes[0] == -2);
}

// Rewrite 1's gathers, by new node: the table they gather from and the labels.
using Projections = std::map<std::int32_t, std::pair<Value, Value>>;

// add(gather_rows(T, t), b) with b [N] or [1, N] -> gather_rows(add(T, b), t): the bias added
// to the table's V rows instead of the R gathered ones (an invalid Value where `n` is no such
// add).
template <class Moved>
Value fold_bias(const Graph& g, const Node& n, Moved& moved, const Projections& projections) {
  for (std::size_t k = 0; k < 2; ++k) {
    const auto it = projections.find(moved(n.inputs[k]).ref().node);
    if (it == projections.end()) continue;
    const TensorType &gathered = g.type(n.inputs[k]), &bias = g.type(n.inputs[1 - k]);
    const std::int64_t width = gathered.shape[1];
    const bool row = bias.shape.rank() == 1
                         ? bias.shape[0] == width
                         : bias.shape.rank() == 2 && bias.shape[0] == 1 && bias.shape[1] == width;
    if (!row || bias.dtype != gathered.dtype || n.outputs[0] != gathered) continue;
    const auto& [table, labels] = it->second;
    const Value b = moved(n.inputs[1 - k]);
    const Value sum = k == 0 ? table + b : b + table;
    return gather_rows(sum, labels);
  }
  return {};
}

}  // namespace

Graph rewrite_one_hot_products(const Graph& g) {
  const auto count = static_cast<std::int32_t>(g.nodes().size());
  std::vector<Match> matches(static_cast<std::size_t>(count));
  std::map<ScatterKey, std::int64_t> scattered;  // and the one-hot's classes
  for (std::int32_t id = 0; id < count; ++id) {
    Match& m = matches[static_cast<std::size_t>(id)];
    m = match_product(g, id);
    if (m.rewrite == Rewrite::weight_grad || m.rewrite == Rewrite::input_grad)
      scattered[scatter_key(m)] = m.one_hot.classes;
  }
  Graph out;
  std::vector<std::int32_t> new_id(static_cast<std::size_t>(count), -1);
  auto moved = [&](ValueRef ref) {
    return out.value({new_id[static_cast<std::size_t>(ref.node)], ref.index});
  };
  std::map<ScatterKey, Value> scatters;
  auto scatter = [&](ValueRef labels, ValueRef rows, std::int64_t classes) {
    auto it = scatters.find({labels, rows});
    if (it == scatters.end())
      it = scatters
               .emplace(ScatterKey{labels, rows},
                        scatter_add_rows(moved(rows), moved(labels), classes))
               .first;
    return it->second;
  };
  Projections projections;
  for (std::int32_t id = 0; id < count; ++id) {
    Node n = g.node(id);
    const Match& m = matches[static_cast<std::size_t>(id)];
    const std::int64_t classes = m.one_hot.classes;
    Value rewritten;
    switch (m.rewrite) {
      case Rewrite::projection: {
        const Value table = matmul(moved(m.table), moved(m.other));
        rewritten = gather_rows(table, moved(m.one_hot.labels));
        projections[rewritten.ref().node] = {table, moved(m.one_hot.labels)};
        break;
      }
      case Rewrite::weight_grad:
        rewritten = matmul(moved(m.table), scatter(m.one_hot.labels, m.other, classes), true);
        break;
      case Rewrite::input_grad:
        rewritten =
            matmul(scatter(m.one_hot.labels, m.table, classes), moved(m.other), false, true);
        break;
      case Rewrite::gather:
        rewritten = gather_rows(moved(m.other), moved(m.one_hot.labels));
        break;
      case Rewrite::scatter:
        rewritten = scatter(m.one_hot.labels, m.other, classes);
        break;
      case Rewrite::none:
        break;
    }
    if (!rewritten.valid() && sums_rows(g, n))  // rewrite 4
      for (const auto& [key, rows] : scattered)
        if (key.second == n.inputs[0]) {
          rewritten = out.apply1(OpId::reduce_sum, {scatter(key.first, key.second, rows)}, n.attrs);
          break;
        }
    if (!rewritten.valid() && n.op->id == OpId::add)
      rewritten = fold_bias(g, n, moved, projections);
    for (ValueRef& in : n.inputs) in.node = new_id[static_cast<std::size_t>(in.node)];
    if (!rewritten.valid()) rewritten = out.value(out.add_node(std::move(n)));
    new_id[static_cast<std::size_t>(id)] = rewritten.ref().node;
  }
  for (const auto& [name, ref] : g.outputs()) out.output(name, moved(ref));
  for (const auto& [var, ref] : g.assignments()) out.assign(var, moved(ref));
  return out;
}

}  // namespace kiln
