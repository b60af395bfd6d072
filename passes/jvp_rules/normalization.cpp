// JVP rules of softmax and the normalizations.
//
// softmax: d(out) = out · (t − Σ out·t), which is softmax's own backward formula, so the tangent
// is one _softmax_backward_data kernel reading the primal output as a residual. _safe_softmax's
// fully masked rows have out = 0 and get a zero tangent, as they should.
//
// layer, group and batch norm share one formula. With x̂ = (x − μ)·rstd over the normalized
// dims (the last ones; each group of channels; all but the channels):
//   d(x̂)   = rstd · (t − mean(t) − x̂ · mean(t·x̂))
//   d(out)  = d(x̂)·w + x̂·dw + db              (w and b per channel for group and batch norm)
//   d(μ)    = mean(t),   d(rstd) = −rstd · mean(t·x̂) · rstd
// x̂ is a primal expression (a residual after folding). Batch norm in eval mode is affine in x:
// out = (x − running_mean)·w/√(running_var + eps) + b. Statistics kept in float32 for a
// half-precision input (CUDA) make the tangent's arithmetic float32; the JVP pass casts each
// tangent to its primal's dtype at the end.
#include "passes/jvp_rules/rules.h"
#include "ir/op.h"

namespace jvpc::jvp_rules {

namespace {

/// Tangents of a normalization x̂ = (x − μ)·rstd over `dims` (keepdim shapes).
struct Normalized {
  Value* t_xhat = nullptr;
  Value* t_mean = nullptr;
  Value* t_rstd = nullptr;
};

Normalized normalized(Ctx& c, Value* t, Value* xhat, Value* rstd, const std::vector<int64_t>& dims) {
  if (!t) return {};
  std::pair<Value*, Value*> means;
  Value* t_xhat = normalized_tangent(c, t, xhat, rstd, dims, &means);
  auto [m1, m2] = means;
  return {t_xhat, m1, c.mul(c.neg(m2), c.square(rstd))};
}

/// The node's optional weight argument, followed by its bias: 2 and 3 for layer norm (whose
/// normalized_shape comes first), 1 and 2 for group and batch norm.
size_t weight_arg(const Ctx& c) { return c.n.is(ops::native_layer_norm) ? 2 : 1; }

bool has_affine(const Ctx& c) {
  size_t w = weight_arg(c);
  return c.n.arg(w).kind == ArgKind::Tensor || c.n.arg(w + 1).kind == ArgKind::Tensor;
}

/// d(x̂·w + b) = d(x̂)·w + x̂·dw + db for the node's optional weight and bias, each broadcast by
/// `shape`.
Value* affine(Ctx& c, Value* t_xhat, Value* xhat, const std::function<Value*(Value*)>& shape) {
  size_t w = weight_arg(c);
  Value* t = c.n.arg(w).kind == ArgKind::Tensor ? c.mul(t_xhat, shape(c.x(w))) : t_xhat;
  if (Value* tw = c.t(w)) t = c.add(t, c.mul(shape(tw), xhat));  // (an absent weight or bias: no tangent)
  if (Value* tb = c.t(w + 1)) t = c.add(t, shape(tb));
  return t;
}

/// x̂ = (x − μ)·rstd; without weight and bias it is the node's own output, which then serves
/// as the residual for both (a later op's rule may keep that output too).
Value* normalized_input(Ctx& c, Value* x, Value* mean, Value* rstd) {
  if (!has_affine(c) && c.out()->meta().same_signature(x->meta()) && c.out()->meta().dtype == mean->meta().dtype)
    return c.out();
  return c.mul(c.sub(x, mean), rstd);
}

/// Broadcasts per-channel vectors against an input of `rank` (group and batch norm).
std::function<Value*(Value*)> channels(Ctx& c, size_t rank) {
  return [&c, rank](Value* v) { return per_channel(c, v, rank); };
}

}  // namespace

Value* normalized_tangent(Ctx& c, Value* t, Value* xhat, Value* rstd, const std::vector<int64_t>& dims,
                          std::pair<Value*, Value*>* means) {
  Value* m1 = c.call(ops::mean_dim, {t, dims, true});
  Value* m2 = c.call(ops::mean_dim, {c.mul(t, xhat), dims, true});
  if (means) *means = {m1, m2};
  return c.mul(c.sub(c.sub(t, m1), c.mul(m2, xhat)), rstd);
}

void register_normalization(Registry& r) {
  // d(softmax) = out · (t − Σ out·t): softmax's backward kernel
  for (Op op : {ops::_safe_softmax, ops::_softmax})
    r.add(op, per_arg({[](Ctx& c, Value* t) {
            c10::ScalarType dt = c.out()->meta().dtype;
            return c.call(ops::_softmax_backward_data, {c.cast(t, dt), c.out(), c.c(1).toInt(), dt});
          }}));
  // d(log_softmax) = t − Σ t · exp(out)
  r.add(ops::_log_softmax,
        per_arg({[](Ctx& c, Value* t) { return c.sub(t, c.sum(c.mul(t, c.exp(c.out())), {c.c(1).toInt()}, true)); }}));

  r.add(ops::native_layer_norm, [](Ctx& c) -> std::vector<Value*> {
    Value* x = c.x(0);
    int64_t rank = static_cast<int64_t>(x->meta().sizes.size());
    int64_t k = static_cast<int64_t>(c.c(1).toIntVector().size());
    std::vector<int64_t> dims;
    for (int64_t d = rank - k; d < rank; ++d) dims.push_back(d);
    Value *mean = c.out(1), *rstd = c.out(2);
    Value* xhat = normalized_input(c, x, mean, rstd);
    Normalized n = normalized(c, c.t(0), xhat, rstd, dims);
    return {affine(c, n.t_xhat, xhat, [](Value* v) { return v; }), n.t_mean, n.t_rstd};
  });

  // Group norm: layer norm of each group, [N, G, C/G·HxW], with per-channel w and b.
  r.add(ops::native_group_norm, [](Ctx& c) -> std::vector<Value*> {
    Value* x = c.x(0);
    const std::vector<int64_t>& sizes = x->meta().sizes;
    int64_t n = c.c(3).toInt(), g = c.c(6).toInt();
    std::vector<int64_t> grouped = {n, g, -1}, stats = {n, g};
    Value* mean = c.unsqueeze(c.out(1), -1);
    Value* rstd = c.unsqueeze(c.out(2), -1);
    Value* xhat = !has_affine(c) && c.out()->meta().is_contiguous() && c.out()->meta().dtype == mean->meta().dtype
                      ? reshape(c.b, c.out(), grouped)  // the output itself, viewed by group (as normalized_input)
                      : c.mul(c.sub(reshape(c.b, x, grouped), mean), rstd);
    Normalized nd = normalized(c, c.reshape(c.t(0), grouped), xhat, rstd, {2});
    Value* out = affine(c, c.reshape(nd.t_xhat, sizes), reshape(c.b, xhat, sizes), channels(c, sizes.size()));
    return {out, c.reshape(nd.t_mean, stats), c.reshape(nd.t_rstd, stats)};
  });

  // Batch norm: statistics per channel over all other dims (training), or the running ones.
  // cuDNN's kernel (LibTorch's choice on CUDA) takes the same arguments and returns the same
  // outputs, plus a workspace.
  // _native_batch_norm_legit_functional: the same, with the running statistics' new values as
  // two more outputs (a compiled program's state), which have no tangent.
  for (Op op : {ops::native_batch_norm, ops::cudnn_batch_norm, ops::_native_batch_norm_legit_functional})
    r.add(op, [](Ctx& c) -> std::vector<Value*> {
      Value* x = c.x(0);
      size_t rank = x->meta().sizes.size();
      auto channel = channels(c, rank);
      bool running = c.n.arg(3).kind == ArgKind::Tensor && c.n.arg(4).kind == ArgKind::Tensor;
      if (c.c(5).toBool() || !running) {
        std::vector<int64_t> dims = {0};
        for (size_t d = 2; d < rank; ++d) dims.push_back(static_cast<int64_t>(d));
        Value* mean = channel(c.out(1));
        Value* rstd = channel(c.out(2));
        Value* xhat = normalized_input(c, x, mean, rstd);
        Normalized n = normalized(c, c.t(0), xhat, rstd, dims);
        std::vector<int64_t> flat = {x->meta().sizes.at(1)};
        return {affine(c, n.t_xhat, xhat, channel), c.reshape(n.t_mean, flat), c.reshape(n.t_rstd, flat)};
      }
      // eval: out = (x − m)·rstd·w + b with rstd = (v + eps)^(−1/2) from the running statistics,
      // which are buffers: like LibTorch, jvpc does not differentiate them.
      if (c.t(3) || c.t(4))
        throw Error("running_mean and running_var are not differentiable (differentiate the input, weight and bias)");
      double eps = c.c(7).toDouble();
      Value* rstd = c.rsqrt(c.add(channel(c.x(4)), eps));
      Value* xhat = c.mul(c.sub(x, channel(c.x(3))), rstd);
      return {affine(c, c.mul(c.t(0), rstd), xhat, channel)};
    });

  // RMS norm: y = x·rstd·w, rstd = (mean(x², dims) + eps)^(-1/2), so
  // d(rstd) = -rstd³ · mean(x·dx, dims) and dy = (dx·rstd + x·d(rstd))·w + x·rstd·dw.
  r.add(ops::_fused_rms_norm, [](Ctx& c) -> std::vector<Value*> {
    Value* x = c.x(0);
    bool has_w = c.n.arg(2).kind == ArgKind::Tensor;
    int64_t rank = static_cast<int64_t>(x->meta().sizes.size());
    int64_t k = static_cast<int64_t>(c.c(1).toIntVector().size());
    std::vector<int64_t> dims;
    for (int64_t d = rank - k; d < rank; ++d) dims.push_back(d);
    Value* rstd = c.cast(c.out(1), x->meta().dtype);
    Value* trstd = c.per_arg({[&](Ctx&, Value* t) {  // −rstd³·mean(x·dx)
      return c.mul(c.call(ops::mean_dim, {c.mul(t, x), dims, true}), c.neg(c.mul(rstd, c.square(rstd))));
    }});
    Value* tout = c.per_arg({
        [&](Ctx&, Value* t) {  // (dx·rstd + x·d(rstd))·w
          Value* d = c.add(c.mul(t, rstd), c.mul(trstd, x));
          return has_w ? c.mul(d, c.x(2)) : d;
        },
        {},
        [&](Ctx&, Value* t) { return c.mul(t, c.mul(x, rstd)); },  // x·rstd·dw
    });
    return {tout, trstd};
  });
}

}  // namespace jvpc::jvp_rules
