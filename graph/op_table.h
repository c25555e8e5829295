// The one op table: every op kiln has, looked up by identity (or by name, for parsing).
#pragma once

#include <string>
#include <vector>

#include "graph/op.h"

namespace kiln {

const OpDef& op_def(OpId id);
const OpDef& op_def(const std::string& name);  // throws kiln::Error for an unknown op
const std::vector<const OpDef*>& all_ops();

}  // namespace kiln
