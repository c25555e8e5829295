// The loader that runs ahead: every batch it hands out is the batcher's for that index,
// bit for bit, whatever its thread count and depth, across epochs, after a jump to a
// resumed position, and with augmentation on; a worker's error reaches the caller.
#include <doctest/doctest.h>

#include <cstring>

#include "data/batch_loader.h"

namespace kiln {
namespace {

// Every batch of epochs 1 and 2, as the batcher fills them on this thread.
std::vector<Tensor> expected_batches(const Dataset& d, const Augmentation& a) {
  Batcher b(d, 8, true, 5, 0, 1, a);
  std::vector<Tensor> out;
  for (std::int64_t epoch : {1, 2}) {
    b.start_epoch(epoch);
    for (std::int64_t i = 0; i < b.batches_per_epoch(); ++i) {
      Tensor images = Tensor::empty({8, 3, 6, 6}, DType::f32),
             labels = Tensor::empty({8}, DType::i64);
      b.fill(i, images, labels);
      out.push_back(images);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("BatchLoader: the same batches for 1 to 5 threads and any depth, with augmentation") {
  const Dataset d = synthetic_images(100, {3, 6, 6}, 10, 2);
  const Augmentation a{.crop_padding = 2, .flip = true, .fill = {0.5f, 0.5f, 0.5f}};
  const std::vector<Tensor> expected = expected_batches(d, a);
  for (const LoaderOptions o :
       {LoaderOptions{1, 1}, LoaderOptions{2, 4}, LoaderOptions{5, 3}, LoaderOptions{3, 20}}) {
    CAPTURE(o.threads);
    CAPTURE(o.depth);
    Batcher b(d, 8, true, 5, 0, 1, a);
    BatchLoader loader(b, {8, 3, 6, 6}, o);
    std::size_t k = 0;
    for (std::int64_t epoch : {1, 2}) {
      loader.start_epoch(epoch);
      for (std::int64_t i = 0; i < b.batches_per_epoch(); ++i, ++k) {
        const BatchLoader::Batch batch = loader.take(i);
        CHECK(batch.wait_seconds >= 0);
        CHECK(std::memcmp(batch.images.raw(), expected[k].raw(), expected[k].nbytes()) == 0);
      }
    }
  }
}

TEST_CASE("BatchLoader: a resumed epoch starts mid-way, batches are fresh tensors") {
  const Dataset d = synthetic_images(100, {3, 6, 6}, 10, 2);
  const std::vector<Tensor> expected = expected_batches(d, {});
  Batcher b(d, 8, true, 5);
  BatchLoader loader(b, {8, 3, 6, 6}, {.threads = 2, .depth = 2});
  loader.start_epoch(2);
  const BatchLoader::Batch seventh = loader.take(7), eighth = loader.take(8);
  CHECK(std::memcmp(seventh.images.raw(), expected[12 + 7].raw(), expected[0].nbytes()) == 0);
  CHECK(std::memcmp(eighth.images.raw(), expected[12 + 8].raw(), expected[0].nbytes()) == 0);
  CHECK(seventh.images.raw() != eighth.images.raw());
  const BatchLoader::Batch again = loader.take(3);  // back again: filled anew
  CHECK(std::memcmp(again.images.raw(), expected[12 + 3].raw(), expected[0].nbytes()) == 0);
  CHECK_THROWS_WITH_AS(loader.take(12), doctest::Contains("outside the epoch's 12 batches"), Error);
}

TEST_CASE("BatchLoader: the defaults come from the core count, a worker's error is rethrown") {
  const LoaderOptions o = resolved_loader_options({});
  CHECK(o.threads >= 1);
  CHECK(o.threads <= 8);
  CHECK(o.depth == 2 * o.threads);
  CHECK(resolved_loader_options({.threads = 3}).depth == 6);
  const Dataset d = synthetic_images(100, {3, 6, 6}, 10, 2);
  Batcher b(d, 8, true, 5);
  BatchLoader loader(b, {8, 3, 5, 5}, {.threads = 2, .depth = 1});  // the wrong image shape
  loader.start_epoch(1);
  CHECK_THROWS_WITH_AS(loader.take(0), doctest::Contains("batch buffers are [8, 3, 5, 5]"), Error);
}

}  // namespace kiln
