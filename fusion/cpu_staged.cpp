// The CPU evaluator of staged groups (fusion/stages.h). Blocks of whole rows are each one
// thread's; a block passes over its rows once per stage, accumulating that stage's reductions
// row by row (in element order: the same bits for any thread count), stores them, and makes
// the outputs in a last pass, so a block's rows stay in the thread's cache between passes.
// Tiles gather a row's elements (its runs between the reduced axes) into registers; where a
// tile is one row, the values that are the same across the row (its reductions, a per-channel
// scale and what is computed from them alone) are computed once, not per element.
#include <omp.h>

#include <cstring>
#include <limits>

#include "fusion/cpu_tiles.h"
#include "fusion/strided_walk.h"
#include "graph/reduction_rule.h"

namespace kiln {
namespace {

using namespace cpu_tiles;

// Rows of at least this many elements get tiles of one row each.
constexpr std::int64_t kRowTile = 512;
// A thread's block of rows: about this many elements (whole rows).
constexpr std::int64_t kBlockElements = 16384;

// The elements around the one run of kept axes: `outer` reduced elements before it, `rows`
// kept, `inner` reduced after; element j of outer index o in row r is (o * rows + r) * inner + j.
struct RowLayout {
  std::int64_t outer = 1, rows = 1, inner = 1;
};

RowLayout row_layout(const FusedGroup& g) {
  RowLayout l;
  const std::vector<std::int64_t>& axes = g.reduction->axes;
  int part = 0;  // 0 before the kept run, 1 in it, 2 after
  for (std::size_t d = 0; d < g.shape.rank(); ++d) {
    if (g.shape[d] == 1) continue;
    const bool kept =
        std::find(axes.begin(), axes.end(), static_cast<std::int64_t>(d)) == axes.end();
    if (kept)
      part = 1;
    else if (part == 1)
      part = 2;
    (part == 0 ? l.outer : part == 1 ? l.rows : l.inner) *= g.shape[d];
  }
  return l;
}

struct Run {
  std::int64_t element, position, length;  // group elements [element, +length) at tile position
};
struct Segment {
  std::int64_t row, begin, end;  // tile positions [begin, end) are elements of `row`
};
struct Tile {
  std::vector<Run> runs;
  std::vector<Segment> segments;
  std::int64_t count = 0;
  bool one_row = false;
};

// The tiles of rows [r0, r1): one row's elements in chunks of kTile when rows are long, else
// whole rows together.
std::vector<Tile> tiles_of(const RowLayout& l, std::int64_t r0, std::int64_t r1) {
  std::vector<Tile> tiles;
  const std::int64_t per_row = l.outer * l.inner;
  if (per_row >= kRowTile) {
    for (std::int64_t r = r0; r < r1; ++r)
      for (std::int64_t e0 = 0; e0 < per_row; e0 += kTile) {
        Tile t;
        t.one_row = true;
        t.count = std::min(kTile, per_row - e0);
        t.segments.push_back({r, 0, t.count});
        for (std::int64_t e = e0; e < e0 + t.count;) {
          const std::int64_t o = e / l.inner, j = e % l.inner;
          const std::int64_t length = std::min(l.inner - j, e0 + t.count - e);
          t.runs.push_back({(o * l.rows + r) * l.inner + j, e - e0, length});
          e += length;
        }
        tiles.push_back(std::move(t));
      }
    return tiles;
  }
  const std::int64_t rows_per_tile = std::max<std::int64_t>(1, kTile / per_row);
  for (std::int64_t ra = r0; ra < r1; ra += rows_per_tile) {
    Tile t;
    for (std::int64_t r = ra; r < std::min(r1, ra + rows_per_tile); ++r) {
      const std::int64_t begin = t.count;
      for (std::int64_t o = 0; o < l.outer; ++o) {
        t.runs.push_back({(o * l.rows + r) * l.inner, t.count, l.inner});
        t.count += l.inner;
      }
      t.segments.push_back({r, begin, t.count});
    }
    tiles.push_back(std::move(t));
  }
  return tiles;
}

template <class T>
class RowEvaluator {
 public:
  RowEvaluator(const FusedGroup& g, const KernelCall& call)
      : g_(g),
        call_(call),
        reductions_(g.reductions()),
        gathered_(g.inputs.size() * kTile),
        regs_(g.instrs.size() * kTile),
        reduced_(reductions_.size() * kTile),
        results_(g.instrs.size()),
        steps_(g.instrs.size(), 1),
        bound_(g.inputs.size()),
        bound_reduced_(reductions_.size()) {
    const std::vector<std::int64_t>& axes = g.reduction->axes;
    for (const FusedInput& in : g.inputs) {
      walks_.emplace_back(g.shape, in.strides);
      bool invariant = true;  // the same element across each row
      for (std::int64_t a : axes)
        invariant = invariant && (g.shape[static_cast<std::size_t>(a)] == 1 ||
                                  in.strides[static_cast<std::size_t>(a)] == 0);
      input_invariant_.push_back(invariant);
    }
    for (const FusedInstr& instr : g.instrs) {
      bool invariant = true;
      for (const Operand& a : instr.args) invariant = invariant && operand_invariant(a);
      instr_invariant_.push_back(invariant);
    }
  }

