// jvpc::attention_tangent, attention's tangent in O(L) memory: a dispatcher operator that the
// runtime library registers (CPU and CUDA through ATen ops, a Meta kernel for shape inference).
//
//   jvpc::attention_tangent(Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? dq,
//       Tensor? dk, Tensor? dv, Tensor? mask, Tensor? dmask, bool causal, float scale,
//       int block_q, int block_k) -> Tensor
//
// q [B, H, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv] with H a multiple of Hkv (grouped-query
// attention: query head h reads key head h / (H / Hkv)); out [B, H, Lq, Dv] = softmax(S)·v with
// S = q·kᵀ·scale + mask (causal: key j > query i hidden, aligned to the top left); lse [B, H, Lq]
// (or [B, H, Lq, 1]) its row logsumexp. dq, dk, dv are the tangents of q, k, v (None: zero),
// mask a boolean or float mask broadcastable to [B, H, Lq, Lk], dmask the float mask's tangent.
// Returns d(out) [B, H, Lq, Dv] in q's dtype.
//
// Because lse is known, every block of P = exp(S − lse) is exact by itself. For each block of
// block_q queries and block_k keys the operator runs, in the accumulation type (float32 for
// float16 and bfloat16, else q's dtype), one bmm per line:
//   S  = q·kᵀ·scale (+ mask)                      recomputed
//   dS = (dq·kᵀ + q·dkᵀ)·scale (+ dmask)           the bmms with dq and dk, where present
//   acc += (P ⊙ dS)·v ;  c += rowsum(P ⊙ dS)       where dS is not zero
//   acc += P·dv                                    where dv is present
// and d(out) = acc − c ⊙ out. Key blocks a causal mask hides entirely are skipped. Grouped heads
// share their key block: the G query heads of a key head are one bmm batch row of G·block_q
// rows, so k, v, dk and dv are never repeated. A row whose lse is −inf (every key masked)
// gives 0. Memory per call: the output and O(B·H·block_q·block_k) of block temporaries.
//
//   jvpc::attention_tangent.batched(<the same arguments>) -> Tensor
//
// The same for K tangents at once (passes/batch.cpp emits it): dq, dk, dv are [K, ...] of their
// primals' shapes, dmask [K, ...] broadcastable to the scores, and the result is [K, B, H, Lq, Dv].
// S and P of each block are computed once per call and shared by the K tangents: the K tangents'
// dq rows (and dS, the accumulators) are stacked in the rows of one bmm, their dk and dv blocks
// in its columns. Matmul FLOPs: the score recompute once, the rest K times.
//
// The operator is differentiable (an Autograd kernel): d(out) carries autograd history to q, k,
// v, dq, dk and dv, and its backward is
//
//   jvpc::attention_tangent_backward(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor out,
//       Tensor lse, Tensor dout, <dq, dk, dv, mask, dmask, causal, scale, block_q, block_k>)
//       -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)
//
// given G = grad, the gradient of d(out), and dout, the operator's result: (g_q, g_k, g_v, g_dq,
// g_dk, g_dv) (g_dq, g_dk, g_dv undefined, None in Python, where that tangent is absent). out
// and lse are by-products of the forward at (q, k, v): the gradients to q, k and v are the total
// derivative through them, and none is given to out and lse. Gradients to a float mask and to
// dmask are not propagated: the Autograd kernel refuses a mask or dmask that requires grad.
// The backward is not differentiable again. With P, dS as above, c = rowsum(P ⊙ dS),
// r = rowsum(G ⊙ out) and q_row = rowsum(G ⊙ dout) − r·c, each block computes
//   A = G·vᵀ ;  dP = P ⊙ (dS − c) ;  GdS = P ⊙ (A − r)
//   GP = G·dvᵀ + A ⊙ (dS − c) − r·dS ;  GS = P ⊙ (GP − q_row)
//   g_dv += Pᵀ·G ;  g_v += dPᵀ·G
//   g_dq += scale·GdS·k ;  g_dk += scale·GdSᵀ·q
//   g_q += scale·(GdS·dk + GS·k) ;  g_k += scale·(GdSᵀ·dq + GSᵀ·q)
// c is needed before the first block, so each query block makes two sweeps over its key blocks:
// the first recomputes P and dS for c (the forward's c is not one of its outputs), the second
// computes the rest. Same layout, grouped heads, causal skip, masks, dead rows and accumulation
// type as the operator; memory: the gradients, [B·Hkv, Lk, ·] accumulators for k, v, dk, dv, and
// O(B·H·block_q·block_k) of block temporaries. Matmul FLOPs per block: the first sweep q·kᵀ and
// dS's bmms (where dS is not zero), the second q·kᵀ, dS's bmms, A, dPᵀ·G, two per present dq
// and dk, two for dv, and GS's two.
#pragma once

#include <cstdint>

namespace jvpc::runtime {

/// Block sizes linearize uses unless told otherwise.
inline constexpr int64_t kAttentionBlockQ = 256;
inline constexpr int64_t kAttentionBlockK = 512;

/// Registers the runtime's operators (jvpc::attention_tangent). They are registered by static
/// initializers in the runtime library; this function does nothing, but a call to it (the
/// Executable's constructor makes one) keeps the object file that holds them in a static link,
/// where a linker drops an object that nothing references.
void register_ops();

}  // namespace jvpc::runtime
