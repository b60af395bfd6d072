"""FlopCounterMode's formulas for jvpc's own operators, jvpc::attention_tangent (and its batched
overload, jvpc::attention_tangent.batched) and its backward, jvpc::attention_tangent_backward.

The operator (runtime/attention_tangent.h) runs its bmms inside its kernel, where a dispatch
mode does not see them: the mode sees the operator itself, and takes itself off the mode stack
while it runs it. So the mode counts it by this formula, registered with
torch.utils.flop_counter when jvpc is imported (before any FlopCounterMode is made: each mode
copies the registry). It counts exactly the bmms the kernel runs: for each block of block_q
queries and each block_k keys it computes (a causal mask skips the key blocks it hides),
2·rows·keys·(D per q·kᵀ, dq·kᵀ, q·dkᵀ) + 2·rows·keys·(Dv per (P⊙dS)·v, P·dv), as
attention_tangent_matmul_flops does in the cost model (ir/cost/cost_model.cpp); the batched
overload the recompute once and the tangents' bmms K times.
"""

from torch.utils.flop_counter import register_flop_formula

from . import _C  # noqa: F401  (registers the jvpc operators with the dispatcher)

import torch


def score_elements(lq: int, lk: int, causal: bool, block_q: int, block_k: int) -> int:
    """Query-key pairs the kernel computes per (batch, head): its blocks, less those causal skips."""
    total = 0
    for i0 in range(0, lq, block_q):
        bq = min(block_q, lq - i0)
        # Causal (top left): key block [j0, j0 + bk) runs while j0 <= the block's last query.
        keys = min(lk, ((i0 + bq - 1) // block_k + 1) * block_k) if causal else lk
        total += bq * keys
    return total


@register_flop_formula(torch.ops.jvpc.attention_tangent)
def attention_tangent_flop(q, k, v, out, lse, dq, dk, dv, mask, dmask, causal, scale, block_q, block_k, *,
                           out_shape=None, **kwargs) -> int:
    """Matmul FLOPs of one jvpc::attention_tangent or jvpc::attention_tangent.batched call (arguments
    are shapes, None for an absent tensor; the packet registers the formula for both overloads).

    The batched overload's tangents and result have K in front ([K, B, H, Lq, Dv]): the score
    recompute q·kᵀ runs once per call, the tangents' bmms K times."""
    b, h, lq, d = q
    lk, dv_size = k[2], v[3]
    tangents = 1 if out_shape is None or len(out_shape) == 4 else out_shape[0]
    has_ds = dq is not None or dk is not None or dmask is not None
    if (not has_ds and dv is None) or tangents * b * h * lq * dv_size == 0:
        return 0  # the kernel returns zeros without a bmm
    per = d + tangents * (d * ((dq is not None) + (dk is not None)) + dv_size * (int(has_ds) + (dv is not None)))
    return 2 * b * h * score_elements(lq, lk, causal, block_q, block_k) * per


@register_flop_formula(torch.ops.jvpc.attention_tangent_backward)
def attention_tangent_backward_flop(grad, q, k, v, out, lse, dout, dq, dk, dv, mask, dmask, causal, scale, block_q,
                                   block_k, *, out_shape=None, **kwargs) -> int:
    """Matmul FLOPs of one jvpc::attention_tangent_backward call: per computed block, the first
    sweep's q·kᵀ and dS bmms (where dS is not zero), and the second's q·kᵀ, dS bmms, G·vᵀ, dPᵀ·G,
    two per present dq and dk, two for dv (Pᵀ·G, G·dvᵀ) and two for GS (GS·k, GSᵀ·q)."""
    b, h, lq, d = q
    lk, dv_size = k[2], v[3]
    n_ds = (dq is not None) + (dk is not None)
    has_ds = n_ds > 0 or dmask is not None
    if not has_ds and dv is None:
        return 0  # all-zero gradients without a bmm
    first = d * (1 + n_ds) if has_ds else 0
    second = 3 * d + 2 * dv_size * (dv is not None) + ((3 * d * n_ds + 2 * dv_size) if has_ds else 0)
    return 2 * b * h * score_elements(lq, lk, causal, block_q, block_k) * (first + second)
