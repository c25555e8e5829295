// Augmentation: the statistics of the draws (flip rate, crop offsets within range and all
// of them used), the augmented pixels against a direct reading of the definition, batches
// that do not depend on how the work is split, and a resumed run equal to an uninterrupted
// one with augmentation on.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "data/dataset.h"
#include "train/loop.h"

namespace kiln {

TEST_CASE("augment_draw: flips half the time, crop offsets cover [-p, p] and stay in it") {
  const Augmentation a{.crop_padding = 4, .flip = true};
  std::int64_t flips = 0;
  std::set<std::int64_t> ys, xs;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const AugmentDraw d = augment_draw(a, 11, 1 + i / 5000, i % 5000);
    flips += d.flip;
    ys.insert(d.dy);
    xs.insert(d.dx);
  }
  CHECK(flips > n * 0.48);
  CHECK(flips < n * 0.52);
  CHECK(ys == std::set<std::int64_t>{-4, -3, -2, -1, 0, 1, 2, 3, 4});
  CHECK(xs == ys);
  // The same (seed, epoch, index) the same draw; another epoch or seed, other draws.
  const AugmentDraw d = augment_draw(a, 11, 3, 17), same = augment_draw(a, 11, 3, 17);
  CHECK((d.dx == same.dx && d.dy == same.dy && d.flip == same.flip));
  int differ = 0;
  for (int i = 0; i < 50; ++i) {
    const AugmentDraw e = augment_draw(a, 11, 4, i), f = augment_draw(a, 12, 3, i);
    const AugmentDraw g = augment_draw(a, 11, 3, i);
    differ += (e.dx != g.dx || e.dy != g.dy) + (f.dx != g.dx || f.dy != g.dy);
  }
  CHECK(differ > 80);
  CHECK(augment_draw({}, 1, 1, 1).flip == false);
  CHECK(augment_draw({.flip = true}, 1, 1, 1).dx == 0);
}

TEST_CASE("augment_image: the crop's offset, the flip and the border, pixel by pixel") {
  const std::int64_t c = 2, h = 5, w = 4;
  std::vector<float> in(static_cast<std::size_t>(c * h * w)), out(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i);
  const Augmentation a{.crop_padding = 2, .flip = true, .fill = {-7.0f, -9.0f}};
  for (const AugmentDraw d : {AugmentDraw{1, -2, false}, AugmentDraw{-1, 2, true},
                              AugmentDraw{0, 0, true}, AugmentDraw{2, 2, false}}) {
    augment_image(in.data(), out.data(), c, h, w, a, d);
    for (std::int64_t k = 0; k < c; ++k)
      for (std::int64_t y = 0; y < h; ++y)
        for (std::int64_t x = 0; x < w; ++x) {
          const std::int64_t cropped_x = d.flip ? w - 1 - x : x;  // flip the crop
          const std::int64_t sy = y + d.dy, sx = cropped_x + d.dx;
          const float want =
              sy < 0 || sy >= h || sx < 0 || sx >= w ? a.fill[k] : in[(k * h + sy) * w + sx];
          CHECK(out[(k * h + y) * w + x] == want);
        }
  }
}

TEST_CASE("Batcher with augmentation: a batch filled in shares equals one filled whole") {
  Dataset d = synthetic_images(64, {3, 8, 8}, 10, 4);
  Batcher batcher(d, 16, true, 9, 0, 1, {.crop_padding = 3, .flip = true, .fill = {0, 0, 0}});
  batcher.start_epoch(2);
  Tensor whole = Tensor::empty({16, 3, 8, 8}, DType::f32), parts = whole.clone();
  Tensor labels = Tensor::empty({16}, DType::i64), part_labels = labels.clone();
  batcher.fill(1, whole, labels);
  for (std::int64_t begin : {10, 0, 3})
    batcher.fill_range(1, begin, begin == 0 ? 3 : (begin == 3 ? 10 : 16), parts, part_labels);
  CHECK(std::memcmp(whole.raw(), parts.raw(), whole.nbytes()) == 0);
  CHECK(std::memcmp(labels.raw(), part_labels.raw(), labels.nbytes()) == 0);
  Batcher plain(d, 16, true, 9);
  plain.start_epoch(2);
  Tensor unaugmented = whole.clone();
  plain.fill(1, unaugmented, labels);
  CHECK(std::memcmp(whole.raw(), unaugmented.raw(), whole.nbytes()) != 0);
}

TEST_CASE("resume with random crops and flips: the same bits as an uninterrupted run (CPU)") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("kiln-augment-resume-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  TrainConfig base;
  base.model = "lenet";
  base.images.synthetic = true;
  base.images.crop_padding = 2;
  base.images.flip = true;
  base.loop.batch_size = 512;  // 8 steps an epoch of the 4096 synthetic images
  base.loop.progress = false;
  base.loop.epochs = 2;
  base.loop.lr_schedule = "constant";
  auto final_params = [](const TrainConfig& c) {
    std::vector<Tensor> out;
    train(c, {}, [&](const TaskState& state) {
      for (const VariablePtr& v : state.parameters) out.push_back(v->value.clone());
      for (const VariablePtr& v : state.buffers) out.push_back(v->value.clone());
    });
    return out;
  };
  TrainConfig whole = base;
  whole.loop.max_steps = 11;  // crosses the epoch boundary
  const std::vector<Tensor> uninterrupted = final_params(whole);
  TrainConfig first = base;
  first.loop.max_steps = 5;
  first.loop.checkpoint = (dir / "part.safetensors").string();
  final_params(first);
  TrainConfig second = whole;
  second.loop.resume = first.loop.checkpoint;
  const std::vector<Tensor> resumed = final_params(second);
  TrainConfig unaugmented = whole;
  unaugmented.images.crop_padding = 0;
  unaugmented.images.flip = false;
  const std::vector<Tensor> plain = final_params(unaugmented);
  std::filesystem::remove_all(dir);
  REQUIRE(resumed.size() == uninterrupted.size());
  for (std::size_t i = 0; i < resumed.size(); ++i) {
    CAPTURE(i);
    CHECK(std::memcmp(resumed[i].raw(), uninterrupted[i].raw(), resumed[i].nbytes()) == 0);
  }
  CHECK(std::memcmp(plain[0].raw(), uninterrupted[0].raw(), plain[0].nbytes()) != 0);
}

}  // namespace kiln
