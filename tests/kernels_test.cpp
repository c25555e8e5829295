// The CPU kernels against naive loops written from the definitions, in f32 on random inputs.
#include <doctest/doctest.h>

#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>

#include "graph/nn/functional.h"
#include "graph/ops.h"
#include "tests/support.h"

namespace kiln {
namespace {

Tensor run_unary(const Shape& in_shape, const std::function<Value(Value)>& build, const Tensor& x) {
  Graph g;
  g.output("y", build(g.input("x", in_shape)));
  return test::run_once(g, {{"x", x}}).at("y");
}

Tensor run_binary(const Tensor& a, const Tensor& b,
                  const std::function<Value(Value, Value)>& build) {
  Graph g;
  g.output("y", build(g.input("a", a.shape(), a.dtype()), g.input("b", b.shape(), b.dtype())));
  return test::run_once(g, {{"a", a}, {"b", b}}).at("y");
}

}  // namespace

TEST_CASE("conv2d matches the direct definition (stride 2, padding 1)") {
  const Tensor x = test::random_tensor({3, 2, 7, 6}, DType::f32, 1);
  const Tensor w = test::random_tensor({4, 2, 3, 3}, DType::f32, 2);
  const Tensor y = run_binary(x, w, [](Value a, Value b) { return conv2d(a, b, 2, 1); });
  REQUIRE(y.shape() == Shape{3, 4, 4, 3});
  Tensor ref = Tensor::zeros(y.shape(), DType::f32);
  for (int b = 0; b < 3; ++b)
    for (int o = 0; o < 4; ++o)
      for (int oh = 0; oh < 4; ++oh)
        for (int ow = 0; ow < 3; ++ow) {
          double acc = 0;
          for (int c = 0; c < 2; ++c)
            for (int kh = 0; kh < 3; ++kh)
              for (int kw = 0; kw < 3; ++kw) {
                const int ih = oh * 2 - 1 + kh, iw = ow * 2 - 1 + kw;
                if (ih < 0 || ih >= 7 || iw < 0 || iw >= 6) continue;
                acc +=
                    x.at(((b * 2 + c) * 7 + ih) * 6 + iw) * w.at(((o * 2 + c) * 3 + kh) * 3 + kw);
              }
          ref.data<float>()[((b * 4 + o) * 4 + oh) * 3 + ow] = static_cast<float>(acc);
        }
  CHECK(test::closeness(y, ref, 1e-5, 1e-4) <= 1.0);
}

TEST_CASE("matmul matches the definition, with transposes and a batch axis") {
  const Tensor a = test::random_tensor({2, 5, 3}, DType::f32, 3);
  const Tensor b = test::random_tensor({2, 4, 5}, DType::f32, 4);
  const Tensor y = run_binary(
      a, b, [](Value p, Value q) { return matmul(p, q, true, true); });  // a^T b^T: [2, 3, 4]
  REQUIRE(y.shape() == Shape{2, 3, 4});
  for (int n = 0; n < 2; ++n)
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 4; ++j) {
        double acc = 0;
        for (int k = 0; k < 5; ++k) acc += a.at((n * 5 + k) * 3 + i) * b.at((n * 4 + j) * 5 + k);
        CHECK(y.at((n * 3 + i) * 4 + j) == doctest::Approx(acc).epsilon(1e-5));
      }
}

// The zoo's GEMM shapes through oneDNN's sgemm: one block (a lone task, limited to one
// thread), many blocks, both transposes; against the f64 definition, and the same bits for
// 1, 2 and 3 threads.
TEST_CASE("float32 matmul: close to the f64 definition, the same bits for any thread count") {
  struct Case {
    std::int64_t m, k, n;
    bool ta, tb;
  };
  const int before = omp_get_max_threads();
  for (const Case c : {Case{8, 30, 12, false, false}, Case{64, 784, 256, false, false},
                       Case{300, 96, 520, true, false}, Case{64, 256, 784, false, true},
                       Case{130, 70, 90, true, true}}) {
    CAPTURE(c.m);
    CAPTURE(c.ta);
    CAPTURE(c.tb);
    const Tensor a = test::random_tensor(c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k}, DType::f32, 1);
    const Tensor b = test::random_tensor(c.tb ? Shape{c.n, c.k} : Shape{c.k, c.n}, DType::f32, 2);
    auto product = [&](int threads) {
      omp_set_num_threads(threads);
      return run_binary(a, b, [&](Value p, Value q) { return matmul(p, q, c.ta, c.tb); });
    };
    const Tensor one = product(1);
    for (const int threads : {2, 3})
      CHECK(std::memcmp(one.raw(), product(threads).raw(), one.nbytes()) == 0);
    const Tensor exact = run_binary(a.to(DType::f64), b.to(DType::f64),
                                    [&](Value p, Value q) { return matmul(p, q, c.ta, c.tb); });
    CHECK(test::closeness(one, exact, 1e-5, 1e-5) <= 1);
  }
  omp_set_num_threads(before);
}

