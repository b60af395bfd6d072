#include "ir/liveness.h"

#include "ir/op_contracts.h"
#include "ir/ops.h"

#include <algorithm>

namespace jvpc {

size_t Liveness::index(const Value* v) const {
  if (!covers(v)) throw Error("liveness: %" + std::to_string(v->id()) + " is not a value of the graph");
  return static_cast<size_t>(v->id());
}

Liveness analyze_liveness(const Graph& g) {
  Liveness l;
  auto nodes = g.nodes();
  l.last_use_.assign(static_cast<size_t>(g.id_bound()), -1);
  l.root_.assign(static_cast<size_t>(g.id_bound()), nullptr);
  for (const Input& in : g.inputs()) l.root_.at(static_cast<size_t>(in.value->id())) = in.value;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node* n = nodes[i];
    for (const Value* v : n->inputs()) l.last_use_.at(static_cast<size_t>(v->id())) = static_cast<int>(i);
    // View ops alias their first tensor operand ("self"); everything else allocates.
    const Value* alias = nullptr;
    if (op_info(n->op()).is_view && !n->inputs().empty()) alias = l.storage_root(n->input(0));
    for (const Value* o : n->outputs()) l.root_.at(static_cast<size_t>(o->id())) = alias ? alias : o;
  }
  for (const Value* o : g.outputs()) l.last_use_.at(static_cast<size_t>(o->id())) = static_cast<int>(nodes.size());
  return l;
}

int64_t peak_intermediate_bytes(const Graph& g, const Liveness& live, bool workspace) {
  auto nodes = g.nodes();
  std::vector<int> refs(static_cast<size_t>(g.id_bound()));  // storage root's id -> live values in it
  int64_t current = 0, peak = 0;
  auto release = [&](const Value* v) {
    const Value* root = live.storage_root(v);
    if (g.is_input(root)) return;
    if (--refs[root->id()] == 0) current -= root->meta().nbytes();
  };
  for (size_t i = 0; i < nodes.size(); ++i) {
    for (const Value* o : nodes[i]->outputs()) {
      const Value* root = live.storage_root(o);
      if (g.is_input(root)) continue;
      if (refs[root->id()]++ == 0 && __builtin_add_overflow(current, root->meta().nbytes(), &current))
        throw Error("bytes of intermediates exceed 2^63 (sizes too large to count)");
    }
    int64_t at_node = current;
    if (workspace && __builtin_add_overflow(current, workspace_bytes(*nodes[i]), &at_node))
      throw Error("bytes of intermediates exceed 2^63 (sizes too large to count)");
    peak = std::max(peak, at_node);
    const std::vector<Value*>& in = nodes[i]->inputs();
    for (size_t j = 0; j < in.size(); ++j)  // each operand once, however often the node reads it
      if (live.last_use(in[j]) == static_cast<int>(i) && std::find(in.begin(), in.begin() + j, in[j]) == in.begin() + j)
        release(in[j]);
    for (const Value* o : nodes[i]->outputs())
      if (live.last_use(o) < 0) release(o);
  }
  return peak;
}

int64_t peak_intermediate_bytes(const Graph& g) { return peak_intermediate_bytes(g, analyze_liveness(g)); }

}  // namespace jvpc
