// JVP rules of the fused attention kernels (CPU flash; CUDA flash, efficient and cuDNN).
// Each emits one jvpc::attention_tangent node (runtime/attention_tangent.h), the tangent in
// O(L) memory, from the kernel's operands, its output and the logsumexp it returns (the
// tracer asks every kernel for it):
//
//   S  = q·kᵀ·scale + mask            (mask: the additive or boolean mask, or causal)
//   P  = exp(S − lse)                  exact per block, recomputed per call
//   dS = (dq·kᵀ + q·dkᵀ)·scale (+ dmask)
//   d(out) = (P ⊙ dS)·v − rowsum(P ⊙ dS) ⊙ out + P·dv
//
// The attention-form pass (passes/attention_form.cpp) then chooses, per attention under the
// residual budget, whether it stays so or is expanded into the P form, which holds P
// (B·H·Lq·Lk) and saves the recomputed q·kᵀ. The math backend never reaches this file: it is
// traced as bmm, softmax and views, whose own rules give the P form.
#include "passes/jvp_rules/rules.h"
#include "ir/op.h"

#include "runtime/attention_tangent.h"

#include <ATen/TensorUtils.h>

#include <cmath>

namespace jvpc::jvp_rules {

namespace {

constexpr size_t kNone = static_cast<size_t>(-1);

struct Layout {  // argument positions in each kernel's schema
  size_t mask, causal, scale;
  bool bottom_right = false;  // causal masks align to the bottom right when Sq != Sk (FlashAttention-2)
};

Rule fused_attention(Layout at) {
  return [at](Ctx& c) -> std::vector<Value*> {
    Value *tq = c.t(0), *tk = c.t(1), *tv = c.t(2);
    // A float mask is added to the scores, so its tangent is too.
    bool has_mask = at.mask != kNone && c.n.arg(at.mask).kind == ArgKind::Tensor;
    Value* tm = has_mask && c.x(at.mask)->meta().dtype != c10::kBool ? c.t(at.mask) : nullptr;
    if (!tq && !tk && !tv && !tm) return {};
    if (c.n.impure())  // dropout_p > 0
      throw Error(c.n.op() +
                  " with dropout draws its mask inside the kernel, where the tangent cannot read it: "
                  "no JVP rule covers it (the math backend's dropout is differentiated)");
    Value *q = c.x(0), *k = c.x(1), *v = c.x(2);
    const auto& qs = q->meta().sizes;
    int64_t B = qs[0], H = qs[1], Sq = qs[2], D = qs[3];
    int64_t Sk = k->meta().sizes[2];
    double scale = 1.0 / std::sqrt(static_cast<double>(D));
    if (at.scale != kNone && !c.c(at.scale).isNone()) scale = c.c(at.scale).toDouble();
    bool causal = at.causal != kNone && c.c(at.causal).toBool();
    if (causal && at.bottom_right && Sq != Sk)
      throw Error("causal attention with query length " + std::to_string(Sq) + " and key length " + std::to_string(Sk) +
                  " is aligned to the bottom right in this kernel; no JVP rule covers it");
    Value* lse = c.out(1);
    if (lse->meta().numel() != B * H * Sq)  // padded (efficient attention): keep the first Sq
      lse = c.call(ops::clone, {c.call(ops::slice_Tensor, {lse, 2, 0, Sq, 1}), c10::MemoryFormat::Contiguous});
    lse = c.reshape(lse, {B, H, Sq});  // cuDNN's is [B, H, Sq, 1], flash's [B, H, Sq]
    auto opt = [](Value* t) { return t ? BArg(t) : BArg(std::nullopt); };
    return {c.call(ops::jvpc_attention_tangent, {q, k, v, c.out(0), lse, opt(tq), opt(tk), opt(tv),
                                                 has_mask ? BArg(c.x(at.mask)) : BArg(std::nullopt), opt(tm), causal,
                                                 scale, runtime::kAttentionBlockQ, runtime::kAttentionBlockK})};
  };
}

}  // namespace

void register_attention(Registry& r) {
  r.add(ops::_scaled_dot_product_flash_attention_for_cpu, fused_attention({5, 4, 6}));
  r.add(ops::_scaled_dot_product_flash_attention, fused_attention({kNone, 4, 6, true}));
  r.add(ops::_scaled_dot_product_efficient_attention, fused_attention({3, 6, 7}));
  r.add(ops::_scaled_dot_product_cudnn_attention, fused_attention({3, 6, 8}));
}

}  // namespace jvpc::jvp_rules
