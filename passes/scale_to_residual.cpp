// Moves scalar multiplications off the tangent path, onto values fold can precompute.
//
// The math path of attention scales q and kᵀ by sqrt(scale) each; their tangents inherit the
// multiplications and would pay for them on every call. Scaling commutes with views and with
// matrix products, so:
//
//   %t1 = aten::mul.Scalar(%dq, s)
//   %t2 = aten::view(%t1, [5, 128, 64])          %t2' = aten::view(%dq, [5, 128, 64])
//   %t3 = aten::bmm(%t2, %k3)              =>    %k3' = aten::mul.Scalar(%k3, s)    // primal: folded
//                                                %t3  = aten::bmm(%t2', %k3')
//
// Step 1 sinks a tangent-dependent mul.Scalar below each view that is its only reader. Step 2
// moves a mul.Scalar feeding one operand of mm/bmm onto the other operand, when that operand
// is tangent-independent (so fold computes the product once). Both steps erase the nodes they
// replace.
#include "passes/passes.h"

#include "compiler/ir/builder.h"
#include "compiler/ir/ops.h"

#include <unordered_set>

namespace jvpc {

namespace {

// Views that rearrange elements (so commute with scaling), with one tensor operand. Not the
// views that reinterpret storage (view.dtype, as_strided), nor ops that may alias.
bool is_simple_view(const Node* n) {
  static const std::unordered_set<std::string> views = {
      "aten::view", "aten::expand", "aten::transpose.int", "aten::t", "aten::permute", "aten::unsqueeze",
      "aten::squeeze", "aten::squeeze.dim", "aten::squeeze.dims", "aten::select.int", "aten::slice.Tensor",
      "aten::alias", "aten::diagonal", "aten::unfold"};
  return n->outputs().size() == 1 && n->inputs().size() == 1 && views.count(n->op()) > 0;
}

// The mul.Scalar producing `v`, if `v` is read only once and that node's other operand is a number.
const Node* sole_scalar_mul(const Value* v) {
  const Node* p = v->producer();
  if (!p || p->op() != "aten::mul.Scalar" || v->uses().size() != 1) return nullptr;
  if (!p->arg(1).number()) return nullptr;
  return is_graph_output(v) ? nullptr : p;
}

BArg scalar_of(const Node* mul) { return BArg::of_arg(mul->arg(1), mul); }

}  // namespace

bool scale_to_residual(Graph& g) {
  bool changed = false;
  Builder b(g);
  // Step 1: view(mul(t, s)) -> mul(view(t), s), for tangent-dependent t.
  auto dep = tangent_dependent(g);
  for (Node* n : g.nodes()) {
    if (!is_simple_view(n)) continue;
    const Node* m = sole_scalar_mul(n->input(0));
    if (!m || !dep.count(m->input(0))) continue;
    if (!c10::isFloatingType(m->input(0)->meta().dtype) || m->input(0)->meta().dtype != m->output()->meta().dtype) continue;
    g.set_insertion_point(n);
    std::vector<BArg> args;
    for (size_t i = 0; i < n->args().size(); ++i) args.push_back(i == 0 ? BArg(m->input(0)) : BArg::of_arg(n->arg(i), n));
    Value* view = nullptr;
    try {
      view = b.call(n->op(), std::move(args));
    } catch (const Error&) {  // a view the unscaled value's layout cannot take (t expanded: stride 0)
      continue;
    }
    Value* scaled = b.call("aten::mul.Scalar", {view, scalar_of(m)});
    if (!scaled->meta().same_signature(n->output()->meta())) {  // not the view's shape or dtype: undone
      erase_if_dead(g, scaled->producer());
      continue;
    }
    replace_output(g, n, scaled);
    changed = true;
  }
  // Step 2: mm/bmm(mul(t, s), w) -> mm/bmm(t, mul(w, s)) when w is tangent-independent.
  dep = tangent_dependent(g);
  for (Node* n : g.nodes()) {
    if (n->op() != "aten::bmm" && n->op() != "aten::mm") continue;
    for (size_t side = 0; side < 2; ++side) {
      const Node* m = sole_scalar_mul(n->input(side));
      Value* other = n->input(1 - side);
      if (!m || dep.count(other) || !dep.count(m->input(0))) continue;
      if (m->input(0)->meta().dtype != other->meta().dtype) continue;
      g.set_insertion_point(n);
      Value* scaled_other = b.call("aten::mul.Scalar", {other, scalar_of(m)});
      Node* old = n->input(side)->producer();
      n->replace_input(1 - side, scaled_other);
      n->replace_input(side, m->input(0));
      erase_if_dead(g, old);
      changed = true;
      break;
    }
  }
  g.set_insertion_point(nullptr);
  return changed;
}

}  // namespace jvpc
