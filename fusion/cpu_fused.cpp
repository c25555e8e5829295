// The CPU evaluator of fused groups: the iteration space is cut into tiles that stay in
// cache; each instruction runs its op's elementwise loop over the tile, so intermediates
// live only in per-thread tile registers (an instruction that is a group output computes
// straight into it). A broadcast input that is one value over a tile (a channel's scale over
// an image) is read as that value; other broadcast inputs are gathered per tile. A reduction
// accumulates per block of tiles and the blocks are combined last, in order.
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>

#include "fusion/cpu_lanes.h"
#include "fusion/cpu_tile_spans.h"
#include "fusion/cpu_tiles.h"
#include "fusion/fused_group.h"
#include "fusion/strided_walk.h"
#include "graph/kernels/transpose_cpu.h"
#include "graph/ops.h"
#include "graph/reduction_rule.h"

namespace kiln {
namespace {

using namespace cpu_tiles;

template <class T>
class TileEvaluator {
 public:
  // `lanes`: g is that view of a group over blocked values (cpu_lanes.h).
  TileEvaluator(const FusedGroup& g, const KernelCall& call, const LaneView* lanes)
      : g_(g),
        gathered_(g.inputs.size() * kTile),
        scattered_(lanes != nullptr ? g.outputs.size() * kTile : 0),
        regs_(g.instrs.size() * kTile),
        output_of_instr_(g.instrs.size(), -1),
        results_(g.instrs.size()),
        steps_(g.instrs.size(), 1),
        cursors_(g.inputs.size()),
        out_cursors_(g.reductions().size()) {
    for (std::size_t k = 0; k < g.inputs.size(); ++k) {
      const FusedInput& in = g.inputs[k];
      walks_.emplace_back(g.shape, in.strides);
      contiguous_.push_back(in.contiguous(g.shape));
      input_base_.push_back(call.inputs[k].template data<T>() + in.offset);
    }
    for (std::size_t o = 0; o < g.outputs.size(); ++o)
      output_base_.push_back(call.outputs[o].template data<T>());
    if constexpr (std::is_same_v<T, float>)
      if (lanes != nullptr) lane_io_.emplace(*lanes, call.inputs, call.outputs);
    for (const FusedInstr& instr : g.instrs)
      rounds_.push_back(std::is_same_v<T, float> && is_low_precision(instr.dtype));
    tile_out_.resize(g.outputs.size());
    // An instruction whose value is a group output computes straight into that output
    // (a node's outputs never share its inputs' buffers: backends/plan.cpp frees a slot
    // only after its last reader), which saves copying it out of the tile registers.
    for (std::size_t o = 0; o < g.outputs.size(); ++o) {
      const Operand& out = g.outputs[o];
      if (out.kind == Operand::Kind::instr &&
          output_of_instr_[static_cast<std::size_t>(out.index)] < 0)
        output_of_instr_[static_cast<std::size_t>(out.index)] = static_cast<int>(o);
    }
  }

  // Evaluates elements [start, start + count) and writes the full-shape outputs.
  void run(std::int64_t start, std::int64_t count) {
    bind_inputs(start, count);
    for (std::size_t o = 0; o < g_.outputs.size(); ++o)
      tile_out_[o] =
          lane_io_ && lane_io_->writes(o) ? &scattered_[o * kTile] : output_base_[o] + start;
    compute(count, true);
    for (std::size_t o = 0; o < g_.outputs.size(); ++o) {
      const Operand& operand_o = g_.outputs[o];
      if (operand_o.kind == Operand::Kind::instr &&
          output_of_instr_[static_cast<std::size_t>(operand_o.index)] == static_cast<int>(o))
        continue;  // computed in place
      const T* src;
      std::int64_t step;
      T literal;
      operand(operand_o, src, step, literal);
      T* dst = tile_out_[o];
      if (step == 1)
        std::memcpy(dst, src, static_cast<std::size_t>(count) * sizeof(T));
      else
        std::fill_n(dst, count, src[0]);
    }
    if constexpr (std::is_same_v<T, float>)
      for (std::size_t o = 0; lane_io_ && o < g_.outputs.size(); ++o)
        if (lane_io_->writes(o)) lane_io_->write(o, start, count, tile_out_[o]);
  }

