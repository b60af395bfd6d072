// JVP rules of the fused attention kernels (CPU flash; CUDA flash, efficient and cuDNN).
// None of them returns the attention probabilities, so the rule rebuilds them from the
// kernel's definition and the logsumexp it returns (the tracer asks every kernel for it):
//
//   S  = q·kᵀ·scale + mask            (mask: the additive or boolean mask, or causal)
//   P  = exp(S − lse)                  primal only: fold computes it once (one extra q·kᵀ)
//   dS = dq·(kᵀ·scale) + (q·scale)·dkᵀ  (scaled operands are primal: folded)
//   dP = P·(dS − Σ P·dS)               one _softmax_backward_data
//   d(out) = dP·v + P·dv
//
// Grouped-query attention repeats k and v (and their tangents) over the query heads. The math
// backend never reaches this file: it is traced as bmm, softmax and views, whose own rules
// give the same tangent graph.
#include "passes/jvp_rules/rules.h"

#include <ATen/TensorUtils.h>

#include <cmath>
#include <limits>

namespace jvpc::jvp_rules {

namespace {

constexpr size_t kNone = static_cast<size_t>(-1);

struct Layout {  // argument positions in each kernel's schema
  size_t mask, causal, scale;
  bool bottom_right = false;  // causal masks align to the bottom right when Sq != Sk (FlashAttention-2)
};

// [b, h, s, d] -> [b·h, s, d], copying only if the value cannot be viewed that way.
Value* as3d(Ctx& c, Value* x) {
  const auto& s = x->meta().sizes;
  std::vector<int64_t> shape = {s[0] * s[1], s[2], s[3]};
  if (!at::detail::computeStride(s, x->meta().strides, shape))
    x = c.call("aten::clone", {x, c10::MemoryFormat::Contiguous});
  return c.call("aten::view", {x, shape});
}

Value* as4d(Ctx& c, Value* x, std::vector<int64_t> shape) { return c.call("aten::view", {x, shape}); }

// Repeats the heads of k or v ([b, h_k, s, d]) to `heads`, as grouped-query attention does.
Value* repeat_heads(Ctx& c, Value* x, int64_t heads) {
  if (!x) return nullptr;
  auto s = x->meta().sizes;
  if (s[1] == heads) return x;
  int64_t r = heads / s[1];
  Value* e =
      c.call("aten::expand", {c.call("aten::unsqueeze", {x, 2}), std::vector<int64_t>{s[0], s[1], r, s[2], s[3]}});
  e = c.call("aten::clone", {e, c10::MemoryFormat::Contiguous});
  return c.call("aten::view", {e, std::vector<int64_t>{s[0], heads, s[2], s[3]}});
}

Value* cast(Ctx& c, Value* x, c10::ScalarType dt) {
  return x->meta().dtype == dt ? x : c.call("aten::_to_copy", {x, dt});
}

Rule fused_attention(Layout at) {
  return [at](Ctx& c) -> std::vector<Value*> {
    Value *tq = c.t(0), *tk = c.t(1), *tv = c.t(2);
    // A float mask is added to the scores, so its tangent is too.
    bool has_mask = at.mask != kNone && c.n.arg(at.mask).kind == ArgKind::Tensor;
    Value* tm = has_mask ? c.t(at.mask) : nullptr;
    if (!tq && !tk && !tv && !tm) return {};
    Value *q = c.x(0), *k = c.x(1), *v = c.x(2);
    const auto& qs = q->meta().sizes;
    int64_t B = qs[0], H = qs[1], Sq = qs[2], D = qs[3];
    int64_t Sk = k->meta().sizes[2], Dv = v->meta().sizes[3];
    c10::ScalarType dt = q->meta().dtype;
    c10::ScalarType acc = c10::isReducedFloatingType(dt) ? c10::kFloat : dt;
    double scale = 1.0 / std::sqrt(static_cast<double>(D));
    if (at.scale != kNone && !c.c(at.scale).isNone()) scale = c.c(at.scale).toDouble();

    // Primal: the probabilities P, from the definition and the logsumexp.
    Value* kr = repeat_heads(c, k, H);
    Value* vr = repeat_heads(c, v, H);
    Value* q3 = as3d(c, q);
    Value* kt3 = as3d(c, c.call("aten::transpose.int", {kr, -2, -1}));
    Value* v3 = as3d(c, vr);
    // Scores in the accumulation type, as the kernels compute them (bf16 scores would put
    // their rounding error into P).
    Value* s = c.call("aten::bmm", {cast(c, q3, acc), cast(c, kt3, acc)});
    s = as4d(c, c.call("aten::mul.Scalar", {s, scale}), {B, H, Sq, Sk});
    if (has_mask) {
      Value* m = c.x(at.mask);
      if (m->meta().dtype == c10::kBool)
        m = c.call("aten::where.Scalar", {m, 0.0, -std::numeric_limits<double>::infinity()});
      s = c.call("aten::add.Tensor", {s, cast(c, m, acc)});
    }
    if (at.causal != kNone && c.c(at.causal).toBool()) {
      if (at.bottom_right && Sq != Sk)
        throw Error("causal attention with query length " + std::to_string(Sq) + " and key length " +
                    std::to_string(Sk) + " is aligned to the bottom right in this kernel; no JVP rule covers it");
      Value* full = c.call("aten::full", {std::vector<int64_t>{Sq, Sk}, -std::numeric_limits<double>::infinity(), acc,
                                          std::nullopt, q->meta().device});
      s = c.call("aten::add.Tensor", {s, c.call("aten::triu", {full, 1})});
    }
    Value* lse = cast(c, c.out(1), acc);
    if (lse->meta().numel() != B * H * Sq) {  // padded (efficient attention): keep the first Sq
      lse = c.call("aten::slice.Tensor", {lse, 2, 0, Sq, 1});
      lse = c.call("aten::clone", {lse, c10::MemoryFormat::Contiguous});
    }
    std::vector<int64_t> lse4 = {B, H, Sq, 1};  // cuDNN's is [B, H, Sq, 1], flash's [B, H, Sq]
    if (!at::detail::computeStride(lse->meta().sizes, lse->meta().strides, lse4))
      lse = c.call("aten::clone", {lse, c10::MemoryFormat::Contiguous});
    lse = c.call("aten::view", {lse, lse4});
    Value* p = cast(c, c.call("aten::exp", {c.call("aten::sub.Tensor", {s, lse})}), dt);

    // Tangent. The scale goes on the primal operands, which fold precomputes.
    Value* ds = nullptr;
    if (tq) ds = c.call("aten::bmm", {as3d(c, tq), c.call("aten::mul.Scalar", {kt3, scale})});
    if (tk) {
      Value* tkt = as3d(c, c.call("aten::transpose.int", {repeat_heads(c, tk, H), -2, -1}));
      ds = c.add(ds, c.call("aten::bmm", {c.call("aten::mul.Scalar", {q3, scale}), tkt}));
    }
    Value* dout = nullptr;
    if (ds) ds = as4d(c, ds, {B, H, Sq, Sk});
    if (tm) {
      Value* tm4 = c.call("aten::expand", {cast(c, tm, dt), std::vector<int64_t>{B, H, Sq, Sk}});
      ds = ds ? c.call("aten::add.Tensor", {ds, tm4}) : c.call("aten::clone", {tm4, c10::MemoryFormat::Contiguous});
    }
    if (ds) {
      Value* dp = c.call("aten::_softmax_backward_data", {ds, p, -1, dt});
      dout = c.call("aten::bmm", {as3d(c, dp), v3});
    }
    if (tv) dout = c.add(dout, c.call("aten::bmm", {as3d(c, p), as3d(c, repeat_heads(c, tv, H))}));
    return {as4d(c, dout, {B, H, Sq, Dv})};
  };
}

}  // namespace

void register_attention(Registry& r) {
  r.add("aten::_scaled_dot_product_flash_attention_for_cpu", fused_attention({5, 4, 6}));
  r.add("aten::_scaled_dot_product_flash_attention", fused_attention({kNone, 4, 6, true}));
  r.add("aten::_scaled_dot_product_efficient_attention", fused_attention({3, 6, 7}));
  r.add("aten::_scaled_dot_product_cudnn_attention", fused_attention({3, 6, 8}));
}

}  // namespace jvpc::jvp_rules
