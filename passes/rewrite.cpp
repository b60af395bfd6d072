// Helpers every rewrite uses: erasing what a rewrite left dead, replacing a node's result,
// asking about layouts and graph outputs, and which values depend on the tangents.
#include "passes/rewrite.h"

#include <ATen/TensorUtils.h>

#include <algorithm>
#include <unordered_set>

namespace jvpc {

void erase_if_dead(Graph& g, Node* n) {
  // Work proportional to what is erased: a node reached twice (it produced two operands of an
  // erased one) is skipped once erased.
  std::unordered_set<Node*> erased;
  std::vector<Node*> work{n};
  while (!work.empty()) {
    Node* m = work.back();
    work.pop_back();
    if (!m || erased.count(m) || m->impure()) continue;
    bool dead = true;
    for (Value* o : m->outputs()) dead &= !o->has_uses();  // returning a value is a use
    if (!dead) continue;
    for (Value* v : m->inputs())
      if (v->producer()) work.push_back(v->producer());
    g.erase(m);
    erased.insert(m);
  }
}

void replace_output(Graph& g, Node* n, Value* v) {
  n->output()->replace_all_uses_with(v);
  erase_if_dead(g, n);
}

bool replace_output_if_same_layout(Graph& g, Node* n, Value* v) {
  const TensorMeta &a = v->meta(), &b = n->output()->meta();
  if (!a.same_signature(b) || a.strides != b.strides) {
    erase_if_dead(g, v->producer());
    return false;
  }
  replace_output(g, n, v);
  return true;
}

ValueSet tangent_dependent(const Graph& g) {
  ValueSet dep;
  dep.reserve(g.num_nodes() + g.inputs().size());
  for (const Input& in : g.inputs())
    if (in.role == Role::Tangent) dep.insert(in.value);
  for (const Node* n : g.nodes()) {
    bool d = false;
    for (const Value* v : n->inputs()) d |= dep.count(v) > 0;
    if (d)
      for (const Value* o : n->outputs()) dep.insert(o);
  }
  return dep;
}

}  // namespace jvpc