  // Evaluates channel-major tile t (its images' runs gathered side by side, per-channel
  // inputs bound as scalars) and scatters the outputs back to the images.
  void run_channel(const ChannelTiles& ct, std::int64_t t) {
    const std::int64_t c = ct.channel(t), first = ct.first(t), images = ct.images(t);
    const std::int64_t count = images * ct.run;
    const std::size_t run_bytes = static_cast<std::size_t>(ct.run) * sizeof(T);
    bound_.resize(g_.inputs.size());
    for (std::size_t k = 0; k < g_.inputs.size(); ++k) {
      const FusedInput& in = g_.inputs[k];
      const T* data = input_base_[k];
      if (!contiguous_[k]) {  // a scalar or one value per channel
        bound_[k] = {data + in.strides[ct.axis] * c, 0};
        continue;
      }
      T* buf = &gathered_[k * kTile];
      for (std::int64_t i = 0; i < images; ++i)
        std::memcpy(buf + i * ct.run, data + ct.start(c, first + i), run_bytes);
      bound_[k] = {buf, 1};
    }
    compute(count, false);
    for (std::size_t o = 0; o < g_.outputs.size(); ++o) {
      const T* src;
      std::int64_t step;
      T literal;
      operand(g_.outputs[o], src, step, literal);
      T* out = output_base_[o];
      for (std::int64_t i = 0; i < images; ++i) {
        T* dst = out + ct.start(c, first + i);
        if (step == 1)
          std::memcpy(dst, src + i * ct.run, run_bytes);
        else
          std::fill_n(dst, ct.run, src[0]);
      }
    }
  }

  // The tile's value of reduction r (the whole tile reduces into one output) folded into
  // acc[offset].
  void accumulate_tile(const FusedReduction& r, std::int64_t count, std::int64_t offset,
                       std::vector<double>& acc) {
    const T* src;
    std::int64_t step;
    T literal;
    operand(r.value, src, step, literal);
    const ReductionRule& rule = r.op->reduction;
    double& out = acc[static_cast<std::size_t>(offset)];
    out = rule.combine(out, reduction_fold<T>(rule)(rule.identity, src, count, step));
  }

 private:
  // The instructions over the bound tile of `count` elements; with `in_place`, an
  // instruction that is a group output computes straight into its tile_out_.
  void compute(std::int64_t count, bool in_place) {
    for (std::size_t i = 0; i < g_.instrs.size(); ++i) {
      const FusedInstr& instr = g_.instrs[i];
      const T* args[8];
      std::int64_t steps[8];
      T literals[8];
      bool uniform = true;  // every argument one value over the tile
      for (std::size_t a = 0; a < instr.args.size(); ++a) {
        operand(instr.args[a], args[a], steps[a], literals[a]);
        uniform = uniform && steps[a] == 0;
      }
      const int out = in_place ? output_of_instr_[i] : -1;
      T* output = out >= 0 ? tile_out_[static_cast<std::size_t>(out)] : nullptr;
      // A value that is the same over the tile (a channel's coefficient computed from its
      // per-channel inputs, a broadcast_to of one) is computed once and read as a scalar.
      T* result = uniform || output == nullptr ? &regs_[i * kTile] : output;
      const std::int64_t computed = uniform ? 1 : count;
      results_[i] = result;
      steps_[i] = uniform ? 0 : 1;
      loop_of<T> (*instr.op)(args, steps, result, computed);
      if constexpr (std::is_same_v<T, float>)
        if (rounds_[i]) round_to(instr.dtype, result, computed);
      if (uniform && output != nullptr) std::fill_n(output, count, result[0]);
    }
  }

 public:
  // Asks for a tile's contiguous inputs ahead of its turn (the next tile's, while this one
  // computes): each instruction's loop reads 4 KiB of an input, too short a stream for the
  // hardware prefetcher to run ahead of.
  void prefetch(const TileSpan& tile) const {
    for (std::size_t k = 0; k < g_.inputs.size(); ++k) {
      if (!contiguous_[k]) continue;
      const char* p = reinterpret_cast<const char*>(input_base_[k] + tile.start);
      for (std::size_t b = 0; b < static_cast<std::size_t>(tile.count) * sizeof(T); b += 64)
        __builtin_prefetch(p + b, 0, 2);
    }
  }

  // A lane view's tile of reduction r folded into 16 lanes, one per channel of its block (where
  // the reductions keep no pixel axis: LaneTileIo::reduced_at).
  void fold_lanes(const FusedReduction& r, std::int64_t count, double* lanes) const {
    if constexpr (std::is_same_v<T, float>) {
      const T* src;
      std::int64_t step;
      T literal;
      operand(r.value, src, step, literal);
      const ReductionRule& rule = r.op->reduction;
      if (step == 1) {
        rule.accumulate_rows16_f32(lanes, src, count / kLanes);
        return;
      }
      for (std::int64_t i = 0; i < count; ++i)
        lanes[i % kLanes] = rule.combine(lanes[i % kLanes], static_cast<double>(src[0]));
    }
  }

