// JVP rules of reductions and scans. Sums, means and cumulative sums are linear, and so is the
// negative log-likelihood in its input (the log-probabilities); its total weight has no tangent.
// The others are Σ t·f'(x) over the reduced dims, with f'(x) a primal expression that fold
// computes once (a softmax for logsumexp, the centred input for var and std), so each costs
// one multiplication and one sum per call.
#include "passes/jvp_rules/rules.h"
#include "ir/op.h"

#include <cmath>

namespace jvpc::jvp_rules {

namespace {

/// Σ t·factor over `dims`, keeping them or not.
Value* weighted_sum(Ctx& c, Value* t, Value* factor, const std::vector<int64_t>& dims, bool keepdim) {
  return c.sum(c.mul(t, factor), dims, keepdim);
}

int64_t count(const Value* x, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= x->meta().sizes.at(static_cast<size_t>(d));
  return n;
}

/// x − mean(x) over dims, scaled by 1/(N − correction): d(var) = 2·Σ t·that.
Value* centred(Ctx& c, const std::vector<int64_t>& dims) {
  double n = static_cast<double>(count(c.x(0), dims)) - scalar(c.c(2), 1.0);
  return c.scale(c.sub(c.x(0), c.call(ops::mean_dim, {c.x(0), dims, true})), 1.0 / n);
}

/// Products of all other elements along `dim` (exclusive prefix times exclusive suffix
/// products), exact where x has zeros, unlike out / x.
Value* others_product(Ctx& c, Value* x, int64_t dim) {
  int64_t n = x->meta().sizes.at(static_cast<size_t>(dim));
  Value* one = c.call(ops::ones_like, {c.call(ops::slice_Tensor, {x, dim, 0, 1})});
  auto exclusive = [&](Value* v) {
    Value* cp = c.call(ops::cumprod, {v, dim});
    return c.call(ops::cat, {std::vector<Value*>{one, c.call(ops::slice_Tensor, {cp, dim, 0, n - 1})}, dim});
  };
  Value* suffix =
      c.call(ops::flip, {exclusive(c.call(ops::flip, {x, std::vector<int64_t>{dim}})), std::vector<int64_t>{dim}});
  return c.mul(exclusive(x), suffix);
}

/// A loss's elementwise tangent, reduced as the loss: 0 none, 1 mean, 2 sum.
Value* reduce(Ctx& c, Value* v, int64_t reduction) {
  if (!v || reduction == 0) return v;
  return c.call(reduction == 1 ? ops::mean : ops::sum, {v});
}

/// l(x, y) with ∂l/∂y = −∂l/∂x = −derivative(c), reduced by argument 2.
Rule pointwise_loss(std::function<Value*(Ctx&)> derivative) {
  return [derivative](Ctx& c) -> std::vector<Value*> {
    return {reduce(c, c.mul(c.sub(c.t(0), c.t(1)), derivative(c)), c.c(2).toInt())};
  };
}

}  // namespace

Value* norm_tangent(Ctx& c, Value* x, Value* t, double p, const std::vector<int64_t>& dims, bool keepdim) {
  if (p == 0.0) return nullptr;
  x = c.cast(x, c.out()->meta().dtype);
  Value* norm = keep_dims(c, c.out(), x, dims);
  Value* sgn = c.call(ops::sgn, {x});
  Value* f;
  if (std::isinf(p)) {
    f = c.mul(sgn, tie_shares(c, c.call(ops::eq_Tensor, {c.call(ops::abs, {x}), norm}), dims));
  } else if (p == 1.0) {
    f = sgn;
  } else {
    Value* ratio = c.div(c.call(ops::abs, {x}), norm);
    f = c.masked_fill(c.mul(sgn, p == 2.0 ? ratio : c.pow(ratio, p - 1.0)), c.eq(norm, 0), 0.0);
    if (p < 1.0) f = c.masked_fill(f, c.eq(x, 0), 0.0);
  }
  return weighted_sum(c, t, f, dims, keepdim);
}

void register_reductions(Registry& r) {
  for (Op op : {ops::sum, ops::sum_dim_IntList, ops::mean, ops::mean_dim, ops::cumsum}) r.add(op, linear_in(0));
  // nansum: the sum of the tangent where x is a number
  r.add(ops::nansum, per_arg({[](Ctx& c, Value* t) {
          Value* nan = c.call(ops::ne_Tensor, {c.x(0), c.x(0)});  // (isnan has no kernel of its own)
          // a plain sum: a NaN tangent where x is a number stays NaN, as in forward AD
          return c.call(ops::sum_dim_IntList, {c.masked_fill(t, nan, 0.0), c.a(1), c.a(2), c.a(3)});
        }}));
  for (Op op : {ops::nll_loss_forward, ops::nll_loss2d_forward})  // (the total weight has no tangent)
    r.add(op, [](Ctx& c) -> std::vector<Value*> { return {c.linear_in(0)}; });

  // d(logsumexp) = Σ t·softmax(x)
  r.add(ops::logsumexp, per_arg({[](Ctx& c, Value* t) {
          auto dims = reduced_dims(c.x(0), c.c(1));
          Value* p = c.exp(c.sub(c.x(0), keep_dims(c, c.out(), c.x(0), dims)));
          return weighted_sum(c, t, p, dims, c.c(2).toBool());
        }}));
  // cumprod: before the first zero z of a row, y_i·Σ_{j≤i} t_j/x_j (y is 0 from z on, where the
  // terms j ≥ z vanish); from z on, t_z·Π_{k<z} x_k·Π_{z<k≤i} x_k. Exact at zeros, like prod.
  r.add(ops::cumprod, per_arg({[](Ctx& c, Value* t) {
          if (c.x(0)->meta().sizes.empty()) return t;
          int64_t dim = reduced_dims(c.x(0), c.c(1)).at(0);
          c10::ScalarType dt = c.out()->meta().dtype;
          Value* x = c.cast(c.x(0), dt);
          auto ones_where = [&](Value* mask) { return c.masked_fill(x, mask, 1.0); };
          Value* zero = c.eq(x, 0);
          Value* ratio = c.call(ops::cumsum, {c.mul(t, c.recip(ones_where(zero))), dim});
          Value* no_zero = c.mul(ratio, c.out());
          Value* seen = c.call(ops::cumsum, {zero, dim});  // zeros up to i
          Value* first = c.call(ops::bitwise_and_Tensor, {zero, c.eq(seen, 1)});
          Value* before_first = c.eq(seen, 0);
          // Π_{k<z} x_k and Π_{z<k≤i} x_k
          Value* before = c.call(ops::prod_dim_int, {ones_where(c.call(ops::gt_Scalar, {seen, 0})), dim, true});
          Value* after = c.call(ops::cumprod, {ones_where(c.call(ops::bitwise_or_Tensor, {before_first, first})), dim});
          Value* f = c.masked_fill(c.mul(before, after), before_first, 0.0);
          Value* tz = weighted_sum(c, t, c.cast(first, dt), {dim}, true);
          return c.add(no_zero, c.mul(tz, f));
        }}));
  // d logcumsumexp(x)_i = Σ_{j≤i} t_j·exp(x_j − y_i) = cumsum(t·e)_i / cumsum(e)_i with
  // e = exp(x − max x) along the dim, as LibTorch's forward AD computes it; 0 where cumsum(e)
  // is 0 (a prefix of −inf, or of values so far below the row's max that exp underflows), as
  // LibTorch's is.
  r.add(ops::logcumsumexp, per_arg({[](Ctx& c, Value* t) {
          if (c.x(0)->meta().sizes.empty()) return t;
          int64_t dim = reduced_dims(c.x(0), c.c(1)).at(0);
          Value* e = c.exp(c.sub(c.x(0), c.call(ops::amax, {c.x(0), std::vector<int64_t>{dim}, true})));
          Value* sums = c.call(ops::cumsum, {e, dim});
          Value* f = c.masked_fill(c.recip(sums), c.eq(sums, 0), 0.0);
          return c.mul(c.call(ops::cumsum, {c.mul(t, e), dim}), f);
        }}));
  // var and std, and var_mean and std_mean, which also return the mean (linear).
  for (Op op : {ops::var_correction, ops::std_correction, ops::var_mean_correction, ops::std_mean_correction}) {
    bool is_std = std::string(op).find("std") != std::string::npos;
    r.add(op, per_arg_outputs({[is_std](Ctx& c, Value* t) -> std::vector<Value*> {
            auto dims = reduced_dims(c.x(0), c.c(1));
            bool keepdim = c.c(3).toBool();
            Value* f = c.scale(centred(c, dims), 2.0);
            if (is_std) {  // d(std) = d(var) / (2 std), 0 where std is 0
              Value* s = c.scale(keep_dims(c, c.out(), c.x(0), dims), 2.0);
              f = c.masked_fill(c.div(f, s), c.eq(s, 0), 0.0);
            }
            std::vector<Value*> out = {weighted_sum(c, t, f, dims, keepdim)};
            if (c.n.outputs().size() == 2) out.push_back(c.call(ops::mean_dim, {t, dims, keepdim}));
            return out;
          }}));
  }
  // norm(x, p, dim, keepdim) takes linalg_vector_norm's first four arguments; norm(x, p) is
  // over all elements.
  for (Op op : {ops::linalg_vector_norm, ops::norm_ScalarOpt_dim})
    r.add(op, per_arg({[](Ctx& c, Value* t) {
            return norm_tangent(c, c.x(0), t, scalar(c.c(1), 2.0), reduced_dims(c.x(0), c.c(2)), c.c(3).toBool());
          }}));
  // dist(x, y, p) = ‖x − y‖_p over all elements of the broadcast difference: norm's rule on it.
  r.add(ops::dist, [](Ctx& c) -> std::vector<Value*> {
    Value* t = c.sub(c.t(0), c.t(1));
    if (!t) return {};
    Value* d = c.sub(c.x(0), c.x(1));
    if (t->meta().sizes != d->meta().sizes) t = c.call(ops::expand, {t, d->meta().sizes});
    return {norm_tangent(c, d, t, scalar(c.c(2), 2.0), reduced_dims(d, c10::IValue()), false)};
  });
  r.add(ops::norm_Scalar, per_arg({[](Ctx& c, Value* t) {
          return norm_tangent(c, c.x(0), t, scalar(c.c(1), 2.0), reduced_dims(c.x(0), c10::IValue()), false);
        }}));
  r.add(ops::prod_dim_int, per_arg({[](Ctx& c, Value* t) {
          if (c.x(0)->meta().sizes.empty()) return t;
          int64_t dim = reduced_dims(c.x(0), c.c(1)).at(0);
          return weighted_sum(c, t, others_product(c, c.x(0), dim), {dim}, c.c(2).toBool());
        }}));
  r.add(ops::prod, per_arg({[](Ctx& c, Value* t) {  // over all elements, flattened
          Value* flat = c.call(ops::view,
                               {c.call(ops::clone, {c.x(0), c10::MemoryFormat::Contiguous}), std::vector<int64_t>{-1}});
          Value* f = c.call(ops::view, {others_product(c, flat, 0), c.x(0)->meta().sizes});
          return c.call(ops::sum, {c.mul(t, f)});
        }}));
  // Pointwise losses l(x, y), reduced: d = reduce(tx·∂l/∂x + ty·∂l/∂y); for these ∂l/∂y = −∂l/∂x.
  r.add(ops::mse_loss, pointwise_loss([](Ctx& c) { return c.scale(c.sub(c.x(0), c.x(1)), 2.0); }));  // 2(x − y)
  for (Op op : {ops::smooth_l1_loss, ops::huber_loss})
    r.add(op, pointwise_loss([op = std::string(op)](Ctx& c) {  // the loss's backward kernel, unreduced
            return c.call(op + "_backward", {c.call(ops::ones_like, {c.x(0)}), c.x(0), c.x(1), 0, c.a(3)});
          }));
  // binary_cross_entropy(p, y, w, reduction) = −w·(y·log p + (1 − y)·log(1 − p)), logs clamped at −100:
  // ∂/∂p from its backward kernel, ∂/∂y = w·(log(1 − p) − log p).
  r.add(ops::binary_cross_entropy, [](Ctx& c) -> std::vector<Value*> {
    if (c.t(2)) throw Error("no tangent through the weight");
    Value* t = c.per_arg({
        [](Ctx& c, Value* t) {
          return c.mul(t, c.call(ops::binary_cross_entropy_backward,
                                 {c.call(ops::ones_like, {c.x(0)}), c.x(0), c.x(1), c.a(2), 0}));
        },
        [](Ctx& c, Value* t) {
          auto clamped_log = [&](Value* v) { return c.call(ops::clamp_min, {c.call(ops::log, {v}), -100.0}); };
          Value* log_1mp = clamped_log(c.sub(1, c.x(0)));
          Value* f = c.sub(log_1mp, clamped_log(c.x(0)));
          if (c.n.arg(2).kind == ArgKind::Tensor) f = c.mul(f, c.x(2));
          return c.mul(t, f);
        },
    });
    return {reduce(c, t, c.c(3).toInt())};
  });
  // with logits x, weight w and positive weight q: ∂/∂x = w·(σ(x)·(1 − y + q·y) − q·y),
  // ∂/∂y = w·(log σ(−x) − q·log σ(x)); without q, w·(σ(x) − y) and −w·x.
  r.add(ops::binary_cross_entropy_with_logits, [](Ctx& c) -> std::vector<Value*> {
    if (c.t(2) || c.t(3)) throw Error("no tangent through weight or pos_weight");
    bool has_w = c.n.arg(2).kind == ArgKind::Tensor, has_q = c.n.arg(3).kind == ArgKind::Tensor;
    Value *x = c.x(0), *y = c.x(1);
    auto weighted = [&](Value* f) { return has_w ? c.mul(f, c.x(2)) : f; };
    Value* t = c.per_arg({
        [&](Ctx&, Value* t) {
          Value* sig = c.sigmoid(x);
          if (!has_q) return c.mul(t, weighted(c.sub(sig, y)));
          Value* qy = c.mul(c.x(3), y);
          return c.mul(t, weighted(c.sub(c.mul(sig, c.add(c.sub(1, y), qy)), qy)));
        },
        [&](Ctx&, Value* t) {
          if (!has_q) return c.mul(t, weighted(c.neg(x)));
          Value* log_sig = c.neg(c.call(ops::softplus, {c.neg(x)}));  // log σ(x)
          Value* log_sig_neg = c.neg(c.call(ops::softplus, {x}));     // log σ(−x)
          return c.mul(t, weighted(c.sub(log_sig_neg, c.mul(c.x(3), log_sig))));
        },
    });
    return {reduce(c, t, c.c(4).toInt())};
  });
}

}  // namespace jvpc::jvp_rules
