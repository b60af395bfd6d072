// JVP rules of elementwise ops: arithmetic, math functions, copies and dtype casts.
// Derivative factors are primal expressions (fold computes them once), so each tangent costs
// one multiplication per call.
#include "passes/jvp_rules/rules.h"

#include <cmath>

namespace jvpc::jvp_rules {

namespace {

/// x·log(y) (xlogy, pole 0) and x·log(1 + y) (xlog1py, pole −1), 0 where x = 0: tx·log(..), 0
/// where also y <= pole, as in LibTorch, plus ty·x/(y − pole).
Rule x_times_log(const char* log_op, double pole) {
  return [log_op = std::string(log_op), pole](Ctx& c) -> std::vector<Value*> {
    Value* a = nullptr;
    if (c.t(0)) {
      Value* undefined = c.call("aten::bitwise_and.Tensor",
                                {c.call("aten::eq.Scalar", {c.x(0), 0}), c.call("aten::le.Scalar", {c.x(1), pole})});
      Value* log_y = c.call(log_op, {c.x(1)});
      if (log_y->meta().dtype != c.out()->meta().dtype)
        log_y = c.call("aten::_to_copy", {log_y, c.out()->meta().dtype});
      a = c.mul(c.t(0), c.call("aten::where.ScalarSelf", {undefined, 0.0, log_y}));
    }
    Value* shifted = pole == 0.0 ? c.x(1) : c.call("aten::sub.Scalar", {c.x(1), pole});
    Value* b = c.t(1) ? c.mul(c.t(1), c.call("aten::div.Tensor", {c.x(0), shifted})) : nullptr;
    return {c.add(a, b)};
  };
}

}  // namespace

void register_elementwise(Registry& r) {
  // x + alpha * y, x - alpha * y
  r.add("aten::add.Tensor",
        [](Ctx& c) -> std::vector<Value*> { return {c.add(c.t(0), c.scale(c.t(1), scalar(c.c(2))))}; });
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
  r.add("aten::erfc", unary([](Ctx& c) {  // −2/sqrt(pi) exp(−x²)
          Value* e = c.call("aten::exp", {c.call("aten::neg", {c.call("aten::mul.Tensor", {c.x(0), c.x(0)})})});
          return c.call("aten::mul.Scalar", {e, -2.0 / std::sqrt(M_PI)});
        }));
  r.add("aten::erfinv", unary([](Ctx& c) {  // sqrt(pi)/2 exp(out²)
          return c.call("aten::mul.Scalar",
                        {c.call("aten::exp", {c.call("aten::mul.Tensor", {c.out(), c.out()})}), std::sqrt(M_PI) / 2});
        }));
  // Special functions: lgamma' = digamma, digamma' = polygamma(1), polygamma(n)' = polygamma(n + 1).
  r.add("aten::lgamma", unary([](Ctx& c) { return c.call("aten::digamma", {c.x(0)}); }));
  r.add("aten::digamma", unary([](Ctx& c) { return c.call("aten::polygamma", {1, c.x(0)}); }));
  r.add("aten::polygamma", [](Ctx& c) -> std::vector<Value*> {  // (n, x)
    if (!c.t(1)) return {};
    return {c.mul(c.t(1), c.call("aten::polygamma", {c.c(0).toInt() + 1, c.x(1)}))};
  });
  r.add("aten::special_log_ndtr", unary([](Ctx& c) {  // φ(x)/Φ(x) = exp(−x²/2 − log Φ(x)) / sqrt(2π)
          Value* half_square = c.call("aten::mul.Scalar", {c.call("aten::mul.Tensor", {c.x(0), c.x(0)}), 0.5});
          Value* e = c.call("aten::exp", {c.call("aten::neg", {c.call("aten::add.Tensor", {half_square, c.out()})})});
          return c.call("aten::mul.Scalar", {e, 1.0 / std::sqrt(2 * M_PI)});
        }));
  r.add("aten::special_ndtri", unary([](Ctx& c) {  // sqrt(2π) exp(out²/2)
          Value* half_square = c.call("aten::mul.Scalar", {c.call("aten::mul.Tensor", {c.out(), c.out()}), 0.5});
          return c.call("aten::mul.Scalar", {c.call("aten::exp", {half_square}), std::sqrt(2 * M_PI)});
        }));
  // copysign(x, y) = |x|·sign(y): tx·out/x, 0 where x = 0 (as LibTorch); y's tangent is 0.
  for (const char* op : {"aten::copysign.Tensor", "aten::copysign.Scalar"})
    r.add(op, unary([](Ctx& c) {
            return c.call("aten::masked_fill.Scalar",
                          {c.call("aten::div.Tensor", {c.out(), c.x(0)}), c.call("aten::eq.Scalar", {c.x(0), 0}), 0.0});
          }));
  r.add("aten::deg2rad", [](Ctx& c) -> std::vector<Value*> { return {c.scale(c.t(0), M_PI / 180.0)}; });
  r.add("aten::rad2deg", [](Ctx& c) -> std::vector<Value*> { return {c.scale(c.t(0), 180.0 / M_PI)}; });
  // ldexp(x, e) = x·2^e: tx·2^e + te·out·log 2.
  r.add("aten::ldexp.Tensor", [](Ctx& c) -> std::vector<Value*> {
    Value* a = nullptr;
    if (c.t(0)) {
      Value* e = c.x(1);
      if (e->meta().dtype != c.out()->meta().dtype) e = c.call("aten::_to_copy", {e, c.out()->meta().dtype});
      a = c.mul(c.t(0), c.call("aten::exp2", {e}));
    }
    Value* b = c.t(1) ? c.mul(c.t(1), c.call("aten::mul.Scalar", {c.out(), std::log(2.0)})) : nullptr;
    return {c.add(a, b)};
  });
  r.add("aten::i0", unary([](Ctx& c) { return c.call("aten::special_i1", {c.x(0)}); }));
  // frexp(x) = (mantissa, exponent) with x = mantissa·2^exponent: the mantissa's tangent is
  // t / 2^exponent (the exponent is piecewise constant, an integer).
  r.add("aten::frexp.Tensor", [](Ctx& c) -> std::vector<Value*> {
    if (!c.t(0)) return {};
    Value* e = c.call("aten::_to_copy", {c.out(1), c.out(0)->meta().dtype});
    return {c.call("aten::div.Tensor", {c.t(0), c.call("aten::exp2", {e})}), nullptr};
  });
  r.add("aten::exp2", unary([](Ctx& c) { return c.call("aten::mul.Scalar", {c.out(), std::log(2.0)}); }));
  // log(eᵃ + eᵇ): ta·σ(a − b) + tb·σ(b − a), finite where a or b is +inf (e^(a − out) would be
  // inf − inf there); base 2: σ((a − b)·ln 2).
  for (auto [op, scale] : {std::pair{"aten::logaddexp", 1.0}, std::pair{"aten::logaddexp2", std::log(2.0)}})
    r.add(op, [scale = scale](Ctx& c) -> std::vector<Value*> {
      auto share = [&](size_t i) {
        Value* d = c.call("aten::sub.Tensor", {c.x(i), c.x(1 - i)});
        return c.call("aten::sigmoid", {scale == 1.0 ? d : c.call("aten::mul.Scalar", {d, scale})});
      };
      return {c.add(c.t(0) ? c.mul(c.t(0), share(0)) : nullptr, c.t(1) ? c.mul(c.t(1), share(1)) : nullptr)};
    });
  // Σᵢ lgamma(x − i/2) (+ a constant): Σᵢ digamma(x − i/2)
  r.add("aten::mvlgamma", unary([](Ctx& c) {
          int64_t p = c.c(1).toInt();
          Value* sum = nullptr;
          for (int64_t i = 0; i < p; ++i) {
            Value* d = c.call("aten::digamma", {c.call("aten::sub.Scalar", {c.x(0), 0.5 * static_cast<double>(i)})});
            sum = sum ? c.call("aten::add.Tensor", {sum, d}) : d;
          }
          return sum;
        }));
  // t·isfinite(x), a product as LibTorch's (isfinite: x − x == 0; it has no kernel of its own).
  r.add("aten::nan_to_num", unary([](Ctx& c) {
          Value* finite = c.call("aten::eq.Scalar", {c.call("aten::sub.Tensor", {c.x(0), c.x(0)}), 0});
          return c.call("aten::_to_copy", {finite, c.out()->meta().dtype});
        }));
  r.add("aten::sin", unary([](Ctx& c) { return c.call("aten::cos", {c.x(0)}); }));
  r.add("aten::cos", unary([](Ctx& c) { return c.call("aten::neg", {c.call("aten::sin", {c.x(0)})}); }));
  r.add("aten::abs", [](Ctx& c) -> std::vector<Value*> { return {abs_tangent(c)}; });
  r.add("aten::sinh", unary([](Ctx& c) { return c.call("aten::cosh", {c.x(0)}); }));
  r.add("aten::cosh", unary([](Ctx& c) { return c.call("aten::sinh", {c.x(0)}); }));
  r.add("aten::atan", unary([](Ctx& c) {  // 1 / (1 + x^2)
          return c.call("aten::reciprocal",
                        {c.call("aten::add.Scalar", {c.call("aten::mul.Tensor", {c.x(0), c.x(0)}), 1})});
        }));
  r.add("aten::tan", unary([](Ctx& c) {  // 1 + tan²
          return c.call("aten::add.Scalar", {c.call("aten::mul.Tensor", {c.out(), c.out()}), 1});
        }));
  // asin, acos: ±1/√(1 − x²); asinh: 1/√(x² + 1); acosh: 1/√(x² − 1); atanh: 1/(1 − x²)
  auto one_minus_square = [](Ctx& c) {
    return c.call("aten::rsub.Scalar", {c.call("aten::mul.Tensor", {c.x(0), c.x(0)}), 1});
  };
  auto square_plus = [](Ctx& c, double a) {
    return c.call("aten::add.Scalar", {c.call("aten::mul.Tensor", {c.x(0), c.x(0)}), a});
  };
  r.add("aten::asin", unary([=](Ctx& c) { return c.call("aten::rsqrt", {one_minus_square(c)}); }));
  r.add("aten::acos",
        unary([=](Ctx& c) { return c.call("aten::neg", {c.call("aten::rsqrt", {one_minus_square(c)})}); }));
  r.add("aten::asinh", unary([=](Ctx& c) { return c.call("aten::rsqrt", {square_plus(c, 1.0)}); }));
  r.add("aten::acosh", unary([=](Ctx& c) { return c.call("aten::rsqrt", {square_plus(c, -1.0)}); }));
  r.add("aten::atanh", unary([=](Ctx& c) { return c.call("aten::reciprocal", {one_minus_square(c)}); }));
  r.add("aten::log1p", unary([](Ctx& c) {
          return c.call("aten::reciprocal", {c.call("aten::add.Scalar", {c.x(0), 1})});
        }));
  r.add("aten::expm1", unary([](Ctx& c) { return c.call("aten::add.Scalar", {c.out(), 1}); }));
  for (auto [op, base] : {std::pair{"aten::log2", 2.0}, std::pair{"aten::log10", 10.0}})
    r.add(op, unary([base = base](Ctx& c) {  // 1 / (x ln b)
            return c.call("aten::reciprocal", {c.call("aten::mul.Scalar", {c.x(0), std::log(base)})});
          }));
  // x - y·round(x/y) and the like: the derivative in x is 1 almost everywhere, in y −round(x/y).
  for (const char* op : {"aten::remainder.Scalar", "aten::fmod.Scalar", "aten::frac"})
    r.add(op, [](Ctx& c) -> std::vector<Value*> { return {c.t(0)}; });
  for (auto [op, rounding] : {std::pair{"aten::remainder.Tensor", "floor"}, std::pair{"aten::fmod.Tensor", "trunc"}})
    r.add(op, [rounding = std::string(rounding)](Ctx& c) -> std::vector<Value*> {
      if (!c.t(1)) return {c.t(0)};
      Value* q = c.call("aten::div.Tensor_mode", {c.x(0), c.x(1), rounding});
      return {c.add(c.t(0), c.mul(c.t(1), c.call("aten::neg", {q})))};
    });
  r.add("aten::remainder.Scalar_Tensor", [](Ctx& c) -> std::vector<Value*> {  // s − y·floor(s/y)
    if (!c.t(1)) return {};
    const TensorMeta& m = c.x(1)->meta();
    Value* s = c.call("aten::scalar_tensor", {scalar(c.c(0)), m.dtype, std::nullopt, m.device, std::nullopt});
    Value* q = c.call("aten::div.Tensor_mode", {s, c.x(1), "floor"});  // as the op rounds s/y
    return {c.mul(c.t(1), c.call("aten::neg", {q}))};
  });
  r.add("aten::div.Tensor_mode", [](Ctx& c) -> std::vector<Value*> {  // rounded: piecewise constant
    if (!c.c(2).isNone()) return {};
    Value* a = c.t(0) ? c.call("aten::div.Tensor", {c.t(0), c.x(1)}) : nullptr;
    Value* b = c.t(1) ? c.mul(c.t(1), c.call("aten::neg", {c.call("aten::div.Tensor", {c.out(), c.x(1)})})) : nullptr;
    return {c.add(a, b)};
  });
  r.add("aten::special_xlog1py", x_times_log("aten::log1p", -1.0));
  r.add("aten::special_xlog1py.self_scalar", [](Ctx& c) -> std::vector<Value*> {  // s·log1p(y): ty·s/(1 + y)
    if (!c.t(1)) return {};
    return {
        c.mul(c.t(1), c.call("aten::mul.Scalar",
                             {c.call("aten::reciprocal", {c.call("aten::add.Scalar", {c.x(1), 1})}), scalar(c.c(0))}))};
  });
  r.add("aten::special_xlog1py.other_scalar", [](Ctx& c) -> std::vector<Value*> {  // x·log1p(s): tx·log1p(s)
    if (!c.t(0)) return {};
    return {c.scale(c.t(0), std::log1p(scalar(c.c(1))))};
  });
  // Piecewise constant: the derivative is 0 almost everywhere.
  for (const char* op : {"aten::sign", "aten::sgn", "aten::floor", "aten::ceil", "aten::round", "aten::trunc"})
    r.add(op, zero());
  r.add("aten::pow.Tensor_Scalar", [](Ctx& c) -> std::vector<Value*> {
    double p = scalar(c.c(1));
    if (!c.t(0) || p == 0.0) return {};
    if (p == 1.0) return {c.t(0)};
    Value* f = p == 2.0 ? c.x(0) : c.call("aten::pow.Tensor_Scalar", {c.x(0), p - 1.0});
    return {c.mul(c.t(0), c.call("aten::mul.Scalar", {f, p}))};
  });
  // d(x^y) = tx · y·x^(y-1) + ty · x^y·log(x), with LibTorch's values where x or y is 0.
  r.add("aten::pow.Tensor_Tensor", [](Ctx& c) -> std::vector<Value*> {
    Value *x = c.x(0), *y = c.x(1);
    Value* a = nullptr;
    if (c.t(0)) {
      Value* f =
          c.call("aten::mul.Tensor", {y, c.call("aten::pow.Tensor_Tensor", {x, c.call("aten::sub.Scalar", {y, 1})})});
      a = c.mul(c.t(0), c.call("aten::masked_fill.Scalar", {f, c.call("aten::eq.Scalar", {y, 0}), 0.0}));
    }
    Value* b = nullptr;
    if (c.t(1)) {
      Value* zero_base =
          c.call("aten::bitwise_and.Tensor", {c.call("aten::eq.Scalar", {x, 0}), c.call("aten::ge.Scalar", {y, 0})});
      Value* f = c.call("aten::mul.Tensor", {c.out(), c.call("aten::log", {x})});
      b = c.mul(c.t(1), c.call("aten::masked_fill.Scalar", {f, zero_base, 0.0}));
    }
    return {c.add(a, b)};
  });
  r.add("aten::pow.Scalar", [](Ctx& c) -> std::vector<Value*> {  // b^y: ty · b^y·log(b)
    Value* t = c.t(1);
    double base = scalar(c.c(0));
    if (!t) return {};
    if (base == 0.0) {  // 0^y: derivative 0 for y >= 0, as in LibTorch
      Value* f = c.call("aten::mul.Scalar", {c.out(), -INFINITY});
      return {c.mul(t, c.call("aten::masked_fill.Scalar", {f, c.call("aten::ge.Scalar", {c.x(1), 0}), 0.0}))};
    }
    return {c.mul(t, c.call("aten::mul.Scalar", {c.out(), std::log(base)}))};
  });
  // self + value·t1·t2 and self + value·t1/t2
  r.add("aten::addcmul", [](Ctx& c) -> std::vector<Value*> {
    double v = scalar(c.c(3));
    Value* prod = c.add(c.mul(c.t(1), c.x(2)), c.mul(c.t(2), c.x(1)));
    return {c.add(c.t(0), c.scale(prod, v))};
  });
  r.add("aten::addcdiv", [](Ctx& c) -> std::vector<Value*> {  // d(t1/t2) = dt1/t2 − dt2·t1/t2²
    double v = scalar(c.c(3));
    Value* inv = c.call("aten::reciprocal", {c.x(2)});
    Value* q = c.t(2)
                   ? c.call("aten::neg", {c.call("aten::mul.Tensor", {c.x(1), c.call("aten::mul.Tensor", {inv, inv})})})
                   : nullptr;
    return {c.add(c.t(0), c.scale(c.add(c.mul(c.t(1), inv), c.mul(c.t(2), q)), v))};
  });
  // start + w·(end − start)
  r.add("aten::lerp.Scalar", [](Ctx& c) -> std::vector<Value*> {
    double w = scalar(c.c(2));
    return {c.add(c.scale(c.t(0), 1.0 - w), c.scale(c.t(1), w))};
  });
  r.add("aten::lerp.Tensor", [](Ctx& c) -> std::vector<Value*> {
    Value* w = c.x(2);
    Value* a = c.t(0) ? c.mul(c.t(0), c.call("aten::rsub.Scalar", {w, 1})) : nullptr;
    Value* tw = c.t(2) ? c.mul(c.t(2), c.call("aten::sub.Tensor", {c.x(1), c.x(0)})) : nullptr;
    return {c.add(c.add(a, c.mul(c.t(1), w)), tw)};
  });
  // atan2(y, x): (ty·x − tx·y) / (x² + y²), the numerator first, as LibTorch: where x² + y²
  // underflows to 0 the tangent is infinite, not 0/0.
  r.add("aten::atan2", [](Ctx& c) -> std::vector<Value*> {
    Value *y = c.x(0), *x = c.x(1);
    Value* r2 = c.call("aten::add.Tensor", {c.call("aten::mul.Tensor", {x, x}), c.call("aten::mul.Tensor", {y, y})});
    Value* a = c.t(0) ? c.mul(c.t(0), x) : nullptr;
    Value* b = c.t(1) ? c.mul(c.t(1), c.call("aten::neg", {y})) : nullptr;
    return {c.call("aten::div.Tensor", {c.add(a, b), r2})};
  });
  r.add("aten::hypot", [](Ctx& c) -> std::vector<Value*> {  // (ta·a + tb·b) / out
    Value* a = c.t(0) ? c.mul(c.t(0), c.call("aten::div.Tensor", {c.x(0), c.out()})) : nullptr;
    Value* b = c.t(1) ? c.mul(c.t(1), c.call("aten::div.Tensor", {c.x(1), c.out()})) : nullptr;
    return {c.add(a, b)};
  });
  r.add("aten::xlogy.Tensor", x_times_log("aten::log", 0.0));

  // Copies and casts are linear; detach stops tangents; a copy takes the source's tangent.
  r.add("aten::_to_copy", linear_in(0));
  r.add("aten::clone", linear_in(0));
  r.add("aten::tril", linear_in(0));
  r.add("aten::triu", linear_in(0));
  r.add("aten::detach", zero());
  // Factories shaped like their argument do not depend on its values.
  for (const char* op : {"aten::zeros_like", "aten::ones_like", "aten::empty_like", "aten::full_like",
                         "aten::new_zeros", "aten::new_ones", "aten::new_empty", "aten::new_full"})
    r.add(op, zero());
  r.add("aten::fill.Scalar", zero());
  r.add("aten::zero", zero());
  r.add("aten::copy", [](Ctx& c) -> std::vector<Value*> { return {c.t(1)}; });
}

}  // namespace jvpc::jvp_rules
