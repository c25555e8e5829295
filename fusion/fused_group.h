// The fused-group IR: what one fused kernel computes. Both code generators (the CPU
// evaluator and CUDA C) read it. A group iterates over one shape; its inputs are read
// in place at broadcast strides from an offset (slices of a value, such as an LSTM's
// four gates of one GEMM output, need no copy); its instructions are elementwise ops in order; its
// outputs are full-shape values and, optionally, reductions of values at the end (over the
// same axes). A staged group (fusion/stages.h) also holds reductions that read earlier ones:
// reduction r's value at an element's row is an operand (Operand::reduced), each reduction
// runs in the pass over the row its stage names, and values of one per row are outputs too.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "graph/op.h"

namespace kiln {

// An operand of an instruction or an output.
struct Operand {
  // reduced: reduction `index` of FusedGroup::reductions() at this element's row, as stored
  // (rounded to its dtype); only in staged groups, read by instructions of later stages.
  enum class Kind { input, instr, constant, reduced };
  Kind kind = Kind::input;
  int index = 0;          // input, instruction or reduction index
  double constant = 0.0;  // Kind::constant: a folded fill value
  static Operand input(int i) { return {Kind::input, i, 0.0}; }
  static Operand instr(int i) { return {Kind::instr, i, 0.0}; }
  static Operand literal(double v) { return {Kind::constant, 0, v}; }
  static Operand reduced(int r) { return {Kind::reduced, r, 0.0}; }
};

struct FusedInput {
  TensorType type;                    // the outer value's own type
  std::vector<std::int64_t> strides;  // element strides over the group's shape (0: broadcast)
  std::int64_t offset = 0;            // element of `type` read at index 0 (a slice read in place)
  bool contiguous(const Shape& group_shape) const;             // reads element i at offset + i
  bool scalar() const;                                         // every stride is 0
  std::int64_t elements_read(const Shape& group_shape) const;  // distinct elements the group reads
};

struct FusedInstr {
  const OpDef* op = nullptr;  // an elementwise op of the table
  std::vector<Operand> args;
  // The value's dtype: computed in the group's compute dtype, rounded to it in registers when
  // it is bf16 or f16 (as the unfused op would store it), so fusion never changes a result.
  DType dtype = DType::f32;
};

// A reduction (sum or max) of one operand over axes of the group's shape.
struct FusedReduction {
  const OpDef* op = nullptr;  // a reduction: its ReductionRule says how it combines
  Operand value;
  std::vector<std::int64_t> axes;  // sorted
  bool keepdims = false;
  TensorType type;  // the reduced output's type
  int stage = 0;    // staged groups: the pass over each row that computes it (0 first)
};

// A staged group's value of one per row (batch norm's mean, a reduced-shape group that was
// merged in): stored once per row after every pass, of its own shape (that of the reductions'
// outputs, with or without their kept 1s).
struct RowOutput {
  Operand value;  // the same at every element of a row
  TensorType type;
};

namespace cpu_tiles {
struct LaneView;
}

// The views of a group over blocked values that its CPU runs made (fusion/cpu_lanes.h), by
// KernelCall::blocked; a copy of the group starts without any.
struct LaneViewCache {
  LaneViewCache() = default;
  LaneViewCache(const LaneViewCache&) {}
  LaneViewCache& operator=(const LaneViewCache&) { return *this; }
  std::mutex mutex;
  std::vector<std::pair<std::uint32_t, std::shared_ptr<const cpu_tiles::LaneView>>> views;
};

class FusedGroup final : public NodeBody {
 public:
  Shape shape;  // the iteration space
  // The register type: f64 for a group of f64 values, else f32 (f32, bf16 and f16 values mix
  // in one group: loads widen, stores round to nearest even).
  DType compute = DType::f32;
  std::vector<FusedInput> inputs;  // node inputs, in order
  std::vector<FusedInstr> instrs;
  std::vector<Operand> outputs;  // node outputs 0..k-1, each of the group's shape
  // Per output (empty: none), whether it is stored channels-last: [B, H, W, C] for a group over
  // [B, C, H, W], element (b, c, h, w) at ((b H + h) W + w) C + c. Only groups without
  // reductions have them (fusion/channels_last_outputs.h folds a transpose into its producer).
  std::vector<char> channels_last;
  bool output_channels_last(std::size_t o) const {
    return o < channels_last.size() && channels_last[o] != 0;
  }
  bool any_channels_last() const;
  std::optional<FusedReduction> reduction;  // node output k, when present
  // Node outputs k+1, ...: more reductions over the same axes to the same outputs as
  // `reduction` (batch norm's backward sums), computed in the same pass over the shape.
  std::vector<FusedReduction> more_reductions;
  // `reduction`, then `more_reductions` (empty without a reduction).
  std::vector<const FusedReduction*> reductions() const;
  // Node outputs after the reductions (staged groups only).
  std::vector<RowOutput> row_outputs;
  // Whether some value reads a reduction (Operand::reduced) or there are row outputs.
  // Every reduction of a staged group reduces the same axes, of which at most one run of
  // adjacent axes is kept (a row is one index of it).
  bool staged() const;
  int stage_count() const;  // 1 + the last reduction's stage; 0 without reductions
  // Per instruction, whether one of `values` reads it (directly or through instructions).
  std::vector<char> instrs_read_by(std::vector<Operand> values) const;
  // Per instruction, whether pass `stage` computes it: the reductions of that stage read it.
  std::vector<char> stage_instrs(int stage) const;
  // Per instruction, whether a row output reads it.
  std::vector<char> row_output_instrs() const;
  // Whether the reductions are read by the row outputs only (one stage, and no elementwise
  // output or reduction reads a reduced value): the row outputs can then be computed once each
  // row's reductions are final, after an ordinary reduction (the GPU's finisher: batch norm's
  // per-channel statistics of long rows, codegen_reduction.cpp).
  bool rows_finish_only() const;

  std::vector<TensorType> infer(std::span<const TensorType> inputs) const override;
  void run_cpu(const KernelCall& call) const override;
  // The inputs and outputs run_cpu can take blocked (fusion/cpu_lanes.h).
  std::uint32_t cpu_blocked(std::span<const TensorType> inputs) const override;
  mutable LaneViewCache cpu_lane_views;
  std::string summary() const override;

  DType operand_dtype(const Operand& op) const;  // a constant has the compute dtype
  bool low_precision() const;                    // some input or output is bf16 or f16

  // Bytes the group reads (its inputs once each) and writes (its outputs).
  std::int64_t bytes_read() const;
  std::int64_t bytes_written() const;
  // Bytes the unfused ops would move for the same work (each op reads its inputs and
  // writes its output); the difference is what fusion saves.
  std::int64_t unfused_bytes() const;
};

// A node's fused group, or nullptr for any other node.
const FusedGroup* fused_group_of(const Node& n);

// Strides over `shape` at which a reduction over `axes` is read at each element's row: dense
// over the kept axes in order (the reduced output's layout, with or without keepdims), 0 on
// the reduced ones.
std::vector<std::int64_t> row_strides(const Shape& shape, const std::vector<std::int64_t>& axes);

}  // namespace kiln
