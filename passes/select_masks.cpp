// Keeps 0/1 masks as booleans: t·float(m) becomes where(m, t, 0).
//
// The tangent of relu, of a clamp or of a hardtanh is the primal tangent where a condition
// holds and zero elsewhere; rules write it t·float(m), so that merge-factors can fold the mask
// into other factors. What stays a product by a mask after merge-factors reads a residual
// 4 bytes per element (float32; 8 in float64) where a boolean takes 1:
//
//   %m = aten::gt.Scalar(%x, 0)                           %m = aten::gt.Scalar(%x, 0)      // primal: a bool residual
//   %f = aten::_to_copy(%m, f32)                   =>     %t = aten::where.ScalarOther(%m, %dx, 0.)
//   %t = aten::mul.Tensor(%dx, %f)
//
// The same work per call, and where() gives 0 where the mask is off even for a non-finite
// tangent, as LibTorch's own relu tangent (threshold_backward) does.
#include "passes/passes.h"

#include "compiler/ir/builder.h"

namespace jvpc {

bool select_masks(Graph& g) {
  bool changed = false;
  Builder b(g);
  InsertionGuard at(g);
  auto dep = tangent_dependent(g);
  for (Node* n : g.nodes()) {
    if (n->op() != "aten::mul.Tensor" || n->inputs().size() != 2) continue;
    for (size_t side = 0; side < 2; ++side) {
      Value *t = n->input(side), *f = n->input(1 - side);
      const Node* cast = f->producer();
      if (!dep.count(t) || dep.count(f) || !cast || cast->op() != "aten::_to_copy" ||
          cast->input(0)->meta().dtype != c10::kBool || f->meta().dtype != t->meta().dtype ||
          n->output()->meta().dtype != t->meta().dtype)
        continue;
      at.move_to(n);
      if (!replace_output_if_same_layout(g, n, b.call("aten::where.ScalarOther", {cast->input(0), t, 0.0}))) continue;
      changed = true;
      dep = tangent_dependent(g);
      break;
    }
  }
  return changed;
}

}  // namespace jvpc
