// JVP rules of random ops. A draw does not depend on the values of its operands (a shape to
// take, a probability to sample with), so its tangent is zero, as PyTorch's derivatives say; the
// draw itself is a primal value that fold computes once, so the linear map is for that draw, as
// torch.func's is. Dropout's fused kernel passes its input's tangent through its mask.
#include "passes/jvp_rules/rules.h"

namespace jvpc::jvp_rules {

void register_random(Registry& r) {
  for (const char* op :
       {"aten::rand_like", "aten::randn_like", "aten::bernoulli", "aten::bernoulli.p", "aten::bernoulli.Tensor",
        "aten::uniform", "aten::normal.functional", "aten::exponential", "aten::geometric", "aten::log_normal",
        "aten::cauchy", "aten::random", "aten::random.from", "aten::random.to"})
    r.add(op, zero());
  // (out, mask) = native_dropout(x, p, train): out = x·mask/(1 − p) in training, x otherwise.
  r.add("aten::native_dropout", [](Ctx& c) -> std::vector<Value*> {
    if (!c.t(0)) return {};
    const c10::IValue& train = c.c(2);
    if (!train.isNone() && !train.toBool()) return {c.t(0)};
    double p = scalar(c.c(1));
    Value* keep = c.call("aten::_to_copy", {c.out(1), c.out(0)->meta().dtype});
    return {c.mul(c.t(0), c.call("aten::mul.Scalar", {keep, p == 1.0 ? 0.0 : 1.0 / (1.0 - p)}))};
  });
}

}  // namespace jvpc::jvp_rules
