// JVP rules of backward kernels, for forward-over-reverse (the JVP of a function that takes a
// gradient: a Hessian-vector product). A backward kernel linear in its incoming gradient and
// selecting by its input (relu's, a clamp's, an embedding's) is that kernel applied to the
// tangent; the others are written as the formula they compute (`composite`), whose ops' own
// rules give the tangent, so no second derivative is written by hand.
#include "passes/jvp_rules/rules.h"
#include "ir/op.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace jvpc::jvp_rules {

namespace {

Value* mul(Ctx& c, Value* a, BArg b) { return c.call(ops::mul_Tensor, {a, std::move(b)}); }
Value* mul_s(Ctx& c, Value* a, double s) { return c.call(ops::mul_Scalar, {a, s}); }
Value* add(Ctx& c, Value* a, Value* b) { return c.call(ops::add_Tensor, {a, b}); }
/// The tensor passed for optional argument `arg`, or null for None.
Value* optional(Ctx& c, size_t arg) { return c.n.arg(arg).kind == ArgKind::Tensor ? c.x(arg) : nullptr; }
Value* sub(Ctx& c, Value* a, Value* b) { return c.call(ops::sub_Tensor, {a, b}); }
Value* one_minus(Ctx& c, Value* a) { return c.call(ops::rsub_Scalar, {a, 1.0, 1.0}); }
Value* sum_keep(Ctx& c, Value* a, std::vector<int64_t> dims) {
  return c.call(ops::sum_dim_IntList, {a, std::move(dims), true});
}

/// f'(x) of gelu, exact (erf) or with the tanh approximation, as LibTorch's gelu_backward has it.
Value* gelu_derivative(Ctx& c, Value* x, bool tanh_form) {
  if (!tanh_form) {
    Value* cdf = mul_s(c, c.call(ops::add_Scalar, {c.call(ops::erf, {mul_s(c, x, M_SQRT1_2)}), 1.0, 1.0}), 0.5);
    Value* pdf = mul_s(c, c.call(ops::exp, {mul_s(c, mul(c, x, x), -0.5)}), M_2_SQRTPI * M_SQRT1_2 * 0.5);
    return add(c, cdf, mul(c, x, pdf));
  }
  const double k_beta = M_SQRT2 * M_2_SQRTPI * 0.5, k_kappa = 0.044715;
  Value* x2 = mul(c, x, x);
  Value* inner = mul_s(c, add(c, x, mul_s(c, mul(c, x2, x), k_kappa)), k_beta);
  Value* th = c.call(ops::tanh, {inner});
  Value* left_derivative = mul_s(c, c.call(ops::add_Scalar, {th, 1.0, 1.0}), 0.5);
  Value* inner_derivative = mul_s(c, c.call(ops::add_Scalar, {mul_s(c, x2, 3 * k_kappa), 1.0, 1.0}), k_beta);
  Value* right_derivative = mul(c, mul(c, mul_s(c, x, 0.5), one_minus(c, mul(c, th, th))), inner_derivative);
  return add(c, left_derivative, right_derivative);
}

/// The dims of `x` that a layer norm over `normalized` trailing dims reduces, and the others.
std::pair<std::vector<int64_t>, std::vector<int64_t>> layer_dims(const Value* x, size_t normalized) {
  int64_t rank = static_cast<int64_t>(x->meta().sizes.size()), axis = rank - static_cast<int64_t>(normalized);
  std::vector<int64_t> inner, outer;
  for (int64_t d = 0; d < rank; ++d) (d >= axis ? inner : outer).push_back(d);
  return {inner, outer};
}

}  // namespace

