// The CUDA code generator's internals (fusion/codegen.h is its interface): the Writer that
// turns one fused group into CUDA C, and the text helpers its bodies share. The elementwise
// bodies are in codegen.cpp and codegen_vector.cpp, the reduction bodies in
// codegen_reduction.cpp and codegen_columns.cpp, the horizontal kernel (segments of one kind) in
// codegen_horizontal.cpp.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "fusion/codegen.h"
#include "fusion/strided_walk.h"

namespace kiln::codegen {

// A literal of the compute dtype (NaN and infinities as bit patterns).
std::string literal(double v, DType compute);
// Offset into an input for element `index` (a C expression), from merged dims and strides.
std::string offset_expr(const StridedWalk& walk, const std::string& index);
// Replaces {0}, {1}, ... in an op's snippet with argument expressions.
std::string expand(const std::string& snippet, const std::vector<std::string>& args);

// Storage in generated code: bf16 and f16 are their bit patterns (unsigned short), widened to
// the compute type where they are loaded and rounded to nearest even where they are stored.
std::string storage_name(DType dtype);
std::string widen(DType dtype, const std::string& stored);  // a loaded element as compute
std::string narrow(DType dtype, const std::string& value);  // a compute value to store
// The conversion functions the two above use, emitted once by kernels that store 16 bits.
const char* low_precision_prelude();

// The reduction's start value and its combination of an accumulator with a value, from the
// op's ReductionRule; a NaN value wins where the rule says so, as on the CPU.
std::string reduction_identity(const FusedReduction& red, DType compute);
std::string reduction_combine(const FusedReduction& red, const std::string& acc,
                              const std::string& value);
// A warp's butterfly over `acc` (one statement): each pair of lanes combined in a fixed order,
// so that every lane ends with the same bits; from lane distance `first_mask` down (16: the
// whole warp; 8: each half of it apart, ...).
std::string warp_butterfly(const FusedReduction& red, const std::string& acc, int first_mask = 16);

// Names of reduction r's accumulator, output (or partials) and shared per-warp results: the
// first keeps the plain names, so a group of one reduction reads as it always has.
std::string reduction_name(const char* base, std::size_t r);

// Merged axes of the iteration space, split into kept and reduced ones.
struct ReductionAxes {
  std::vector<std::int64_t> kept_sizes, kept_strides, red_sizes,
      red_strides;                     // strides: dense, in elements
  std::int64_t reduced_count() const;  // the elements each output reduces
};
ReductionAxes split_axes(const Shape& shape, const std::vector<std::int64_t>& axes);

// sum_k ((index / inner_k) % size_k) * stride_k as C code, its constants with `suffix`
// ("LL": 64-bit arithmetic; "": 32-bit, when every index fits, for cheaper divisions).
std::string coordinate_sum(const std::vector<std::int64_t>& sizes,
                           const std::vector<std::int64_t>& strides, const std::string& index,
                           const char* suffix = "LL");

enum class Access { contiguous, scalar, strided };

// The column body's vector form (codegen_columns.cpp): `lanes` adjacent outputs a thread,
// `groups` channel groups a warp; lanes 1: the scalar form, a warp's 32 lanes an output each.
struct ColumnVectors {
  int lanes = 1, groups = 32;
  int tile() const { return lanes * groups; }  // outputs a job covers
  int rows() const { return 32 / groups; }     // rows a warp takes at once
};

// A column reduction's elements (codegen_columns.cpp): `outer` independent blocks of `rows` x
// `n_out`, element (b, r, c) at (b * rows + r) * n_out + c, the rows reduced and the n_out
// adjacent columns kept; output (b, c) is b * n_out + c. outer 1: batch norm's sums over
// [B, H, W, C] (B H W rows); outer B: a global average pool over [B, H, W, C] (H W rows).
struct ColumnShape {
  std::int64_t outer = 0, rows = 0, n_out = 0;  // outer 0: not a column reduction
};

struct InputPlan {
  Access access;
  StridedWalk walk;
  bool vector_load;     // one vector load at offset(i) for lanes i..i+width-1
  bool lane_invariant;  // the same element for lanes i..i+width-1
};
InputPlan plan_input(const FusedGroup& g, const FusedInput& in, int width);

class Writer {
 public:
  explicit Writer(const FusedGroup& g);
  CudaKernelSource generate();
  CudaKernelSource generate_horizontal();  // codegen_horizontal.cpp

