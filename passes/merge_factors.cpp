// Merges chains of primal factors on a tangent into one factor, which fold computes once.
//
// Product rules leave a tangent multiplied by several primal values in turn; SwiGLU's
// silu(a)·b, for one, gives
//
//   %1 = aten::mul.Tensor(%da, %silu_grad)                 %f = aten::mul.Tensor(%silu_grad, %b)  // primal: folded
//   %2 = aten::mul.Tensor(%1, %b)                   =>     %2 = aten::mul.Tensor(%da, %f)
//
// which saves one multiplication per call, and holds one residual where there were two when
// neither factor has another tangent-side reader. The rewrite is made only where the merged
// factor takes no more residual bytes than the factors it frees (a merged [n, d] factor in place of
// an [n, 1] and a primal input, which the graph only aliases, would take more), and only in
// float32, float64 and bfloat16: a float16 product of two factors may overflow where the
// tangent's product does not.
#include "passes/passes.h"

#include "compiler/cost/cost_model.h"
#include "compiler/ir/builder.h"
#include "compiler/ir/ops.h"

#include <ATen/ExpandUtils.h>

namespace jvpc {

namespace {

bool is_output(const Value* v) {
  for (const Value* o : v->graph()->outputs())
    if (o == v) return true;
  return false;
}

// Bytes that stop being residuals when `v` is read by nothing else on the tangent side than
// `except`: an intermediate's own. A graph input is the caller's (or stays bound), and a view
// holds no bytes of its own (of an input, it costs nothing; of another value, that value's).
int64_t freed_bytes(const Value* v, const Node* except, const std::unordered_set<const Value*>& dep) {
  if (!v->producer() || is_output(v) || op_info(v->producer()->op()).is_view) return 0;
  for (const Use& u : v->uses())
    if (u.user != except && dep.count(u.user->output(0))) return 0;
  return distinct_bytes(v->meta());
}

struct Split {
  Value* tangent;
  Value* factor;
};

// The operands of a binary mul.Tensor as (tangent-dependent, primal-only), if it has one of each.
std::optional<Split> split(const Node* n, const std::unordered_set<const Value*>& dep) {
  if (n->op() != "aten::mul.Tensor" || n->inputs().size() != 2) return std::nullopt;
  Value *a = n->input(0), *b = n->input(1);
  if (dep.count(a) && !dep.count(b)) return Split{a, b};
  if (dep.count(b) && !dep.count(a)) return Split{b, a};
  return std::nullopt;
}

bool mergeable_dtype(c10::ScalarType t) { return t == c10::kFloat || t == c10::kDouble || t == c10::kBFloat16; }

}  // namespace

bool merge_factors(Graph& g) {
  bool changed = false;
  Builder b(g);
  for (bool again = true; again;) {
    again = false;
    auto dep = tangent_dependent(g);
    for (Node* n : g.nodes()) {
      auto outer = split(n, dep);
      if (!outer) continue;
      Node* m = outer->tangent->producer();
      auto inner = m ? split(m, dep) : std::nullopt;
      if (!inner || outer->tangent->uses().size() != 1 || is_output(outer->tangent)) continue;
      c10::ScalarType dt = n->output()->meta().dtype;
      if (!mergeable_dtype(dt)) continue;
      bool same = true;
      for (const Value* v : {inner->tangent, inner->factor, outer->factor, outer->tangent}) same &= v->meta().dtype == dt;
      if (!same) continue;
      auto merged_sizes = at::infer_size(inner->factor->meta().sizes, outer->factor->meta().sizes);
      int64_t merged = c10::elementSize(dt);
      for (int64_t s : merged_sizes) merged *= s;
      if (merged > freed_bytes(inner->factor, m, dep) + freed_bytes(outer->factor, n, dep)) continue;
      g.set_insertion_point(n);
      Value* factor = b.call("aten::mul.Tensor", {inner->factor, outer->factor});
      Value* out = b.call("aten::mul.Tensor", {inner->tangent, factor});
      if (!out->meta().same_signature(n->output()->meta()) || out->meta().strides != n->output()->meta().strides) {
        // a layout the chain's result did not have: readers were built for the old one
        erase_if_dead(g, out->producer());
        continue;
      }
      replace_output(g, n, out);
      changed = again = true;
      break;  // the uses and dependences changed
    }
  }
  g.set_insertion_point(nullptr);
  return changed;
}

}  // namespace jvpc
