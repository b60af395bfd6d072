// Keeps 0/1 masks as booleans: t·float(m) becomes t·m, the mask read as a boolean.
//
// A product by a mask (the tangent of `x * (x > 0).float()`, or of nan_to_num) reads a residual
// 4 bytes per element (float32; 8 in float64) where a boolean takes 1:
//
//   %m = aten::gt.Scalar(%x, 0)                           %m = aten::gt.Scalar(%x, 0)      // primal: a bool residual
//   %f = aten::_to_copy(%m, f32)                   =>     %t = aten::mul.Tensor(%dx, %m)
//   %t = aten::mul.Tensor(%dx, %f)
//
// The same work per call and the same values: mul promotes the boolean to 0 and 1, so a
// non-finite tangent where the mask is off still gives NaN, as the product does in eager code.
// (The rules that select instead, relu's and the clamps', write where(m, t, 0) themselves.)
#include "passes/passes.h"
#include "ir/op.h"

#include "ir/builder.h"

namespace jvpc {

bool select_masks(Graph& g) {
  auto dep = tangent_dependent(g);
  return rewrite_nodes(g, [&](Node* n, Builder& b) {
    if (!n->is(ops::mul_Tensor) || n->inputs().size() != 2) return false;
    for (size_t side = 0; side < 2; ++side) {
      Value *t = n->input(side), *f = n->input(1 - side);
      const Node* cast = f->producer();
      if (!dep.count(t) || dep.count(f) || !cast || !cast->is(ops::_to_copy) ||
          cast->input(0)->meta().dtype != c10::kBool || f->meta().dtype != t->meta().dtype ||
          n->output()->meta().dtype != t->meta().dtype)
        continue;
      if (!replace_output_if_same_layout(g, n, b.call(ops::mul_Tensor, {t, cast->input(0)}))) continue;
      dep = tangent_dependent(g);
      return true;
    }
    return false;
  });
}

}  // namespace jvpc