 private:
  // Few outputs over many elements would leave most SMs idle with one block per output:
  // aim at about `blocks` blocks, each reducing at least `least` elements (the row body:
  // 2048 and 512, so that a per-channel sum over [64, 32, 14, 14] runs 32 x 25 blocks, not
  // 32 x 7 of 1792 elements each; the column body: 1024 and 2048).
  static std::int64_t reduction_splits(std::int64_t outputs, std::int64_t per_output,
                                       std::int64_t blocks, std::int64_t least);
  std::string parameters(std::int64_t splits, bool finish_in_kernel = false) const;
  // A pointer's element type in generated code: "T" where values are stored as they compute,
  // else the storage (bf16/f16 bit patterns).
  std::string pointer_type(DType stored) const;
  std::string input_parameters() const;  // "const T* __restrict__ in0, ..."
  std::string offsets() const;
  // `lane` selects a vector lane of vector-loaded inputs; with `lane_instrs` also of the
  // instructions' values (r<i><lane>: two lanes computed side by side, compute_pair).
  std::string operand(const Operand& op, const std::string& lane, bool lane_instrs = false) const;
  // `needed`: only the instructions it marks (a staged group's earlier passes; by default
  // pass_instrs_ where that is set).
  std::string compute(const std::string& indent, const std::string& lane,
                      const std::vector<char>* needed = nullptr) const;
  // Lanes `a` and `b` of the instructions side by side, r<i><a> and r<i><b>, each bf16
  // rounding of the two in one cvt.rn.bf16x2 (kiln_round_bf16x2); lane_names then gives a
  // lane's block compute's names, r<i> = r<i><lane>, for those of them that `uses` reads.
  std::string compute_pair(const std::string& indent, const std::string& a,
                           const std::string& b) const;
  std::string lane_names(const std::string& indent, const std::string& lane,
                         const std::string& uses) const;
  // Whether the vector bodies compute their lanes in pairs: bf16 values rounded in f32 groups
  // (KILN_PAIRED_ROUNDING=0: one lane at a time, for measuring).
  bool pairs_rounding() const;
  // Instruction i's expression at `lane` before rounding, and whether it is rounded to its
  // 16-bit dtype (what the unfused op would store).
  std::string instr_value(std::size_t i, const std::string& lane, bool lane_instrs) const;
  bool rounds(std::size_t i) const;
  bool computed(std::size_t i, const std::vector<char>* needed) const;
  bool exact_in_dtype(std::size_t instr) const;
  // Every input's x<k> at element `index`, but those `preloaded` marks (already in scope).
  std::string scalar_loads(const std::string& indent, const std::string& index,
                           const std::vector<char>& preloaded = {}) const;
  std::string hoisted_scalars() const;
  std::string store(std::size_t output, const std::string& target, const std::string& lane) const;

  std::string elementwise_body(int& vector_width) const;
  // codegen_vector.cpp: float4 loads and stores for f32 groups; 16-byte loads of 8 elements
  // (two for f32 values) for groups that read or write bf16 or f16.
  bool vectorizable() const;    // every input loads as a vector or is the same for all lanes
  std::string aligned() const;  // whether every vector-loaded pointer is 16-byte aligned (C)
  std::string alignment_test() const;
  int vector_width() const;
  std::string vector_loop_f32() const;
  std::string vector_loop_wide() const;
  // One iteration at element i (the loops' bodies); `after_lane` adds lines at the end of
  // each lane's block (its arguments: the lane's operand suffix and its number), where its
  // values are in scope.
  // `preloaded` marks inputs whose x<k> values are already in scope (a column job's
  // row-invariant inputs, loaded before its rows).
  using LaneHook = std::function<std::string(const std::string& suffix, int lane)>;
  std::string vector_body_f32(const LaneHook& after_lane = {},
                              const std::vector<char>& preloaded = {}) const;
  // `channels_last_store`: the lines that store a channels-last output o's lanes (o<o>[]),
  // instead of the vector store at element i.
  using OutputHook = std::function<std::string(std::size_t o)>;
  std::string vector_body_wide(const LaneHook& after_lane = {},
                               const std::vector<char>& preloaded = {},
                               const OutputHook& channels_last_store = {}) const;
  // Input k's vector-path values at element `index` (a C expression): x<k> (a float4, or one
  // value where the lanes share it) in f32 groups, x<k>_<lane> in 16-bit ones.
  std::string vector_input_loads(std::size_t k, const std::string& index,
                                 const std::string& indent) const;

