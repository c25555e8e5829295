// Autograd followed by the optimizer, in one graph.
#include "graph/train_step.h"

#include "graph/autograd.h"

namespace kiln {

void append_training_step(Value loss, const std::vector<VariablePtr>& params, Optimizer& optimizer) {
  Graph& g = loss.graph();
  std::vector<Value> wrt;
  for (const VariablePtr& p : params) {
    KILN_CHECK(p->trainable, "training step: '{}' is not trainable", p->name);
    wrt.push_back(g.variable(p));
  }
  optimizer.append_update(g, params, grad(loss, wrt));
  g.output("loss", loss);
}

}  // namespace kiln