  // Computes the instructions `needed` marks (all when null) over the tile, reading the
  // reductions of the stages before `stage`.
  void run(const Tile& t, const std::vector<char>* needed, int stage) {
    bind_inputs(t);
    bind_reduced(t, stage);
    for (std::size_t i = 0; i < g_.instrs.size(); ++i) {
      if (needed != nullptr && !(*needed)[i]) continue;
      const FusedInstr& instr = g_.instrs[i];
      const T* args[8];
      std::int64_t steps[8];
      T literals[8];
      for (std::size_t a = 0; a < instr.args.size(); ++a)
        operand(instr.args[a], args[a], steps[a], literals[a]);
      const bool once = t.one_row && instr_invariant_[i];
      const std::int64_t count = once ? 1 : t.count;
      T* result = &regs_[i * kTile];
      results_[i] = result;
      steps_[i] = once ? 0 : 1;
      loop_of<T> (*instr.op)(args, steps, result, count);
      if constexpr (std::is_same_v<T, float>)
        if (is_low_precision(instr.dtype)) round_to(instr.dtype, result, count);
    }
  }

  void accumulate(const FusedReduction& r, const Tile& t, std::vector<double>& acc) const {
    const T* src;
    std::int64_t step;
    T literal;
    operand(r.value, src, step, literal);
    const ReductionRule& rule = r.op->reduction;
    const auto fold = reduction_fold<T>(rule);
    for (const Segment& s : t.segments) {
      double& out = acc[static_cast<std::size_t>(s.row)];
      out = rule.combine(out, fold(rule.identity, src + s.begin * step, s.end - s.begin, step));
    }
  }

  void store(const Tile& t) const {
    for (std::size_t o = 0; o < g_.outputs.size(); ++o) {
      const T* src;
      std::int64_t step;
      T literal;
      operand(g_.outputs[o], src, step, literal);
      T* dst = call_.outputs[o].template data<T>();
      for (const Run& run : t.runs)
        if (step == 1)
          std::memcpy(dst + run.element, src + run.position,
                      static_cast<std::size_t>(run.length) * sizeof(T));
        else
          std::fill_n(dst + run.element, run.length, src[0]);
    }
    const std::size_t first = g_.outputs.size() + reductions_.size();
    for (std::size_t w = 0; w < g_.row_outputs.size(); ++w) {
      const T* src;
      std::int64_t step;
      T literal;
      operand(g_.row_outputs[w].value, src, step, literal);
      T* dst = call_.outputs[first + w].template data<T>();
      for (const Segment& s : t.segments) dst[s.row] = src[s.begin * step];
    }
  }

 private:
  bool operand_invariant(const Operand& a) const {
    switch (a.kind) {
      case Operand::Kind::input:
        return input_invariant_[static_cast<std::size_t>(a.index)];
      case Operand::Kind::instr:
        return instr_invariant_[static_cast<std::size_t>(a.index)];
      case Operand::Kind::constant:
      case Operand::Kind::reduced:
        break;
    }
    return true;
  }

  void bind_inputs(const Tile& t) {
    for (std::size_t k = 0; k < g_.inputs.size(); ++k) {
      const FusedInput& in = g_.inputs[k];
      const T* data = call_.inputs[k].template data<T>() + in.offset;
      if (in.scalar() || (t.one_row && input_invariant_[k])) {
        std::int64_t at = 0;  // the element the row reads
        walks_[k].runs(
            t.runs[0].element, 1,
            [&](std::int64_t, std::int64_t, std::int64_t offset, std::int64_t) { at = offset; });
        bound_[k] = {data + at, 0};
        continue;
      }
      T* buf = &gathered_[k * kTile];
      const bool contiguous = in.contiguous(g_.shape);
      for (const Run& run : t.runs) {
        if (contiguous) {
          std::memcpy(buf + run.position, data + run.element,
                      static_cast<std::size_t>(run.length) * sizeof(T));
          continue;
        }
        walks_[k].runs(
            run.element, run.length,
            [&](std::int64_t pos, std::int64_t length, std::int64_t offset, std::int64_t step) {
              T* to = buf + run.position + pos;
              if (step == 0)
                std::fill_n(to, length, data[offset]);
              else
                for (std::int64_t j = 0; j < length; ++j) to[j] = data[offset + j * step];
            });
      }
      bound_[k] = {buf, 1};
    }
  }