  // codegen_horizontal.cpp: the segment's pointers, from the table; its vector path
  std::string segment_pointers() const;
  int horizontal_lanes() const;
  std::string horizontal_vectors(int lanes) const;

 public:
  // Whether a segment of this group with these pointers (offsets applied) takes the vector
  // path, as the group's own kernel would (generate_cuda_horizontal's table, third word).
  bool segment_vectorized(const std::vector<const void*>& inputs,
                          const std::vector<void*>& outputs) const;

 private:
  // codegen_channels_last.cpp: a group with channels-last outputs, a tile of 64 pixels x 64
  // channels at a time through shared memory; sets k's work items.
  std::string channels_last_body(CudaKernelSource& k) const;

  // codegen_stages.cpp: a staged group, a warp per row or (short rows) rows a warp
  std::string staged_body() const;
  std::string stage_pass(int stage) const;
  std::string last_pass() const;
  std::string row_loop(const std::string& body) const;  // a lane's elements of its row

 public:
  // The lanes a staged group's row takes: 32, or for rows of at most 64 elements the fewest
  // (a power of two) that take at most 4 elements each; a warp takes 32 / that many rows
  // (KILN_ROW_LANES=0: 32, for measuring).
  int row_lanes() const;

 private:
  // codegen_reduction.cpp
  // `finish_in_kernel`: the last block to finish an output's split combines its partials
  // (CudaKernelSource::finish_in_kernel).
  std::string reduction_body(std::int64_t splits, bool finish_in_kernel) const;
  std::string last_block_finish() const;
  // Lanes of the row-by-row body's vector loop: the vector width where every input allows it
  // and the reduced axes end with a contiguous run of a multiple of it (per-channel sums over
  // NCHW maps of 8 x 8, 16 x 16, ...; bf16 over 14 x 14 stays scalar: 196 is no multiple of
  // the 8 lanes its inputs were planned for), else 1.
  int reduction_lanes() const;
  // `launched`: the splits are the launch's (a parameter after `partial`), at most `splits`.
  std::string finish_kernel(std::int64_t outputs, std::int64_t splits, int threads,
                            bool launched) const;
  // A rows_finish_only group's row outputs of row `row` (C expressions), from the reductions'
  // final values `finals` and the inputs at `element` (any element of the row).
  std::string row_outputs_code(const std::string& indent, const std::string& row,
                               const std::string& element,
                               const std::vector<std::string>& finals) const;
  std::string store_reduced(const std::string& index, const std::string& value, std::int64_t splits,
                            std::size_t r = 0) const;

  // codegen_columns.cpp: the reduced axes between an outer kept one and an inner kept one
  ColumnShape column_shape() const;  // outer 0 where the column body does not apply
  ColumnVectors column_vectors(std::int64_t n_out) const;  // n_out: ColumnShape's
  // Inputs that are the same in every reduced row (a per-channel scale): a column job loads
  // them once, before its rows, and so does a job of the row-by-row body (its output's
  // elements). None where the switch `off_switch` is 0 (for measuring).
  std::vector<char> row_invariant_inputs(const char* off_switch) const;
  // Fills k's splits, work items, block and body for a column reduction of shape `cs`.
  void column_kernel(const ColumnShape& cs, CudaKernelSource& k, std::string& body) const;
  std::string column_reduction_body(const ColumnShape& cs, std::int64_t splits) const;
  std::string column_vector_body(const ColumnShape& cs, const ColumnVectors& cv,
                                 std::int64_t splits) const;

  // Plans the inputs for `lanes` adjacent elements a thread; whether every input takes them.
  bool plan_lanes(int lanes);
  // A 16-bit column body's lanes a thread: 8 (16-byte loads), or 4 (8-byte) where its
  // row-invariant inputs would hold more than 32 registers at 8 (KILN_COLUMN_LANES=4 or 8
  // forces one, for measuring).
  int column_lanes() const;

  const FusedGroup& g_;
  std::string t_;  // the compute type's name
  std::vector<InputPlan> plans_;
  int lanes_ = 4;  // of the vector path, when there is one
  // A long-row group's instructions that its pass over the elements computes (those the
  // outputs and reductions read); empty for every other group.
  std::vector<char> pass_instrs_;
};

}  // namespace kiln::codegen
