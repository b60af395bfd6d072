// JVP rules of activation functions. Most have a backward kernel g·f'(x); applied to ones it
// gives f'(x) as a primal expression, which fold computes once, so each tangent costs one
// multiplication per call and the rule states no derivative by hand.
#include "passes/jvp_rules/rules.h"

namespace jvpc::jvp_rules {

namespace {

Value* ones(Ctx& c) { return c.call("aten::ones_like", {c.x(0)}); }

/// f'(x) = backward(ones, x, <the primal node's arguments 1..>).
Rule via_backward(const char* backward) {
  return unary([backward](Ctx& c) {
    std::vector<BArg> args = {ones(c), c.x(0)};
    for (size_t i = 1; i < c.n.args().size(); ++i) args.push_back(c.a(i));
    return c.call(backward, std::move(args));
  });
}

}  // namespace

void register_activations(Registry& r) {
  r.add("aten::relu", unary([](Ctx& c) {  // 1 where x > 0
    return c.call("aten::_to_copy", {c.call("aten::gt.Scalar", {c.x(0), 0}), c.out()->meta().dtype});
  }));
  r.add("aten::gelu", via_backward("aten::gelu_backward"));
  r.add("aten::silu", via_backward("aten::silu_backward"));
  r.add("aten::mish", via_backward("aten::mish_backward"));
  r.add("aten::hardswish", via_backward("aten::hardswish_backward"));
  r.add("aten::hardsigmoid", via_backward("aten::hardsigmoid_backward"));
  r.add("aten::hardtanh", via_backward("aten::hardtanh_backward"));
  r.add("aten::softplus", via_backward("aten::softplus_backward"));
  r.add("aten::logit", via_backward("aten::logit_backward"));
  r.add("aten::leaky_relu", unary([](Ctx& c) {
    return c.call("aten::leaky_relu_backward", {ones(c), c.x(0), c.a(1), false});
  }));
  r.add("aten::elu", unary([](Ctx& c) {
    return c.call("aten::elu_backward", {ones(c), c.a(1), c.a(2), c.a(3), false, c.x(0)});
  }));
  // log_sigmoid_forward returns the output and a buffer its backward reads; the buffer has no tangent.
  r.add("aten::log_sigmoid_forward", unary([](Ctx& c) {
    return c.call("aten::log_sigmoid_backward", {ones(c), c.x(0), c.out(1)});
  }));
}

}  // namespace jvpc::jvp_rules
