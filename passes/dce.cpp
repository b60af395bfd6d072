// Dead-code elimination: a reverse walk from the graph outputs.
//
//   %3 = aten::mul.Scalar(%0, 2.)        // read by %4
//   %4 = aten::exp(%3)                   // read by nobody      -> both removed
//   return (%0)
//
// Impure (random) nodes are kept even when unread. Constant inputs nothing reads are removed;
// primal inputs too when asked (a tangent graph after folding reads none).
#include "passes/passes.h"

#include <unordered_set>

namespace jvpc {

bool dce(Graph& g, bool prune_primal_inputs) {
  bool changed = false;
  auto nodes = g.nodes();
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
    Node* n = *it;
    if (n->impure()) continue;
    bool used = false;
    for (Value* o : n->outputs()) {
      if (o->has_uses()) used = true;
      for (Value* out : g.outputs())
        if (out == o) used = true;
    }
    if (!used) {
      g.erase(n);
      changed = true;
    }
  }
  std::unordered_set<const Value*> outputs(g.outputs().begin(), g.outputs().end());
  for (size_t i = g.inputs().size(); i-- > 0;) {
    const Input& in = g.inputs()[i];
    bool removable = in.role == Role::Constant || (prune_primal_inputs && in.role == Role::Primal);
    if (removable && !in.value->has_uses() && !outputs.count(in.value)) {
      g.erase_input(i);
      changed = true;
    }
  }
  return changed;
}

}  // namespace jvpc
