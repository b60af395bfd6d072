// Merges primal factors on a tangent into one factor, which fold computes once.
//
// Product rules leave a tangent multiplied by several primal values in turn; SwiGLU's
// silu(a)·b, for one, gives
//
//   %1 = aten::mul.Tensor(%da, %silu_grad)                 %f = aten::mul.Tensor(%silu_grad, %b)  // primal: folded
//   %2 = aten::mul.Tensor(%1, %b)                   =>     %2 = aten::mul.Tensor(%da, %f)
//
// The same for a number on either side ((t·2)·a -> t·(2a)), and for a sum of two products of
// one tangent (t·a + t·b -> t·(a + b): hardswish(x) + hardsigmoid(x), or elu and selu of one
// value). Each rewrite saves a pass over the tangent per call, and holds one residual where
// there were two when neither factor has another tangent-side reader. It is made only where the
// merged factor takes no more residual bytes than the factors it frees (a merged [n, d] factor
// in place of an [n, 1] one and a primal input, which the graph only aliases, would take more),
// and only in float32, float64 and bfloat16: a float16 product of two factors may overflow where
// the tangent's product does not.
#include "passes/passes.h"
#include "ir/op.h"

#include "ir/cost/cost_model.h"
#include "ir/builder.h"
#include "ir/ops.h"

#include <ATen/ExpandUtils.h>

namespace jvpc {

namespace {

// Bytes that stop being residuals when `v` is read by nothing else on the tangent side than
// `except`: an intermediate's own. A graph input is the caller's (or stays bound), and a view
// holds no bytes of its own (of an input, it costs nothing; of another value, that value's).
int64_t freed_bytes(const Value* v, const Node* except, const ValueSet& dep) {
  if (!v->producer() || op_info(v->producer()->op()).is_view) return 0;
  for (const Use& u : v->uses())
    if (u.user->is_return() || (u.user != except && dep.count(u.user->output(0)))) return 0;
  return distinct_bytes(v->meta());
}

// A tangent times a primal factor: a tensor, or a number (mul.Scalar).
struct Scaled {
  Value* tangent;
  Value* factor = nullptr;  // a primal tensor, or
  BArg number = 1.0;        // a number, when factor is null
};

std::optional<Scaled> scaled(const Node* n, const ValueSet& dep) {
  if (n->is(ops::mul_Tensor) && n->inputs().size() == 2) {
    Value *a = n->input(0), *b = n->input(1);
    if (dep.count(a) && !dep.count(b)) return Scaled{a, b};
    if (dep.count(b) && !dep.count(a)) return Scaled{b, a};
  }
  if (n->is(ops::mul_Scalar) && n->arg(1).number() && dep.count(n->input(0)))
    return Scaled{n->input(0), nullptr, BArg::of_arg(n->arg(1), n)};
  return std::nullopt;
}

bool mergeable_dtype(c10::ScalarType t) { return t == c10::kFloat || t == c10::kDouble || t == c10::kBFloat16; }

// The producer of `v` as a scaled tangent, when `n` is its only reader.
std::optional<Scaled> sole_scaled(const Value* v, const ValueSet& dep) {
  if (!v->producer() || v->uses().size() != 1) return std::nullopt;  // read by the node at hand alone
  return scaled(v->producer(), dep);
}

int64_t bytes_of(const std::vector<int64_t>& sizes, c10::ScalarType dt) {
  int64_t n = c10::elementSize(dt);
  for (int64_t s : sizes) n *= s;
  return n;
}

// (t·a)·b -> t·(a·b), for tensors or numbers a, b (not both numbers: simplify-arith's).
bool merge_chain(Graph& g, Builder& b, Node* n, const ValueSet& dep) {
  auto outer = scaled(n, dep);
  if (!outer) return false;
  auto inner = sole_scaled(outer->tangent, dep);
  if (!inner || (!inner->factor && !outer->factor)) return false;
  Node* m = outer->tangent->producer();
  c10::ScalarType dt = n->output()->meta().dtype;
  for (const Value* v : {inner->tangent, inner->factor, outer->factor})
    if (v && v->meta().dtype != dt) return false;
  std::vector<int64_t> sizes = !inner->factor ? outer->factor->meta().sizes
                               : !outer->factor
                                   ? inner->factor->meta().sizes
                                   : at::infer_size(inner->factor->meta().sizes, outer->factor->meta().sizes);
  int64_t freed = (inner->factor ? freed_bytes(inner->factor, m, dep) : 0) +
                  (outer->factor ? freed_bytes(outer->factor, n, dep) : 0);
  if (bytes_of(sizes, dt) > freed) return false;
  Value* factor = inner->factor && outer->factor ? b.call(ops::mul_Tensor, {inner->factor, outer->factor})
                  : inner->factor                ? b.call(ops::mul_Scalar, {inner->factor, outer->number})
                                                 : b.call(ops::mul_Scalar, {outer->factor, inner->number});
  return replace_output_if_same_layout(g, n, b.call(ops::mul_Tensor, {inner->tangent, factor}));
}

// t·a ± t·b -> t·(a ± b), for tensors a, b.
bool merge_sum(Graph& g, Builder& b, Node* n, const ValueSet& dep) {
  const Op op = n->handle();
  if ((op != ops::add_Tensor && op != ops::sub_Tensor) || n->inputs().size() != 2 || !dep.count(n->output()) ||
      !n->arg(2).is_number(1.0))
    return false;
  auto l = sole_scaled(n->input(0), dep), r = sole_scaled(n->input(1), dep);
  if (!l || !r || l->tangent != r->tangent || !l->factor || !r->factor) return false;
  c10::ScalarType dt = n->output()->meta().dtype;
  if (l->tangent->meta().dtype != dt || l->factor->meta().dtype != dt || r->factor->meta().dtype != dt) return false;
  auto sizes = at::infer_size(l->factor->meta().sizes, r->factor->meta().sizes);
  int64_t freed =
      freed_bytes(l->factor, n->input(0)->producer(), dep) + freed_bytes(r->factor, n->input(1)->producer(), dep);
  if (bytes_of(sizes, dt) > freed) return false;
  Value* factor = b.call(op, {l->factor, r->factor});
  return replace_output_if_same_layout(g, n, b.call(ops::mul_Tensor, {l->tangent, factor}));
}

}  // namespace

bool merge_factors(Graph& g) {
  // The merges build at the builder's insertion point, just before n. Each merge changes uses
  // and dependences: the sweep skips the rest of the nodes and starts again from the first,
  // with the dependences recomputed, until one merges nothing.
  ValueSet dep;
  bool merged = false;
  auto rule = [&](Node* n, Builder& b) {
    if (merged || n->outputs().size() != 1 || !mergeable_dtype(n->output()->meta().dtype)) return false;
    merged = merge_chain(g, b, n, dep) || merge_sum(g, b, n, dep);
    return merged;
  };
  bool changed = false;
  do {
    dep = tangent_dependent(g);
    merged = false;
    changed |= rewrite_nodes(g, rule);
  } while (merged);
  return changed;
}

}  // namespace jvpc