  // Reductions of earlier stages, from the node outputs they were stored to.
  void bind_reduced(const Tile& t, int stage) {
    for (std::size_t r = 0; r < reductions_.size(); ++r) {
      if (reductions_[r]->stage >= stage) continue;
      const T* data = call_.outputs[g_.outputs.size() + r].template data<T>();
      if (t.one_row) {
        bound_reduced_[r] = {data + t.segments[0].row, 0};
        continue;
      }
      T* buf = &reduced_[r * kTile];
      for (const Segment& s : t.segments) std::fill(buf + s.begin, buf + s.end, data[s.row]);
      bound_reduced_[r] = {buf, 1};
    }
  }

  void operand(const Operand& op, const T*& ptr, std::int64_t& step, T& literal) const {
    switch (op.kind) {
      case Operand::Kind::input:
        std::tie(ptr, step) = bound_[static_cast<std::size_t>(op.index)];
        return;
      case Operand::Kind::instr:
        ptr = results_[static_cast<std::size_t>(op.index)];
        step = steps_[static_cast<std::size_t>(op.index)];
        return;
      case Operand::Kind::reduced:
        std::tie(ptr, step) = bound_reduced_[static_cast<std::size_t>(op.index)];
        return;
      case Operand::Kind::constant:
        literal = static_cast<T>(op.constant);
        ptr = &literal;
        step = 0;
        return;
    }
  }

  const FusedGroup& g_;
  const KernelCall& call_;
  std::vector<const FusedReduction*> reductions_;
  AlignedBuffer<T> gathered_, regs_, reduced_;
  std::vector<T*> results_;
  std::vector<std::int64_t> steps_;  // 0: the instruction's tile is one value (a row's)
  std::vector<std::pair<const T*, std::int64_t>> bound_, bound_reduced_;
  std::vector<StridedWalk> walks_;
  std::vector<char> input_invariant_, instr_invariant_;
};

template <class T>
void run_staged(const FusedGroup& g, const KernelCall& call) {
  const RowLayout l = row_layout(g);
  const std::int64_t per_row = l.outer * l.inner;
  const std::int64_t rows_per_block =
      std::clamp<std::int64_t>((kBlockElements + per_row - 1) / per_row, 1, l.rows);
  const std::int64_t blocks = (l.rows + rows_per_block - 1) / rows_per_block;
  const int threads = blocks >= 2 && g.shape.numel() >= 16 * kTile ? omp_get_max_threads() : 1;
  const std::vector<const FusedReduction*> reductions = g.reductions();
  std::vector<std::vector<char>> needed;
  for (int s = 0; s < g.stage_count(); ++s) needed.push_back(g.stage_instrs(s));
  std::vector<std::vector<double>> acc;
  for (const FusedReduction* r : reductions)
    acc.emplace_back(static_cast<std::size_t>(l.rows), r->op->reduction.identity);
  const bool last_pass = !g.outputs.empty() || !g.row_outputs.empty();
#pragma omp parallel num_threads(threads)
  {
    RowEvaluator<T> eval(g, call);
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::int64_t r0 = b * rows_per_block, r1 = std::min(l.rows, r0 + rows_per_block);
      const std::vector<Tile> tiles = tiles_of(l, r0, r1);
      for (int s = 0; s < g.stage_count(); ++s) {
        for (const Tile& t : tiles) {
          eval.run(t, &needed[static_cast<std::size_t>(s)], s);
          for (std::size_t r = 0; r < reductions.size(); ++r)
            if (reductions[r]->stage == s) eval.accumulate(*reductions[r], t, acc[r]);
        }
        for (std::size_t r = 0; r < reductions.size(); ++r) {
          if (reductions[r]->stage != s) continue;
          T* out = call.outputs[g.outputs.size() + r].template data<T>();
          for (std::int64_t row = r0; row < r1; ++row) {
            T v = static_cast<T>(acc[r][static_cast<std::size_t>(row)]);
            if constexpr (std::is_same_v<T, float>)
              if (is_low_precision(reductions[r]->type.dtype))
                round_to(reductions[r]->type.dtype, &v, 1);
            out[row] = v;
          }
        }
      }
      if (last_pass)
        for (const Tile& t : tiles) {
          eval.run(t, nullptr, std::numeric_limits<int>::max());
          eval.store(t);
        }
    }
  }
}

}  // namespace

void run_staged_cpu(const FusedGroup& g, const KernelCall& call) {
  if (g.compute == DType::f64)
    run_staged<double>(g, call);
  else
    run_staged<float>(g, call);
}

}  // namespace kiln
