// FID: the Fréchet distance against closed forms, Gaussian fits of samples, and the scorer on
// a lenet's features (zero for a set with itself, growing with a shift).
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>

#include "train/checkpoint.h"
#include "data/dataset.h"
#include "train/fid.h"
#include "tests/support.h"

namespace kiln {
namespace {

GaussianFit fit_of(std::vector<double> mean, std::vector<double> covariance) {
  return {static_cast<std::int64_t>(mean.size()), std::move(mean), std::move(covariance)};
}

// n samples of N(mean, L L^T) as f32 rows [n, 2] (L lower triangular, row-major 2x2).
Tensor gaussian_samples(std::int64_t n, const std::vector<double>& mean,
                        const std::vector<double>& l, std::uint64_t seed) {
  Tensor z = Tensor::empty({n, 2}, DType::f64);
  Philox(seed).fill_normal(z, 0.0, 1.0);
  Tensor x = Tensor::empty({n, 2}, DType::f32);
  for (std::int64_t i = 0; i < n; ++i) {
    const double a = z.at(2 * i), b = z.at(2 * i + 1);
    x.data<float>()[2 * i] = static_cast<float>(mean[0] + l[0] * a);
    x.data<float>()[2 * i + 1] = static_cast<float>(mean[1] + l[2] * a + l[3] * b);
  }
  return x;
}

// A freshly initialised lenet saved as a checkpoint: untrained, but its features are a fixed
// nonlinear map of the images, which is all these tests need.
std::string lenet_checkpoint(const std::filesystem::path& dir) {
  Philox rng(11);
  LeNet lenet(rng);
  const std::string path = (dir / "lenet.safetensors").string();
  save_checkpoint(path, lenet.parameters(), {}, {}, {{"model", "lenet"}});
  return path;
}

Tensor test_images(std::int64_t n) {  // real Fashion-MNIST when installed, in [-1, 1]
  if (std::filesystem::exists(kFashionMnistDir))
    return load_fashion_mnist(kFashionMnistDir, Split::test, PixelScale::symmetric)
        .images.narrow_rows(0, n)
        .clone();
  return test::random_tensor({n, 1, 28, 28}, DType::f32, 8);
}

Tensor shifted(const Tensor& images, float by) {
  Tensor out = images.clone();
  for (std::int64_t i = 0; i < out.numel(); ++i)
    out.data<float>()[i] = std::min(1.0f, out.data<float>()[i] + by);
  return out;
}

}  // namespace

TEST_CASE(
    "frechet distance: diagonal covariances give |mu1 - mu2|^2 + sum (sqrt(a_i) - sqrt(b_i))^2") {
  const GaussianFit a = fit_of({1, 2, 3}, {4, 0, 0, 0, 1, 0, 0, 0, 9});
  const GaussianFit b = fit_of({0, 2, 5}, {1, 0, 0, 0, 1, 0, 0, 0, 16});
  CHECK(frechet_distance(a, b) ==
        doctest::Approx(1 + 4 + (2 - 1) * (2 - 1) + 0 + (3 - 4) * (3 - 4)).epsilon(1e-12));
  CHECK(std::abs(frechet_distance(a, a)) < 1e-12);
}

TEST_CASE(
    "frechet distance: non-commuting 2x2 covariances match tr sqrt(M) = sqrt(tr M + 2 sqrt(det "
    "M))") {
  // S1 S2 is not symmetric; for a 2x2 M with positive eigenvalues, tr sqrt(M) has this closed form.
  const double s1[4] = {2.0, 0.5, 0.5, 1.0}, s2[4] = {1.0, -0.3, -0.3, 3.0};
  const double m00 = s1[0] * s2[0] + s1[1] * s2[2], m11 = s1[2] * s2[1] + s1[3] * s2[3];
  const double det = (s1[0] * s1[3] - s1[1] * s1[2]) * (s2[0] * s2[3] - s2[1] * s2[2]);
  const double trace_root = std::sqrt(m00 + m11 + 2.0 * std::sqrt(det));
  const double expected =
      (0.5 * 0.5 + 1.5 * 1.5) + (s1[0] + s1[3]) + (s2[0] + s2[3]) - 2.0 * trace_root;
  const GaussianFit a = fit_of({0.0, 0.0}, {s1[0], s1[1], s1[2], s1[3]});
  const GaussianFit b = fit_of({0.5, -1.5}, {s2[0], s2[1], s2[2], s2[3]});
  CHECK(frechet_distance(a, b) == doctest::Approx(expected).epsilon(1e-10));
  CHECK(frechet_distance(b, a) == doctest::Approx(expected).epsilon(1e-10));  // symmetric
}

TEST_CASE(
    "Gaussian fits of samples recover mean and covariance, and their FID approaches the closed "
    "form") {
  const std::vector<double> l1 = {1.0, 0.0, 0.6, 0.8}, l2 = {2.0, 0.0, -0.5, 0.5};  // S = L L^T
  const GaussianFit a = fit_gaussian(gaussian_samples(50000, {1.0, -1.0}, l1, 1));
  const GaussianFit b = fit_gaussian(gaussian_samples(50000, {0.0, 0.5}, l2, 2));
  CHECK(a.mean[0] == doctest::Approx(1.0).epsilon(0.02));
  CHECK(a.covariance[0] == doctest::Approx(1.0).epsilon(0.03));
  CHECK(a.covariance[1] == doctest::Approx(0.6).epsilon(0.05));
  CHECK(a.covariance[3] == doctest::Approx(1.0).epsilon(0.03));
  const GaussianFit exact_a = fit_of({1.0, -1.0}, {1.0, 0.6, 0.6, 1.0});
  const GaussianFit exact_b = fit_of({0.0, 0.5}, {4.0, -1.0, -1.0, 0.5});
  CHECK(frechet_distance(a, b) ==
        doctest::Approx(frechet_distance(exact_a, exact_b)).epsilon(0.03));
}

TEST_CASE("bad Gaussian fits are rejected with their sizes") {
  CHECK_THROWS_WITH_AS(fit_gaussian(Tensor::zeros({1, 4}, DType::f32)), doctest::Contains("N >= 2"),
                       Error);
  CHECK_THROWS_WITH_AS(frechet_distance(fit_of({0, 0}, {1, 0, 0, 1}), fit_of({0}, {1})),
                       doctest::Contains("fits of 2 and 1 dimensions"), Error);
  CHECK_THROWS_WITH_AS(frechet_distance(fit_of({0, 0}, {1, 0, 0}), fit_of({0, 0}, {1, 0, 0, 1})),
                       doctest::Contains("3 covariance entries"), Error);
}

TEST_CASE("FID on lenet features: ~0 for a set with itself, growing with a shift of the images") {
  const test::TempDir dir("kiln-fid-test");
  FidScorer scorer(lenet_checkpoint(dir.path), {}, 200);
  const Tensor images = test_images(600);  // three batches: 200 per program run
  const Tensor features = scorer.features(images);
  REQUIRE(features.shape() == Shape{600, 128});
  const GaussianFit reference = fit_gaussian(features);
  double trace = 0;
  for (std::int64_t i = 0; i < 128; ++i)
    trace += reference.covariance[static_cast<std::size_t>(i * 129)];
  REQUIRE(trace > 0);
  const double self = scorer.score(reference, images);
  const double small = scorer.score(reference, shifted(images, 0.1f));
  const double large = scorer.score(reference, shifted(images, 0.4f));
  MESSAGE("FID self " << self << ", shift 0.1 " << small << ", shift 0.4 " << large << " (trace "
                      << trace << ")");
  CHECK(std::abs(self) < 1e-6 * trace);
  CHECK(small > 1e-3 * trace);
  CHECK(large > 2 * small);
}

TEST_CASE("FidScorer rejects a checkpoint that is not of a lenet, naming the file") {
  const test::TempDir dir("kiln-fid-bad");
  const std::string path = (dir.path / "other.safetensors").string();
  save_checkpoint(path, {make_variable("weight", Tensor::zeros({2}, DType::f32))}, {}, {},
                  {{"model", "gan"}});
  CHECK_THROWS_WITH_AS(FidScorer(path, {}), doctest::Contains(path.c_str()), Error);
}

}  // namespace kiln
