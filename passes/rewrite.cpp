// Helpers every rewrite uses: the driver of local rewrites, erasing what a rewrite left dead,
// replacing a node's result, asking about layouts, and which values depend on the tangents.
#include "passes/rewrite.h"

#include "ir/builder.h"

#include <algorithm>
#include <unordered_set>

namespace jvpc {

bool rewrite_nodes(Graph& g, const NodeRewrite& rule) {
  bool changed = false;
  Builder b(g);
  InsertionGuard at(g);
  // A copy of the order: the rule may erase the node at hand (and those before it).
  for (Node* n : g.nodes()) {
    at.move_to(n);
    changed |= rule(n, b);
  }
  return changed;
}

void erase_if_dead(Graph& g, Node* n) { erase_if_dead(g, std::vector<Node*>{n}); }

void erase_if_dead(Graph& g, const std::vector<Node*>& nodes) {
  // Work proportional to what is erased: a node reached twice (it produced two operands of an
  // erased one, or it is in `nodes` too) is skipped once erased, before it is read.
  std::unordered_set<Node*> erased;
  std::vector<Node*> work = nodes;
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

bool same_layout(const Value* v, const Value* n) {
  const TensorMeta &a = v->meta(), &b = n->meta();
  return a.same_signature(b) && a.strides == b.strides;
}

bool replace_output_if_same_layout(Graph& g, Node* n, Value* v) {
  if (!same_layout(v, n->output())) {
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
