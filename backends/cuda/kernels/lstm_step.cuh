// The fused LSTM recurrence (lstm_sequence, lstm_sequence_grad; notes in lstm.h): one launch
// per time step that computes the step's recurrent GEMM for a block's hidden units and batch
// rows, then applies the cell (forward) or its gradient (backward). The host defines KILN_T,
// the K tile KILN_GEMM_KT and split KILN_GEMM_S, and the entry it wants as the kernel's name
// (lstm_kernels.cpp). The tiles, sums and the cell are of W = Wide<T>::type (float for bf16
// and f16): the loaders widen what they read, and every stored value is rounded once. (The
// recurrence reads h, c and the carried dc of the step before as stored, rounded to T.)
#pragma once

#include "backends/cuda/kernels/lstm_cell.cuh"

namespace kiln::cuda {

// The tiling shared by both kernels. A block owns LSTM_UNITS hidden units j0 .. j0+7 and
// LSTM_ROWS batch rows row0 .. row0+15 and computes a [ROWS, NC] tile C = A[rows, 0:K] B[0:K, NC]:
//  - forward:  A = h_prev [B, H], K = H, NC = 4 * UNITS: column c = g * UNITS + uu is gate g of
//              unit j0 + uu, i.e. B[k][c] = u[k][g * H + j0 + uu].
//  - backward: A = d_projected of the step processed before [B, 4H], K = 4H, NC = UNITS:
//              B[k][c] = u[j0 + c][k] (u^T), so C = dh_next of the block's units.
// K is walked in tiles of KT: each thread loads its share of the next tile into registers
// while the block computes on the current one from shared memory (A as [ROWS][KT + 1], the
// padding keeps the rows in different banks; B as [KT][NC]). The 256 threads split K S ways
// (thread ks takes k = ks, ks + S, ...) and each holds a 4x4 register tile (4 rows x 4
// columns); the S partial tiles are summed in a fixed order through shared memory (red).
#define LSTM_ROWS 16
#define LSTM_UNITS 8
#define LSTM_THREADS 256

template <int NC, int S, int KT>
struct TileGemm {
  static constexpr int CG = NC / 4, RG = LSTM_ROWS / 4;
  static constexpr int KTP = KT + 1;
  static constexpr int A_ELEMS = LSTM_ROWS * KT / LSTM_THREADS;  // per thread and tile
  static constexpr int B_ELEMS = KT * NC / LSTM_THREADS;
  static constexpr int TILE = LSTM_ROWS * KTP + KT * NC;
  static constexpr int RED = S * LSTM_ROWS * NC;
  static constexpr int SMEM = TILE > RED ? TILE : RED;  // elements, tile and red share it
  static_assert(CG * RG * S == LSTM_THREADS, "one 4x4 tile per thread and K slice");
  static_assert(KT % S == 0 && A_ELEMS * LSTM_THREADS == LSTM_ROWS * KT &&
                    B_ELEMS * LSTM_THREADS == KT * NC,
                "tiles split evenly over the threads");
  static_assert((LSTM_ROWS * KTP) % 4 == 0, "B tile aligned for Quad loads");
};

// The tile of K starting at k0 into registers (zeros past K; loaders zero rows and units
// past the batch and hidden sizes). Consecutive threads read consecutive k of A's rows.
template <int NC, int S, int KT, typename T, class Loader>
__device__ __forceinline__ void load_tile(const Loader& ld, int k0, int K, T* ra, T* rb) {
  typedef TileGemm<NC, S, KT> G;
#pragma unroll
  for (int i = 0; i < G::A_ELEMS; ++i) {
    const int e = threadIdx.x + i * LSTM_THREADS, k = k0 + e % KT;
    ra[i] = k < K ? ld.a(e / KT, k) : T(0);
  }
#pragma unroll
  for (int i = 0; i < G::B_ELEMS; ++i) {
    const int e = threadIdx.x + i * LSTM_THREADS, k = k0 + e / NC;
    rb[i] = k < K ? ld.b(k, e % NC) : T(0);
  }
}

template <int NC, int S, int KT, typename T>
__device__ __forceinline__ void store_tile(const T* ra, const T* rb, T* sa, T* sb) {
  typedef TileGemm<NC, S, KT> G;
#pragma unroll
  for (int i = 0; i < G::A_ELEMS; ++i) {
    const int e = threadIdx.x + i * LSTM_THREADS;
    sa[(e / KT) * G::KTP + e % KT] = ra[i];
  }
#pragma unroll
  for (int i = 0; i < G::B_ELEMS; ++i) sb[threadIdx.x + i * LSTM_THREADS] = rb[i];
}

// Leaves the partial sums in smem as red[ks][row][col] (all threads synchronised);
// tile_sum adds them up in ks order.
template <int NC, int S, int KT, typename T, class Loader>
__device__ void tile_gemm(const Loader& ld, int K, T* smem) {
  typedef TileGemm<NC, S, KT> G;
  const int cg = threadIdx.x % G::CG, rg = threadIdx.x / G::CG % G::RG,
            ks = threadIdx.x / (G::CG * G::RG);
  T* sa = smem;
  T* sb = smem + LSTM_ROWS * G::KTP;
  T ra[G::A_ELEMS], rb[G::B_ELEMS];
  T acc[4][4];
#pragma unroll
  for (int q = 0; q < 4; ++q)
#pragma unroll
    for (int p = 0; p < 4; ++p) acc[q][p] = T(0);
  load_tile<NC, S, KT>(ld, 0, K, ra, rb);
  for (int k0 = 0; k0 < K; k0 += KT) {
    store_tile<NC, S, KT>(ra, rb, sa, sb);
    __syncthreads();
    if (k0 + KT < K) load_tile<NC, S, KT>(ld, k0 + KT, K, ra, rb);  // in flight meanwhile
#pragma unroll
    for (int i = 0; i < KT / S; ++i) {
      const int kk = ks + i * S;
      const Quad<T> b = *reinterpret_cast<const Quad<T>*>(sb + kk * NC + 4 * cg);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const T a = sa[(4 * rg + q) * G::KTP + kk];
#pragma unroll
        for (int p = 0; p < 4; ++p) acc[q][p] += a * b.v[p];
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int q = 0; q < 4; ++q)
#pragma unroll
    for (int p = 0; p < 4; ++p) smem[(ks * LSTM_ROWS + 4 * rg + q) * NC + 4 * cg + p] = acc[q][p];
  __syncthreads();
}

template <int NC, int S, typename T>
__device__ __forceinline__ T tile_sum(const T* red, int r, int c) {
  T sum = T(0);
#pragma unroll
  for (int ks = 0; ks < S; ++ks) sum += red[(ks * LSTM_ROWS + r) * NC + c];
  return sum;
}

// Time t of lstm_sequence: gates = projected[t] + h_prev @ u for the block's units and
// rows, then the cell. h_prev, c_prev: [B, H], h0/c0 or the previous processed step's rows
// of hs/cs (so h_prev and hs share a buffer: no __restrict__ on them).
template <typename T, typename W>
struct ForwardLoader {
  const T* h;
  const T* u;
  int batch, hidden, row0, j0;
  __device__ W a(int r, int k) const {
    const int row = row0 + r;
    return row < batch ? W(h[(long long)row * hidden + k]) : W(0);
  }
  __device__ W b(int k, int c) const {
    const int j = j0 + c % LSTM_UNITS;
    return j < hidden ? W(u[(long long)k * 4 * hidden + (c / LSTM_UNITS) * hidden + j]) : W(0);
  }
};

template <typename T, int GEMM_S, int GEMM_KT>
__device__ __forceinline__ void lstm_forward_step(const T* __restrict__ projected,
                                                  const T* __restrict__ u, const T* h_prev,
                                                  const T* c_prev, T* hs, T* cs,
                                                  T* __restrict__ acts, int batch, int hidden,
                                                  int t) {
  typedef TileGemm<4 * LSTM_UNITS, GEMM_S, GEMM_KT> G;
  typedef typename Wide<T>::type W;
  __shared__ Quad<W> smem_quads[(G::SMEM + 3) / 4];
  W* smem = reinterpret_cast<W*>(smem_quads);
  const int row0 = blockIdx.y * LSTM_ROWS, j0 = blockIdx.x * LSTM_UNITS;
  const int r = threadIdx.x / LSTM_UNITS, uu = threadIdx.x % LSTM_UNITS, b = row0 + r, j = j0 + uu;
  // The first 128 threads own one (row, unit) each for the cell.
  const bool owner = threadIdx.x < LSTM_ROWS * LSTM_UNITS && b < batch && j < hidden;
  const long long row = (long long)t * batch + b;  // time t's row b in projected, hs, cs, acts
  W gate[4] = {W(0), W(0), W(0), W(0)}, c_old = W(0);
  if (owner) {  // loaded before the GEMM, so that their latency hides behind it
    for (int g = 0; g < 4; ++g) gate[g] = projected[row * 4 * hidden + g * hidden + j];
    c_old = c_prev[(long long)b * hidden + j];
  }
  const ForwardLoader<T, W> ld{h_prev, u, batch, hidden, row0, j0};
  tile_gemm<4 * LSTM_UNITS, GEMM_S, GEMM_KT>(ld, hidden, smem);
  if (!owner) return;
  for (int g = 0; g < 4; ++g)
    gate[g] += tile_sum<4 * LSTM_UNITS, GEMM_S>(smem, r, g * LSTM_UNITS + uu);
  lstm_cell(gate, c_old, row, j, hidden, acts, cs, hs);
}

// Time t of lstm_sequence_grad: dh_next = d_next @ u^T for the block's units and rows
// (d_next: the d_projected rows of the step processed before, null on the first step:
// dh_next = dc_next = 0), then the cell's gradient; dc_next is carried in dc_carry (dc0's
// buffer, each element read and written by its owner thread only). The last launch passes
// dh0 and only writes dh0 = d_next @ u^T.
template <typename T, typename W>
struct BackwardLoader {
  const T* d;
  const T* u;
  int batch, hidden, row0, j0;
  __device__ W a(int r, int k) const {
    const int row = row0 + r;
    return row < batch ? W(d[(long long)row * 4 * hidden + k]) : W(0);
  }
  __device__ W b(int k, int c) const {
    const int j = j0 + c;
    return j < hidden ? W(u[(long long)j * 4 * hidden + k]) : W(0);
  }
};

template <typename T, int GEMM_S, int GEMM_KT>
__device__ __forceinline__ void lstm_backward_step(
    const T* d_next, const T* __restrict__ u, const T* __restrict__ d_hs,
    const T* __restrict__ d_cs, const T* __restrict__ cs, const T* __restrict__ acts,
    const T* __restrict__ c_prev, T* dc_carry, T* d_projected, T* dh0, int batch, int hidden,
    int t) {
  typedef TileGemm<LSTM_UNITS, GEMM_S, GEMM_KT> G;
  typedef typename Wide<T>::type W;
  __shared__ Quad<W> smem_quads[(G::SMEM + 3) / 4];
  W* smem = reinterpret_cast<W*>(smem_quads);
  const int row0 = blockIdx.y * LSTM_ROWS, j0 = blockIdx.x * LSTM_UNITS;
  const int r = threadIdx.x / LSTM_UNITS, uu = threadIdx.x % LSTM_UNITS, b = row0 + r, j = j0 + uu;
  const bool owner = threadIdx.x < LSTM_ROWS * LSTM_UNITS && b < batch && j < hidden;
  const long long row = (long long)t * batch + b, at = row * hidden + j,
                  at0 = (long long)b * hidden + j;
  W act[4] = {W(0), W(0), W(0), W(0)}, c = W(0), c_old = W(0), dh = W(0), dc = W(0);
  if (owner && dh0 == nullptr) {  // loaded before the GEMM
    for (int g = 0; g < 4; ++g) act[g] = acts[row * 4 * hidden + g * hidden + j];
    c = cs[at];
    c_old = c_prev[at0];
    dh = d_hs[at];
    dc = W(d_cs[at]) + (d_next != nullptr ? W(dc_carry[at0]) : W(0));
  }
  if (d_next != nullptr) {  // uniform over the block
    const BackwardLoader<T, W> ld{d_next, u, batch, hidden, row0, j0};
    tile_gemm<LSTM_UNITS, GEMM_S, GEMM_KT>(ld, 4 * hidden, smem);
    if (owner) dh += tile_sum<LSTM_UNITS, GEMM_S>(smem, r, uu);
  }
  if (!owner) return;
  if (dh0 != nullptr) {
    dh0[at0] = T(dh);
    return;
  }
  const W i = act[0], f = act[1], g = act[2], o = act[3];
  const W tc = lstm_tanh(c);
  dc += dh * o * (W(1) - tc * tc);
  T* dp = d_projected + row * 4 * hidden + j;
  dp[0] = T(dc * g * i * (W(1) - i));
  dp[hidden] = T(dc * c_old * f * (W(1) - f));
  dp[2 * hidden] = T(dc * i * (W(1) - g * g));
  dp[3 * hidden] = T(dh * tc * o * (W(1) - o));
  dc_carry[at0] = T(dc * f);
}

}  // namespace kiln::cuda

#ifdef KILN_LSTM_FORWARD_STEP
extern "C" __global__ void __launch_bounds__(LSTM_THREADS)
    KILN_LSTM_FORWARD_STEP(const KILN_T* __restrict__ projected, const KILN_T* __restrict__ u,
                           const KILN_T* h_prev, const KILN_T* c_prev, KILN_T* hs, KILN_T* cs,
                           KILN_T* __restrict__ acts, int batch, int hidden, int t) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::lstm_forward_step<KILN_T, KILN_GEMM_S, KILN_GEMM_KT>(projected, u, h_prev, c_prev, hs,
                                                                   cs, acts, batch, hidden, t);
}
#endif

#ifdef KILN_LSTM_BACKWARD_STEP
extern "C" __global__ void __launch_bounds__(LSTM_THREADS)
    KILN_LSTM_BACKWARD_STEP(const KILN_T* d_next, const KILN_T* __restrict__ u,
                            const KILN_T* __restrict__ d_hs, const KILN_T* __restrict__ d_cs,
                            const KILN_T* __restrict__ cs, const KILN_T* __restrict__ acts,
                            const KILN_T* __restrict__ c_prev, KILN_T* dc_carry,
                            KILN_T* d_projected, KILN_T* dh0, int batch, int hidden, int t) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::lstm_backward_step<KILN_T, KILN_GEMM_S, KILN_GEMM_KT>(
      d_next, u, d_hs, d_cs, cs, acts, c_prev, dc_carry, d_projected, dh0, batch, hidden, t);
}
#endif
