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

/// The tensor passed for optional argument `arg`, or null for None.
Value* optional(Ctx& c, size_t arg) { return c.n.arg(arg).kind == ArgKind::Tensor ? c.x(arg) : nullptr; }

/// f'(x) of gelu, exact (erf) or with the tanh approximation, as LibTorch's gelu_backward has it.
Value* gelu_derivative(Ctx& c, Value* x, bool tanh_form) {
  if (!tanh_form) {
    Value* cdf = c.scale(c.add(c.call(ops::erf, {c.scale(x, M_SQRT1_2)}), 1.0), 0.5);
    Value* pdf = c.scale(c.exp(c.scale(c.square(x), -0.5)), M_2_SQRTPI * M_SQRT1_2 * 0.5);
    return c.add(cdf, c.mul(x, pdf));
  }
  const double k_beta = M_SQRT2 * M_2_SQRTPI * 0.5, k_kappa = 0.044715;
  Value* x2 = c.square(x);
  Value* inner = c.scale(c.add(x, c.scale(c.mul(x2, x), k_kappa)), k_beta);
  Value* th = c.call(ops::tanh, {inner});
  Value* left_derivative = c.scale(c.add(th, 1.0), 0.5);
  Value* inner_derivative = c.scale(c.add(c.scale(x2, 3 * k_kappa), 1.0), k_beta);
  Value* right_derivative = c.mul(c.mul(c.scale(x, 0.5), c.sub(1.0, c.square(th))), inner_derivative);
  return c.add(left_derivative, right_derivative);
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
          return {c.mul(c.x(0), c.sub(1.0, c.square(y)))};
        }));
  r.add(ops::sigmoid_backward, composite([](Ctx& c) -> std::vector<Value*> {
          Value* y = c.x(1);
          return {c.mul(c.x(0), c.mul(y, c.sub(1.0, y)))};
        }));
  r.add(ops::silu_backward, composite([](Ctx& c) -> std::vector<Value*> {
          Value* x = c.x(1);
          Value* s = c.sigmoid(x);
          Value* d = c.mul(s, c.add(c.mul(x, c.sub(1.0, s)), 1.0));
          return {c.mul(c.x(0), d)};
        }));
  r.add(ops::gelu_backward, composite([](Ctx& c) -> std::vector<Value*> {
          bool tanh_form = c.c(2).isString() && c.c(2).toStringRef() == "tanh";
          return {c.mul(c.x(0), gelu_derivative(c, c.x(1), tanh_form))};
        }));
  // g ↦ y·(g − Σ g·y) and g ↦ g − exp(y)·Σ g over `dim`, in input_dtype.
  r.add(ops::_softmax_backward_data, composite([](Ctx& c) -> std::vector<Value*> {
          Value *g = c.x(0), *y = c.x(1);
          Value* out = c.mul(y, c.sub(g, c.sum(c.mul(g, y), {c.c(2).toInt()}, true)));
          return {c.call(ops::_to_copy, {out, c.a(3)})};
        }));
  r.add(ops::_log_softmax_backward_data, composite([](Ctx& c) -> std::vector<Value*> {
          Value *g = c.x(0), *y = c.x(1);
          Value* out = c.sub(g, c.mul(c.exp(y), c.sum(g, {c.c(2).toInt()}, true)));
          return {c.call(ops::_to_copy, {out, c.a(3)})};
        }));
  // mse_loss_backward(g, x, target, reduction): 2·(x − target)·g, over the element count for mean.
  r.add(ops::mse_loss_backward, composite([](Ctx& c) -> std::vector<Value*> {
          Value* out = c.mul(c.scale(c.sub(c.x(1), c.x(2)), 2.0), c.x(0));
          if (c.c(3).toInt() == 1) out = c.scale(out, 1.0 / static_cast<double>(c.x(1)->meta().numel()));
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
          Value* xhat = c.mul(c.sub(x, c.x(3)), c.x(4));
          Value* gx = normalized_tangent(c, weight ? c.mul(g, weight) : g, xhat, c.x(4), inner);
          auto over_outer = [&](Value* v) { return outer.empty() ? v : c.sum(v, outer); };
          return {gx, weight ? over_outer(c.mul(g, xhat)) : nullptr, optional(c, 6) ? over_outer(g) : nullptr};
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
            invstd = channel(c.rsqrt(c.add(c.x(4), c.c(8).toDouble())));
          }
          Value* xhat = c.mul(c.sub(x, mean), invstd);
          Value* gw = weight ? c.mul(g, channel(weight)) : g;
          Value* gx = train ? normalized_tangent(c, gw, xhat, invstd, others) : c.mul(gw, invstd);
          return {gx, c.sum(c.mul(g, xhat), others), c.sum(g, others)};
        }));
  // native_group_norm_backward(g, x, mean, rstd, weight, N, C, HxW, group, mask): as the
  // training batch norm's, over each group of C/group channels × HxW, with mean and rstd [N, group].
  r.add(ops::native_group_norm_backward, composite([](Ctx& c) -> std::vector<Value*> {
          Value *g = c.x(0), *x = c.x(1), *weight = optional(c, 4);
          const std::vector<int64_t>& shape = x->meta().sizes;
          int64_t N = c.c(5).toInt(), C = c.c(6).toInt(), HxW = c.c(7).toInt(), G = c.c(8).toInt();
          std::vector<int64_t> grouped = {N, G, C / G * HxW}, stats = {N, G, 1}, by_channel = {N, C, HxW};
          Value* rstd = reshape(c.b, c.x(3), stats);
          Value* xhat = c.mul(c.sub(reshape(c.b, x, grouped), reshape(c.b, c.x(2), stats)), rstd);
          Value* g_c = reshape(c.b, g, by_channel);
          Value* gw = reshape(c.b, weight ? c.mul(g_c, reshape(c.b, weight, {C, 1})) : g_c, grouped);
          Value* gx = normalized_tangent(c, gw, xhat, rstd, {2});
          Value* xhat_c = reshape(c.b, xhat, by_channel);
          std::vector<int64_t> n_hw = {0, 2};
          return {reshape(c.b, gx, shape), c.sum(c.mul(g_c, xhat_c), n_hw), c.sum(g_c, n_hw)};
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
          Value* scores = c.scale(c.matmul(q, mT(c, k)), scale);
          int64_t L = qs[qs.size() - 2], S = k->meta().sizes[qs.size() - 2];
          if (c.c(7).toBool()) {
            Value* ones =
                c.call(ops::ones, {std::vector<int64_t>{L, S}, c10::ScalarType::Bool, std::nullopt, q->meta().device});
            scores = c.masked_fill(scores, c.call(ops::triu, {ones, 1}), -std::numeric_limits<double>::infinity());
          }
          if (mask)
            scores =
                mask->meta().dtype == c10::ScalarType::Bool
                    ? c.masked_fill(scores, c.call(ops::logical_not, {mask}), -std::numeric_limits<double>::infinity())
                    : c.add(scores, mask);
          Value* p = c.call(ops::_softmax, {scores, -1, false});
          Value* grad_v = c.matmul(mT(c, p), g);
          Value* gp = c.matmul(g, mT(c, v));
          Value* grad_s = c.mul(p, c.sub(gp, c.sum(c.mul(p, gp), {-1}, true)));
          return {c.scale(c.matmul(grad_s, k), scale), c.scale(c.matmul(mT(c, grad_s), q), scale), grad_v};
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
