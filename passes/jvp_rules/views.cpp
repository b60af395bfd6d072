// JVP rules of views and data movement: all linear, so the tangent goes through the same op.
// A view of the primal may not be a view of its tangent when the two are laid out differently
// (a tangent input is contiguous, a primal may be a transposed weight); `view` then copies the
// tangent first, visibly, rather than fail at run time.
#include "passes/jvp_rules/rules.h"

namespace jvpc::jvp_rules {

void register_views(Registry& r) {
  for (const char* op : {"aten::expand", "aten::transpose.int", "aten::t", "aten::permute", "aten::unsqueeze",
                         "aten::squeeze", "aten::squeeze.dim", "aten::squeeze.dims", "aten::select.int", "aten::slice.Tensor",
                         "aten::split.Tensor", "aten::split_with_sizes", "aten::unbind.int", "aten::alias",
                         "aten::diagonal", "aten::unfold", "aten::index_select", "aten::gather",
                         "aten::repeat", "aten::flip", "aten::roll", "aten::index.Tensor", "aten::embedding",
                         // the copying forms of views (diag() is diagonal_copy)
                         "aten::diagonal_copy", "aten::expand_copy", "aten::permute_copy", "aten::transpose_copy.int",
                         "aten::select_copy.int", "aten::slice_copy.Tensor"})
    r.add(op, linear_in(0));
  r.add("aten::cat", linear_in_list(0));
  r.add("aten::stack", linear_in_list(0));
  r.add("aten::constant_pad_nd", [](Ctx& c) -> std::vector<Value*> {  // the padding is constant: tangent 0
    if (!c.t(0)) return {};
    return {c.call("aten::constant_pad_nd", {c.t(0), c.a(1), 0.0})};
  });
  // Scatters are linear in (self, source) jointly: the same op on both tangents, zeros for an
  // absent one. Adding a constant source leaves self's tangent as it is.
  for (const char* op : {"aten::scatter_add", "aten::scatter.src", "aten::index_add"})
    r.add(op, [](Ctx& c) -> std::vector<Value*> {
      if (!c.t(3) && c.n.op() != "aten::scatter.src") return {c.t(0)};
      Value* self = c.t(0) ? c.t(0) : c.call("aten::zeros_like", {c.x(0)});
      Value* source = c.t(3) ? c.t(3) : c.call("aten::zeros_like", {c.x(3)});
      return c.reapply({{0, self}, {3, source}});
    });
  r.add("aten::scatter.value", [](Ctx& c) -> std::vector<Value*> {
    if (!c.t(0)) return {};
    return {c.call("aten::scatter.value", {c.t(0), c.a(1), c.x(2), 0.0})};
  });
  r.add("aten::view", [](Ctx& c) -> std::vector<Value*> {
    if (!c.t(0)) return {};
    return {reshape(c, c.t(0), c.c(1).toIntVector())};
  });
}

}  // namespace jvpc::jvp_rules
