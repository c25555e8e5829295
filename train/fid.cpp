// Gaussian fits and the Fréchet distance (Eigen, double), and the lenet feature extractor.
#include "train/fid.h"

#include <Eigen/Dense>

#include "graph/nn/functional.h"
#include "train/checkpoint.h"
#include "data/dataset.h"

namespace kiln {
namespace {

using RowMajor = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

Eigen::MatrixXd covariance_of(const GaussianFit& f) {
  KILN_CHECK(f.dim >= 1 && f.mean.size() == static_cast<std::size_t>(f.dim) &&
                 f.covariance.size() == static_cast<std::size_t>(f.dim * f.dim),
             "frechet distance: a Gaussian fit of dim {} has {} means and {} covariance entries",
             f.dim, f.mean.size(), f.covariance.size());
  return Eigen::Map<const RowMajor>(f.covariance.data(), f.dim, f.dim);
}

}  // namespace

GaussianFit fit_gaussian(const Tensor& features) {
  KILN_CHECK(features.shape().rank() == 2 && features.shape()[0] >= 2,
             "fit_gaussian: features must be [N, D] with N >= 2 but are {}",
             features.shape().str());
  features.check_host("fit_gaussian");
  const std::int64_t n = features.shape()[0], d = features.shape()[1];
  const Tensor f64 = features.dtype() == DType::f64 ? features : features.to(DType::f64);
  const Eigen::Map<const RowMajor> x(f64.data<double>(), n, d);
  const Eigen::RowVectorXd mu = x.colwise().mean();
  const RowMajor centred = x.rowwise() - mu;
  const RowMajor cov = (centred.transpose() * centred) / static_cast<double>(n - 1);
  GaussianFit fit{d, std::vector<double>(mu.data(), mu.data() + d),
                  std::vector<double>(cov.data(), cov.data() + d * d)};
  return fit;
}

double frechet_distance(const GaussianFit& a, const GaussianFit& b) {
  KILN_CHECK(a.dim == b.dim, "frechet distance: fits of {} and {} dimensions", a.dim, b.dim);
  const Eigen::MatrixXd s1 = covariance_of(a), s2 = covariance_of(b);
  const Eigen::Map<const Eigen::VectorXd> mu1(a.mean.data(), a.dim), mu2(b.mean.data(), b.dim);
  // Covariances are positive semi-definite; rounding can make tiny eigenvalues negative.
  const Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> e1(s1);
  const Eigen::VectorXd root_values = e1.eigenvalues().cwiseMax(0.0).cwiseSqrt();
  const Eigen::MatrixXd root1 =
      e1.eigenvectors() * root_values.asDiagonal() * e1.eigenvectors().transpose();
  const Eigen::MatrixXd m = root1 * s2 * root1;
  const Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> e2(0.5 * (m + m.transpose()),
                                                          Eigen::EigenvaluesOnly);
  const double trace_root = e2.eigenvalues().cwiseMax(0.0).cwiseSqrt().sum();
  return (mu1 - mu2).squaredNorm() + s1.trace() + s2.trace() - 2.0 * trace_root;
}

FidScorer::FidScorer(const std::string& lenet_checkpoint, const CompileOptions& options,
                     std::int64_t batch)
    : lenet_(rng_), options_(options), batch_(batch) {
  KILN_CHECK(batch >= 1, "FID: batch must be at least 1 (got {})", batch);
  lenet_.set_training(false);
  std::map<std::string, std::string> settings;
  load_checkpoint(lenet_checkpoint, lenet_.parameters(), {}, &settings);
  auto model = settings.find("model");
  KILN_CHECK(model == settings.end() || model->second == "lenet",
             "--fid-classifier {}: a checkpoint of model '{}', not of lenet", lenet_checkpoint,
             model->second);
}

Program& FidScorer::program_for(std::int64_t count) {
  std::unique_ptr<Program>& slot = programs_[count];
  if (!slot) {
    Graph g;
    const Value x = g.input("x", {count, 1, 28, 28});
    const Value standardised = ((x + 1.0) * 0.5 - static_cast<double>(kFashionMnistMean)) *
                               (1.0 / static_cast<double>(kFashionMnistStd));
    g.output("features", lenet_.features(standardised));
    slot = compile(g, options_);
  }
  return *slot;
}

Tensor FidScorer::features(const Tensor& images) {
  const Shape& s = images.shape();
  KILN_CHECK(s.rank() == 4 && s[1] == 1 && s[2] == 28 && s[3] == 28 && s[0] >= 1 &&
                 images.dtype() == DType::f32,
             "FID: images must be f32 [N, 1, 28, 28] but are {}{}", dtype_name(images.dtype()),
             s.str());
  Tensor out = Tensor::empty({s[0], 128}, DType::f64);
  for (std::int64_t begin = 0; begin < s[0]; begin += batch_) {
    const std::int64_t count = std::min(batch_, s[0] - begin);
    const Tensor f =
        program_for(count).run({{"x", images.narrow_rows(begin, count)}}).at("features");
    const float* src = f.data<float>();
    for (std::int64_t i = 0; i < f.numel(); ++i) out.data<double>()[begin * 128 + i] = src[i];
  }
  return out;
}

}  // namespace kiln