  std::int64_t reduced_at(std::int64_t start) const {
    if constexpr (std::is_same_v<T, float>) return lane_io_ ? lane_io_->reduced_at(start) : -1;
    return -1;
  }

  // Adds the tile's values of the reduced operand into per-output accumulators; with `rows`,
  // each run is a whole row of one output (row_length says when a group's rows allow it) and
  // its fold goes straight into that output.
  void accumulate(std::size_t index, const FusedReduction& r, std::int64_t start,
                  std::int64_t count, const StridedWalk& out_walk, std::vector<double>& acc,
                  T* rows = nullptr) {
    const T* src;
    std::int64_t step;
    T literal;
    operand(r.value, src, step, literal);
    const ReductionRule& rule = r.op->reduction;
    if constexpr (std::is_same_v<T, float>) {
      const std::int64_t at = reduced_at(start);
      if (at >= 0) {  // into 16 lanes, each combined into its channel's output
        double lanes[kLanes];
        std::fill_n(lanes, kLanes, rule.identity);
        fold_lanes(r, count, lanes);
        rule.accumulate_f64(&acc[static_cast<std::size_t>(at)], lane_io_->reduced_lane_stride(),
                            lanes, kLanes, 1);
        return;
      }
    }
    const auto fold = reduction_fold<T>(rule);
    const auto accumulate_run = reduction_accumulate<T>(rule);
    out_walk.runs(
        start, count, out_cursors_[index],
        [&](std::int64_t pos, std::int64_t length, std::int64_t offset, std::int64_t out_step) {
          if (rows != nullptr) {
            rows[offset] = static_cast<T>(fold(rule.identity, src + pos * step, length, step));
            return;
          }
          double* out = &acc[static_cast<std::size_t>(offset)];
          if (out_step == 0) {  // the whole run reduces into one output
            *out = rule.combine(*out, fold(rule.identity, src + pos * step, length, step));
            return;
          }
          accumulate_run(out, out_step, src + pos * step, length, step);
        });
  }

 private:
  void bind_inputs(std::int64_t start, std::int64_t count) {
    bound_.resize(g_.inputs.size());
    for (std::size_t k = 0; k < g_.inputs.size(); ++k) {
      const FusedInput& in = g_.inputs[k];
      const T* data = input_base_[k];
      if constexpr (std::is_same_v<T, float>)
        if (lane_io_)
          if (const float* read = lane_io_->read(k, start, count, &gathered_[k * kTile])) {
            bound_[k] = {read, 1};
            continue;
          }
      if (contiguous_[k]) {
        bound_[k] = {data + start, 1};
      } else if (in.scalar()) {
        bound_[k] = {data, 0};
      } else {
        T* buf = &gathered_[k * kTile];
        bound_[k] = {buf, 1};
        walks_[k].runs(
            start, count, cursors_[k],
            [&](std::int64_t pos, std::int64_t length, std::int64_t offset, std::int64_t step) {
              if (step == 0 && length == count)  // one value over the whole tile
                bound_[k] = {data + offset, 0};
              else if (step == 0)
                std::fill_n(buf + pos, length, data[offset]);
              else
                for (std::int64_t j = 0; j < length; ++j) buf[pos + j] = data[offset + j * step];
            });
      }
    }
  }

  void operand(const Operand& op, const T*& ptr, std::int64_t& step, T& literal) const {
    switch (op.kind) {
      case Operand::Kind::input:
        ptr = bound_[static_cast<std::size_t>(op.index)].first;
        step = bound_[static_cast<std::size_t>(op.index)].second;
        return;
      case Operand::Kind::instr:
        ptr = results_[static_cast<std::size_t>(op.index)];
        step = steps_[static_cast<std::size_t>(op.index)];
        return;
      case Operand::Kind::constant:
        literal = static_cast<T>(op.constant);
        ptr = &literal;
        step = 0;
        return;
      case Operand::Kind::reduced:  // staged groups run in cpu_staged.cpp
        break;
    }
    KILN_ASSERT(false, "fused group: a reduced operand outside a staged group");
  }