void register_backward(Registry& r) {
  const std::vector<std::string> before = r.ops();
  // Linear in the incoming gradient, selecting by the input: the kernel on the tangent.
  // Views', pools' and resamplings' backward kernels are linear in the gradient too (max pooling's
  // and im2col's are in views.cpp).
  for (Op op : {ops::threshold_backward,
                ops::hardtanh_backward,
                ops::leaky_relu_backward,
                ops::hardsigmoid_backward,
                ops::embedding_dense_backward,
                ops::softshrink_backward,
                ops::hardshrink_backward,
                ops::select_backward,
                ops::slice_backward,
                ops::diagonal_backward,
                ops::unfold_backward,
                ops::avg_pool2d_backward,
                ops::avg_pool3d_backward,
                ops::_adaptive_avg_pool2d_backward,
                ops::_adaptive_avg_pool3d_backward,
                ops::upsample_nearest1d_backward,
                ops::upsample_nearest2d_backward,
                ops::upsample_nearest3d_backward,
                ops::_upsample_nearest_exact1d_backward,
                ops::_upsample_nearest_exact2d_backward,
                ops::_upsample_nearest_exact3d_backward,
                ops::upsample_linear1d_backward,
                ops::upsample_bilinear2d_backward,
                ops::upsample_bicubic2d_backward,
                ops::upsample_trilinear3d_backward,
                ops::reflection_pad1d_backward,
                ops::reflection_pad2d_backward,
                ops::reflection_pad3d_backward,
                ops::replication_pad1d_backward,
                ops::replication_pad2d_backward,
                ops::replication_pad3d_backward})
    r.add(op, linear_in(0));
  r.add(ops::tanh_backward, composite([](Ctx& c) -> std::vector<Value*> {
          Value* y = c.x(1);
          return {mul(c, c.x(0), one_minus(c, mul(c, y, y)))};
        }));
  r.add(ops::sigmoid_backward, composite([](Ctx& c) -> std::vector<Value*> {
          Value* y = c.x(1);
          return {mul(c, c.x(0), mul(c, y, one_minus(c, y)))};
        }));
  r.add(ops::silu_backward, composite([](Ctx& c) -> std::vector<Value*> {
          Value* x = c.x(1);
          Value* s = c.call(ops::sigmoid, {x});
          Value* d = mul(c, s, c.call(ops::add_Scalar, {mul(c, x, one_minus(c, s)), 1.0, 1.0}));
          return {mul(c, c.x(0), d)};
        }));
  r.add(ops::gelu_backward, composite([](Ctx& c) -> std::vector<Value*> {
          bool tanh_form = c.c(2).isString() && c.c(2).toStringRef() == "tanh";
          return {mul(c, c.x(0), gelu_derivative(c, c.x(1), tanh_form))};
        }));
  // g ↦ y·(g − Σ g·y) and g ↦ g − exp(y)·Σ g over `dim`, in input_dtype.
  r.add(ops::_softmax_backward_data, composite([](Ctx& c) -> std::vector<Value*> {
          Value *g = c.x(0), *y = c.x(1);
          Value* out = mul(c, y, sub(c, g, sum_keep(c, mul(c, g, y), {c.c(2).toInt()})));
          return {c.call(ops::_to_copy, {out, c.a(3)})};
        }));
  r.add(ops::_log_softmax_backward_data, composite([](Ctx& c) -> std::vector<Value*> {
          Value *g = c.x(0), *y = c.x(1);
          Value* out = sub(c, g, mul(c, c.call(ops::exp, {y}), sum_keep(c, g, {c.c(2).toInt()})));
          return {c.call(ops::_to_copy, {out, c.a(3)})};
        }));
  // mse_loss_backward(g, x, target, reduction): 2·(x − target)·g, over the element count for mean.
  r.add(ops::mse_loss_backward, composite([](Ctx& c) -> std::vector<Value*> {
          Value* out = mul(c, mul_s(c, sub(c, c.x(1), c.x(2)), 2.0), c.x(0));
          if (c.c(3).toInt() == 1) out = mul_s(c, out, 1.0 / static_cast<double>(c.x(1)->meta().numel()));
          return {out};
        }));
  // native_layer_norm_backward(g, x, normalized_shape, mean, rstd, weight, bias, mask): with
  // x̂ = (x − mean)·rstd and gw = g·weight, grad_x = rstd·(gw − mean(gw) − x̂·mean(gw·x̂)) over the
  // normalized dims, grad_weight = Σ g·x̂ and grad_bias = Σ g over the others.
  r.add(ops::native_layer_norm_backward, composite([](Ctx& c) -> std::vector<Value*> {
          Value *g = c.x(0), *x = c.x(1), *weight = optional(c, 5);
          const auto dims = layer_dims(x, c.c(2).toIntVector().size());  // (clang 14 captures no bindings)
          const std::vector<int64_t>& inner = dims.first;
          const std::vector<int64_t>& outer = dims.second;
          Value* xhat = mul(c, sub(c, x, c.x(3)), c.x(4));
          Value* gx = normalized_tangent(c, weight ? mul(c, g, weight) : g, xhat, c.x(4), inner);
          auto over_outer = [&](Value* v) {
            return outer.empty() ? v : c.call(ops::sum_dim_IntList, {v, outer, false});
          };
          return {gx, weight ? over_outer(mul(c, g, xhat)) : nullptr, optional(c, 6) ? over_outer(g) : nullptr};
        }));
  // native_batch_norm_backward(g, x, weight, running_mean, running_var, save_mean, save_invstd,
  // train, eps, mask), per channel (dim 1): in training, with x̂ = (x − save_mean)·save_invstd
  // and gw = g·weight, grad_x = save_invstd·(gw − mean(gw) − x̂·mean(gw·x̂)) over the other dims;
  // in eval, with the running statistics, grad_x = gw·invstd. grad_weight = Σ g·x̂, grad_bias = Σ g.
  r.add(ops::native_batch_norm_backward, composite([](Ctx& c) -> std::vector<Value*> {
          Value *g = c.x(0), *x = c.x(1), *weight = optional(c, 2);
          size_t rank = x->meta().sizes.size();
          std::vector<int64_t> others;
          for (int64_t d = 0; d < static_cast<int64_t>(rank); ++d)
            if (d != 1) others.push_back(d);
          auto channel = [&](Value* v) { return per_channel(c, v, rank); };
          bool train = c.c(7).toBool();
          Value *mean, *invstd;
          if (train) {
            mean = channel(c.x(5)), invstd = channel(c.x(6));
          } else {
            mean = channel(c.x(3));
            Value* var_eps = c.call(ops::add_Scalar, {c.x(4), c.c(8).toDouble(), 1.0});
            invstd = channel(c.call(ops::rsqrt, {var_eps}));
          }
          Value* xhat = mul(c, sub(c, x, mean), invstd);
          Value* gw = weight ? mul(c, g, channel(weight)) : g;
          Value* gx = train ? normalized_tangent(c, gw, xhat, invstd, others) : mul(c, gw, invstd);
          return {gx, c.call(ops::sum_dim_IntList, {mul(c, g, xhat), others, false}),
                  c.call(ops::sum_dim_IntList, {g, others, false})};
        }));
  // native_group_norm_backward(g, x, mean, rstd, weight, N, C, HxW, group, mask): as the
  // training batch norm's, over each group of C/group channels × HxW, with mean and rstd [N, group].
  r.add(ops::native_group_norm_backward, composite([](Ctx& c) -> std::vector<Value*> {
          Value *g = c.x(0), *x = c.x(1), *weight = optional(c, 4);
          const std::vector<int64_t>& shape = x->meta().sizes;
          int64_t N = c.c(5).toInt(), C = c.c(6).toInt(), HxW = c.c(7).toInt(), G = c.c(8).toInt();
          std::vector<int64_t> grouped = {N, G, C / G * HxW}, stats = {N, G, 1}, by_channel = {N, C, HxW};
          Value* rstd = reshape(c.b, c.x(3), stats);
          Value* xhat = mul(c, sub(c, reshape(c.b, x, grouped), reshape(c.b, c.x(2), stats)), rstd);
          Value* g_c = reshape(c.b, g, by_channel);
          Value* gw = reshape(c.b, weight ? mul(c, g_c, reshape(c.b, weight, {C, 1})) : g_c, grouped);
          Value* gx = normalized_tangent(c, gw, xhat, rstd, {2});
          Value* xhat_c = reshape(c.b, xhat, by_channel);
          std::vector<int64_t> n_hw = {0, 2};
          return {reshape(c.b, gx, shape), c.call(ops::sum_dim_IntList, {mul(c, g_c, xhat_c), n_hw, false}),
                  c.call(ops::sum_dim_IntList, {g_c, n_hw, false})};
        }));
  // The CPU flash attention's backward, as the attention it differentiates: with P = softmax(S),
  // S = q·kᵀ·scale (masked), grad_v = Pᵀ·g, grad_s = P ⊙ (g·vᵀ − rowsum(P ⊙ g·vᵀ)),
  // grad_q = grad_s·k·scale and grad_k = grad_sᵀ·q·scale. P is formed from q and k, so its tangent
  // is exact; it is L×S per head, as the JVP of a materialized attention's gradient is.
  r.add(ops::_scaled_dot_product_flash_attention_for_cpu_backward, composite([](Ctx& c) -> std::vector<Value*> {
          Value *g = c.x(0), *q = c.x(1), *k = c.x(2), *v = c.x(3), *mask = optional(c, 8);
          if (scalar(c.c(6)) != 0.0) throw Error("attention with dropout inside a gradient is not differentiated");
          const auto& qs = q->meta().sizes;
          if (k->meta().sizes.size() != qs.size() || k->meta().sizes[qs.size() - 3] != qs[qs.size() - 3])
            throw Error("attention whose keys have fewer heads than its queries is not differentiated here");
          double scale = c.c(9).isNone() ? 1.0 / std::sqrt(static_cast<double>(qs.back())) : c.c(9).toDouble();
          Value* scores = mul_s(c, matmul(c, q, mT(c, k)), scale);
          int64_t L = qs[qs.size() - 2], S = k->meta().sizes[qs.size() - 2];
          if (c.c(7).toBool()) {
            Value* ones =
                c.call(ops::ones, {std::vector<int64_t>{L, S}, c10::ScalarType::Bool, std::nullopt, q->meta().device});
            scores = c.call(ops::masked_fill_Scalar,
                            {scores, c.call(ops::triu, {ones, 1}), -std::numeric_limits<double>::infinity()});
          }
          if (mask)
            scores = mask->meta().dtype == c10::ScalarType::Bool
                         ? c.call(ops::masked_fill_Scalar,
                                  {scores, c.call(ops::logical_not, {mask}), -std::numeric_limits<double>::infinity()})
                         : add(c, scores, mask);
          Value* p = c.call(ops::_softmax, {scores, -1, false});
          Value* grad_v = matmul(c, mT(c, p), g);
          Value* gp = matmul(c, g, mT(c, v));
          Value* grad_s = mul(c, p, sub(c, gp, sum_keep(c, mul(c, p, gp), {-1})));
          return {mul_s(c, matmul(c, grad_s, k), scale), mul_s(c, matmul(c, mT(c, grad_s), q), scale), grad_v};
        }));
  // convolution_backward is linear in the incoming gradient and in each of input and weight:
  // grad_input = A(g, weight), grad_weight = B(g, input), grad_bias = Σ g. Its tangent is the
  // kernel on (t_g, input, weight) plus the kernel on (g, t_input, t_weight) without the bias.
  r.add(ops::convolution_backward, [](Ctx& c) -> std::vector<Value*> {
    const std::vector<int>& returned = c.n.return_counts();  // [1, 1, 0]: no grad_bias
    std::vector<Value*> out(c.n.outputs().size(), nullptr);
    auto accumulate = [&](const std::vector<Value*>& terms, bool with_bias) {
      for (size_t r = 0, i = 0; r < 3; ++r) {
        if (r < returned.size() && returned[r] == 0) continue;
        if (r < 2 || with_bias) out[i] = c.add(out[i], terms.at(i));
        ++i;
      }
    };
    if (c.t(0)) accumulate(c.reapply(0, c.t(0)), true);
    if (c.t(1) || c.t(2)) {
      Value* ti = c.t_or_zeros(1);
      accumulate(c.reapply({{1, ti}, {2, c.t_or_zeros(2)}}), false);
    }
    return out;
  });
  // Graph files may not use these (unless another rule emits them, as softmax's rule does
  // _softmax_backward_data): their sizes come from int arguments no safety contract checks.
  for (const std::string& op : r.ops())
    if (std::find(before.begin(), before.end(), op) == before.end()) r.traced_only(op);
}

}  // namespace jvpc::jvp_rules