TEST_CASE("matmul names both shapes when the inner dimensions differ") {
  Graph g;
  const Value a = g.input("a", {64, 3136});
  const Value b = g.input("b", {3316, 128});
  CHECK_THROWS_WITH_AS(matmul(a, b), doctest::Contains("lhs is [64, 3136] but rhs is [3316, 128]"),
                       Error);
}

TEST_CASE("max_pool2d matches the definition") {
  const Tensor x = test::random_tensor({2, 3, 6, 5}, DType::f32, 5);
  const Tensor y = run_unary(
      x.shape(), [](Value v) { return max_pool2d(v, 2); }, x);
  REQUIRE(y.shape() == Shape{2, 3, 3, 2});
  for (int p = 0; p < 6; ++p)
    for (int oh = 0; oh < 3; ++oh)
      for (int ow = 0; ow < 2; ++ow) {
        double best = -1e30;
        for (int kh = 0; kh < 2; ++kh)
          for (int kw = 0; kw < 2; ++kw)
            best = std::max(best, x.at((p * 6 + oh * 2 + kh) * 5 + ow * 2 + kw));
        CHECK(y.at((p * 3 + oh) * 2 + ow) == best);
      }
}

// The 2x2 stride-2 gradient has its own loop (disjoint windows: no zeroing pass). Against the
// definition: dy goes to each window's first maximum in row-major order, a NaN wins (the last
// one), and cells in no window (odd sizes) get 0. Values from a few levels so that ties are
// common, signed zeros and NaNs among them; 40 planes so that the loop runs on the team.
TEST_CASE("max_pool2d 2x2 and its gradient: the first maximum, ties, zeros and NaNs, odd sizes") {
  for (auto [h, w] : {std::pair{7, 9}, {8, 6}, {5, 5}}) {
    CAPTURE(h);
    CAPTURE(w);
    Tensor x = test::random_tensor({4, 10, h, w}, DType::f32, 31, -2.0, 2.0);
    float* xv = x.data<float>();
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      xv[i] = std::round(xv[i]);
      if (xv[i] == 0 && i % 3 == 0) xv[i] = -0.0f;
      if (i % 97 == 0 || i % 89 == 1) xv[i] = std::numeric_limits<float>::quiet_NaN();
    }
    const std::int64_t oh_n = h / 2, ow_n = w / 2;
    const Tensor dy = test::random_tensor({4, 10, oh_n, ow_n}, DType::f32, 32, 0.5, 1.0);
    const Tensor dx =
        run_binary(x, dy, [](Value a, Value b) { return max_pool2d_grad(a, b, 2, 2, 0); });
    const Tensor y = run_unary(
        x.shape(), [](Value v) { return max_pool2d(v, 2); }, x);
    Tensor ref = Tensor::zeros(x.shape(), DType::f32), ref_y = Tensor::zeros(y.shape(), DType::f32);
    for (std::int64_t plane = 0; plane < 40; ++plane)
      for (std::int64_t oh = 0; oh < oh_n; ++oh)
        for (std::int64_t ow = 0; ow < ow_n; ++ow) {
          std::int64_t best = -1;
          for (std::int64_t r = 0; r < 2; ++r)
            for (std::int64_t c = 0; c < 2; ++c) {
              const std::int64_t at = (plane * h + 2 * oh + r) * w + 2 * ow + c;
              if (best < 0 || xv[at] > xv[best] || std::isnan(xv[at])) best = at;
            }
          ref.data<float>()[best] += dy.at((plane * oh_n + oh) * ow_n + ow);
          ref_y.data<float>()[(plane * oh_n + oh) * ow_n + ow] = xv[best];
        }
    CHECK(std::memcmp(y.data<float>(), ref_y.data<float>(), y.numel() * sizeof(float)) == 0);
    REQUIRE(dx.shape() == x.shape());
    CHECK(std::memcmp(dx.data<float>(), ref.data<float>(), x.numel() * sizeof(float)) == 0);
  }
}

