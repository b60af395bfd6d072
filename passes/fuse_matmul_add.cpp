// Fuses the sum of a product into the product: the tangent of q·kᵀ is dq·kᵀ + q·dkᵀ, two bmms
// and an add; baddbmm computes it with the second bmm accumulating into the first's output.
//
//   %a = aten::bmm(%dq, %k)
//   %b = aten::bmm(%q, %dk)                 =>   %a = aten::bmm(%dq, %k)
//   %c = aten::add.Tensor(%a, %b, 1)             %c = aten::baddbmm(%a, %q, %dk, 1, 1)
//
// Applies to add.Tensor with alpha 1 when one operand is an mm/bmm read only by the add, with the
// result's shape and dtype, and the other has the same dtype and broadcasts to it (a bias
// tangent: addmm broadcasts its `self`). FLOPs by FlopCounterMode's rules are unchanged (baddbmm
// counts as its bmm); one kernel and one intermediate fewer.
#include "passes/passes.h"
#include "ir/op.h"

#include "ir/builder.h"

namespace jvpc {

bool fuse_matmul_add(Graph& g) {
  return rewrite_nodes(g, [&](Node* n, Builder& b) {
    if (!n->is(ops::add_Tensor) || n->inputs().size() != 2) return false;
    if (!n->arg(2).is_number(1.0)) return false;  // alpha
    for (size_t side : {size_t(1), size_t(0)}) {
      Value* prod = n->input(side);
      Value* other = n->input(1 - side);
      const Node* p = prod->producer();
      if (!p || (!p->is(ops::bmm) && !p->is(ops::mm)) || prod->uses().size() != 1) continue;  // read by n alone
      const TensorMeta& out = n->output()->meta();
      if (!prod->meta().same_signature(out) || other->meta().dtype != out.dtype || other->meta().device != out.device)
        continue;
      Value* fused = b.call(p->is(ops::bmm) ? ops::baddbmm : ops::addmm, {other, p->input(0), p->input(1)});
      if (!fused->meta().same_signature(n->output()->meta())) {  // not the sum's shape or dtype: undone
        erase_if_dead(g, fused->producer());
        continue;
      }
      replace_output(g, n, fused);
      return true;
    }
    return false;
  });
}

}  // namespace jvpc
