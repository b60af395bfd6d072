#include "compiler/ir/liveness.h"

#include "compiler/ir/ops.h"

namespace jvpc {

Liveness analyze_liveness(const Graph& g) {
  Liveness l;
  auto nodes = g.nodes();
  for (const Input& in : g.inputs()) {
    l.storage_root[in.value] = in.value;
    l.last_use[in.value] = -1;
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node* n = nodes[i];
    for (const Value* v : n->inputs()) l.last_use[v] = static_cast<int>(i);
    // View ops alias their first tensor operand ("self"); everything else allocates.
    const Value* alias = nullptr;
    if (op_info(n->op()).is_view && !n->inputs().empty()) alias = l.storage_root.at(n->input(0));
    for (const Value* o : n->outputs()) {
      l.storage_root[o] = alias ? alias : o;
      l.last_use[o] = -1;
    }
  }
  for (const Value* o : g.outputs()) l.last_use[o] = static_cast<int>(nodes.size());
  return l;
}

}  // namespace jvpc
