// JVP rules of random ops. A draw does not depend on the values of its operands (a shape to
// take, a probability to sample with), so its tangent is zero, as PyTorch's derivatives say; the
// draw itself is a primal value that fold computes once, so the linear map is for that draw, as
// torch.func's is. Dropout's fused kernel passes its input's tangent through its mask.
#include "passes/jvp_rules/rules.h"
#include "ir/op.h"

namespace jvpc::jvp_rules {

void register_random(Registry& r) {
  for (Op op : {ops::rand_like, ops::randn_like, ops::bernoulli, ops::bernoulli_p, ops::bernoulli_Tensor, ops::uniform,
                ops::normal_functional, ops::exponential, ops::geometric, ops::log_normal, ops::cauchy, ops::random,
                ops::random_from, ops::random_to})
    r.add(op, zero());
  // (out, mask) = native_dropout(x, p, train): out = x·mask/(1 − p) in training, x otherwise.
  r.add(ops::native_dropout, per_arg({[](Ctx& c, Value* t) {
          const c10::IValue& train = c.c(2);
          if (!train.isNone() && !train.toBool()) return t;
          double p = scalar(c.c(1));
          return c.mul(t, c.scale(c.cast(c.out(1), c.out(0)->meta().dtype), p == 1.0 ? 0.0 : 1.0 / (1.0 - p)));
        }}));
}

}  // namespace jvpc::jvp_rules
