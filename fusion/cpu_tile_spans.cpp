// The tile structures of the CPU evaluator of fused groups (cpu_tile_spans.h).
#include "fusion/cpu_tile_spans.h"

#include "fusion/cpu_tiles.h"
#include "graph/reduction_rule.h"

namespace kiln::cpu_tiles {

// Where every input that is neither read in place nor a single value is the same along the
// group's last `run` elements (a per-channel value over [B, C, H, W]: run = H * W), tiles are
// pieces of those runs, at most kTile each, so that such an input is one value over each
// tile: nothing to gather, and its instructions read a scalar. Runs under kMinRun elements
// keep kTile tiles (more, smaller tiles would cost more per tile than the gathers).
constexpr std::int64_t kMinRun = 256;

TileSpans tile_spans(const FusedGroup& g) {
  const std::int64_t n = g.shape.numel();
  std::int64_t run = n;
  bool broadcasts = false;
  for (const FusedInput& in : g.inputs) {
    if (in.contiguous(g.shape) || in.scalar()) continue;
    broadcasts = true;
    std::int64_t same = 1;  // the trailing elements over which `in` reads one value
    for (std::size_t d = g.shape.rank(); d-- > 0 && in.strides[d] == 0;) same *= g.shape[d];
    run = std::min(run, same);
  }
  if (!broadcasts || run < kMinRun || run >= n) return TileSpans{n, n, kTile};
  const std::int64_t pieces = (run + kTile - 1) / kTile;
  return TileSpans{n, run, (run + pieces - 1) / pieces};
}

// Channel-major tiles where every input is contiguous, a scalar or one value per index of a
// single axis (the channel), every reduction keeps at most that axis, and the elements after
// it make runs of kMinChannelRun to kMaxChannelRun: images are gathered by the tile (at least
// 4 a tile, else nullopt). Gathering costs a copy of each contiguous input and output; it
// saves the per-element work of per-channel values and the reductions' fold of each short
// run. On 7 x 7 images every batch norm group of resnet and dcgan gained (2 threads, the
// build machine: 10-48 %); on 14 x 14 some gained and some lost, within this machine's
// noise, so they keep kTile tiles with gathered per-channel values; under 16 elements (a bias
// along the rows of a [B, N] matrix: runs of 1) a run is too short to pay for its copy (the
// GAN's steps ran 40 % slower). A group without per-channel inputs (sums of products alone)
// keeps kTile tiles: its folds per image cost less than the copies (7 x 7: 12.9 against 14.4
// ms over 55 runs of a micro-benchmark; with a per-channel input, 4 x 4: 34-38 against 65).
constexpr std::int64_t kMinChannelRun = 16, kMaxChannelRun = 64;
std::optional<ChannelTiles> channel_tiles(const FusedGroup& g) {
  const Shape& shape = g.shape;
  const std::size_t rank = shape.rank();
  std::vector<char> varies(rank, 0);  // axes along which a broadcast input or an output moves
  bool broadcasts = false;
  for (const FusedInput& in : g.inputs) {
    if (in.contiguous(shape) || in.scalar()) continue;
    broadcasts = true;
    for (std::size_t d = 0; d < rank; ++d) varies[d] |= shape[d] > 1 && in.strides[d] != 0;
  }
  if (g.reduction) {
    const std::vector<std::int64_t> out = row_strides(shape, g.reduction->axes);
    for (std::size_t d = 0; d < rank; ++d) varies[d] |= shape[d] > 1 && out[d] != 0;
  }
  if (!broadcasts || std::count(varies.begin(), varies.end(), 1) != 1) return std::nullopt;
  ChannelTiles ct;
  ct.axis = static_cast<std::size_t>(std::find(varies.begin(), varies.end(), 1) - varies.begin());
  ct.outer = 1;
  ct.run = 1;
  for (std::size_t d = 0; d < rank; ++d)
    (d < ct.axis ? ct.outer : ct.run) *= d == ct.axis ? 1 : shape[d];
  ct.channels = shape[ct.axis];
  if (ct.run < kMinChannelRun || ct.run >= kMaxChannelRun || ct.outer < 4) return std::nullopt;
  const std::int64_t parts = (ct.outer + kTile / ct.run - 1) / (kTile / ct.run);
  ct.per_tile = (ct.outer + parts - 1) / parts;  // balanced: images * run <= kTile
  return ct;
}

// Where each output of the group's reduction is one run of the iteration space (the kept axes
// lead, the reduced ones trail: a softmax's sums over [R, 96]), the run's length, else 0.
// Tiles of whole such rows then fold each row once, straight into its output: no per-block
// partials to fill and combine (char-lstm's loss groups over [4096, 96] kept 48 blocks of
// 4096 partials each, combined on one thread).
std::int64_t row_length(const StridedWalk& out_walk) {
  if (out_walk.strides.back() != 0) return 0;
  for (std::size_t d = 0; d + 1 < out_walk.strides.size(); ++d)
    if (out_walk.strides[d] == 0) return 0;
  return out_walk.dims.back();
}

}  // namespace kiln::cpu_tiles
