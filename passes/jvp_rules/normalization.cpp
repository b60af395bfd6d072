// JVP rules of softmax and layer normalization.
//
// softmax: d(out) = out · (t − Σ out·t), which is softmax's own backward formula, so the tangent
// is one _softmax_backward_data kernel reading the primal output as a residual. _safe_softmax's
// fully masked rows have out = 0 and get a zero tangent, as they should.
//
// layer norm, with x̂ = (x − μ)·rstd over the normalized dims:
//   d(x̂)   = rstd · (t − mean(t) − x̂ · mean(t·x̂))
//   d(out)  = d(x̂)·w + x̂·dw + db
//   d(μ)    = mean(t),   d(rstd) = −rstd · mean(t·x̂) · rstd
// x̂ is a primal expression (a residual after folding).
#include "passes/jvp_rules/rules.h"

namespace jvpc::jvp_rules {

namespace {

Value* softmax_jvp(Ctx& c, int64_t dim) {
  Value* t = c.t(0);
  c10::ScalarType dt = c.out()->meta().dtype;
  if (t->meta().dtype != dt) t = c.call("aten::_to_copy", {t, dt});
  return c.call("aten::_softmax_backward_data", {t, c.out(), dim, dt});
}

}  // namespace

void register_normalization(Registry& r) {
  for (const char* op : {"aten::_safe_softmax", "aten::_softmax"})
    r.add(op, [](Ctx& c) -> std::vector<Value*> {
      if (!c.t(0)) return {};
      return {softmax_jvp(c, c.c(1).toInt())};
    });
  // d(log_softmax) = t − Σ t · exp(out)
  r.add("aten::_log_softmax", [](Ctx& c) -> std::vector<Value*> {
    Value* t = c.t(0);
    if (!t) return {};
    int64_t dim = c.c(1).toInt();
    Value* p = c.call("aten::exp", {c.out()});
    Value* s = c.call("aten::sum.dim_IntList", {c.mul(t, p), std::vector<int64_t>{dim}, true});
    return {c.call("aten::sub.Tensor", {t, s})};
  });

  r.add("aten::native_layer_norm", [](Ctx& c) -> std::vector<Value*> {
    Value* x = c.x(0);
    int64_t rank = static_cast<int64_t>(x->meta().sizes.size());
    int64_t k = static_cast<int64_t>(c.c(1).toIntVector().size());
    std::vector<int64_t> dims;
    for (int64_t d = rank - k; d < rank; ++d) dims.push_back(d);
    Value *mean = c.out(1), *rstd = c.out(2);
    bool has_w = c.n.arg(2).kind == ArgKind::Tensor, has_b = c.n.arg(3).kind == ArgKind::Tensor;
    Value* tw = has_w ? c.t(2) : nullptr;
    Value* tb = has_b ? c.t(3) : nullptr;
    Value* xhat = c.call("aten::mul.Tensor", {c.call("aten::sub.Tensor", {x, mean}), rstd});
    Value *tout = nullptr, *tmean = nullptr, *trstd = nullptr;
    if (Value* t = c.t(0)) {
      tmean = c.call("aten::mean.dim", {t, dims, true});
      Value* m2 = c.call("aten::mean.dim", {c.mul(t, xhat), dims, true});
      Value* centered = c.call("aten::sub.Tensor", {c.call("aten::sub.Tensor", {t, tmean}), c.mul(m2, xhat)});
      Value* txhat = c.mul(centered, rstd);
      tout = has_w ? c.mul(txhat, c.x(2)) : txhat;
      trstd = c.mul(c.call("aten::neg", {m2}), c.call("aten::mul.Tensor", {rstd, rstd}));
    }
    if (tw) tout = c.add(tout, c.mul(tw, xhat));
    tout = c.add(tout, tb);
    return {tout, tmean, trstd};
  });

  // RMS norm: y = x·rstd·w, rstd = (mean(x², dims) + eps)^(-1/2), so
  // d(rstd) = -rstd³ · mean(x·dx, dims) and dy = (dx·rstd + x·d(rstd))·w + x·rstd·dw.
  r.add("aten::_fused_rms_norm", [](Ctx& c) -> std::vector<Value*> {
    Value* x = c.x(0);
    bool has_w = c.n.arg(2).kind == ArgKind::Tensor;
    Value* tw = has_w ? c.t(2) : nullptr;
    Value* tx = c.t(0);
    if (!tx && !tw) return {};
    int64_t rank = static_cast<int64_t>(x->meta().sizes.size());
    int64_t k = static_cast<int64_t>(c.c(1).toIntVector().size());
    std::vector<int64_t> dims;
    for (int64_t d = rank - k; d < rank; ++d) dims.push_back(d);
    Value* rstd = c.out(1);
    if (rstd->meta().dtype != x->meta().dtype) rstd = c.call("aten::_to_copy", {rstd, x->meta().dtype});
    Value *tout = nullptr, *trstd = nullptr;
    if (tx) {
      Value* cube = c.call("aten::neg", {c.call("aten::mul.Tensor", {rstd, c.call("aten::mul.Tensor", {rstd, rstd})})});
      trstd = c.mul(c.call("aten::mean.dim", {c.mul(tx, x), dims, true}), cube);
      tout = c.add(c.mul(tx, rstd), c.mul(trstd, x));
      if (has_w) tout = c.mul(tout, c.x(2));
    }
    if (tw) tout = c.add(tout, c.mul(tw, c.call("aten::mul.Tensor", {x, rstd})));
    return {tout, trstd};
  });
}

}  // namespace jvpc::jvp_rules