namespace {

// Pooling by the definition: window (oh, ow) covers rows oh*s - p .. oh*s - p + k - 1 (and
// the same for columns); cells outside the plane are skipped, neither maxima nor counted.
Tensor pool_reference(const Tensor& x, std::int64_t k, std::int64_t s, std::int64_t p,
                      bool average) {
  const Shape& xs = x.shape();
  const std::int64_t oh_n = (xs[2] + 2 * p - k) / s + 1, ow_n = (xs[3] + 2 * p - k) / s + 1;
  Tensor y = Tensor::empty({xs[0], xs[1], oh_n, ow_n}, DType::f32);
  for (std::int64_t plane = 0; plane < xs[0] * xs[1]; ++plane)
    for (std::int64_t oh = 0; oh < oh_n; ++oh)
      for (std::int64_t ow = 0; ow < ow_n; ++ow) {
        double best = -1e30, total = 0;
        int cells = 0;
        for (std::int64_t ih = oh * s - p; ih < oh * s - p + k; ++ih)
          for (std::int64_t iw = ow * s - p; iw < ow * s - p + k; ++iw) {
            if (ih < 0 || ih >= xs[2] || iw < 0 || iw >= xs[3]) continue;
            const double v = x.at((plane * xs[2] + ih) * xs[3] + iw);
            best = std::max(best, v);
            total += v;
            ++cells;
          }
        y.data<float>()[(plane * oh_n + oh) * ow_n + ow] =
            static_cast<float>(average ? total / cells : best);
      }
  return y;
}

}  // namespace

TEST_CASE("padded max_pool2d: padded cells never win, even over all-negative inputs") {
  const Tensor x = test::random_tensor({2, 3, 7, 6}, DType::f32, 21, -2.0, -0.5);
  for (auto [k, s, p] : {std::tuple{3, 1, 1}, {3, 2, 1}, {2, 2, 1}, {5, 2, 2}, {4, 3, 2}}) {
    CAPTURE(k);
    CAPTURE(s);
    CAPTURE(p);
    const Tensor y = run_unary(
        x.shape(), [&](Value v) { return max_pool2d(v, k, s, p); }, x);
    const Tensor ref = pool_reference(x, k, s, p, false);
    REQUIRE(y.shape() == ref.shape());
    CHECK(test::closeness(y, ref, 0, 0) == 0);
  }
}

TEST_CASE("avg_pool2d matches the definition (padded cells not counted)") {
  const Tensor x = test::random_tensor({2, 3, 7, 6}, DType::f32, 22);
  for (auto [k, s, p] :
       {std::tuple{2, 2, 0}, {3, 1, 1}, {3, 2, 1}, {2, 3, 0}, {5, 2, 2}, {6, 1, 0}}) {
    CAPTURE(k);
    CAPTURE(s);
    CAPTURE(p);
    const Tensor y = run_unary(
        x.shape(), [&](Value v) { return avg_pool2d(v, k, s, p); }, x);
    const Tensor ref = pool_reference(x, k, s, p, true);
    REQUIRE(y.shape() == ref.shape());
    CHECK(test::closeness(y, ref, 1e-6, 1e-5) <= 1.0);
  }
}

TEST_CASE(
    "overlapping padded max_pool2d_grad: threads over planes give the serial reference's bits") {
  const Shape xs{8, 16, 14, 14};  // 25088 windows: the kernel runs threaded
  const Tensor x = test::random_tensor(xs, DType::f32, 24),
               dy = test::random_tensor(xs, DType::f32, 25);
  Tensor ref = Tensor::zeros(
      xs, DType::f32);  // dy routed to each 3x3 window's first maximum, in window order
  for (std::int64_t plane = 0; plane < 8 * 16; ++plane)
    for (std::int64_t oh = 0; oh < 14; ++oh)
      for (std::int64_t ow = 0; ow < 14; ++ow) {
        std::int64_t best = -1;
        for (std::int64_t ih = std::max<std::int64_t>(oh - 1, 0);
             ih <= std::min<std::int64_t>(oh + 1, 13); ++ih)
          for (std::int64_t iw = std::max<std::int64_t>(ow - 1, 0);
               iw <= std::min<std::int64_t>(ow + 1, 13); ++iw) {
            const std::int64_t at = (plane * 14 + ih) * 14 + iw;
            if (best < 0 || x.at(at) > x.at(best)) best = at;
          }
        ref.data<float>()[best] += dy.data<float>()[(plane * 14 + oh) * 14 + ow];
      }
  for (int threads : {1, 2, 3}) {
    CAPTURE(threads);
    omp_set_num_threads(threads);
    const Tensor dx =
        run_binary(x, dy, [](Value a, Value b) { return max_pool2d_grad(a, b, 3, 1, 1); });
    CHECK(std::memcmp(dx.raw(), ref.raw(), ref.nbytes()) == 0);
  }
  omp_set_num_threads(omp_get_num_procs());
}

