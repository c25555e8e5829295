// Feed validation with messages that name the input and both types.
#include "backends/feeds.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "graph/op.h"

namespace kiln {

void check_feed_names(const Graph& g, const std::vector<Feed>& feeds) {
  std::vector<std::string> names;
  for (const Node& n : g.nodes())
    if (n.op->id == OpId::input) names.push_back(n.name);
  for (const Feed& f : feeds) {
    KILN_CHECK(std::find(names.begin(), names.end(), f.name) != names.end(),
               "run: '{}' is not an input of this program (inputs: {})", f.name,
               fmt::join(names, ", "));
    KILN_CHECK(f.tensor.defined(), "run: the tensor fed to '{}' is empty", f.name);
  }
}

const Tensor& feed_for(const Node& n, const std::vector<Feed>& feeds) {
  for (const Feed& f : feeds) {
    if (f.name != n.name) continue;
    const TensorType& want = n.outputs[0];
    KILN_CHECK(f.tensor.shape() == want.shape && f.tensor.dtype() == want.dtype,
               "run: input '{}' expects {} but was fed {}{}", n.name, want.str(),
               dtype_name(f.tensor.dtype()), f.tensor.shape().str());
    return f.tensor;
  }
  throw Error(fmt::format("run: input '{}' ({}) was not fed", n.name, n.outputs[0].str()));
}

}  // namespace kiln
