// CUDA code generation: golden lines of the generated source, NVRTC compilation of every
// kernel of the LeNet step and of random DAGs (no GPU needed), and, where a GPU exists,
// every fused kernel against the CPU evaluator on fresh random inputs.
#include <doctest/doctest.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cstring>
#include <utility>

#include "backends/cpu/low_precision.h"
#include "backends/horizontal.h"
#include "fusion/codegen.h"
#include "fusion/fuse.h"
#include "fusion/fused_group.h"
#include "gpu/kernel_cache.h"
#include "gpu/nvrtc_compiler.h"
#include "graph/autograd.h"
#include "graph/passes/autocast.h"
#include "graph/passes/dead_code.h"
#include "models/lenet.h"
#include "graph/testing/lstm_step_graph.h"
#include "graph/testing/random_graph.h"
#include "tests/support.h"

#ifdef KILN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "fusion/cuda_fused.h"
#include "gpu/cuda_runtime.h"
#endif

namespace kiln {
namespace {

std::vector<std::shared_ptr<const FusedGroup>> groups_of(const Graph& fused) {
  std::vector<std::shared_ptr<const FusedGroup>> out;
  for (const Node& n : fused.nodes())
    if (n.body) out.push_back(std::dynamic_pointer_cast<const FusedGroup>(n.body));
  return out;
}

std::shared_ptr<const FusedGroup> single_group(Graph& g) {
  const auto groups = groups_of(fuse(eliminate_dead_code(g)));
  REQUIRE(groups.size() == 1);
  return groups[0];
}

Graph lenet_step(std::int64_t batch, bool adam = false) {
  Graph g;
  Philox rng(0);
  static LeNet model(rng);  // parameters outlive the graph's variable nodes
  const Value loss =
      cross_entropy(model(g.input("x", {batch, 1, 28, 28})), g.input("y", {batch}, DType::i64));
  std::vector<Value> params;
  for (const VariablePtr& p : model.parameters()) params.push_back(g.variable(p));
  Sgd sgd({.lr = 0.01, .momentum = 0.9});
  Adam adam_optimizer({.lr = 0.01});
  Optimizer& optimizer = adam ? static_cast<Optimizer&>(adam_optimizer) : sgd;
  optimizer.append_update(g, model.parameters(), grad(loss, params));
  g.output("loss", loss);
  return g;
}

bool contains(const std::string& text, const std::string& line) {
  return text.find(line) != std::string::npos;
}

}  // namespace

TEST_CASE("golden: bf16 and f16 groups load bits, compute in float, store rounded, 8 a vector") {
  std::vector<CudaKernelSource> kernels;
  for (DType low : {DType::bf16, DType::f16}) {
    const std::string from = low == DType::bf16 ? "kiln_from_bf16" : "kiln_from_f16";
    const std::string to = low == DType::bf16 ? "kiln_to_bf16" : "kiln_to_f16";
    Graph g;
    g.output("y", relu(g.input("x", {8, 20}, low)) * 0.5);
    const CudaKernelSource k = generate_cuda(*single_group(g));
    CAPTURE(k.source);
    CHECK(contains(k.source, "typedef float T;"));
    CHECK(contains(k.source,
                   "(const unsigned short* __restrict__ in0, unsigned short* __restrict__ out0)"));
    CHECK(k.vector_width == 8);  // one 16-byte load per thread
    CHECK(contains(
        k.source,
        "reinterpret_cast<uint4*>(s0)[0] = reinterpret_cast<const uint4*>((in0 + i))[0];"));
    CHECK(contains(k.source, "const T x0_7 = " + from + "(s0[7]);"));
    // relu of a 16-bit value is one (OpDef::exact): no rounding; the product is rounded as the
    // unfused op would store it, and stored: bf16 two lanes a cvt, f16 one. bf16 lanes are
    // computed in pairs, each rounding of the two one cvt (the scalar tail one a lane).
    CHECK(contains(k.source, "const T r1 = " + from + "(" + to + "((r0 * 0.5f)));"));
    if (low == DType::bf16) {
      CHECK(contains(k.source,
                     "const T r0_6 = (x0_6 > T(0) ? x0_6 : T(0)), r0_7 = (x0_7 > "
                     "T(0) ? x0_7 : T(0));"));
      CHECK(contains(k.source,
                     "T r1_6, r1_7; kiln_round_bf16x2((r0_6 * 0.5f), (r0_7 * 0.5f), r1_6, r1_7);"));
      CHECK(contains(k.source, "const T r1 = r1_7;"));
      CHECK(contains(k.source, "v0[7] = r1;"));
      CHECK(contains(k.source,
                     "reinterpret_cast<unsigned*>(o0)[3] = kiln_pack_bf16x2(v0[6], v0[7]);"));
    } else {
      CHECK(contains(k.source, "const T r0 = (x0_7 > T(0) ? x0_7 : T(0));"));
      CHECK(contains(k.source, "o0[7] = " + to + "(r1);"));
    }
    CHECK(contains(k.source, "start = n / 8 * 8 + first;"));  // 160 = 20 vectors: no tail
    CHECK(contains(k.source, "for (long long i = start; i < n; i += step) {"));
    kernels.push_back(k);
    // A cast from f32 fuses: the input stays T (float), the output is 16 bits.
    Graph c;
    c.output("y", cast(tanh(c.input("x", {3, 7})), low));
    const CudaKernelSource ck = generate_cuda(*single_group(c));
    CAPTURE(ck.source);
    CHECK(contains(ck.source, "(const T* __restrict__ in0, unsigned short* __restrict__ out0)"));
    CHECK(ck.vector_width == 8);  // 21 elements: two vectors, then a tail of 5
    kernels.push_back(ck);
    // A per-channel value over 2x2 maps: 4 lanes (8-byte loads) keep a vector in one channel.
    Graph pc;
    pc.output("y", pc.input("x", {2, 3, 2, 2}, low) * pc.input("b", {1, 3, 1, 1}, low));
    const CudaKernelSource pk = generate_cuda(*single_group(pc));
    CAPTURE(pk.source);
    CHECK(pk.vector_width == 4);
    CHECK(contains(pk.source, "reinterpret_cast<uint2*>(s0)[0] = reinterpret_cast<const uint2*>("));
    kernels.push_back(pk);
    // A sum of 16-bit values accumulates in float and rounds once.
    Graph r;
    r.output("s", sum(cast(r.input("x", {6, 50}, low), DType::f32) * 2.0, {1}));
    const CudaKernelSource rk = generate_cuda(*single_group(r));
    CAPTURE(rk.source);
    CHECK(contains(rk.source, "T acc = 0.0f;"));
    CHECK(contains(rk.source, "const T x0 = " + from + "(in0["));
    kernels.push_back(rk);
  }
#ifdef KILN_HAVE_CUDA
  for (const CudaKernelSource& k : kernels)
    CHECK(gpu::compile_to_cubin({k.name, k.source, {}}, {.sm = 90}).size() > 4);
#endif
}

TEST_CASE("golden: a bias-add + relu group over [8, 16] with a [16] bias") {
  Graph g;
  const Value x = g.input("x", {8, 16});
  const Value b = g.input("b", {16});
  g.output("y", relu(x + b) * 0.5);
  const CudaKernelSource k = generate_cuda(*single_group(g));
  CAPTURE(k.source);
  CHECK(contains(k.source, "typedef float T;"));
  CHECK(contains(k.source,
                 "(const T* __restrict__ in0, const T* __restrict__ in1, T* __restrict__ out0)"));
  CHECK(contains(k.source, "const long long n = 128LL;"));
  CHECK(contains(k.source,
                 "const T x1 = in1[(i % 16LL)];"));  // the bias, read in place at broadcast strides
  CHECK(contains(k.source, "const T r0 = (x0 + x1);  // add"));
  CHECK(contains(k.source, "const T r1 = (r0 > T(0) ? r0 : T(0));  // relu"));
  CHECK(contains(k.source, "const T r2 = (r1 * 0.5f);  // mul"));
  CHECK(
      contains(k.source, "const float4 x1 = *reinterpret_cast<const float4*>(in1 + (i % 16LL));"));
  CHECK(contains(k.source, "*reinterpret_cast<float4*>(out0 + i) = o0;"));
  CHECK(k.vector_width == 4);
}

TEST_CASE("golden: a per-channel bias over [2, 3, 5, 5] is lane-invariant only when H*W allows") {
  Graph g;
  const Value x = g.input("x", {2, 3, 5, 5});
  const Value b = g.input("b", {1, 3, 1, 1});
  g.output("y", x * b);
  const CudaKernelSource k = generate_cuda(*single_group(g));
  CAPTURE(k.source);
  CHECK(contains(k.source, "const T x1 = in1[((i / 25LL) % 3LL)];"));
  CHECK(k.vector_width == 1);  // 25 is not a multiple of 4: lanes would cross channels
}

TEST_CASE("golden: a gate slice of a [4, 32] GEMM output is read in place from an offset") {
  Graph g;
  const Value pre = g.input("pre", {4, 32});
  g.output("y", tanh(slice(pre, 1, 16, 8)) * slice(pre, 1, 0, 8));
  const CudaKernelSource k = generate_cuda(*single_group(g));
  CAPTURE(k.source);
  CHECK(contains(k.source, "in0 += 16LL;  // a slice read in place"));
  CHECK(contains(k.source, "const T x0 = in0[(i % 8LL) + (i / 8LL) * 32LL];"));
  CHECK(contains(k.source, "const T x1 = in1[(i % 8LL) + (i / 8LL) * 32LL];"));
  CHECK(k.vector_width ==
        4);  // rows of 8 at a pitch of 32 allow float4 (alignment tested at run time)
}

TEST_CASE("golden: a sum reduction tail is one block per output with a shuffle reduction") {
  Graph g;
  const Value x = g.input("x", {4, 6, 10});
  g.output("s", sum(exp(x), {0, 2}));
  const CudaKernelSource k = generate_cuda(*single_group(g));
  CAPTURE(k.source);
  CHECK(k.reduction);
  CHECK(k.work_items == 6);  // 40 values per output: no split
  CHECK(k.splits == 1);
  CHECK(contains(k.source, "const long long n_out = 6LL;"));
  CHECK(contains(k.source, "const long long n_red = 40LL;"));
  CHECK(contains(k.source, "const int base = ((int)o) * 10;"));  // 32-bit indices: 240 elements
  CHECK(contains(k.source, "const int i = base + (r % 10) * 1 + (r / 10) * 60;"));
  CHECK(contains(k.source, "__shfl_down_sync(0xffffffffu, acc, off)"));
  CHECK(contains(k.source, "reduced[job] = acc;"));
  CHECK(k.finish_name.empty());
  Graph big;  // 3 * 2^30 elements: 64-bit indices
  big.output("s", sum(exp(big.input("x", {std::int64_t{1} << 30, 3})), {1}));
  CHECK(contains(generate_cuda(*single_group(big)).source, "const long long i = base + r * 1LL;"));
}

TEST_CASE(
    "golden: per-channel sums over NCHW load a vector per thread (8 bf16, 4 f32) where the "
    "maps allow it, with the element loop kept for unaligned pointers") {
  for (const auto& [dtype, lanes] : {std::pair{DType::bf16, 8}, std::pair{DType::f32, 4}}) {
    CAPTURE(dtype_name(dtype));
    Graph g;
    const Value x = g.input("x", {16, 32, 14, 14}, dtype);  // 196 = 4 x 49: f32 vectors only
    const Value y = g.input("y", {16, 32, 16, 16}, dtype);  // 256: both
    g.output("sx", sum(cast(x, DType::f32) * 2.0, {0, 2, 3}));
    g.output("sy", sum(cast(y, DType::f32) * 2.0, {0, 2, 3}));
    const auto groups = groups_of(fuse(eliminate_dead_code(g)));
    int vectorized = 0;
    for (const auto& group : groups) {
      const CudaKernelSource k = generate_cuda(*group);
      CAPTURE(k.source);
      const bool vec = contains(k.source, fmt::format("(int)threadIdx.x * {};", lanes));
      vectorized += vec ? 1 : 0;
      CHECK(vec == contains(k.source, "if (vec) {"));
      CHECK(contains(k.source, "r += (int)blockDim.x) {"));  // the element loop
    }
    CHECK(groups.size() == 2);
    CHECK(vectorized == (dtype == DType::f32 ? 2 : 1));
  }
}

TEST_CASE("golden: sibling reductions keep an accumulator, a result and partials each") {
  Graph g;
  const Value dy = relu(g.input("dy", {64, 32, 28, 28}));
  g.output("a", sum(dy, {0, 2, 3}));
  g.output("b", sum(dy * g.input("xhat", {64, 32, 28, 28}), {0, 2, 3}));
  const CudaKernelSource k = generate_cuda(*single_group(g));
  CAPTURE(k.source);
  CHECK(k.reductions == 2);
  CHECK(k.splits == 64);
  CHECK(contains(k.source, "T* __restrict__ reduced, T* __restrict__ reduced1)"));
  CHECK(contains(k.source, "    T acc1 = 0.0f;"));
  CHECK(contains(k.source, "if (threadIdx.x == 0u) reduced1[job] = acc1;"));
  CHECK(contains(k.source,
                 "(const T* __restrict__ partial, T* __restrict__ reduced, T* "
                 "__restrict__ reduced1)"));
  CHECK(contains(k.source, "const T v = (partial + 1LL * n_out * splits)[o * splits + c]; acc1 ="));
  CHECK(contains(k.source, "if (lane == 0u) reduced1[o] = acc1;"));
}

TEST_CASE(
    "golden: a bias gradient over [64, 32, 28, 28] is split across blocks and finished by warps") {
  Graph g;
  const Value dy = g.input("dy", {64, 32, 28, 28});
  g.output("db", sum(dy * 2.0, {0, 2, 3}));
  const CudaKernelSource k = generate_cuda(*single_group(g));
  CAPTURE(k.source);
  CHECK(k.splits ==
        64);  // 32 outputs of 50176 values: 64 blocks each (2048 in all) of >= 512 values
  CHECK(k.work_items == 32 * 64);
  CHECK(k.finish_name == k.name + "_finish");
  CHECK(contains(k.source, "const long long chunk = 784LL;"));
  CHECK(k.block_threads == 128);  // 784 values a split, 4 a thread: 196 threads busy
  CHECK(k.finish_threads == 32);  // 64 partials an output: a warp combines them
  CHECK(contains(k.source, "extern \"C\" __global__ void " + k.finish_name +
                               "(const T* __restrict__ partial, T* __restrict__ reduced)"));
  // A warp an output: each lane its partials in order, then the lanes in a butterfly.
  CHECK(contains(k.source,
                 "for (long long c = lane; c < splits; c += 32) { const T v = partial[o * splits + "
                 "c]; acc = (acc + v); }"));
  CHECK(contains(k.source, "__shfl_xor_sync(0xffffffffu, acc, mask); acc = (acc + other); }"));
  CHECK(contains(k.source, "if (lane == 0u) reduced[o] = acc;"));
}

TEST_CASE(
    "golden: a column sum (a linear layer's bias gradient) gives a warp adjacent outputs, rows "
    "split") {
  Graph g;
  const Value dy = g.input("dy", {4096, 1024});
  g.output("db", sum(dy * 2.0, {0}));
  const CudaKernelSource k = generate_cuda(*single_group(g));
  CAPTURE(k.source);
  CHECK(k.splits == 32);  // 32 tiles of 32 outputs, 4096 rows in 32 splits of 128: 1024 blocks
  CHECK(k.work_items == 32 * 32);
  CHECK(contains(k.source, "const long long c = tile * 32 + lane, o = b * n_out + c;"));
  CHECK(contains(k.source, "const long long i = first + r * n_out + c;"));
  CHECK(k.split_jobs == 32);  // the launch picks the splits, at most 32 (128 rows or more each)
  CHECK(contains(k.source,
                 "const long long splits = (long long)gridDim.x / (1LL * tiles);  // <= 32"));
  CHECK(contains(k.source, "const long long chunk = (n_red + splits - 1) / splits;"));
  CHECK(k.block_threads == 256);  // 128 rows a split, a row a warp at a time: 8 warps busy
  CHECK(contains(k.source, "reduced[o * splits + job % splits] = acc;"));
  CHECK(k.finish_name == k.name + "_finish");
  Graph narrow,
      short_columns;  // fewer than 32 outputs, or fewer than 512 rows: the row-by-row body
  narrow.output("s", sum(narrow.input("x", {512, 16}), {0}));
  CHECK(!contains(generate_cuda(*single_group(narrow)).source, "const long long tiles ="));
  short_columns.output("s", sum(short_columns.input("x", {64, 256}), {0}));
  CHECK(!contains(generate_cuda(*single_group(short_columns)).source, "const long long tiles ="));
#ifdef KILN_HAVE_CUDA
  Graph f64;
  f64.output("m", max(exp(f64.input("x", {600, 70}, DType::f64)), {0}, true));
  const CudaKernelSource d = generate_cuda(*single_group(f64));
  CHECK(contains(d.source, "const long long tiles ="));
  for (const CudaKernelSource& source : {k, d})
    CHECK(gpu::compile_to_cubin({source.name, source.source, {}}, {.sm = 90}).size() > 4);
#endif
}

TEST_CASE("golden: the same group gives the same kernel name, another group another") {
  Graph g1, g2;
  g1.output("y", tanh(g1.input("x", {64})));
  g2.output("y", tanh(g2.input("x", {65})));
  const std::string a = generate_cuda(*single_group(g1)).name;
  CHECK(a == generate_cuda(*single_group(g1)).name);
  CHECK(a != generate_cuda(*single_group(g2)).name);
}

namespace {

// The horizontal launches of a fused step on one stream (backends/horizontal.h).
std::vector<HorizontalLaunch> horizontal_of(const Graph& fused) {
  return merge_horizontal(fused, std::vector<int>(fused.nodes().size(), 0),
                          in_place_updates(fused));
}

const FusedGroup& group_at(const Graph& fused, std::int32_t node) {
  return dynamic_cast<const FusedGroup&>(*fused.node(node).body);
}

}  // namespace

// Generated kernels may be launched programmatically (gpu/kernel_source.h): the main kernel, a
// split reduction's finisher and a horizontal launch's kernel each begin with
// KILN_AFTER_PRIOR_GRIDS(), whose definition the source carries.
TEST_CASE("every generated kernel of LeNet's Adam step begins with KILN_AFTER_PRIOR_GRIDS()") {
  const Graph fused = fuse(eliminate_dead_code(lenet_step(64, true)));
  int finishers = 0, kernels = 0;
  for (const auto& group : groups_of(fused)) {
    const CudaKernelSource k = generate_cuda(*group);
    CAPTURE(k.source);
    CHECK(k.source.find(gpu::after_prior_grids_definition()) != std::string::npos);
    CHECK(test::kernels_after_prior_grids(k.source) == (k.finish_name.empty() ? 1 : 2));
    finishers += !k.finish_name.empty();
    ++kernels;
  }
  CHECK(finishers >= 1);
  CHECK(kernels >= 15);
  const std::vector<HorizontalLaunch> launches = horizontal_of(fused);
  REQUIRE(!launches.empty());
  for (const HorizontalLaunch& h : launches)
    CHECK(test::kernels_after_prior_grids(
              generate_cuda_horizontal(group_at(fused, h.nodes.front())).source) == 1);
}

TEST_CASE(
    "golden: the horizontal kernel of LeNet's SGD updates walks a segment table and runs each "
    "group's own instruction lines") {
  const Graph fused = fuse(eliminate_dead_code(lenet_step(64)));
  const std::vector<HorizontalLaunch> launches = horizontal_of(fused);
  REQUIRE(!launches.empty());
  std::size_t members = 0;
  for (const HorizontalLaunch& h : launches) {
    members += h.nodes.size();
    const FusedGroup& first = group_at(fused, h.nodes.front());
    const CudaKernelSource k = generate_cuda_horizontal(first);
    CAPTURE(k.source);
    CHECK(contains(k.source, "(const long long* __restrict__ table, int segments)"));
    CHECK(contains(k.source, "const long long n = seg[0];"));
    CHECK(contains(k.source, "i += blockDim.x"));
    // The same kernel for every member (sizes are not in the source)...
    for (std::int32_t m : h.nodes)
      CHECK(generate_cuda_horizontal(group_at(fused, m)).name == k.name);
    // ...computing each element with the lines of the group's own kernel: its vector path's
    // (where the segment's size and alignment allow it) and its scalar loop's.
    const std::string own = generate_cuda(first).source;
    CHECK(contains(k.source, "if (seg[2] != 0LL) {"));
    for (const char* line : {"const float4 x0 = *reinterpret_cast<const float4*>(in0 + i);",
                             "const T r0 = (x0.x * 0.9f);  // mul"})
      CHECK(contains(own, line) == contains(k.source, line));
    const std::size_t scalar_loop = own.rfind("for (long long i = ");  // after any vector path
    REQUIRE(scalar_loop != std::string::npos);
    for (std::size_t at = own.find("const T r", scalar_loop); at != std::string::npos;
         at = own.find("const T r", at + 1))
      CHECK(contains(k.source, own.substr(at, own.find('\n', at) - at)));
  }
  CHECK(members == 8);  // every parameter's update (LeNet has 8 parameters)
}

#ifdef KILN_HAVE_CUDA
TEST_CASE(
    "every generated kernel of the LeNet step and of random DAGs compiles with NVRTC for sm_90") {
  std::vector<gpu::KernelSource> sources;
  auto add = [&](const Graph& fused) {
    for (const auto& group : groups_of(fused)) {
      const CudaKernelSource k = generate_cuda(*group);
      sources.push_back({k.name, k.source, {}});
    }
  };
  add(fuse(eliminate_dead_code(lenet_step(64))));
  for (const Graph& fused :
       {fuse(eliminate_dead_code(lenet_step(64))),
        fuse(eliminate_dead_code(autocast(lenet_step(64), DType::bf16))),
        fuse(eliminate_dead_code(lenet_step(64, true))),
        fuse(eliminate_dead_code(autocast(lenet_step(64, true), DType::bf16)))})
    for (const HorizontalLaunch& h : horizontal_of(fused)) {
      const CudaKernelSource k = generate_cuda_horizontal(group_at(fused, h.nodes.front()));
      sources.push_back({k.name, k.source, {}});
    }
  Graph lstm;
  testing::lstm_step_graph(lstm, 8, 12, 16, true);
  add(fuse(eliminate_dead_code(lstm)));
  for (int s = 0; s < 20; ++s) {
    Graph g;
    testing::RandomGraphBuilder builder(500 + static_cast<std::uint64_t>(s));
    const testing::RandomGraph r = builder.build(g, 12, s % 5 == 0 ? DType::f64 : DType::f32);
    for (std::size_t i = 0; i < r.outputs.size(); ++i)
      g.output("o" + std::to_string(i), r.outputs[i]);
    add(fuse(eliminate_dead_code(g)));
  }
  const auto dir = std::filesystem::temp_directory_path() /
                   ("kiln-codegen-test-cache-" + std::to_string(::getpid()));
  gpu::KernelCache cache(dir);
  const auto compiled = cache.get_or_compile(sources, {.sm = 90});
  REQUIRE(compiled.size() == sources.size());
  for (const auto& k : compiled) CHECK(k.cubin.size() > 4);
  std::filesystem::remove_all(dir);
  MESSAGE(sources.size() << " generated kernels compiled for sm_90");
}

namespace {

// Runs one group on the GPU and on the CPU with the same random inputs; returns the worst
// closeness over its outputs.
double gpu_vs_cpu(const Node& node, const FusedGroup& group, const CudaFusedKernel& kernel,
                  std::uint64_t seed) {
  std::vector<Tensor> inputs, cpu_outputs;
  std::vector<void*> device;
  std::vector<const void*> in_ptrs;
  std::vector<void*> out_ptrs;
  for (std::size_t k = 0; k < group.inputs.size(); ++k) {
    inputs.push_back(test::random_tensor(group.inputs[k].type.shape, group.inputs[k].type.dtype,
                                         seed + k, -2, 2));
    void* p = nullptr;
    REQUIRE(cudaMalloc(&p, std::max<std::size_t>(inputs.back().nbytes(), 16)) == cudaSuccess);
    REQUIRE(cudaMemcpy(p, inputs.back().raw(), inputs.back().nbytes(), cudaMemcpyHostToDevice) ==
            cudaSuccess);
    device.push_back(p);
    in_ptrs.push_back(p);
  }
  for (const TensorType& t : node.outputs) {
    cpu_outputs.push_back(Tensor::empty(t.shape, t.dtype));
    void* p = nullptr;
    REQUIRE(cudaMalloc(&p, std::max<std::size_t>(cpu_outputs.back().nbytes(), 16)) == cudaSuccess);
    device.push_back(p);
    out_ptrs.push_back(p);
  }
  std::vector<Tensor> outs = cpu_outputs;
  run_cpu_kernel(node, inputs, outs);  // bf16 and f16 through f32, as the CPU backend runs them
  kernel.launch(in_ptrs, out_ptrs, nullptr);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  double worst = 0;
  for (std::size_t o = 0; o < outs.size(); ++o) {
    Tensor gpu = Tensor::empty(outs[o].shape(), outs[o].dtype());
    REQUIRE(cudaMemcpy(gpu.raw(), out_ptrs[o], gpu.nbytes(), cudaMemcpyDeviceToHost) ==
            cudaSuccess);
    // A reduction of n values in float (GPU) against double (CPU) differs by about
    // sqrt(n) float roundings: the tolerance of the reduced output grows with sqrt(n).
    const bool reduced = o >= group.outputs.size();  // the last outputs: the reductions
    const double n =
        reduced
            ? static_cast<double>(group.shape.numel() / std::max<std::int64_t>(1, outs[o].numel()))
            : 1.0;
    const double tolerance =
        std::max(test::dtype_tolerance(outs[o].dtype()), test::dtype_tolerance(group.compute)) *
        std::sqrt(n);
    worst = std::max(worst, test::closeness(gpu, outs[o], tolerance, tolerance));
  }
  for (void* p : device) cudaFree(p);
  return worst;
}

void check_graph_on_gpu(const Graph& fused, std::uint64_t seed, int& kernels) {
  std::vector<const FusedGroup*> groups;
  std::vector<const Node*> nodes;
  for (const Node& n : fused.nodes())
    if (n.body) {
      groups.push_back(dynamic_cast<const FusedGroup*>(n.body.get()));
      nodes.push_back(&n);
    }
  const auto compiled = compile_fused_kernels(groups);
  for (std::size_t i = 0; i < groups.size(); ++i) {
    CAPTURE(groups[i]->summary());
    CAPTURE(compiled[i]->source().source);
    CHECK(gpu_vs_cpu(*nodes[i], *groups[i], *compiled[i], seed + i * 31) <= 1.0);
    ++kernels;
  }
}

}  // namespace

TEST_CASE(
    "GPU: every fused kernel of the LeNet step and of random DAGs matches the CPU evaluator") {
  if (gpu::cuda_device_count() == 0) {
    MESSAGE("skipped: " << gpu::cuda_unavailable_reason());
    return;
  }
  int kernels = 0;
  check_graph_on_gpu(fuse(eliminate_dead_code(lenet_step(64))), 1, kernels);
  check_graph_on_gpu(fuse(eliminate_dead_code(lenet_step(256))), 2, kernels);
  for (DType low : {DType::bf16, DType::f16})  // mixed groups: 16-bit activations, f32 updates
    check_graph_on_gpu(fuse(eliminate_dead_code(autocast(lenet_step(64), low))), 4, kernels);
  for (const DType dtype : {DType::f32, DType::f64}) {
    Graph lstm;
    testing::lstm_step_graph(lstm, 5, 7, 12, true, dtype);
    check_graph_on_gpu(fuse(eliminate_dead_code(lstm)), 3, kernels);
  }
  for (int s = 0; s < 200; ++s) {
    Graph g;
    testing::RandomGraphBuilder builder(9000 + static_cast<std::uint64_t>(s));
    const testing::RandomGraph r =
        builder.build(g, 4 + s % 24, s % 7 == 0 ? DType::f64 : DType::f32);
    for (std::size_t i = 0; i < r.outputs.size(); ++i)
      g.output("o" + std::to_string(i), r.outputs[i]);
    check_graph_on_gpu(fuse(eliminate_dead_code(g)), 100 + static_cast<std::uint64_t>(s), kernels);
    if (s % 4 == 1)  // the same DAG in 16 bits
      check_graph_on_gpu(
          fuse(eliminate_dead_code(autocast(g, s % 8 == 1 ? DType::bf16 : DType::f16))),
          500 + static_cast<std::uint64_t>(s), kernels);
  }
  // Batch norm's backward sums as sibling reductions in one group, split over blocks (a
  // finisher per reduction's partials), over [64, 32, 28, 28] in f32 and bf16.
  for (DType dtype : {DType::f32, DType::bf16}) {
    Graph g;
    test::add_sibling_sums(g, {64, 32, 28, 28}, dtype);
    check_graph_on_gpu(fuse(eliminate_dead_code(g)), 700, kernels);
  }
  MESSAGE(kernels << " fused kernels matched the CPU evaluator on the GPU");
}
namespace {

struct DeviceCopy {
  void* p = nullptr;
  explicit DeviceCopy(const Tensor& t) {
    REQUIRE(cudaMalloc(&p, std::max<std::size_t>(t.nbytes(), 16)) == cudaSuccess);
    REQUIRE(cudaMemcpy(p, t.raw(), t.nbytes(), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  ~DeviceCopy() { cudaFree(p); }
  Tensor read(const TensorType& t) const {
    Tensor host = Tensor::empty(t.shape, t.dtype);
    REQUIRE(cudaMemcpy(host.raw(), p, host.nbytes(), cudaMemcpyDeviceToHost) == cudaSuccess);
    return host;
  }
};

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Every horizontal launch of `fused` against its members' own kernels (the same bits) and the
// CPU evaluator (close), on random inputs.
void check_horizontal_on_gpu(const Graph& fused, std::uint64_t seed, int& launches) {
  for (const HorizontalLaunch& h : horizontal_of(fused)) {
    HorizontalMembers members;
    std::vector<std::unique_ptr<DeviceCopy>> memory;
    std::vector<std::vector<Tensor>> cpu_out;
    std::vector<std::vector<const DeviceCopy*>> own_out, merged_out;
    for (std::int32_t m : h.nodes) {
      const FusedGroup& g = group_at(fused, m);
      members.groups.push_back(&g);
      std::vector<Tensor> in;
      members.inputs.emplace_back();
      for (const FusedInput& fi : g.inputs) {
        // Positive inputs: an Adam second moment is never negative, and a random negative one
        // makes b2 * v + (1 - b2) * g^2 cancel, where FMA contraction alone moves the f32 result
        // past the tolerance (the merged and own kernels still agree bit for bit).
        in.push_back(test::random_tensor(fi.type.shape, fi.type.dtype, seed++, 0.5, 2));
        memory.push_back(std::make_unique<DeviceCopy>(in.back()));
        members.inputs.back().push_back(memory.back()->p);
      }
      std::vector<Tensor> out;
      members.outputs.emplace_back();
      own_out.emplace_back();
      merged_out.emplace_back();
      for (const TensorType& t : fused.node(m).outputs) {
        out.push_back(Tensor::full(t.shape, 0.0, t.dtype));
        memory.push_back(std::make_unique<DeviceCopy>(out.back()));
        own_out.back().push_back(memory.back().get());
        memory.push_back(std::make_unique<DeviceCopy>(out.back()));
        merged_out.back().push_back(memory.back().get());
        members.outputs.back().push_back(memory.back()->p);
      }
      run_cpu_kernel(fused.node(m), in, out);
      cpu_out.push_back(out);
      std::vector<void*> own_ptrs;
      for (const DeviceCopy* d : own_out.back()) own_ptrs.push_back(d->p);
      compile_fused_kernels({&g})[0]->launch(members.inputs.back(), own_ptrs, nullptr);
    }
    compile_horizontal_kernels({members})[0]->launch(nullptr);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    for (std::size_t s = 0; s < h.nodes.size(); ++s)
      for (std::size_t o = 0; o < cpu_out[s].size(); ++o) {
        CAPTURE(members.groups[s]->summary());
        const TensorType& t = fused.node(h.nodes[s]).outputs[o];
        const Tensor merged = merged_out[s][o]->read(t);
        CHECK(same_bits(merged, own_out[s][o]->read(t)));
        const double tolerance = test::dtype_tolerance(t.dtype);
        CHECK(test::closeness(merged, cpu_out[s][o], tolerance, tolerance) <= 1.0);
      }
    ++launches;
  }
}

}  // namespace

TEST_CASE(
    "GPU: horizontal launches (LeNet's SGD and Adam updates, f32 and bf16 with weight copies) "
    "give each group's own kernel's bits and the CPU evaluator's values") {
  if (gpu::cuda_device_count() == 0) {
    MESSAGE("skipped: " << gpu::cuda_unavailable_reason());
    return;
  }
  int launches = 0;
  for (const bool adam : {false, true}) {
    check_horizontal_on_gpu(fuse(eliminate_dead_code(lenet_step(64, adam))), 1, launches);
    check_horizontal_on_gpu(fuse(eliminate_dead_code(autocast(lenet_step(64, adam), DType::bf16))),
                            99, launches);
  }
  CHECK(launches >= 4);
}
#endif

}  // namespace kiln