TEST_CASE("global_avg_pool is the mean over H and W") {
  const Tensor x = test::random_tensor({2, 3, 5, 4}, DType::f32, 23);
  const Tensor y = run_unary(
      x.shape(), [](Value v) { return global_avg_pool(v); }, x);
  REQUIRE(y.shape() == Shape{2, 3});
  for (std::int64_t plane = 0; plane < 6; ++plane) {
    double total = 0;
    for (std::int64_t i = 0; i < 20; ++i) total += x.at(plane * 20 + i);
    CHECK(y.at(plane) == doctest::Approx(total / 20).epsilon(1e-6));
  }
}

TEST_CASE("pooling names the bad kernel, stride or padding") {
  Graph g;
  const Value x = g.input("x", {2, 3, 6, 6});
  CHECK_THROWS_WITH_AS(
      max_pool2d(x, 3, 1, 2),
      doctest::Contains("max_pool2d: padding 2 must be between 0 and half the kernel 3"), Error);
  CHECK_THROWS_WITH_AS(avg_pool2d(x, 2, 1, -1), doctest::Contains("avg_pool2d: padding -1"), Error);
  CHECK_THROWS_WITH_AS(
      avg_pool2d(x, 9, 1, 1),
      doctest::Contains("window 9 is larger than the input [2, 3, 6, 6] padded by 1"), Error);
  CHECK_THROWS_WITH_AS(max_pool2d(x, 2, -1),
                       doctest::Contains("kernel 2 and stride -1 must be positive"), Error);
  CHECK_THROWS_WITH_AS(
      avg_pool2d_grad(g.input("dy", {2, 3, 3, 3}), {2, 3, 6, 6}, 3, 1, 1),
      doctest::Contains(
          "avg_pool2d_grad: dy is f32[2, 3, 3, 3] but the pooling output is [2, 3, 6, 6]"),
      Error);
  CHECK_THROWS_WITH_AS(global_avg_pool(g.input("v", {2, 3})),
                       doctest::Contains("global_avg_pool: input must be [B, C, H, W]"), Error);
}

TEST_CASE("reductions over every axis subset match the definition") {
  const Tensor x = test::random_tensor({3, 4, 5}, DType::f32, 6);
  const std::vector<std::vector<std::int64_t>> subsets = {{0},    {1},    {2},      {0, 1},
                                                          {0, 2}, {1, 2}, {0, 1, 2}};
  for (const auto& axes : subsets) {
    CAPTURE(axes.size());
    const Tensor s = run_unary(
        x.shape(), [&](Value v) { return sum(v, axes, true); }, x);
    const Tensor m = run_unary(
        x.shape(), [&](Value v) { return max(v, axes, true); }, x);
    std::vector<double> ref_sum(static_cast<std::size_t>(s.numel()), 0),
        ref_max(static_cast<std::size_t>(s.numel()), -1e30);
    const Shape& os = s.shape();
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 4; ++j)
        for (int k = 0; k < 5; ++k) {
          const std::int64_t o =
              ((os[0] == 1 ? 0 : i) * os[1] + (os[1] == 1 ? 0 : j)) * os[2] + (os[2] == 1 ? 0 : k);
          const double v = x.at((i * 4 + j) * 5 + k);
          ref_sum[static_cast<std::size_t>(o)] += v;
          ref_max[static_cast<std::size_t>(o)] = std::max(ref_max[static_cast<std::size_t>(o)], v);
        }
    for (std::int64_t o = 0; o < s.numel(); ++o) {
      CHECK(s.at(o) == doctest::Approx(ref_sum[static_cast<std::size_t>(o)]).epsilon(1e-5));
      CHECK(m.at(o) == ref_max[static_cast<std::size_t>(o)]);
    }
  }
}

TEST_CASE("elementwise broadcasting over mixed axes matches index arithmetic") {
  const Tensor a = test::random_tensor({2, 1, 4, 3}, DType::f32, 7);
  const Tensor b = test::random_tensor({5, 1, 3}, DType::f32, 8);
  const Tensor y = run_binary(a, b, [](Value p, Value q) { return p * q - q; });
  REQUIRE(y.shape() == Shape{2, 5, 4, 3});
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 5; ++j)
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < 3; ++l) {
          const double av = a.at((i * 4 + k) * 3 + l), bv = b.at(j * 3 + l);
          CHECK(y.at(((i * 5 + j) * 4 + k) * 3 + l) == doctest::Approx(av * bv - bv));
        }
}

