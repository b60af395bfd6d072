#include "compiler/ir/liveness.h"

#include "compiler/ir/op_contracts.h"
#include "compiler/ir/ops.h"

#include <algorithm>
#include <unordered_set>

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

int64_t peak_intermediate_bytes(const Graph& g, const Liveness& live, bool workspace) {
  auto nodes = g.nodes();
  std::unordered_map<const Value*, int> refs;  // storage root -> live values in it
  int64_t current = 0, peak = 0;
  auto release = [&](const Value* v) {
    const Value* root = live.storage_root.at(v);
    if (g.is_input(root)) return;
    if (--refs[root] == 0) current -= root->meta().nbytes();
  };
  for (size_t i = 0; i < nodes.size(); ++i) {
    for (const Value* o : nodes[i]->outputs()) {
      const Value* root = live.storage_root.at(o);
      if (g.is_input(root)) continue;
      if (refs[root]++ == 0 && __builtin_add_overflow(current, root->meta().nbytes(), &current))
        throw Error("bytes of intermediates exceed 2^63 (sizes too large to count)");
    }
    int64_t at_node = current;
    if (workspace && __builtin_add_overflow(current, workspace_bytes(*nodes[i]), &at_node))
      throw Error("bytes of intermediates exceed 2^63 (sizes too large to count)");
    peak = std::max(peak, at_node);
    std::unordered_set<const Value*> done;
    for (const Value* v : nodes[i]->inputs())
      if (live.last_use.at(v) == static_cast<int>(i) && done.insert(v).second) release(v);
    for (const Value* o : nodes[i]->outputs())
      if (live.last_use.at(o) < 0) release(o);
  }
  return peak;
}

int64_t peak_intermediate_bytes(const Graph& g) { return peak_intermediate_bytes(g, analyze_liveness(g)); }

}  // namespace jvpc
