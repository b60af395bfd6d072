// JVP rules of elementwise ops: arithmetic, math functions, copies and dtype casts.
// Derivative factors are primal expressions (fold computes them once), so each tangent costs
// one multiplication per call.
#include "passes/jvp_rules/rules.h"
#include "ir/op.h"

#include <cmath>

namespace jvpc::jvp_rules {

namespace {

/// x·log(y) (xlogy, pole 0) and x·log(1 + y) (xlog1py, pole −1), 0 where x = 0: tx·log(..), 0
/// where also y <= pole, as in LibTorch, plus ty·x/(y − pole).
Rule x_times_log(Op log_op, double pole) {
  return [log_op, pole](Ctx& c) -> std::vector<Value*> {
    Value* a = nullptr;
    if (c.t(0)) {
      Value* undefined = c.call(ops::bitwise_and_Tensor,
                                {c.call(ops::eq_Scalar, {c.x(0), 0}), c.call(ops::le_Scalar, {c.x(1), pole})});
      Value* log_y = c.call(log_op, {c.x(1)});
      if (log_y->meta().dtype != c.out()->meta().dtype)
        log_y = c.call(ops::_to_copy, {log_y, c.out()->meta().dtype});
      a = c.mul(c.t(0), c.call(ops::where_ScalarSelf, {undefined, 0.0, log_y}));
    }
    Value* shifted = pole == 0.0 ? c.x(1) : c.call(ops::sub_Scalar, {c.x(1), pole});
    Value* b = c.t(1) ? c.mul(c.t(1), c.call(ops::div_Tensor, {c.x(0), shifted})) : nullptr;
    return {c.add(a, b)};
  };
}

}  // namespace

void register_elementwise(Registry& r) {
  // x + alpha * y, x - alpha * y
  r.add(ops::add_Tensor,
        [](Ctx& c) -> std::vector<Value*> { return {c.add(c.t(0), c.scale(c.t(1), scalar(c.c(2))))}; });
  r.add(ops::sub_Tensor, [](Ctx& c) -> std::vector<Value*> {
    double alpha = scalar(c.c(2));
    if (c.t(0) && c.t(1)) return {c.call(ops::sub_Tensor, {c.t(0), c.t(1), alpha})};
    return {c.t(0) ? c.t(0) : c.scale(c.t(1), -alpha)};
  });
  r.add(ops::add_Scalar, [](Ctx& c) -> std::vector<Value*> { return {c.t(0)}; });
  r.add(ops::sub_Scalar, [](Ctx& c) -> std::vector<Value*> { return {c.t(0)}; });
  r.add(ops::rsub_Scalar, [](Ctx& c) -> std::vector<Value*> { return {c.scale(c.t(0), -scalar(c.c(2)))}; });
  r.add(ops::rsub_Tensor, [](Ctx& c) -> std::vector<Value*> {  // y - alpha * x
    return {c.add(c.t(1), c.scale(c.t(0), -scalar(c.c(2))))};
  });
  r.add(ops::neg, linear_in(0));
  r.add(ops::mul_Tensor, bilinear());
  r.add(ops::mul_Scalar, linear_in(0));
  r.add(ops::div_Scalar, linear_in(0));
  // d(x / y) = tx / y - ty * out / y
  r.add(ops::div_Tensor, [](Ctx& c) -> std::vector<Value*> {
    Value* a = c.t(0) ? c.call(ops::div_Tensor, {c.t(0), c.x(1)}) : nullptr;
    Value* b = c.t(1) ? c.mul(c.t(1), c.call(ops::neg, {c.call(ops::div_Tensor, {c.out(), c.x(1)})})) : nullptr;
    return {c.add(a, b)};
  });

  r.add(ops::exp, unary([](Ctx& c) { return c.out(); }));
  r.add(ops::log, unary([](Ctx& c) { return c.call(ops::reciprocal, {c.x(0)}); }));
  r.add(ops::reciprocal, unary([](Ctx& c) {  // -1/x^2 = -out^2
          return c.call(ops::neg, {c.call(ops::mul_Tensor, {c.out(), c.out()})});
        }));
  r.add(ops::tanh, unary([](Ctx& c) {  // 1 - out^2
          return c.call(ops::rsub_Scalar, {c.call(ops::mul_Tensor, {c.out(), c.out()}), 1});
        }));
  r.add(ops::sigmoid, unary([](Ctx& c) {  // out (1 - out)
          return c.call(ops::mul_Tensor, {c.out(), c.call(ops::rsub_Scalar, {c.out(), 1})});
        }));
  r.add(ops::sqrt, unary([](Ctx& c) {  // 1 / (2 sqrt(x))
          return c.call(ops::mul_Scalar, {c.call(ops::reciprocal, {c.out()}), 0.5});
        }));
  r.add(ops::rsqrt, unary([](Ctx& c) {  // -x^(-3/2) / 2 = -out^3 / 2
          return c.call(ops::mul_Scalar, {c.call(ops::pow_Tensor_Scalar, {c.out(), 3}), -0.5});
        }));
  r.add(ops::erf, unary([](Ctx& c) {  // 2/sqrt(pi) exp(-x^2)
          Value* e = c.call(ops::exp, {c.call(ops::neg, {c.call(ops::mul_Tensor, {c.x(0), c.x(0)})})});
          return c.call(ops::mul_Scalar, {e, 2.0 / std::sqrt(M_PI)});
        }));
  r.add(ops::erfc, unary([](Ctx& c) {  // −2/sqrt(pi) exp(−x²)
          Value* e = c.call(ops::exp, {c.call(ops::neg, {c.call(ops::mul_Tensor, {c.x(0), c.x(0)})})});
          return c.call(ops::mul_Scalar, {e, -2.0 / std::sqrt(M_PI)});
        }));
  r.add(ops::erfinv, unary([](Ctx& c) {  // sqrt(pi)/2 exp(out²)
          return c.call(ops::mul_Scalar,
                        {c.call(ops::exp, {c.call(ops::mul_Tensor, {c.out(), c.out()})}), std::sqrt(M_PI) / 2});
        }));
  // Special functions: lgamma' = digamma, digamma' = polygamma(1), polygamma(n)' = polygamma(n + 1).
  r.add(ops::lgamma, unary([](Ctx& c) { return c.call(ops::digamma, {c.x(0)}); }));
  r.add(ops::digamma, unary([](Ctx& c) { return c.call(ops::polygamma, {1, c.x(0)}); }));
  r.add(ops::polygamma, [](Ctx& c) -> std::vector<Value*> {  // (n, x)
    if (!c.t(1)) return {};
    return {c.mul(c.t(1), c.call(ops::polygamma, {c.c(0).toInt() + 1, c.x(1)}))};
  });
  r.add(ops::special_log_ndtr, unary([](Ctx& c) {  // φ(x)/Φ(x) = exp(−x²/2 − log Φ(x)) / sqrt(2π)
          Value* half_square = c.call(ops::mul_Scalar, {c.call(ops::mul_Tensor, {c.x(0), c.x(0)}), 0.5});
          Value* e = c.call(ops::exp, {c.call(ops::neg, {c.call(ops::add_Tensor, {half_square, c.out()})})});
          return c.call(ops::mul_Scalar, {e, 1.0 / std::sqrt(2 * M_PI)});
        }));
  r.add(ops::special_ndtri, unary([](Ctx& c) {  // sqrt(2π) exp(out²/2)
          Value* half_square = c.call(ops::mul_Scalar, {c.call(ops::mul_Tensor, {c.out(), c.out()}), 0.5});
          return c.call(ops::mul_Scalar, {c.call(ops::exp, {half_square}), std::sqrt(2 * M_PI)});
        }));
  // copysign(x, y) = |x|·sign(y): tx·out/x, 0 where x = 0 (as LibTorch); y's tangent is 0.
  for (Op op : {ops::copysign_Tensor, ops::copysign_Scalar})
    r.add(op, unary([](Ctx& c) {
            return c.call(ops::masked_fill_Scalar,
                          {c.call(ops::div_Tensor, {c.out(), c.x(0)}), c.call(ops::eq_Scalar, {c.x(0), 0}), 0.0});
          }));
  r.add(ops::deg2rad, [](Ctx& c) -> std::vector<Value*> { return {c.scale(c.t(0), M_PI / 180.0)}; });
  r.add(ops::rad2deg, [](Ctx& c) -> std::vector<Value*> { return {c.scale(c.t(0), 180.0 / M_PI)}; });
  // ldexp(x, e) = x·2^e: tx·2^e + te·out·log 2.
  r.add(ops::ldexp_Tensor, [](Ctx& c) -> std::vector<Value*> {
    Value* a = nullptr;
    if (c.t(0)) {
      Value* e = c.x(1);
      if (e->meta().dtype != c.out()->meta().dtype) e = c.call(ops::_to_copy, {e, c.out()->meta().dtype});
      a = c.mul(c.t(0), c.call(ops::exp2, {e}));
    }
    Value* b = c.t(1) ? c.mul(c.t(1), c.call(ops::mul_Scalar, {c.out(), std::log(2.0)})) : nullptr;
    return {c.add(a, b)};
  });
  r.add(ops::i0, unary([](Ctx& c) { return c.call(ops::special_i1, {c.x(0)}); }));
  // frexp(x) = (mantissa, exponent) with x = mantissa·2^exponent: the mantissa's tangent is
  // t / 2^exponent (the exponent is piecewise constant, an integer).
  r.add(ops::frexp_Tensor, [](Ctx& c) -> std::vector<Value*> {
    if (!c.t(0)) return {};
    Value* e = c.call(ops::_to_copy, {c.out(1), c.out(0)->meta().dtype});
    return {c.call(ops::div_Tensor, {c.t(0), c.call(ops::exp2, {e})}), nullptr};
  });
  r.add(ops::exp2, unary([](Ctx& c) { return c.call(ops::mul_Scalar, {c.out(), std::log(2.0)}); }));
  // log(eᵃ + eᵇ): ta·σ(a − b) + tb·σ(b − a), finite where a or b is +inf (e^(a − out) would be
  // inf − inf there); base 2: σ((a − b)·ln 2).
  for (auto [op, scale] : {std::pair{ops::logaddexp, 1.0}, std::pair{ops::logaddexp2, std::log(2.0)}})
    r.add(op, [scale = scale](Ctx& c) -> std::vector<Value*> {
      auto share = [&](size_t i) {
        Value* d = c.call(ops::sub_Tensor, {c.x(i), c.x(1 - i)});
        return c.call(ops::sigmoid, {scale == 1.0 ? d : c.call(ops::mul_Scalar, {d, scale})});
      };
      return {c.add(c.t(0) ? c.mul(c.t(0), share(0)) : nullptr, c.t(1) ? c.mul(c.t(1), share(1)) : nullptr)};
    });
  // Σᵢ lgamma(x − i/2) (+ a constant): Σᵢ digamma(x − i/2)
  r.add(ops::mvlgamma, unary([](Ctx& c) {
          int64_t p = c.c(1).toInt();
          Value* sum = nullptr;
          for (int64_t i = 0; i < p; ++i) {
            Value* d = c.call(ops::digamma, {c.call(ops::sub_Scalar, {c.x(0), 0.5 * static_cast<double>(i)})});
            sum = sum ? c.call(ops::add_Tensor, {sum, d}) : d;
          }
          return sum;
        }));
  // t·isfinite(x), a product as LibTorch's (isfinite: x − x == 0; it has no kernel of its own).
  r.add(ops::nan_to_num, unary([](Ctx& c) {
          Value* finite = c.call(ops::eq_Scalar, {c.call(ops::sub_Tensor, {c.x(0), c.x(0)}), 0});
          return c.call(ops::_to_copy, {finite, c.out()->meta().dtype});
        }));
  r.add(ops::sin, unary([](Ctx& c) { return c.call(ops::cos, {c.x(0)}); }));
  r.add(ops::cos, unary([](Ctx& c) { return c.call(ops::neg, {c.call(ops::sin, {c.x(0)})}); }));
  r.add(ops::abs, [](Ctx& c) -> std::vector<Value*> { return {abs_tangent(c)}; });
  r.add(ops::sinh, unary([](Ctx& c) { return c.call(ops::cosh, {c.x(0)}); }));
  r.add(ops::cosh, unary([](Ctx& c) { return c.call(ops::sinh, {c.x(0)}); }));
  r.add(ops::atan, unary([](Ctx& c) {  // 1 / (1 + x^2)
          return c.call(ops::reciprocal,
                        {c.call(ops::add_Scalar, {c.call(ops::mul_Tensor, {c.x(0), c.x(0)}), 1})});
        }));
  r.add(ops::tan, unary([](Ctx& c) {  // 1 + tan²
          return c.call(ops::add_Scalar, {c.call(ops::mul_Tensor, {c.out(), c.out()}), 1});
        }));
  // asin, acos: ±1/√(1 − x²); asinh: 1/√(x² + 1); acosh: 1/√(x² − 1); atanh: 1/(1 − x²)
  auto one_minus_square = [](Ctx& c) {
    return c.call(ops::rsub_Scalar, {c.call(ops::mul_Tensor, {c.x(0), c.x(0)}), 1});
  };
  auto square_plus = [](Ctx& c, double a) {
    return c.call(ops::add_Scalar, {c.call(ops::mul_Tensor, {c.x(0), c.x(0)}), a});
  };
  r.add(ops::asin, unary([=](Ctx& c) { return c.call(ops::rsqrt, {one_minus_square(c)}); }));
  r.add(ops::acos,
        unary([=](Ctx& c) { return c.call(ops::neg, {c.call(ops::rsqrt, {one_minus_square(c)})}); }));
  r.add(ops::asinh, unary([=](Ctx& c) { return c.call(ops::rsqrt, {square_plus(c, 1.0)}); }));
  r.add(ops::acosh, unary([=](Ctx& c) { return c.call(ops::rsqrt, {square_plus(c, -1.0)}); }));
  r.add(ops::atanh, unary([=](Ctx& c) { return c.call(ops::reciprocal, {one_minus_square(c)}); }));
  r.add(ops::log1p, unary([](Ctx& c) {
          return c.call(ops::reciprocal, {c.call(ops::add_Scalar, {c.x(0), 1})});
        }));
  r.add(ops::expm1, unary([](Ctx& c) { return c.call(ops::add_Scalar, {c.out(), 1}); }));
  for (auto [op, base] : {std::pair{ops::log2, 2.0}, std::pair{ops::log10, 10.0}})
    r.add(op, unary([base = base](Ctx& c) {  // 1 / (x ln b)
            return c.call(ops::reciprocal, {c.call(ops::mul_Scalar, {c.x(0), std::log(base)})});
          }));
  // x - y·round(x/y) and the like: the derivative in x is 1 almost everywhere, in y −round(x/y).
  for (Op op : {ops::remainder_Scalar, ops::fmod_Scalar, ops::frac})
    r.add(op, [](Ctx& c) -> std::vector<Value*> { return {c.t(0)}; });
  for (auto [op, rounding] : {std::pair{ops::remainder_Tensor, "floor"}, std::pair{ops::fmod_Tensor, "trunc"}})
    r.add(op, [rounding = std::string(rounding)](Ctx& c) -> std::vector<Value*> {
      if (!c.t(1)) return {c.t(0)};
      Value* q = c.call(ops::div_Tensor_mode, {c.x(0), c.x(1), rounding});
      return {c.add(c.t(0), c.mul(c.t(1), c.call(ops::neg, {q})))};
    });
  r.add(ops::remainder_Scalar_Tensor, [](Ctx& c) -> std::vector<Value*> {  // s − y·floor(s/y)
    if (!c.t(1)) return {};
    const TensorMeta& m = c.x(1)->meta();
    Value* s = c.call(ops::scalar_tensor, {scalar(c.c(0)), m.dtype, std::nullopt, m.device, std::nullopt});
    Value* q = c.call(ops::div_Tensor_mode, {s, c.x(1), "floor"});  // as the op rounds s/y
    return {c.mul(c.t(1), c.call(ops::neg, {q}))};
  });
  r.add(ops::div_Tensor_mode, [](Ctx& c) -> std::vector<Value*> {  // rounded: piecewise constant
    if (!c.c(2).isNone()) return {};
    Value* a = c.t(0) ? c.call(ops::div_Tensor, {c.t(0), c.x(1)}) : nullptr;
    Value* b = c.t(1) ? c.mul(c.t(1), c.call(ops::neg, {c.call(ops::div_Tensor, {c.out(), c.x(1)})})) : nullptr;
    return {c.add(a, b)};
  });
  r.add(ops::special_xlog1py, x_times_log(ops::log1p, -1.0));
  r.add(ops::special_xlog1py_self_scalar, [](Ctx& c) -> std::vector<Value*> {  // s·log1p(y): ty·s/(1 + y)
    if (!c.t(1)) return {};
    return {
        c.mul(c.t(1), c.call(ops::mul_Scalar,
                             {c.call(ops::reciprocal, {c.call(ops::add_Scalar, {c.x(1), 1})}), scalar(c.c(0))}))};
  });
  r.add(ops::special_xlog1py_other_scalar, [](Ctx& c) -> std::vector<Value*> {  // x·log1p(s): tx·log1p(s)
    if (!c.t(0)) return {};
    return {c.scale(c.t(0), std::log1p(scalar(c.c(1))))};
  });
  // Piecewise constant: the derivative is 0 almost everywhere.
  for (Op op : {ops::sign, ops::sgn, ops::floor, ops::ceil, ops::round, ops::trunc})
    r.add(op, zero());
  r.add(ops::pow_Tensor_Scalar, [](Ctx& c) -> std::vector<Value*> {
    double p = scalar(c.c(1));
    if (!c.t(0) || p == 0.0) return {};
    if (p == 1.0) return {c.t(0)};
    Value* f = p == 2.0 ? c.x(0) : c.call(ops::pow_Tensor_Scalar, {c.x(0), p - 1.0});
    return {c.mul(c.t(0), c.call(ops::mul_Scalar, {f, p}))};
  });
  // d(x^y) = tx · y·x^(y-1) + ty · x^y·log(x), with LibTorch's values where x or y is 0.
  r.add(ops::pow_Tensor_Tensor, [](Ctx& c) -> std::vector<Value*> {
    Value *x = c.x(0), *y = c.x(1);
    Value* a = nullptr;
    if (c.t(0)) {
      Value* f =
          c.call(ops::mul_Tensor, {y, c.call(ops::pow_Tensor_Tensor, {x, c.call(ops::sub_Scalar, {y, 1})})});
      a = c.mul(c.t(0), c.call(ops::masked_fill_Scalar, {f, c.call(ops::eq_Scalar, {y, 0}), 0.0}));
    }
    Value* b = nullptr;
    if (c.t(1)) {
      Value* zero_base =
          c.call(ops::bitwise_and_Tensor, {c.call(ops::eq_Scalar, {x, 0}), c.call(ops::ge_Scalar, {y, 0})});
      Value* f = c.call(ops::mul_Tensor, {c.out(), c.call(ops::log, {x})});
      b = c.mul(c.t(1), c.call(ops::masked_fill_Scalar, {f, zero_base, 0.0}));
    }
    return {c.add(a, b)};
  });
  r.add(ops::pow_Scalar, [](Ctx& c) -> std::vector<Value*> {  // b^y: ty · b^y·log(b)
    Value* t = c.t(1);
    double base = scalar(c.c(0));
    if (!t) return {};
    if (base == 0.0) {  // 0^y: derivative 0 for y >= 0, as in LibTorch
      Value* f = c.call(ops::mul_Scalar, {c.out(), -INFINITY});
      return {c.mul(t, c.call(ops::masked_fill_Scalar, {f, c.call(ops::ge_Scalar, {c.x(1), 0}), 0.0}))};
    }
    return {c.mul(t, c.call(ops::mul_Scalar, {c.out(), std::log(base)}))};
  });
  // self + value·t1·t2 and self + value·t1/t2
  r.add(ops::addcmul, [](Ctx& c) -> std::vector<Value*> {
    double v = scalar(c.c(3));
    Value* prod = c.add(c.mul(c.t(1), c.x(2)), c.mul(c.t(2), c.x(1)));
    return {c.add(c.t(0), c.scale(prod, v))};
  });
  r.add(ops::addcdiv, [](Ctx& c) -> std::vector<Value*> {  // d(t1/t2) = dt1/t2 − dt2·t1/t2²
    double v = scalar(c.c(3));
    Value* inv = c.call(ops::reciprocal, {c.x(2)});
    Value* q = c.t(2)
                   ? c.call(ops::neg, {c.call(ops::mul_Tensor, {c.x(1), c.call(ops::mul_Tensor, {inv, inv})})})
                   : nullptr;
    return {c.add(c.t(0), c.scale(c.add(c.mul(c.t(1), inv), c.mul(c.t(2), q)), v))};
  });
  // start + w·(end − start)
  r.add(ops::lerp_Scalar, [](Ctx& c) -> std::vector<Value*> {
    double w = scalar(c.c(2));
    return {c.add(c.scale(c.t(0), 1.0 - w), c.scale(c.t(1), w))};
  });
  r.add(ops::lerp_Tensor, [](Ctx& c) -> std::vector<Value*> {
    Value* w = c.x(2);
    Value* a = c.t(0) ? c.mul(c.t(0), c.call(ops::rsub_Scalar, {w, 1})) : nullptr;
    Value* tw = c.t(2) ? c.mul(c.t(2), c.call(ops::sub_Tensor, {c.x(1), c.x(0)})) : nullptr;
    return {c.add(c.add(a, c.mul(c.t(1), w)), tw)};
  });
  // atan2(y, x): (ty·x − tx·y) / (x² + y²), the numerator first, as LibTorch: where x² + y²
  // underflows to 0 the tangent is infinite, not 0/0.
  r.add(ops::atan2, [](Ctx& c) -> std::vector<Value*> {
    Value *y = c.x(0), *x = c.x(1);
    Value* r2 = c.call(ops::add_Tensor, {c.call(ops::mul_Tensor, {x, x}), c.call(ops::mul_Tensor, {y, y})});
    Value* a = c.t(0) ? c.mul(c.t(0), x) : nullptr;
    Value* b = c.t(1) ? c.mul(c.t(1), c.call(ops::neg, {y})) : nullptr;
    return {c.call(ops::div_Tensor, {c.add(a, b), r2})};
  });
  r.add(ops::hypot, [](Ctx& c) -> std::vector<Value*> {  // (ta·a + tb·b) / out
    Value* a = c.t(0) ? c.mul(c.t(0), c.call(ops::div_Tensor, {c.x(0), c.out()})) : nullptr;
    Value* b = c.t(1) ? c.mul(c.t(1), c.call(ops::div_Tensor, {c.x(1), c.out()})) : nullptr;
    return {c.add(a, b)};
  });
  r.add(ops::xlogy_Tensor, x_times_log(ops::log, 0.0));

  // Copies and casts are linear; detach stops tangents; a copy takes the source's tangent.
  r.add(ops::_to_copy, linear_in(0));
  r.add(ops::clone, linear_in(0));
  r.add(ops::tril, linear_in(0));
  r.add(ops::triu, linear_in(0));
  r.add(ops::detach, zero());
  // Factories shaped like their argument do not depend on its values.
  for (Op op : {ops::zeros_like, ops::ones_like, ops::empty_like, ops::full_like,
                         ops::new_zeros, ops::new_ones, ops::new_empty, ops::new_full})
    r.add(op, zero());
  r.add(ops::fill_Scalar, zero());
  r.add(ops::zero, zero());
  r.add(ops::copy, [](Ctx& c) -> std::vector<Value*> { return {c.t(1)}; });
}

}  // namespace jvpc::jvp_rules
