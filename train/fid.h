// FID (Fréchet Inception Distance, here on kiln's own classifier): the Fréchet distance
// between Gaussian fits of a trained lenet's 128 penultimate features of real and of
// generated images. Lower is better; 0 for identical feature statistics.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/compile.h"
#include "models/lenet.h"

namespace kiln {

// A Gaussian fit of feature vectors, in double.
struct GaussianFit {
  std::int64_t dim = 0;
  std::vector<double> mean;        // [dim]
  std::vector<double> covariance;  // [dim, dim], row-major, unbiased (divided by N - 1)
};

// Fits the rows of `features` [N, D] (f32 or f64 host tensor, N >= 2).
GaussianFit fit_gaussian(const Tensor& features);

// |mu1 - mu2|^2 + tr(S1 + S2 - 2 (S1 S2)^(1/2)), with tr (S1 S2)^(1/2) taken as the sum of
// the square roots of the eigenvalues of the symmetric sqrt(S1) S2 sqrt(S1) (similar to S1 S2).
double frechet_distance(const GaussianFit& a, const GaussianFit& b);

// FID on the features of a lenet loaded from a kiln checkpoint.
class FidScorer {
 public:
  // kiln::Error naming the file if it is not a lenet checkpoint.
  FidScorer(const std::string& lenet_checkpoint, const CompileOptions& options,
            std::int64_t batch = 500);

  // images [N, 1, 28, 28] with pixels in [-1, 1] (a GAN's range; standardised for the
  // classifier inside the graph) -> features f64 [N, 128].
  Tensor features(const Tensor& images);
  GaussianFit fit(const Tensor& images) { return fit_gaussian(features(images)); }
  double score(const GaussianFit& reference, const Tensor& images) {
    return frechet_distance(reference, fit(images));
  }

 private:
  Program& program_for(std::int64_t count);

  Philox rng_{0};  // initialisation only; the checkpoint overwrites every parameter
  LeNet lenet_;
  CompileOptions options_;
  std::int64_t batch_;
  std::map<std::int64_t, std::unique_ptr<Program>> programs_;  // by batch size
};

}  // namespace kiln
