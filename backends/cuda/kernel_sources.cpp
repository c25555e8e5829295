// The list of every hand-written kernel, how one is made from its embedded .cuh file, and the
// CUDA spelling of kiln's dtypes.
#include "backends/cuda/kernel_sources.h"

#include <algorithm>
#include <set>

#include "backends/cuda/op_entry.h"
#include "core/error.h"

namespace kiln::cuda {

gpu::KernelSource embedded_kernel(const std::string& name, const char* file_text,
                                  const std::string& entry, const KernelDefines& defines) {
  std::string code = gpu::after_prior_grids_definition() + "#define " + entry + " " + name + "\n";
  for (const auto& [key, value] : defines) code += "#define " + key + " " + value + "\n";
  gpu::KernelSource source{name, code + file_text, {}};
  source.after_prior_grids = true;  // every kernels/*.cuh entry begins with it
  return source;
}

const char* cuda_type_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "float";
    case DType::f64:
      return "double";
    case DType::i32:
      return "int";
    case DType::i64:
      return "long long";
    case DType::u8:
      return "unsigned char";
    case DType::bf16:
      return "kiln::cuda::Bf16";  // kernels/storage.cuh
    case DType::f16:
      return "kiln::cuda::F16";
  }
  KILN_ASSERT(false, "unknown dtype {}", static_cast<int>(dtype));
}

// Tile choice, from LeNet's passes at batch 64 and 256 on an H200 (132 SMs; CUDA-graph time
// per call, `cuda_kernels_tests -tc="benchmark variants*" --no-skip`):
//  - f32 forward, grad_input with at least 64 output rows: 64x128 tiles of 8x8 per thread
//    while that gives at least 264 blocks (conv2 forward at batch 256: 53.9 us against 77.4
//    for the 4x4 32x64), else 64x32 tiles of 8x4 in two thread groups while that gives 264
//    (batch 64: 19.9 against 21.6 us). Fewer blocks than that (ResNet's 7x7 stage at batch
//    64) keep the smaller 4x4 tiles below: more blocks to fill the SMs.
//  - f32, at most 64 rows: 32x64 tiles of 4x8 while that gives 264 blocks (conv2 grad_input
//    at batch 256: 68.8 against 79.1 us; conv1 forward, K = 9: 15.0 either way), else 32x32
//    of 4x4 in two groups (conv2 grad_input at batch 64: 23.9 us, no 8-wide tile came closer
//    than 32.5); more than 64 rows: 64x32 of 4x4 in two groups.
//  - f32 grad_weight: 32x16 with four groups for filters of at most 16 columns (conv1: 9.9
//    us at batch 64), 64x64 of 8x8 in two groups from 64 rows and 64 columns (conv2, 288
//    columns: 68.6 against 109.7 us for the 4x4 64x32 at batch 256, 23.3 against 24.6 at
//    64), else 64x32.
//  - f64 keeps 4x4 threads and 16-row K steps (registers and shared memory).
IgemmTile igemm_choose_tile(IgemmMode mode, DType dtype, std::int64_t m, std::int64_t n) {
  if (mode == IgemmMode::grad_input_classes) mode = IgemmMode::grad_input;  // (a class's n)
  auto blocks = [&](std::int64_t bm, std::int64_t bn) {
    return (m + bm - 1) / bm * ((n + bn - 1) / bn);
  };
  if (dtype == DType::f64) {
    if (mode == IgemmMode::grad_weight)
      return n <= 16 ? IgemmTile{32, 16, 2, 16} : IgemmTile{64, 32, 1, 16};
    const int bm = m > 64 ? 64 : 32;
    if (blocks(bm, 64) >= 264) return {bm, 64, 1, 16};
    return bm == 64 ? IgemmTile{64, 32, 1, 16} : IgemmTile{32, 32, 2, 16};
  }
  if (mode == IgemmMode::grad_weight) {
    if (n <= 16) return {32, 16, 4, 16};
    // (f32: one thread group over 64 x 128, faster than two over 64 x 64 on every 3x3 pass of
    // resnet18 at b512 on an H100: 1178 / 1072 / 1081 / 1305 us against 1214 / 1202 / 1443 /
    // 1342, "benchmark: f32 weight-gradient tiles ...")
    if (dtype == DType::f32 && m >= 64 && n >= 128) return {64, 128, 1, 16, 8, 8};
    return m >= 64 && n >= 64 ? IgemmTile{64, 64, 2, 16, 8, 8} : IgemmTile{64, 32, 2, 16};
  }
  if (m >= 64 && blocks(64, 128) >= 264) return {64, 128, 1, 16, 8, 8};
  if (m >= 64 && blocks(64, 32) >= 264) return {64, 32, 2, 16, 8, 4};
  if (m <= 64 && blocks(32, 64) >= 264) return {32, 64, 1, 16, 4, 8};
  return m > 64 ? IgemmTile{64, 32, 2, 16} : IgemmTile{32, 32, 2, 16};
}

std::vector<IgemmTile> igemm_tiles(IgemmMode mode, DType dtype) {
  std::vector<IgemmTile> tiles;
  for (std::int64_t m : {32, 128})
    for (std::int64_t n : {16, 32, 64, 8192, 1 << 20})
      if (const IgemmTile t = igemm_choose_tile(mode, dtype, m, n);
          std::find(tiles.begin(), tiles.end(), t) == tiles.end())
        tiles.push_back(t);
  return tiles;
}

std::vector<gpu::KernelSource> all_kernel_sources() {
  std::vector<gpu::KernelSource> all;
  std::set<std::string> names;
  for (const auto& [op, entry] : cuda_op_table()) {
    if (!entry.every_source) continue;
    for (gpu::KernelSource& s : entry.every_source())
      if (names.insert(s.name).second) all.push_back(std::move(s));
  }
  return all;
}

}  // namespace kiln::cuda
