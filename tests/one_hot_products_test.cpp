// The one-hot products pass (graph/passes/one_hot_products.h) and its ops, gather_rows and
// scatter_add_rows: an embedding followed by a projection, as char-lstm builds it, gives the
// same loss and gradients with the pass as without it, as gathers and scatters; indices out
// of range are errors; the scatter's sums are the same bits for any thread count.
#include <doctest/doctest.h>
#include <omp.h>

#include <cstdlib>
#include <cstring>

#include "backends/compile.h"
#include "graph/autograd.h"
#include "graph/op.h"
#include "graph/ops.h"
#include "graph/passes/dead_code.h"
#include "graph/passes/one_hot_products.h"
#include "tests/support.h"

namespace kiln {
namespace {

constexpr std::int64_t kSteps = 6, kBatch = 8, kVocabulary = 10, kWidth = 5, kGates = 12;

Tensor tokens_tensor(std::int64_t first_bad = -1) {
  Tensor t = Tensor::empty({kSteps * kBatch}, DType::i64);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<std::int64_t>()[i] = (i * 7 + 3) % 9;
  if (first_bad >= 0) t.data<std::int64_t>()[first_bad] = kVocabulary;
  return t;
}

// tokens [T*B] -> embedding [V, D] (a one-hot product) viewed as [T, B, D] and back, times
// W [D, G] plus b [G], through tanh; the loss weights each element differently.
struct EmbeddingGraph {
  Graph g;
  std::vector<Feed> feeds;
};
EmbeddingGraph embedding_graph() {
  EmbeddingGraph e;
  Graph& g = e.g;
  const Value tokens = g.input("tokens", {kSteps * kBatch}, DType::i64);
  const Value table = g.input("table", {kVocabulary, kWidth});
  const Value w = g.input("w", {kWidth, kGates});
  const Value b = g.input("b", {kGates});
  const Value x = reshape(matmul(one_hot(tokens, kVocabulary), table), {kSteps, kBatch, kWidth});
  const Value projected = matmul(reshape(x, {kSteps * kBatch, kWidth}), w) + b;
  const Value weights = g.constant(test::random_tensor(projected.shape(), DType::f32, 5));
  const Value loss = sum_all(tanh(projected) * weights);
  const std::vector<Value> grads = grad(loss, {table, w, b});
  g.output("loss", loss);
  g.output("d_table", grads[0]);
  g.output("d_w", grads[1]);
  g.output("d_b", grads[2]);
  e.feeds.emplace_back("tokens", tokens_tensor());
  e.feeds.emplace_back("table", test::random_tensor({kVocabulary, kWidth}, DType::f32, 1));
  e.feeds.emplace_back("w", test::random_tensor({kWidth, kGates}, DType::f32, 2));
  e.feeds.emplace_back("b", test::random_tensor({kGates}, DType::f32, 3));
  return e;
}

int count(const Graph& g, OpId id) {
  int n = 0;
  for (const Node& node : g.nodes()) n += node.op->id == id;
  return n;
}

Outputs run_with_pass(const EmbeddingGraph& e, bool pass) {
  if (!pass) setenv("KILN_ONE_HOT_PRODUCTS", "0", 1);
  Outputs out = compile(e.g, {})->run(e.feeds);
  unsetenv("KILN_ONE_HOT_PRODUCTS");
  return out;
}

}  // namespace

TEST_CASE("one-hot products: an embedding and its projection become one gather and one scatter") {
  const EmbeddingGraph e = embedding_graph();
  const Graph rewritten = eliminate_dead_code(rewrite_one_hot_products(e.g));
  CHECK(count(rewritten, OpId::gather_rows) == 1);       // of E W + b
  CHECK(count(rewritten, OpId::scatter_add_rows) == 1);  // shared by d_table, d_w and d_b
  CHECK(count(rewritten, OpId::one_hot) == 0);
  for (const Node& n : rewritten.nodes())
    if (n.op->id == OpId::matmul)  // E W, E^T S and S W^T: products of V rows, not R
      CHECK(n.outputs[0].shape.numel() <= kVocabulary * kGates);
}

TEST_CASE("one-hot products: the loss and every gradient equal those of the unrewritten graph") {
  const EmbeddingGraph e = embedding_graph();
  const Outputs with = run_with_pass(e, true), without = run_with_pass(e, false);
  for (const char* name : {"loss", "d_table", "d_w", "d_b"}) {
    CAPTURE(name);
    CHECK(test::closeness(with.at(name), without.at(name), 1e-5, 1e-5) <= 1.0);
  }
  // A token that never occurs (9) has a zero gradient row.
  const Tensor& d_table = with.at("d_table");
  for (std::int64_t j = 0; j < kWidth; ++j) CHECK(d_table.data<float>()[9 * kWidth + j] == 0.0f);
}

TEST_CASE(
    "one-hot products: fewer one-hot rows than classes keep the products (no reassociation)") {
  Graph g;
  const Value tokens = g.input("tokens", {4}, DType::i64);
  const Value table = g.input("table", {kVocabulary, kWidth});
  const Value w = g.input("w", {kWidth, kGates});
  g.output("y", matmul(matmul(one_hot(tokens, kVocabulary), table), w));
  const Graph rewritten = eliminate_dead_code(rewrite_one_hot_products(g));
  CHECK(count(rewritten, OpId::gather_rows) == 1);  // the embedding itself
  int wide_products = 0;                            // W still multiplies the 4 gathered rows
  for (const Node& n : rewritten.nodes())
    wide_products += n.op->id == OpId::matmul && n.outputs[0].shape == Shape{4, kGates};
  CHECK(wide_products == 1);
}

TEST_CASE("one-hot products: a token outside the vocabulary is an error that names it") {
  EmbeddingGraph e = embedding_graph();
  e.feeds[0] = Feed("tokens", tokens_tensor(13));
  CHECK_THROWS_WITH_AS(compile(e.g, {})->run(e.feeds),
                       "gather_rows: index 10 at position 13 is outside [0, 10)", Error);
}

TEST_CASE("scatter_add_rows: the dense product's sums, the same bits for any thread count") {
  constexpr std::int64_t rows = 3000, width = 130, classes = 17;
  Graph g;
  const Value x = g.input("x", {rows, width});
  const Value idx = g.input("idx", {rows}, DType::i32);
  g.output("s", scatter_add_rows(x, idx, classes));
  g.output("dense", matmul(one_hot(idx, classes), x, true, false));
  Tensor labels = Tensor::empty({rows}, DType::i32);
  for (std::int64_t i = 0; i < rows; ++i) labels.data<std::int32_t>()[i] = (i * i + 5) % 13;
  const std::vector<Feed> feeds = {{"x", test::random_tensor({rows, width}, DType::f32, 9)},
                                   {"idx", labels}};
  setenv("KILN_ONE_HOT_PRODUCTS", "0", 1);  // keep the dense product as the reference
  auto program = compile(g, {});
  unsetenv("KILN_ONE_HOT_PRODUCTS");
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const Outputs one = program->run(feeds);
  omp_set_num_threads(4);
  const Outputs four = program->run(feeds);
  omp_set_num_threads(threads);
  CHECK(test::closeness(one.at("s"), one.at("dense"), 1e-4, 1e-5) <= 1.0);
  CHECK(std::memcmp(one.at("s").raw(), four.at("s").raw(), rows == 0 ? 0 : classes * width * 4) ==
        0);
  for (std::int64_t j = 0; j < width; ++j)  // classes 13-16 receive no row
    CHECK(one.at("s").data<float>()[15 * width + j] == 0.0f);
}

}  // namespace kiln