  const FusedGroup& g_;
  AlignedBuffer<T> gathered_, scattered_, regs_;
  std::vector<int> output_of_instr_;  // the output an instruction writes in place, or -1
  std::vector<T*> results_;           // where each instruction's tile went this time
  std::vector<std::int64_t> steps_;   // and its step: 0 where it was one value
  std::vector<StridedWalk> walks_;
  // Where each input's walk and each reduction's output walk stopped (a thread's tiles follow
  // one another, so the next tile's walk steps on from there).
  std::vector<StridedWalk::Cursor> cursors_, out_cursors_;
  std::vector<const T*> input_base_;  // input k's element 0 (its offset applied)
  std::vector<T*> output_base_;
  std::vector<T*> tile_out_;  // where each output of the tile goes (in place, or scattered)
  std::optional<LaneTileIo> lane_io_;  // a lane view's values that are not in place
  std::vector<char> rounds_;           // per instruction: rounded to its 16-bit dtype
  std::vector<char> contiguous_;       // per input: element i read at offset + i
  std::vector<std::pair<const T*, std::int64_t>> bound_;
};

// `lanes`: g is that view of a group over blocked values (cpu_lanes.h).
template <class T>
void run_group(const FusedGroup& g, const KernelCall& call, const LaneView* lanes = nullptr) {
  const std::optional<ChannelTiles> by_channel = lanes != nullptr ? std::nullopt : channel_tiles(g);
  TileSpans spans = lanes != nullptr ? lane_spans(g.shape.numel(), lanes->block) : tile_spans(g);
  const std::vector<const FusedReduction*> reductions = g.reductions();
  const bool reduces = !reductions.empty();
  const std::int64_t reduced = reduces ? g.reduction->type.shape.numel() : 0;
  const std::vector<std::int64_t> out_strides =
      !reduces           ? std::vector<std::int64_t>(g.shape.rank(), 0)
      : lanes != nullptr ? lanes->reduced_strides
                         : row_strides(g.shape, g.reduction->axes);
  const StridedWalk out_walk(g.shape, out_strides);
  const std::int64_t row = reduces && !by_channel && lanes == nullptr ? row_length(out_walk) : 0;
  const bool by_rows = row > 0 && row < kTile;
  if (by_rows && (spans.run % row != 0 || spans.piece % row != 0))
    spans = TileSpans{spans.n, spans.n, std::max<std::int64_t>(1, kTile / row) * row};
  const std::int64_t tiles = by_channel ? by_channel->count() : spans.count();
  // One thread below 16 tiles (64 KiB of f32 per operand): waking a sleeping team costs about
  // as much as it computes. Otherwise the whole team, never a smaller one: libgomp ends the
  // threads a smaller team leaves out and creates them again for the next full one.
  const int threads = tiles < 16 ? 1 : omp_get_max_threads();
  // Channel-major tiles: the reductions' output of a tile's channel is at this stride.
  const std::int64_t channel_stride = by_channel ? out_strides[by_channel->axis] : 0;
  // Reductions accumulate per block of consecutive tiles, blocks summed in order: a count that
  // depends only on the shapes, so the result is the same bits for any number of threads (and
  // for a sibling reduction, the bits it had as a group of its own).
  // Blocks of 8 tiles, up to 64 of them, keep 8-16 threads busy on batch norm's reductions
  // (ResNet's [64, 64, 7, 7] has 196 tiles: 24 blocks; 64-tile blocks gave 3).
  const std::int64_t max_blocks =
      reduces
          ? std::max<std::int64_t>(1, (std::int64_t{1} << 22) / std::max<std::int64_t>(1, reduced))
          : 1;
  // A lane view whose reductions keep the images and the channels (global average pooling):
  // each block of 16 channels of an image owns its 16 outputs, so a thread folds the block's
  // tiles straight into them; a block of tiles is a block of the view.
  const bool by_lane_blocks = reduces && lanes != nullptr && lane_blocks_own_outputs(*lanes);
  const std::int64_t blocks =
      by_lane_blocks ? spans.n / spans.run
      : reduces && !by_rows
          ? std::clamp<std::int64_t>(tiles / 8, 1, std::min<std::int64_t>(64, max_blocks))
          : tiles;
  const std::int64_t tiles_per_block = (tiles + blocks - 1) / blocks;
  // partial[r][block][output]
  std::vector<std::vector<std::vector<double>>> partial;
  for (const FusedReduction* r :
       by_rows || by_lane_blocks ? std::vector<const FusedReduction*>{} : reductions)
    partial.emplace_back(
        static_cast<std::size_t>(blocks),
        std::vector<double>(static_cast<std::size_t>(reduced), r->op->reduction.identity));
#pragma omp parallel num_threads(threads)
  {
    TileEvaluator<T> eval(g, call, lanes);
    std::vector<double> no_partials;  // by_rows: the folds go to the outputs
    std::vector<double> lane_folds(by_lane_blocks ? reductions.size() * kLanes : 0);
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < blocks; ++b) {
      for (std::size_t r = 0; r < reductions.size() && by_lane_blocks; ++r)
        std::fill_n(&lane_folds[r * kLanes], kLanes, reductions[r]->op->reduction.identity);
      for (std::int64_t t = b * tiles_per_block; t < std::min(tiles, (b + 1) * tiles_per_block);
           ++t) {
        if (by_channel) {
          eval.run_channel(*by_channel, t);
          const std::int64_t offset = channel_stride * by_channel->channel(t);
          for (std::size_t r = 0; r < reductions.size(); ++r)
            eval.accumulate_tile(*reductions[r], by_channel->images(t) * by_channel->run, offset,
                                 partial[r][static_cast<std::size_t>(b)]);
          continue;
        }
        const TileSpan tile = spans[t];
        if (t + 1 < tiles) eval.prefetch(spans[t + 1]);
        eval.run(tile.start, tile.count);
        for (std::size_t r = 0; r < reductions.size() && by_lane_blocks; ++r)
          eval.fold_lanes(*reductions[r], tile.count, &lane_folds[r * kLanes]);
        for (std::size_t r = 0; r < reductions.size() && !by_lane_blocks; ++r)
          eval.accumulate(
              r, *reductions[r], tile.start, tile.count, out_walk,
              by_rows ? no_partials : partial[r][static_cast<std::size_t>(b)],
              by_rows ? call.outputs[g.outputs.size() + r].template data<T>() : nullptr);
      }
      if (!by_lane_blocks) continue;
      const std::int64_t at = eval.reduced_at(b * spans.run);
      for (std::size_t r = 0; r < reductions.size(); ++r) {
        T* out = call.outputs[g.outputs.size() + r].template data<T>();
        for (std::int64_t l = 0; l < kLanes; ++l)
          out[at + l * lanes->reduced_strides[4]] = static_cast<T>(lane_folds[r * kLanes + l]);
      }
    }
  }
  for (std::size_t r = 0; r < partial.size(); ++r) {
    const ReductionRule& rule = reductions[r]->op->reduction;
    T* out = call.outputs[g.outputs.size() + r].template data<T>();
    // Each output combines the blocks in order, a block's outputs in one vector loop (not a
    // combine call per output and block, on one thread while the others wait).
    std::vector<double> total(static_cast<std::size_t>(reduced), rule.identity);
    for (const auto& acc : partial[r]) rule.accumulate_f64(total.data(), 1, acc.data(), reduced, 1);
    for (std::int64_t o = 0; o < reduced; ++o)
      out[o] = static_cast<T>(total[static_cast<std::size_t>(o)]);
  }
}

}  // namespace

