// DataParallel::check_replicas with real ranks (forked processes on loopback): identical
// variables pass; one element changed on one rank stops every rank with an error naming
// the variable, the ranks and the step.
#include <doctest/doctest.h>

#include "distributed/data_parallel.h"
#include "tests/dist_test_support.h"

namespace kiln {
namespace {

std::vector<VariablePtr> variables() {
  std::vector<VariablePtr> vars;
  for (int i = 0; i < 3; ++i) {
    Tensor t = Tensor::empty({5, 7}, DType::f32);
    for (std::int64_t k = 0; k < t.numel(); ++k)
      t.data<float>()[k] = static_cast<float>(i * 100 + k) * 0.25f;
    vars.push_back(make_variable("layer" + std::to_string(i) + ".weight", t));
  }
  return vars;
}

// Rank `rank` of 2 checks its variables, after changing one element of layer1 when `differ`
// is this rank. 0: passed; 1: the expected error; anything else: a failed expectation.
int check(int rank, int port, int differ) {
  dist::DataParallel parallel(dist::testing::test_options(rank, 2, port), Device::cpu());
  std::vector<VariablePtr> vars = variables();
  if (rank == differ) vars[1]->value.data<float>()[17] += 1e-6f;
  try {
    parallel.check_replicas(vars, 40);
  } catch (const Error& e) {
    const std::string what = e.what();
    if (what.find("step 40") == std::string::npos ||
        what.find("'layer1.weight' differs between rank 0") == std::string::npos ||
        what.find("and rank 1") == std::string::npos)
      return dist::testing::fail(2, "unexpected message: " + what);
    parallel.finish();
    return 1;
  }
  parallel.finish();
  return 0;
}

}  // namespace

TEST_CASE(
    "dist: check_replicas passes identical variables and names the first that differs on every "
    "rank") {
  for (int differ : {-1, 0, 1}) {
    CAPTURE(differ);
    const auto outcomes = dist::testing::run_children(
        2, [differ](int rank, int port) { return check(rank, port, differ); });
    INFO(dist::testing::describe(outcomes));
    for (const auto& outcome : outcomes) CHECK(outcome.code == (differ < 0 ? 0 : 1));
  }
}

TEST_CASE("dist: the replica checksum sees every byte") {
  Tensor a = Tensor::empty({9}, DType::f64), b = Tensor::empty({9}, DType::f64);
  for (std::int64_t k = 0; k < 9; ++k)
    a.data<double>()[k] = b.data<double>()[k] = static_cast<double>(k);
  CHECK(dist::tensor_checksum(a) == dist::tensor_checksum(b));
  for (std::int64_t k : {0, 4, 8}) {
    b.data<double>()[k] = std::nextafter(b.data<double>()[k], 100.0);
    CHECK(dist::tensor_checksum(a) != dist::tensor_checksum(b));
    b.data<double>()[k] = a.data<double>()[k];
  }
  Tensor odd = Tensor::empty({3}, DType::u8),
         odd2 = Tensor::empty({3}, DType::u8);  // a tail shorter than a word
  for (std::int64_t k = 0; k < 3; ++k)
    odd.data<std::uint8_t>()[k] = odd2.data<std::uint8_t>()[k] = static_cast<std::uint8_t>(k);
  odd2.data<std::uint8_t>()[2] = 7;
  CHECK(dist::tensor_checksum(odd) != dist::tensor_checksum(odd2));
}

}  // namespace kiln
