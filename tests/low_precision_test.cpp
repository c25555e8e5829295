// bf16 and f16 in graphs on the CPU: cast rounds to nearest even and casts its gradient back;
// a step on low-precision values equals computing in f32 from the same values and rounding
// each stored result once (DESIGN.md, Precision), fused groups and GEMMs included; on the
// GPU, cast gives the CPU's bits.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "backends/compile.h"
#include "backends/host_copy.h"
#include "core/philox.h"
#include "graph/autograd.h"
#include "graph/ops.h"
#include "tests/support.h"

namespace kiln {
namespace {

Tensor random_tensor(const Shape& shape, std::uint64_t seed) {
  Philox rng(seed);
  Tensor t = Tensor::empty(shape, DType::f32);
  rng.fill_uniform(t, -2.0, 2.0);
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("cast rounds f32 to bf16 and f16 to nearest even, and back exactly") {
  for (DType low : {DType::bf16, DType::f16}) {
    CAPTURE(dtype_name(low));
    Graph g;
    Value x = g.input("x", {1000});
    Value narrow = cast(x, low);
    CHECK(narrow.dtype() == low);
    g.output("narrow", narrow);
    g.output("back", cast(narrow, DType::f32));
    const Tensor in = random_tensor({1000}, 4);
    const Outputs out = compile(g)->run({{x, in}});
    const float* v = in.data<float>();
    for (std::int64_t i = 0; i < 1000; ++i) {
      const std::uint16_t want =
          low == DType::bf16 ? float_to_bf16_bits(v[i]) : float_to_f16_bits(v[i]);
      std::uint16_t got = 0;
      std::memcpy(&got, static_cast<const char*>(out.at("narrow").raw()) + 2 * i, 2);
      REQUIRE(got == want);
      REQUIRE(out.at("back").data<float>()[i] ==
              (low == DType::bf16 ? bf16_bits_to_float(want) : f16_bits_to_float(want)));
    }
  }
  Graph g;
  CHECK(cast(g.input("x", {2}), DType::f32).ref().node == 0);  // a no-op cast adds nothing
  CHECK_THROWS_WITH_AS((void)cast(g.input("i", {2}, DType::i64), DType::bf16),
                       "cast: converts between floating dtypes, not i64 to bf16", Error);
}

TEST_CASE("cast's gradient is the incoming gradient cast back to the input's dtype") {
  Graph g;
  Value x = g.input("x", {5});
  Value y = cast(x, DType::bf16);
  const Value loss = sum_all(cast(y * y, DType::f32));
  const std::vector<Value> grads = grad(loss, {x});
  CHECK(grads[0].dtype() == DType::f32);
  g.output("dx", grads[0]);
  const Tensor in =
      Tensor::from_values({5}, std::vector<double>{0.5, -1.25, 3, 0.1, -7}, DType::f32);
  const Tensor dx = compile(g)->run({{x, in}}).at("dx");
  for (std::int64_t i = 0; i < 5; ++i) {
    const float xb = float{bf16(in.data<float>()[i])};
    CHECK(dx.at(i) == static_cast<double>(float{bf16(2.0f * xb)}));  // 2x computed in bf16
  }
}

TEST_CASE("a bf16 step on the CPU equals f32 math on the same values, rounded where stored") {
  // y = relu(x @ w + b) * 0.5: one GEMM and one fused elementwise group.
  const Tensor x = random_tensor({16, 24}, 1), w = random_tensor({24, 8}, 2),
               b = random_tensor({8}, 3);
  for (DType low : {DType::bf16, DType::f16}) {
    CAPTURE(dtype_name(low));
    auto run = [&](DType dtype, const Tensor& xv, const Tensor& wv, const Tensor& bv) {
      Graph g;
      Value xi = g.input("x", {16, 24}, dtype), wi = g.input("w", {24, 8}, dtype),
            bi = g.input("b", {8}, dtype);
      Value h = matmul(xi, wi);
      g.output("h", h);
      g.output("y", relu(h + bi) * 0.5);
      return compile(g)->run({{xi, xv}, {wi, wv}, {bi, bv}});
    };
    const Outputs low_out = run(low, x.to(low), w.to(low), b.to(low));
    // The reference: f32 inputs holding the rounded values; h rounded where the GEMM stores
    // it, the group computed in f32 from that h, its result rounded once.
    const Outputs ref_h = run(DType::f32, x.to(low).to(DType::f32), w.to(low).to(DType::f32),
                              b.to(low).to(DType::f32));
    CHECK(same_bits(low_out.at("h"), ref_h.at("h").to(low)));
    Graph g;
    Value hi = g.input("h", {16, 8}), bi = g.input("b", {8});
    g.output("y", relu(hi + bi) * 0.5);
    const Tensor ref_y =
        compile(g)
            ->run({{hi, ref_h.at("h").to(low).to(DType::f32)}, {bi, b.to(low).to(DType::f32)}})
            .at("y");
    CHECK(same_bits(low_out.at("y"), ref_y.to(low)));
  }
}

TEST_CASE("GPU: cast gives the CPU's bits for every pair of floating dtypes") {
  if (!test::have_gpu()) return;
  const DType all[] = {DType::f32, DType::f64, DType::bf16, DType::f16};
  for (DType from : all) {
    Graph g;
    Value x = g.input("x", {4099}, from);
    for (DType to : all)
      if (to != from) g.output(std::string(dtype_name(to)), cast(x, to));
    // From f32 through each narrow type and back: two casts in a row.
    if (from == DType::f32) {
      g.output("bf16_back", cast(cast(x, DType::bf16), DType::f32));
      g.output("f16_back", cast(cast(x, DType::f16), DType::f32));
    }
    // Values of every magnitude the narrow types hold, and past f16's range.
    Tensor in = random_tensor({4099}, 9).to(from);
    Tensor scaled = Tensor::empty({4099}, DType::f32);
    for (std::int64_t i = 0; i < 4099; ++i)
      scaled.data<float>()[i] = static_cast<float>(in.at(i) * std::ldexp(1.0, int(i % 40) - 20));
    in = scaled.to(from);
    const Outputs cpu = compile(g)->run({{x, in}});
    const Outputs gpu = compile(g, {.device = Device::cuda()})->run({{x, in}});
    for (const auto& [name, t] : cpu) {
      CAPTURE(dtype_name(from));
      CAPTURE(name);
      CHECK(same_bits(to_host(gpu.at(name)), t));
    }
  }
}

}  // namespace kiln
