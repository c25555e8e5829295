// The divergence checks of the training loop.
#include "train/divergence.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "backends/host_copy.h"

namespace kiln {
namespace {

constexpr const char* kAdvice =
    "(lower the learning rate, or clip gradients with --clip-grad-norm)";

// The index of the first element of `t` that is NaN or Inf, or -1.
std::int64_t first_non_finite(const Tensor& t) {
  if (!is_floating(t.dtype())) return -1;
  const Tensor host = to_host(t);
  for (std::int64_t i = 0; i < host.numel(); ++i)
    if (!std::isfinite(host.at(i))) return i;
  return -1;
}

}  // namespace

void DivergenceCheck::check_step(const StepValues& v, std::int64_t epoch, std::int64_t step) {
  std::string values;
  bool finite = std::isfinite(v.loss);
  for (const auto& [name, value] : v.extras) {
    finite = finite && std::isfinite(value);
    values += fmt::format(", {} {}", name, value);
  }
  KILN_CHECK(finite, "training diverged: loss is {}{} at epoch {} step {} {}", v.loss, values,
             epoch, step, kAdvice);
  if (!first_loss_) first_loss_ = v.loss;
  const double limit = kExplodedLossFactor * std::max(1.0, std::abs(*first_loss_));
  KILN_CHECK(std::abs(v.loss) <= limit,
             "training diverged: loss is {:.6g} at epoch {} step {}, more than {:g} times the "
             "first step's {:.6g} {}",
             v.loss, epoch, step, kExplodedLossFactor, *first_loss_, kAdvice);
}

void DivergenceCheck::check_evaluation(const Values& values, std::int64_t epoch) {
  for (const auto& [name, value] : values)
    KILN_CHECK(std::isfinite(value), "training diverged: {} is {} after epoch {} {}", name, value,
               epoch, kAdvice);
}

void DivergenceCheck::check_state(const TaskState& state, const std::string& when,
                                  const std::string& consequence) {
  for (const auto* part : {&state.parameters, &state.optimizer_state, &state.buffers})
    for (const VariablePtr& var : *part) {
      const std::int64_t at = first_non_finite(var->value);
      if (at < 0) continue;
      throw Error(fmt::format("training diverged: {} holds {} (element {} of {}) {}{} {}",
                              var->name, to_host(var->value).at(at), at, var->value.shape().str(),
                              when, consequence, kAdvice));
    }
}

}  // namespace kiln
