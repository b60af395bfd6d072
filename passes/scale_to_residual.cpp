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
// is tangent-independent (so fold computes the product once). Step 3 moves a scaling of a
// tangent made by products with primal operands (mm, bmm, mul), sums of such and views of them
// onto those primal operands. Attention written by hand scales the scores after q·kᵀ:
//
//   %s = aten::div.Scalar(aten::view(aten::add.Tensor(aten::bmm(%dq, %kT), aten::bmm(%q, %dkT))), 8.)
//   =>   aten::view(aten::add.Tensor(aten::bmm(%dq, %kT'), aten::bmm(%q', %dkT)))   %kT' = %kT / 8 ...
//
// It trades one elementwise pass per call for residuals, so only where the scaled primal
// operands take no more bytes than the scaled tangent (in attention: sequence ≥ 2 · head dim).
// All steps erase the nodes they replace.
#include "passes/passes.h"
#include "ir/op.h"

#include "ir/builder.h"
#include "ir/ops.h"

#include <unordered_set>

namespace jvpc {

namespace {

// Views that rearrange elements (so commute with scaling), with one tensor operand. Not the
// views that reinterpret storage (view.dtype, as_strided), nor ops that may alias.
bool is_simple_view(const Node* n) {
  static const std::unordered_set<std::string> views = {
      ops::view,     ops::expand,      ops::transpose_int, ops::t,          ops::permute,      ops::unsqueeze,
      ops::squeeze,  ops::squeeze_dim, ops::squeeze_dims,  ops::select_int, ops::slice_Tensor, ops::alias,
      ops::diagonal, ops::unfold};
  return n->outputs().size() == 1 && n->inputs().size() == 1 && views.count(n->op()) > 0;
}

// The mul.Scalar producing `v`, if `v` is read only once and that node's other operand is a number.
const Node* sole_scalar_mul(const Value* v) {
  const Node* p = v->producer();
  if (!p || !p->is(ops::mul_Scalar) || v->uses().size() != 1) return nullptr;
  if (!p->arg(1).number()) return nullptr;
  return p;  // v is read by the node at hand alone
}

BArg scalar_of(const Node* mul) { return BArg::of_arg(mul->arg(1), mul); }

// The (product, primal operand) pairs a scaling of the tangent-dependent `v` would move onto:
// v and every value between it and those products read once, each a product with one primal
// operand of v's dtype, a sum of such (alpha 1) or a simple view of one. False if any is not.
bool scaled_operands(const Value* v, const ValueSet& dep, std::vector<std::pair<Node*, size_t>>& out) {
  if (!dep.count(v) || v->uses().size() != 1 || !v->producer()) return false;
  Node* p = v->producer();
  const Op op = p->handle();
  if ((op == ops::mm || op == ops::bmm || op == ops::mul_Tensor) && p->inputs().size() == 2) {
    for (size_t side = 0; side < 2; ++side) {
      const Value* primal = p->input(side);
      if (dep.count(primal) || !dep.count(p->input(1 - side)) || primal->meta().dtype != v->meta().dtype) continue;
      out.emplace_back(p, side);
      return true;
    }
    return false;
  }
  if ((op == ops::add_Tensor || op == ops::sub_Tensor) && p->inputs().size() == 2 && p->arg(2).is_number(1.0))
    return scaled_operands(p->input(0), dep, out) && scaled_operands(p->input(1), dep, out);
  return is_simple_view(p) && scaled_operands(p->input(0), dep, out);
}

}  // namespace

bool scale_to_residual(Graph& g) {
  // Step 1: view(mul(t, s)) -> mul(view(t), s), for tangent-dependent t.
  ValueSet dep = tangent_dependent(g);
  bool changed = rewrite_nodes(g, [&](Node* n, Builder& b) {
    if (!is_simple_view(n)) return false;
    const Node* m = sole_scalar_mul(n->input(0));
    if (!m || !dep.count(m->input(0))) return false;
    if (!c10::isFloatingType(m->input(0)->meta().dtype) || m->input(0)->meta().dtype != m->output()->meta().dtype)
      return false;
    std::vector<BArg> args;
    for (size_t i = 0; i < n->args().size(); ++i)
      args.push_back(i == 0 ? BArg(m->input(0)) : BArg::of_arg(n->arg(i), n));
    Value* view = nullptr;
    try {
      view = b.call(n->op(), std::move(args));
    } catch (const Error&) {  // a view the unscaled value's layout cannot take (t expanded: stride 0)
      return false;
    }
    Value* scaled = b.call(ops::mul_Scalar, {view, scalar_of(m)});
    if (!scaled->meta().same_signature(n->output()->meta())) {  // not the view's shape or dtype: undone
      erase_if_dead(g, scaled->producer());
      return false;
    }
    replace_output(g, n, scaled);
    return true;
  });
  // Step 2: mm/bmm(mul(t, s), w) -> mm/bmm(t, mul(w, s)) when w is tangent-independent.
  dep = tangent_dependent(g);
  changed |= rewrite_nodes(g, [&](Node* n, Builder& b) {
    if (!n->is(ops::bmm) && !n->is(ops::mm)) return false;
    for (size_t side = 0; side < 2; ++side) {
      const Node* m = sole_scalar_mul(n->input(side));
      Value* other = n->input(1 - side);
      if (!m || dep.count(other) || !dep.count(m->input(0))) continue;
      if (m->input(0)->meta().dtype != other->meta().dtype) continue;
      Value* scaled_other = b.call(ops::mul_Scalar, {other, scalar_of(m)});
      Node* old = n->input(side)->producer();
      n->replace_input(1 - side, scaled_other);
      n->replace_input(side, m->input(0));
      erase_if_dead(g, old);
      return true;
    }
    return false;
  });
  // Step 3: scale(products with primal operands, summed and viewed) -> the same with the primal
  // operands scaled.
  dep = tangent_dependent(g);
  changed |= rewrite_nodes(g, [&](Node* n, Builder& b) {
    if ((!n->is(ops::mul_Scalar) && !n->is(ops::div_Scalar)) || !n->arg(1).number()) return false;
    const TensorMeta &in = n->input(0)->meta(), &out = n->output()->meta();
    if (!c10::isFloatingType(out.dtype) || !in.same_signature(out) || in.strides != out.strides) return false;
    std::vector<std::pair<Node*, size_t>> targets;
    if (!scaled_operands(n->input(0), dep, targets)) return false;
    int64_t bytes = 0;
    for (const auto& [p, side] : targets) bytes += p->input(side)->meta().nbytes();
    if (bytes > n->output()->meta().nbytes()) return false;
    for (const auto& [p, side] : targets) {
      InsertionGuard at(g, p);  // the scaled operand lands before the product that reads it
      p->replace_input(side, b.call(n->op(), {p->input(side), scalar_of(n)}));
    }
    replace_output(g, n, n->input(0));
    return true;
  });
  return changed;
}

}  // namespace jvpc