void run_staged_cpu(const FusedGroup& g, const KernelCall& call);  // cpu_staged.cpp

void FusedGroup::run_cpu(const KernelCall& call) const {
  KILN_ASSERT(call.inputs.size() == inputs.size(), "fused group: {} inputs bound, {} expected",
              call.inputs.size(), inputs.size());
  // bf16 and f16 tensors arrive widened to f32 (backends/cpu/low_precision.h) and the outputs
  // are rounded where they are stored, so the group runs in its compute dtype.
  if (any_channels_last()) {  // those outputs made [B, C, H, W], then transposed into place
    KILN_ASSERT(call.blocked == 0 && !reduction, "fused group {}: channels-last outputs with {}",
                summary(), reduction ? "a reduction" : "blocked values");
    std::vector<Tensor> outs(call.outputs.begin(), call.outputs.end());
    for (std::size_t o = 0; o < outputs.size(); ++o)
      if (output_channels_last(o)) outs[o] = Tensor::empty(shape, call.outputs[o].dtype());
    const KernelCall dense{call.node, call.inputs, outs};
    if (compute == DType::f64)
      run_group<double>(*this, dense);
    else
      run_group<float>(*this, dense);
    for (std::size_t o = 0; o < outputs.size(); ++o)
      if (output_channels_last(o)) kernels::transpose(outs[o], kChannelsLast, call.outputs[o]);
  } else if (call.blocked != 0) {
    KILN_ASSERT(lanes_group(*this), "fused group {}: given blocked values it cannot take",
                summary());
    const LaneView& view = lane_view_of(*this, call.blocked);
    run_group<float>(view.group, call, &view);
  } else if (staged()) {
    run_staged_cpu(*this, call);
  } else if (compute == DType::f64) {
    run_group<double>(*this, call);
  } else {
    run_group<float>(*this, call);
  }
}

}  // namespace kiln
