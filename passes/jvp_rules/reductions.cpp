// JVP rules of reductions. Sums and means are linear.
#include "passes/jvp_rules/rules.h"

namespace jvpc::jvp_rules {

void register_reductions(Registry& r) {
  for (const char* op : {"aten::sum", "aten::sum.dim_IntList", "aten::mean", "aten::mean.dim"}) r.add(op, linear_in(0));
}

}  // namespace jvpc::jvp_rules
