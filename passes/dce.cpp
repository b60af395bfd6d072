// Dead-code elimination: a reverse walk from the graph outputs.
//
//   %3 = aten::mul.Scalar(%0, 2.)        // read by %4
//   %4 = aten::exp(%3)                   // read by nobody      -> both removed
//   return (%0)
//
// Impure (random) nodes are kept even when unread, so that a program draws as eager code does,
// until the graph is a tangent graph (prune_primal_inputs: fold has taken the draws it reads as
// residuals, and a tangent graph draws nothing). Constant inputs nothing reads are removed;
// primal inputs too when asked (a tangent graph after folding reads none). Linearize's second
// dce, after fold (row 15 of `jvpc linearize --list-passes`), is the one that prunes.
#include "passes/passes.h"

namespace jvpc {

bool dce(Graph& g, bool prune_primal_inputs) {
  bool changed = false;
  auto nodes = g.nodes();
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
    Node* n = *it;
    if (n->impure() && !prune_primal_inputs) continue;
    bool used = false;
    for (Value* o : n->outputs()) used |= o->has_uses();  // returning a value is a use
    if (!used) {
      g.erase(n);
      changed = true;
    }
  }
  changed |= g.erase_inputs_if([&](const Input& in) {
    bool removable = in.role == Role::Constant || (prune_primal_inputs && in.role == Role::Primal);
    return removable && !in.value->has_uses();
  }) > 0;
  return changed;
}

}  // namespace jvpc
