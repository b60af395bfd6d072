// JVP rules of reductions. Sums and means are linear, and so is the negative log-likelihood in
// its input (the log-probabilities); its total weight has no tangent.
#include "passes/jvp_rules/rules.h"

namespace jvpc::jvp_rules {

void register_reductions(Registry& r) {
  for (const char* op : {"aten::sum", "aten::sum.dim_IntList", "aten::mean", "aten::mean.dim"}) r.add(op, linear_in(0));
  r.add("aten::nll_loss_forward", [](Ctx& c) -> std::vector<Value*> {
    if (!c.t(0)) return {};
    return {c.reapply(0, c.t(0))[0], nullptr};
  });
}

}  // namespace jvpc::jvp_rules
