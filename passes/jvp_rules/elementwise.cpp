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
  return per_arg({
      [log_op, pole](Ctx& c, Value* t) {
        Value* undefined = c.call(ops::bitwise_and_Tensor,
                                  {c.call(ops::eq_Scalar, {c.x(0), 0}), c.call(ops::le_Scalar, {c.x(1), pole})});
        Value* log_y = c.call(log_op, {c.x(1)});
        if (log_y->meta().dtype != c.out()->meta().dtype) log_y = c.call(ops::_to_copy, {log_y, c.out()->meta().dtype});
        return c.mul(t, c.where(undefined, nullptr, log_y));
      },
      [pole](Ctx& c, Value* t) { return c.mul(t, c.div(c.x(0), pole == 0.0 ? c.x(1) : c.sub(c.x(1), pole))); },
  });
}

/// d(x / y) = tx / y − ty·out / y
const std::vector<Term> quotient = {
    [](Ctx& c, Value* t) { return c.div(t, c.x(1)); },
    [](Ctx& c, Value* t) { return c.mul(t, c.neg(c.div(c.out(), c.x(1)))); },
};

}  // namespace

void register_elementwise(Registry& r) {
  // x + alpha * y, x - alpha * y
  r.add(ops::add_Tensor,
        [](Ctx& c) -> std::vector<Value*> { return {c.add(c.t(0), c.scale(c.t(1), scalar(c.c(2))))}; });
  r.add(ops::sub_Tensor, [](Ctx& c) -> std::vector<Value*> {
    double alpha = scalar(c.c(2));
    if (c.t(0) && c.t(1)) return {c.call(ops::sub_Tensor, {c.t(0), c.t(1), alpha})};
    return {c.add(c.t(0), c.scale(c.t(1), -alpha))};
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
  r.add(ops::div_Tensor, per_arg(quotient));

  r.add(ops::exp, unary([](Ctx& c) { return c.out(); }));
  r.add(ops::log, unary([](Ctx& c) { return c.recip(c.x(0)); }));
  r.add(ops::reciprocal, unary([](Ctx& c) { return c.neg(c.square(c.out())); }));        // -1/x^2 = -out^2
  r.add(ops::tanh, unary([](Ctx& c) { return c.sub(1, c.square(c.out())); }));           // 1 - out^2
  r.add(ops::sigmoid, unary([](Ctx& c) { return c.mul(c.out(), c.sub(1, c.out())); }));  // out (1 - out)
  r.add(ops::sqrt, unary([](Ctx& c) { return c.scale(c.recip(c.out()), 0.5); }));        // 1 / (2 sqrt(x))
  r.add(ops::rsqrt, unary([](Ctx& c) { return c.scale(c.pow(c.out(), 3), -0.5); }));     // -out^3 / 2
  r.add(ops::erf, unary([](Ctx& c) {                                                     // 2/sqrt(pi) exp(-x^2)
          return c.scale(c.exp(c.neg(c.square(c.x(0)))), 2.0 / std::sqrt(M_PI));
        }));
  r.add(ops::erfc, unary([](Ctx& c) {  // −2/sqrt(pi) exp(−x²)
          return c.scale(c.exp(c.neg(c.square(c.x(0)))), -2.0 / std::sqrt(M_PI));
        }));
  r.add(ops::erfinv, unary([](Ctx& c) {  // sqrt(pi)/2 exp(out²)
          return c.scale(c.exp(c.square(c.out())), std::sqrt(M_PI) / 2);
        }));
  // Special functions: lgamma' = digamma, digamma' = polygamma(1), polygamma(n)' = polygamma(n + 1).
  r.add(ops::lgamma, unary([](Ctx& c) { return c.call(ops::digamma, {c.x(0)}); }));
  r.add(ops::digamma, unary([](Ctx& c) { return c.call(ops::polygamma, {1, c.x(0)}); }));
  r.add(ops::polygamma, per_arg({{}, [](Ctx& c, Value* t) {  // (n, x)
                                   return c.mul(t, c.call(ops::polygamma, {c.c(0).toInt() + 1, c.x(1)}));
                                 }}));
  r.add(ops::special_log_ndtr, unary([](Ctx& c) {  // φ(x)/Φ(x) = exp(−x²/2 − log Φ(x)) / sqrt(2π)
          Value* half_square = c.scale(c.square(c.x(0)), 0.5);
          return c.scale(c.exp(c.neg(c.add(half_square, c.out()))), 1.0 / std::sqrt(2 * M_PI));
        }));
  r.add(ops::special_ndtri, unary([](Ctx& c) {  // sqrt(2π) exp(out²/2)
          return c.scale(c.exp(c.scale(c.square(c.out()), 0.5)), std::sqrt(2 * M_PI));
        }));
  // copysign(x, y) = |x|·sign(y): tx·out/x, 0 where x = 0 (as LibTorch); y's tangent is 0.
  for (Op op : {ops::copysign_Tensor, ops::copysign_Scalar})
    r.add(op, unary([](Ctx& c) {
            return c.call(ops::masked_fill_Scalar, {c.div(c.out(), c.x(0)), c.call(ops::eq_Scalar, {c.x(0), 0}), 0.0});
          }));
  r.add(ops::deg2rad, [](Ctx& c) -> std::vector<Value*> { return {c.scale(c.t(0), M_PI / 180.0)}; });
  r.add(ops::rad2deg, [](Ctx& c) -> std::vector<Value*> { return {c.scale(c.t(0), 180.0 / M_PI)}; });
  // ldexp(x, e) = x·2^e: tx·2^e + te·out·log 2.
  r.add(ops::ldexp_Tensor, per_arg({
                               [](Ctx& c, Value* t) {
                                 Value* e = c.x(1);
                                 if (e->meta().dtype != c.out()->meta().dtype)
                                   e = c.call(ops::_to_copy, {e, c.out()->meta().dtype});
                                 return c.mul(t, c.call(ops::exp2, {e}));
                               },
                               [](Ctx& c, Value* t) { return c.mul(t, c.scale(c.out(), std::log(2.0))); },
                           }));
  r.add(ops::i0, unary([](Ctx& c) { return c.call(ops::special_i1, {c.x(0)}); }));
  // frexp(x) = (mantissa, exponent) with x = mantissa·2^exponent: the mantissa's tangent is
  // t / 2^exponent (the exponent is piecewise constant, an integer).
  r.add(ops::frexp_Tensor, [](Ctx& c) -> std::vector<Value*> {
    if (!c.t(0)) return {};
    Value* e = c.call(ops::_to_copy, {c.out(1), c.out(0)->meta().dtype});
    return {c.div(c.t(0), c.call(ops::exp2, {e})), nullptr};
  });
  r.add(ops::exp2, unary([](Ctx& c) { return c.scale(c.out(), std::log(2.0)); }));
  // log(eᵃ + eᵇ): ta·σ(a − b) + tb·σ(b − a), finite where a or b is +inf (e^(a − out) would be
  // inf − inf there); base 2: σ((a − b)·ln 2).
  for (auto [op, scale] : {std::pair{ops::logaddexp, 1.0}, std::pair{ops::logaddexp2, std::log(2.0)}})
    r.add(op, per_arg({
                  [s = scale](Ctx& c, Value* t) { return c.mul(t, c.sigmoid(c.scale(c.sub(c.x(0), c.x(1)), s))); },
                  [s = scale](Ctx& c, Value* t) { return c.mul(t, c.sigmoid(c.scale(c.sub(c.x(1), c.x(0)), s))); },
              }));
  // Σᵢ lgamma(x − i/2) (+ a constant): Σᵢ digamma(x − i/2)
  r.add(ops::mvlgamma, unary([](Ctx& c) {
          int64_t p = c.c(1).toInt();
          Value* sum = nullptr;
          for (int64_t i = 0; i < p; ++i) {
            sum = c.add(sum, c.call(ops::digamma, {c.sub(c.x(0), 0.5 * static_cast<double>(i))}));
          }
          return sum;
        }));
  // t·isfinite(x), a product as LibTorch's (isfinite: x − x == 0; it has no kernel of its own).
  r.add(ops::nan_to_num, unary([](Ctx& c) {
          Value* finite = c.call(ops::eq_Scalar, {c.sub(c.x(0), c.x(0)), 0});
          return c.call(ops::_to_copy, {finite, c.out()->meta().dtype});
        }));
  r.add(ops::sin, unary([](Ctx& c) { return c.call(ops::cos, {c.x(0)}); }));
  r.add(ops::cos, unary([](Ctx& c) { return c.neg(c.call(ops::sin, {c.x(0)})); }));
  r.add(ops::abs, [](Ctx& c) -> std::vector<Value*> { return {abs_tangent(c)}; });
  r.add(ops::sinh, unary([](Ctx& c) { return c.call(ops::cosh, {c.x(0)}); }));
  r.add(ops::cosh, unary([](Ctx& c) { return c.call(ops::sinh, {c.x(0)}); }));
  r.add(ops::atan, unary([](Ctx& c) { return c.recip(c.add(c.square(c.x(0)), 1)); }));  // 1 / (1 + x^2)
  r.add(ops::tan, unary([](Ctx& c) { return c.add(c.square(c.out()), 1); }));           // 1 + tan²
  // asin, acos: ±1/√(1 − x²); asinh: 1/√(x² + 1); acosh: 1/√(x² − 1); atanh: 1/(1 − x²)
  r.add(ops::asin, unary([](Ctx& c) { return c.rsqrt(c.sub(1, c.square(c.x(0)))); }));
  r.add(ops::acos, unary([](Ctx& c) { return c.neg(c.rsqrt(c.sub(1, c.square(c.x(0))))); }));
  r.add(ops::asinh, unary([](Ctx& c) { return c.rsqrt(c.add(c.square(c.x(0)), 1.0)); }));
  r.add(ops::acosh, unary([](Ctx& c) { return c.rsqrt(c.add(c.square(c.x(0)), -1.0)); }));
  r.add(ops::atanh, unary([](Ctx& c) { return c.recip(c.sub(1, c.square(c.x(0)))); }));
  r.add(ops::log1p, unary([](Ctx& c) { return c.recip(c.add(c.x(0), 1)); }));
  r.add(ops::expm1, unary([](Ctx& c) { return c.add(c.out(), 1); }));
  for (auto [op, base] : {std::pair{ops::log2, 2.0}, std::pair{ops::log10, 10.0}})  // 1 / (x ln b)
    r.add(op, unary([base = base](Ctx& c) { return c.recip(c.scale(c.x(0), std::log(base))); }));
  // x - y·round(x/y) and the like: the derivative in x is 1 almost everywhere, in y −round(x/y).
  for (Op op : {ops::remainder_Scalar, ops::fmod_Scalar, ops::frac})
    r.add(op, [](Ctx& c) -> std::vector<Value*> { return {c.t(0)}; });
  for (auto [op, rounding] : {std::pair{ops::remainder_Tensor, "floor"}, std::pair{ops::fmod_Tensor, "trunc"}})
    r.add(op, per_arg({
                  [](Ctx&, Value* t) { return t; },
                  [rounding = std::string(rounding)](Ctx& c, Value* t) {
                    return c.mul(t, c.neg(c.call(ops::div_Tensor_mode, {c.x(0), c.x(1), rounding})));
                  },
              }));
  r.add(ops::remainder_Scalar_Tensor, [](Ctx& c) -> std::vector<Value*> {  // s − y·floor(s/y)
    if (!c.t(1)) return {};
    const TensorMeta& m = c.x(1)->meta();
    Value* s = c.call(ops::scalar_tensor, {scalar(c.c(0)), m.dtype, std::nullopt, m.device, std::nullopt});
    Value* q = c.call(ops::div_Tensor_mode, {s, c.x(1), "floor"});  // as the op rounds s/y
    return {c.mul(c.t(1), c.neg(q))};
  });
  r.add(ops::div_Tensor_mode, [](Ctx& c) -> std::vector<Value*> {  // rounded: piecewise constant
    if (!c.c(2).isNone()) return {};
    return {c.per_arg(quotient)};
  });
  r.add(ops::special_xlog1py, x_times_log(ops::log1p, -1.0));
  r.add(ops::special_xlog1py_self_scalar, [](Ctx& c) -> std::vector<Value*> {  // s·log1p(y): ty·s/(1 + y)
    if (!c.t(1)) return {};
    return {c.mul(c.t(1), c.scale(c.recip(c.add(c.x(1), 1)), scalar(c.c(0))))};
  });
  r.add(ops::special_xlog1py_other_scalar, [](Ctx& c) -> std::vector<Value*> {  // x·log1p(s): tx·log1p(s)
    return {c.scale(c.t(0), std::log1p(scalar(c.c(1))))};
  });
  // Piecewise constant: the derivative is 0 almost everywhere.
  for (Op op : {ops::sign, ops::sgn, ops::floor, ops::ceil, ops::round, ops::trunc}) r.add(op, zero());
  r.add(ops::pow_Tensor_Scalar, [](Ctx& c) -> std::vector<Value*> {
    double p = scalar(c.c(1));
    if (!c.t(0) || p == 0.0) return {};
    if (p == 1.0) return {c.t(0)};
    return {c.mul(c.t(0), c.scale(p == 2.0 ? c.x(0) : c.pow(c.x(0), p - 1.0), p))};
  });
  // d(x^y) = tx · y·x^(y-1) + ty · x^y·log(x), with LibTorch's values where x or y is 0.
  r.add(ops::pow_Tensor_Tensor,
        per_arg({
            [](Ctx& c, Value* t) {
              Value *x = c.x(0), *y = c.x(1);
              Value* f = c.mul(y, c.call(ops::pow_Tensor_Tensor, {x, c.sub(y, 1)}));
              return c.mul(t, c.call(ops::masked_fill_Scalar, {f, c.call(ops::eq_Scalar, {y, 0}), 0.0}));
            },
            [](Ctx& c, Value* t) {
              Value *x = c.x(0), *y = c.x(1);
              Value* zero_base =
                  c.call(ops::bitwise_and_Tensor, {c.call(ops::eq_Scalar, {x, 0}), c.call(ops::ge_Scalar, {y, 0})});
              Value* f = c.mul(c.out(), c.call(ops::log, {x}));
              return c.mul(t, c.call(ops::masked_fill_Scalar, {f, zero_base, 0.0}));
            },
        }));
  r.add(ops::pow_Scalar, [](Ctx& c) -> std::vector<Value*> {  // b^y: ty · b^y·log(b)
    Value* t = c.t(1);
    double base = scalar(c.c(0));
    if (!t) return {};
    if (base == 0.0) {  // 0^y: derivative 0 for y >= 0, as in LibTorch
      Value* f = c.scale(c.out(), -INFINITY);
      return {c.mul(t, c.call(ops::masked_fill_Scalar, {f, c.call(ops::ge_Scalar, {c.x(1), 0}), 0.0}))};
    }
    return {c.mul(t, c.scale(c.out(), std::log(base)))};
  });
  // self + value·t1·t2 and self + value·t1/t2
  r.add(ops::addcmul, [](Ctx& c) -> std::vector<Value*> {
    double v = scalar(c.c(3));
    Value* prod = c.add(c.mul(c.t(1), c.x(2)), c.mul(c.t(2), c.x(1)));
    return {c.add(c.t(0), c.scale(prod, v))};
  });
  r.add(ops::addcdiv, [](Ctx& c) -> std::vector<Value*> {  // d(t1/t2) = dt1/t2 − dt2·t1/t2²
    double v = scalar(c.c(3));
    Value* inv = c.recip(c.x(2));
    Value* q = c.per_arg({{},
                          [&](Ctx&, Value* t) { return c.mul(t, inv); },
                          [&](Ctx&, Value* t) { return c.mul(t, c.neg(c.mul(c.x(1), c.square(inv)))); }});
    return {c.add(c.t(0), c.scale(q, v))};
  });
  // start + w·(end − start)
  r.add(ops::lerp_Scalar, [](Ctx& c) -> std::vector<Value*> {
    double w = scalar(c.c(2));
    return {c.add(c.scale(c.t(0), 1.0 - w), c.scale(c.t(1), w))};
  });
  r.add(ops::lerp_Tensor, per_arg({
                              [](Ctx& c, Value* t) { return c.mul(t, c.sub(1, c.x(2))); },
                              [](Ctx& c, Value* t) { return c.mul(t, c.x(2)); },
                              [](Ctx& c, Value* t) { return c.mul(t, c.sub(c.x(1), c.x(0))); },
                          }));
  // atan2(y, x): (ty·x − tx·y) / (x² + y²), the numerator first, as LibTorch: where x² + y²
  // underflows to 0 the tangent is infinite, not 0/0.
  r.add(ops::atan2, [](Ctx& c) -> std::vector<Value*> {
    Value *y = c.x(0), *x = c.x(1);
    Value* x2 = c.square(x);
    Value* r2 = c.add(x2, c.square(y));
    Value* num =
        c.per_arg({[&](Ctx&, Value* t) { return c.mul(t, x); }, [&](Ctx&, Value* t) { return c.mul(t, c.neg(y)); }});
    return {c.div(num, r2)};
  });
  // hypot(a, b): ta·a / out + tb·b / out, in LibTorch's order: where out overflows to inf and
  // ta·a does too, the term is NaN there, as LibTorch's (ta·(a / out) would give 0).
  r.add(ops::hypot, per_arg({
                        [](Ctx& c, Value* t) { return c.div(c.mul(t, c.x(0)), c.out()); },
                        [](Ctx& c, Value* t) { return c.div(c.mul(t, c.x(1)), c.out()); },
                    }));
  r.add(ops::xlogy_Tensor, x_times_log(ops::log, 0.0));

  // Copies and casts are linear; detach stops tangents; a copy takes the source's tangent.
  r.add(ops::_to_copy, linear_in(0));
  r.add(ops::clone, linear_in(0));
  r.add(ops::tril, linear_in(0));
  r.add(ops::triu, linear_in(0));
  r.add(ops::detach, zero());
  // Factories shaped like their argument do not depend on its values.
  for (Op op : {ops::zeros_like, ops::ones_like, ops::empty_like, ops::full_like, ops::new_zeros, ops::new_ones,
                ops::new_empty, ops::new_full})
    r.add(op, zero());
  r.add(ops::fill_Scalar, zero());
  r.add(ops::zero, zero());
  r.add(ops::copy, [](Ctx& c) -> std::vector<Value*> { return {c.t(1)}; });
}

}  // namespace jvpc::jvp_rules
