// JVP rules of activation functions. Most have a backward kernel g·f'(x); applied to ones it
// gives f'(x) as a primal expression, which fold computes once, so each tangent costs one
// multiplication per call and the rule states no derivative by hand.
#include "passes/jvp_rules/rules.h"
#include "ir/op.h"

#include <c10/core/WrapDimMinimal.h>

namespace jvpc::jvp_rules {

namespace {

Value* ones(Ctx& c) { return c.call(ops::ones_like, {c.x(0)}); }

/// f'(x) = backward(ones, x, <the primal node's arguments 1..>).
Rule via_backward(Op backward) {
  return unary([backward](Ctx& c) {
    std::vector<BArg> args = {ones(c), c.x(0)};
    for (size_t i = 1; i < c.n.args().size(); ++i) args.push_back(c.a(i));
    return c.call(backward, std::move(args));
  });
}

/// backward(t, x, <arguments 1..>) itself, per call: for the piecewise-linear activations whose
/// backward kernel selects the tangent (or 0) rather than multiplying it, so that an infinite or
/// NaN tangent where the derivative is 0 gives 0, as in LibTorch.
Rule selecting_backward(Op backward) {
  return per_arg({[backward](Ctx& c, Value* t) {
    std::vector<BArg> args = {t, c.x(0)};
    for (size_t i = 1; i < c.n.args().size(); ++i) args.push_back(c.a(i));
    return c.call(backward, std::move(args));
  }});
}

}  // namespace

void register_activations(Registry& r) {
  // relu and threshold pass the tangent where not x <= threshold (NaN passes), as
  // threshold_backward does.
  r.add(ops::relu, masked([](Ctx& c) { return c.call(ops::bitwise_not, {c.call(ops::le_Scalar, {c.x(0), 0})}); }));
  r.add(ops::gelu, via_backward(ops::gelu_backward));
  r.add(ops::silu, via_backward(ops::silu_backward));
  r.add(ops::mish, via_backward(ops::mish_backward));
  r.add(ops::hardswish, via_backward(ops::hardswish_backward));
  r.add(ops::hardsigmoid, selecting_backward(ops::hardsigmoid_backward));
  r.add(ops::hardtanh, selecting_backward(ops::hardtanh_backward));
  r.add(ops::softplus, via_backward(ops::softplus_backward));
  r.add(ops::logit, via_backward(ops::logit_backward));
  r.add(ops::softshrink, selecting_backward(ops::softshrink_backward));
  r.add(ops::hardshrink, selecting_backward(ops::hardshrink_backward));
  r.add(ops::threshold, masked([](Ctx& c) {
          return c.call(ops::bitwise_not, {c.call(ops::le_Scalar, {c.x(0), c.a(1)})});
        }));
  r.add(ops::celu, unary([](Ctx& c) {  // celu(x, a) = elu(x, alpha a, scale 1, input scale 1/a)
          return c.call(ops::elu_backward, {ones(c), c.a(1), 1.0, 1.0 / scalar(c.c(1)), false, c.x(0)});
        }));
  // prelu: x where x > 0, else w·x: d = tx·(1 or w) + tw·(0 or x)
  r.add(ops::_prelu_kernel, [](Ctx& c) -> std::vector<Value*> {
    Value* positive = c.call(ops::gt_Scalar, {c.x(0), 0});
    auto pick = [&](double where_positive, Value* otherwise) {
      return c.call(ops::where_ScalarSelf, {positive, where_positive, otherwise});
    };
    return {c.per_arg({[&](Ctx&, Value* t) { return c.mul(t, pick(1.0, c.x(1))); },
                       [&](Ctx&, Value* t) { return c.mul(t, pick(0.0, c.x(0))); }})};
  });
  // glu(x, dim) = a·σ(b) for the halves a, b of x along dim: d = ta·σ(b) + tb·a·σ(b)(1 − σ(b))
  r.add(ops::glu, per_arg({[](Ctx& c, Value* t) {
          int64_t dim = c10::maybe_wrap_dim(c.c(1).toInt(), static_cast<int64_t>(c.x(0)->meta().sizes.size()));
          int64_t h = c.x(0)->meta().sizes.at(static_cast<size_t>(dim)) / 2;
          auto half = [&](Value* v, int64_t i) { return c.call(ops::slice_Tensor, {v, dim, i * h, (i + 1) * h}); };
          Value* s = c.sigmoid(half(c.x(0), 1));
          Value* a = half(c.x(0), 0);
          Value* ds = c.mul(a, c.mul(s, c.sub(1, s)));
          return c.add(c.mul(half(t, 0), s), c.mul(half(t, 1), ds));
        }}));
  r.add(ops::leaky_relu, unary([](Ctx& c) {
          return c.call(ops::leaky_relu_backward, {ones(c), c.x(0), c.a(1), false});
        }));
  r.add(ops::elu, unary([](Ctx& c) {
          return c.call(ops::elu_backward, {ones(c), c.a(1), c.a(2), c.a(3), false, c.x(0)});
        }));
  // log_sigmoid_forward returns the output and a buffer its backward reads; the buffer has no tangent.
  r.add(ops::log_sigmoid_forward, unary([](Ctx& c) {
          return c.call(ops::log_sigmoid_backward, {ones(c), c.x(0), c.out(1)});
        }));
}

}  // namespace jvpc::jvp_rules
