// Batching rule of jvpc::attention_tangent, the O(L) form of attention's tangent: its batched
// overload (runtime/attention_tangent.h), which recomputes each block's scores and P once per
// call for all K tangents, and folds the K tangents into the rows or columns of its bmms.
#include "passes/batch_rules/rules.h"

#include "runtime/attention_tangent.h"

namespace jvpc::batch_rules {

namespace {

std::vector<Value*> attention_tangent(Ctx& c) {
  // q, k, v, out, lse and the mask are residuals; a batched one (not from a tangent graph) is unrolled.
  for (size_t a : {0, 1, 2, 3, 4, 8})
    if (c.batched(a)) return {};
  std::vector<BArg> args = c.args();
  for (size_t a : {5, 6, 7, 9})
    if (c.n.arg(a).kind == ArgKind::Tensor && !c.batched(a)) args[a] = c.broadcast(c.x(a));
  return c.b.emit(ops::jvpc_attention_tangent_batched, std::move(args));
}

}  // namespace

void register_attention(Registry& r) { r.add(ops::jvpc_attention_tangent, attention_tangent); }

}  // namespace jvpc::batch_rules
