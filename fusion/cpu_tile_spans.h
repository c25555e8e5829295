// How the CPU evaluator of fused groups (cpu_fused.cpp) cuts a group's iteration space into
// tiles: pieces of per-channel runs, channel-major gathers of short images, or plain tiles.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>

#include "fusion/fused_group.h"
#include "fusion/strided_walk.h"

namespace kiln::cpu_tiles {

struct TileSpan {
  std::int64_t start, count;
};

// The tiles of n elements: runs of `run` elements (n when the tiles need not respect any),
// each cut into pieces of `piece` elements (the last piece of a run may be shorter).
struct TileSpans {
  std::int64_t n, run, piece;
  std::int64_t per_run() const { return (run + piece - 1) / piece; }
  std::int64_t count() const { return n / run * per_run(); }  // run divides n
  TileSpan operator[](std::int64_t t) const {
    const std::int64_t r = t / per_run(), p = t % per_run();
    const std::int64_t start = r * run + p * piece;
    return {start, std::min({piece, run - p * piece, n - start})};
  }
};

// Channel-major tiles of a group over [outer, channels, run] (flattened) whose broadcast
// inputs each read one value per channel and whose reductions keep at most the channel axis
// (batch norm over 7 x 7 or 4 x 4 images): a tile is `per_tile` consecutive images of one
// channel, so per-channel inputs are scalars and a reduction folds the tile into one value.
struct ChannelTiles {
  std::int64_t outer = 0, channels = 0, run = 0, per_tile = 0;
  std::size_t axis = 0;  // the channel axis of the group's shape
  std::int64_t parts() const { return (outer + per_tile - 1) / per_tile; }
  std::int64_t count() const { return channels * parts(); }
  std::int64_t channel(std::int64_t t) const { return t / parts(); }
  std::int64_t first(std::int64_t t) const { return t % parts() * per_tile; }
  std::int64_t images(std::int64_t t) const { return std::min(per_tile, outer - first(t)); }
  // Where image i of the tile's channel starts in the group's element order.
  std::int64_t start(std::int64_t c, std::int64_t image) const {
    return (image * channels + c) * run;
  }
};

// The tile spans of g (see tile_spans in cpu_tile_spans.cpp).
TileSpans tile_spans(const FusedGroup& g);
// Channel-major tiles, where g's shape and inputs allow them, else nullopt.
std::optional<ChannelTiles> channel_tiles(const FusedGroup& g);
// Where each output of the group's reduction is one run of the iteration space, the run's
// length, else 0.
std::int64_t row_length(const StridedWalk& out_walk);

}  // namespace kiln::cpu_tiles
