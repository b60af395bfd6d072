// Dead-code elimination: a reverse walk from the graph outputs.
//
//   %3 = aten::mul.Scalar(%0, 2.)        // read by %4
//   %4 = aten::exp(%3)                   // read by nobody      -> both removed
//   return (%0)
//
// Impure (random) nodes are kept even when unread. Constant inputs nothing reads are removed;
// primal inputs too when asked (a tangent graph after folding reads none).
#include "passes/passes.h"

#include <ATen/TensorUtils.h>

#include <algorithm>

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

void erase_if_dead(Graph& g, Node* n) {
  auto nodes = g.nodes();
  std::unordered_set<Node*> alive(nodes.begin(), nodes.end());
  std::unordered_set<const Value*> outputs(g.outputs().begin(), g.outputs().end());
  std::vector<Node*> work{n};
  while (!work.empty()) {
    Node* m = work.back();
    work.pop_back();
    if (!alive.count(m) || m->impure()) continue;
    bool dead = true;
    for (Value* o : m->outputs()) dead &= !o->has_uses() && !outputs.count(o);
    if (!dead) continue;
    for (Value* v : m->inputs())
      if (v->producer()) work.push_back(v->producer());
    g.erase(m);
    alive.erase(m);
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

bool viewable(const Value* v, const std::vector<int64_t>& shape) {
  return at::detail::computeStride(v->meta().sizes, v->meta().strides, shape).has_value();
}

bool is_graph_output(const Value* v) {
  const auto& outs = v->graph()->outputs();
  return std::find(outs.begin(), outs.end(), v) != outs.end();
}

std::unique_ptr<Pass> make_pass(std::string name, std::function<bool(Graph&)> fn) {
  struct FnPass : Pass {
    std::string n;
    std::function<bool(Graph&)> f;
    std::string name() const override { return n; }
    bool run(Graph& g) override { return f(g); }
  };
  auto p = std::make_unique<FnPass>();
  p->n = std::move(name);
  p->f = std::move(fn);
  return p;
}

std::unordered_set<const Value*> tangent_dependent(const Graph& g) {
  std::unordered_set<const Value*> dep;
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
