// JVP rules of elementwise ops: arithmetic, activations, selection and dtype casts.
// Derivative factors are primal expressions (fold computes them once), so each tangent costs
// one multiplication per call.
#include "passes/jvp_rules/rules.h"

#include <cmath>

namespace jvpc::jvp_rules {

namespace {

double scalar(const c10::IValue& v) { return v.isInt() ? static_cast<double>(v.toInt()) : v.isBool() ? v.toBool() : v.toDouble(); }

Value* ones_like(Ctx& c, Value* x) { return c.call("aten::ones_like", {x}); }

}  // namespace

void register_elementwise(Registry& r) {
  // x + alpha * y, x - alpha * y
  r.add("aten::add.Tensor", [](Ctx& c) -> std::vector<Value*> {
    return {c.add(c.t(0), c.scale(c.t(1), scalar(c.c(2))))};
  });
  r.add("aten::sub.Tensor", [](Ctx& c) -> std::vector<Value*> {
    double alpha = scalar(c.c(2));
    if (c.t(0) && c.t(1)) return {c.call("aten::sub.Tensor", {c.t(0), c.t(1), alpha})};
    return {c.t(0) ? c.t(0) : c.scale(c.t(1), -alpha)};
  });
  r.add("aten::add.Scalar", [](Ctx& c) -> std::vector<Value*> { return {c.t(0)}; });
  r.add("aten::sub.Scalar", [](Ctx& c) -> std::vector<Value*> { return {c.t(0)}; });
  r.add("aten::rsub.Scalar", [](Ctx& c) -> std::vector<Value*> { return {c.scale(c.t(0), -scalar(c.c(2)))}; });
  r.add("aten::rsub.Tensor", [](Ctx& c) -> std::vector<Value*> {  // y - alpha * x
    return {c.add(c.t(1), c.scale(c.t(0), -scalar(c.c(2))))};
  });
  r.add("aten::neg", linear_in(0));
  r.add("aten::mul.Tensor", bilinear());
  r.add("aten::mul.Scalar", linear_in(0));
  r.add("aten::div.Scalar", linear_in(0));
  // d(x / y) = tx / y - ty * out / y
  r.add("aten::div.Tensor", [](Ctx& c) -> std::vector<Value*> {
    Value* a = c.t(0) ? c.call("aten::div.Tensor", {c.t(0), c.x(1)}) : nullptr;
    Value* b = c.t(1) ? c.mul(c.t(1), c.call("aten::neg", {c.call("aten::div.Tensor", {c.out(), c.x(1)})})) : nullptr;
    return {c.add(a, b)};
  });

  r.add("aten::exp", unary([](Ctx& c) { return c.out(); }));
  r.add("aten::log", unary([](Ctx& c) { return c.call("aten::reciprocal", {c.x(0)}); }));
  r.add("aten::reciprocal", unary([](Ctx& c) {  // -1/x^2 = -out^2
    return c.call("aten::neg", {c.call("aten::mul.Tensor", {c.out(), c.out()})});
  }));
  r.add("aten::tanh", unary([](Ctx& c) {  // 1 - out^2
    return c.call("aten::rsub.Scalar", {c.call("aten::mul.Tensor", {c.out(), c.out()}), 1});
  }));
  r.add("aten::sigmoid", unary([](Ctx& c) {  // out (1 - out)
    return c.call("aten::mul.Tensor", {c.out(), c.call("aten::rsub.Scalar", {c.out(), 1})});
  }));
  r.add("aten::relu", unary([](Ctx& c) {  // 1 where x > 0
    return c.call("aten::_to_copy", {c.call("aten::gt.Scalar", {c.x(0), 0}), c.out()->meta().dtype});
  }));
  r.add("aten::gelu", unary([](Ctx& c) {
    return c.call("aten::gelu_backward", {ones_like(c, c.x(0)), c.x(0), c.c(1).toStringRef()});
  }));
  r.add("aten::silu", unary([](Ctx& c) { return c.call("aten::silu_backward", {ones_like(c, c.x(0)), c.x(0)}); }));
  r.add("aten::sqrt", unary([](Ctx& c) {  // 1 / (2 sqrt(x))
    return c.call("aten::mul.Scalar", {c.call("aten::reciprocal", {c.out()}), 0.5});
  }));
  r.add("aten::rsqrt", unary([](Ctx& c) {  // -x^(-3/2) / 2 = -out^3 / 2
    return c.call("aten::mul.Scalar", {c.call("aten::pow.Tensor_Scalar", {c.out(), 3}), -0.5});
  }));
  r.add("aten::erf", unary([](Ctx& c) {  // 2/sqrt(pi) exp(-x^2)
    Value* e = c.call("aten::exp", {c.call("aten::neg", {c.call("aten::mul.Tensor", {c.x(0), c.x(0)})})});
    return c.call("aten::mul.Scalar", {e, 2.0 / std::sqrt(M_PI)});
  }));
  r.add("aten::sin", unary([](Ctx& c) { return c.call("aten::cos", {c.x(0)}); }));
  r.add("aten::cos", unary([](Ctx& c) { return c.call("aten::neg", {c.call("aten::sin", {c.x(0)})}); }));
  r.add("aten::abs", unary([](Ctx& c) { return c.call("aten::sgn", {c.x(0)}); }));
  r.add("aten::pow.Tensor_Scalar", [](Ctx& c) -> std::vector<Value*> {
    double p = scalar(c.c(1));
    if (!c.t(0) || p == 0.0) return {};
    if (p == 1.0) return {c.t(0)};
    Value* f = p == 2.0 ? c.x(0) : c.call("aten::pow.Tensor_Scalar", {c.x(0), p - 1.0});
    return {c.mul(c.t(0), c.call("aten::mul.Scalar", {f, p}))};
  });

  // Selection: tangents follow the selected branch; the condition has none.
  r.add("aten::where.self", [](Ctx& c) -> std::vector<Value*> {
    Value *a = c.t(1), *b = c.t(2);
    if (a && b) return {c.call("aten::where.self", {c.x(0), a, b})};
    if (a) return {c.call("aten::where.ScalarOther", {c.x(0), a, 0.0})};
    return {c.call("aten::where.ScalarSelf", {c.x(0), 0.0, b})};
  });
  r.add("aten::masked_fill.Scalar", [](Ctx& c) -> std::vector<Value*> {
    if (!c.t(0)) return {};
    return {c.call("aten::masked_fill.Scalar", {c.t(0), c.x(1), 0.0})};
  });
  r.add("aten::masked_fill.Tensor", [](Ctx& c) -> std::vector<Value*> {  // value: a 0-dim tensor
    if (!c.t(2)) return {c.t(0) ? c.call("aten::masked_fill.Scalar", {c.t(0), c.x(1), 0.0}) : nullptr};
    Value* self = c.t(0) ? c.t(0) : c.call("aten::zeros_like", {c.out()});
    return {c.call("aten::masked_fill.Tensor", {self, c.x(1), c.t(2)})};
  });

  // Copies and casts are linear; detach stops tangents; a copy takes the source's tangent.
  r.add("aten::_to_copy", linear_in(0));
  r.add("aten::clone", linear_in(0));
  r.add("aten::tril", linear_in(0));
  r.add("aten::triu", linear_in(0));
  r.add("aten::detach", [](Ctx&) -> std::vector<Value*> { return {}; });
  // Factories shaped like their argument do not depend on its values.
  for (const char* op : {"aten::zeros_like", "aten::ones_like", "aten::empty_like", "aten::full_like", "aten::new_zeros",
                         "aten::new_ones", "aten::new_empty", "aten::new_full"})
    r.add(op, [](Ctx&) -> std::vector<Value*> { return {}; });
  r.add("aten::fill.Scalar", [](Ctx&) -> std::vector<Value*> { return {}; });
  r.add("aten::zero", [](Ctx&) -> std::vector<Value*> { return {}; });
  r.add("aten::copy", [](Ctx& c) -> std::vector<Value*> { return {c.t(1)}; });
}

}  // namespace jvpc::jvp_rules