TEST_CASE("large elementwise chains split across threads give the serial answer") {
  const Tensor a = test::random_tensor({300, 1000}, DType::f32, 9);
  const Tensor b = test::random_tensor({1000}, DType::f32, 10);
  const Tensor y = run_binary(a, b, [](Value p, Value q) { return tanh(relu(p * q + 1.0)) * 0.5; });
  for (std::int64_t i = 0; i < a.numel(); i += 997) {
    const double v = a.at(i) * b.at(i % 1000) + 1.0;
    CHECK(y.at(i) == doctest::Approx(std::tanh(std::max(v, 0.0)) * 0.5).epsilon(1e-6));
  }
}

TEST_CASE("transpose matches the definition") {
  const Tensor x = test::random_tensor({2, 3, 4}, DType::f32, 11);
  const Tensor y = run_unary(
      x.shape(),
      [](Value v) {
        return transpose(v, {2, 0, 1});
      },
      x);
  REQUIRE(y.shape() == Shape{4, 2, 3});
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) CHECK(y.at((k * 2 + i) * 3 + j) == x.at((i * 3 + j) * 4 + k));
}

TEST_CASE("one_hot rejects a label outside the classes at run time") {
  Graph g;
  g.output("y", one_hot(g.input("labels", {3}, DType::i64), 4));
  const Tensor bad = Tensor::from_vector<std::int64_t>({3}, {0, 7, 1});
  CHECK_THROWS_WITH_AS(test::run_once(g, {{"labels", bad}}),
                       doctest::Contains("label 7 at index 1"), Error);
}

}  // namespace kiln

namespace kiln {

TEST_CASE("slice, concat and pad move exactly the elements of their definitions (any dtype)") {
  const Tensor x = test::random_tensor({3, 4, 5}, DType::f64, 9, 0, 100).to(DType::i32);
  Graph g;
  const Value in = g.input("x", x.shape(), DType::i32);
  g.output("slice", slice(in, 1, 1, 2));
  g.output("concat", concat({slice(in, 2, 3, 2), in, slice(in, 2, 0, 1)}, -1));
  g.output("pad", pad(in, 0, 1, 2));
  const Outputs out = test::run_once(g, {{"x", x}});
  auto xs = [&](int i, int j, int k) { return x.at((i * 4 + j) * 5 + k); };
  REQUIRE(out.at("slice").shape() == Shape{3, 2, 5});
  REQUIRE(out.at("concat").shape() == Shape{3, 4, 8});
  REQUIRE(out.at("pad").shape() == Shape{6, 4, 5});
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j)
      for (int k = 0; k < 8; ++k) {
        if (j < 2 && k < 5) CHECK(out.at("slice").at((i * 2 + j) * 5 + k) == xs(i, j + 1, k));
        const double expected = k < 2 ? xs(i, j, 3 + k) : k < 7 ? xs(i, j, k - 2) : xs(i, j, 0);
        CHECK(out.at("concat").at((i * 4 + j) * 8 + k) == expected);
      }
  for (int i = 0; i < 6; ++i)
    for (int r = 0; r < 20; ++r)
      CHECK(out.at("pad").at(i * 20 + r) == (i >= 1 && i < 4 ? x.at((i - 1) * 20 + r) : 0.0));
}

TEST_CASE("slice, concat and pad name the mistake") {
  Graph g;
  const Value x = g.input("x", {3, 4});
  CHECK_THROWS_WITH_AS(slice(x, 1, 2, 3),
                       doctest::Contains("slice: [2, 5) is outside axis 1 of f32[3, 4] (size 4)"),
                       Error);
  CHECK_THROWS_WITH_AS(slice(x, 2, 0, 1), doctest::Contains("slice"), Error);
  CHECK_THROWS_WITH_AS(
      concat({x, g.input("y", {3, 5})}, 0),
      doctest::Contains(
          "concat: value 1 is f32[3, 5] but value 0 is f32[3, 4] (only axis 0 may differ)"),
      Error);
  CHECK_THROWS_WITH_AS(concat({x, g.input("z", {3, 4}, DType::f64)}, 1),
                       doctest::Contains("dtypes must match"), Error);
  CHECK_THROWS_WITH_AS(concat({}, 0), doctest::Contains("concat: no values"), Error);
  CHECK_THROWS_WITH_AS(pad(x, 0, -1, 0), doctest::Contains("pad: negative padding"), Error);
}

}  // namespace kiln
