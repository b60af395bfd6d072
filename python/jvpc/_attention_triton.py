"""Attention with its tangent, and the backward through both, as fused Triton kernels.

The GPU route of jvpc::attention_tangent (runtime/attention_tangent.h): the same semantics, in
kernels that keep every Lq x Lk block in registers. Notation, per query row i over keys j:

    S  = q·kᵀ·scale + mask                  (causal: key j > query i hidden, top-left aligned)
    P  = softmax(S) = exp(S − lse)          out = P·v
    dS = (dq·kᵀ + q·dkᵀ)·scale + dmask      c = rowsum(P ⊙ dS)
    dout = (P ⊙ dS)·v + P·dv − c ⊙ out

`forward` computes out, lse and dout in one pass over the key blocks, with an online softmax for
the primal and its tangent (the three accumulators are rescaled together); given out and lse (the
operator's case) it takes P = exp(S − lse) exactly and computes dout alone.

`backward` takes the gradients G of dout and Go of out (either may be absent) and returns those of
q, k, v, dq, dk and dv. With r = rowsum(G ⊙ out), A = G·vᵀ and
q_row = rowsum(G ⊙ dout) − r·c + rowsum(Go ⊙ out), each block computes

    GdS = P ⊙ (A − r) ;  GS = P ⊙ (G·dvᵀ + A ⊙ (dS − c) − r·dS + Go·vᵀ − q_row)
    g_v += (P ⊙ (dS − c))ᵀ·G + Pᵀ·Go ;  g_dv += Pᵀ·G
    g_k += scale·(GdSᵀ·dq + GSᵀ·q) ;     g_dk += scale·GdSᵀ·q
    g_q += scale·(GdS·dk + GS·k) ;       g_dq += scale·GdS·k

in two kernels that recompute P from lse: one per key block (looping over the query blocks of all
the query heads that share its key head, so grouped heads need no atomics) for k, v, dk, dv, and
one per query block for q and dq. c comes from the forward, or from a sweep of its own.

q [B, H, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv] with H a multiple of Hkv; masks boolean
(True: attend) or float, broadcastable to [B, H, Lq, Lk]; D and Dv up to 256. float16 and
bfloat16 accumulate in float32, float32 and float64 in their own type. A row with every key
masked gives 0 (out, dout and every gradient through it) and lse −inf.

Kernels are decorated at import, so TRITON_INTERPRET=1 (Triton's interpreter, on CPU tensors)
must be set before this module is first imported. `register()` makes these the CUDA kernels of
jvpc::attention_tangent and jvpc::attention_tangent_backward.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _C  # noqa: F401  (defines the jvpc operators)

# The devices (lower case) whose attention runs in these kernels: those register() was given.
# _tangent_grad_attention reads it, for its O(L) route's fused attention.
DEVICES: set[str] = set()

_MAX_HEAD = 256


@triton.jit
def _scores(q, dq, k, dk, MASK, DMASK, b, h, offs_m, offs_n, LQ, LK, scale,
            sm_b, sm_h, sm_q, sm_k, sd_b, sd_h, sd_q, sd_k,
            HAS_DQ: tl.constexpr, HAS_DK: tl.constexpr, MASK_KIND: tl.constexpr, HAS_DMASK: tl.constexpr,
            CAUSAL: tl.constexpr, TANGENT: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr):
    """One block's S (−inf where hidden), dS (0 where hidden or without tangent) and validity."""
    inside = (offs_m[:, None] < LQ) & (offs_n[None, :] < LK)
    s = tl.dot(q, tl.trans(k), input_precision=PREC, out_dtype=ACC) * scale
    valid = inside
    if CAUSAL:
        valid = valid & (offs_n[None, :] <= offs_m[:, None])
    if MASK_KIND == 1:
        mk = tl.load(MASK + b * sm_b + h * sm_h + offs_m[:, None] * sm_q + offs_n[None, :] * sm_k, mask=inside, other=0)
        valid = valid & (mk != 0)
    if MASK_KIND == 2:
        s += tl.load(MASK + b * sm_b + h * sm_h + offs_m[:, None] * sm_q + offs_n[None, :] * sm_k, mask=inside,
                     other=0).to(ACC)
    s = tl.where(valid, s, float("-inf"))
    ds = tl.zeros(s.shape, ACC)
    if TANGENT:
        if HAS_DQ:
            ds += tl.dot(dq, tl.trans(k), input_precision=PREC, out_dtype=ACC)
        if HAS_DK:
            ds += tl.dot(q, tl.trans(dk), input_precision=PREC, out_dtype=ACC)
        ds = ds * scale
        if HAS_DMASK:
            ds += tl.load(DMASK + b * sd_b + h * sd_h + offs_m[:, None] * sd_q + offs_n[None, :] * sd_k, mask=inside,
                          other=0).to(ACC)
        ds = tl.where(valid, ds, 0.0)
    return s, ds, valid


@triton.jit
def _rows(X, row0, offs_m, offs_d, L, D):
    """A [rows, BLOCK_D] tile of a contiguous [.., L, D] tensor, zero outside."""
    return tl.load(X + (row0 + offs_m[:, None]) * D + offs_d[None, :],
                   mask=(offs_m[:, None] < L) & (offs_d[None, :] < D), other=0)


@triton.jit
def _forward_kernel(Q, K, V, DQ, DK, DV, MASK, DMASK, OUT, LSE, DOUT, C,
                    sm_b, sm_h, sm_q, sm_k, sd_b, sd_h, sd_q, sd_k,
                    H, G, LQ, LK, D, E, scale,
                    HAS_DQ: tl.constexpr, HAS_DK: tl.constexpr, HAS_DV: tl.constexpr, MASK_KIND: tl.constexpr,
                    HAS_DMASK: tl.constexpr, CAUSAL: tl.constexpr, KNOWN_LSE: tl.constexpr,
                    WANT_DOUT: tl.constexpr, WANT_C: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
                    ACC: tl.constexpr, PREC: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    kv = (b * (H // G) + h // G) * LK
    TANGENT: tl.constexpr = HAS_DQ or HAS_DK or HAS_DMASK
    WANT_V: tl.constexpr = (not KNOWN_LSE) or WANT_DOUT
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    q = _rows(Q, bh * LQ, offs_m, offs_d, LQ, D)
    dq = q
    if HAS_DQ:
        dq = _rows(DQ, bh * LQ, offs_m, offs_d, LQ, D)
    row_ok = offs_m < LQ
    if KNOWN_LSE:
        m_i = tl.load(LSE + bh * LQ + offs_m, mask=row_ok, other=float("-inf")).to(ACC)
        m_i = tl.where(m_i == float("-inf"), float("inf"), m_i)  # a dead row: P = 0
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), ACC)
    l_i = tl.zeros([BLOCK_M], ACC)
    c_i = tl.zeros([BLOCK_M], ACC)
    acc = tl.zeros([BLOCK_M, BLOCK_E], ACC)
    tacc = tl.zeros([BLOCK_M, BLOCK_E], ACC)
    hi = LK
    if CAUSAL:
        hi = tl.minimum(LK, (pid_m + 1) * BLOCK_M)
    for n0 in range(0, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        k = _rows(K, kv, offs_n, offs_d, LK, D)
        dk = k
        if HAS_DK:
            dk = _rows(DK, kv, offs_n, offs_d, LK, D)
        s, ds, valid = _scores(q, dq, k, dk, MASK, DMASK, b, h, offs_m, offs_n, LQ, LK, scale,
                               sm_b, sm_h, sm_q, sm_k, sd_b, sd_h, sd_q, sd_k,
                               HAS_DQ, HAS_DK, MASK_KIND, HAS_DMASK, CAUSAL, TANGENT, ACC, PREC)
        if KNOWN_LSE:
            alpha = tl.full([BLOCK_M], 1.0, ACC)
            p = tl.exp(s - m_i[:, None])
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_i - m_safe)
            p = tl.exp(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            m_i = m_new
        pds = p * ds
        c_i = c_i * alpha + tl.sum(pds, 1)
        if WANT_V:
            v = _rows(V, kv, offs_n, offs_e, LK, E)
            if not KNOWN_LSE:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC, out_dtype=ACC)
            if WANT_DOUT:
                tacc = tacc * alpha[:, None]
                if TANGENT:
                    tacc += tl.dot(pds.to(v.dtype), v, input_precision=PREC, out_dtype=ACC)
                if HAS_DV:
                    dv = _rows(DV, kv, offs_n, offs_e, LK, E)
                    tacc += tl.dot(p.to(dv.dtype), dv, input_precision=PREC, out_dtype=ACC)
    out_ptrs = (bh * LQ + offs_m[:, None]) * E + offs_e[None, :]
    out_ok = row_ok[:, None] & (offs_e[None, :] < E)
    if KNOWN_LSE:
        inv = tl.full([BLOCK_M], 1.0, ACC)
        out = tl.load(OUT + out_ptrs, mask=out_ok, other=0).to(ACC)
    else:
        live = l_i > 0
        inv = tl.where(live, 1.0 / tl.where(live, l_i, 1.0), 0.0)
        out = acc * inv[:, None]
        tl.store(OUT + out_ptrs, out.to(OUT.dtype.element_ty), mask=out_ok)
        lse = tl.where(live, m_i + tl.log(tl.where(live, l_i, 1.0)), float("-inf"))
        tl.store(LSE + bh * LQ + offs_m, lse.to(LSE.dtype.element_ty), mask=row_ok)
    c = c_i * inv
    if WANT_C:
        tl.store(C + bh * LQ + offs_m, c.to(C.dtype.element_ty), mask=row_ok)
    if WANT_DOUT:
        dout = tacc * inv[:, None] - c[:, None] * out
        tl.store(DOUT + out_ptrs, dout.to(DOUT.dtype.element_ty), mask=out_ok)


@triton.jit
def _block_grads(q, dq, k, dk, v, dv, g, go, lse, c, r, q_row, MASK, DMASK, b, h, offs_m, offs_n, LQ, LK, scale,
                 sm_b, sm_h, sm_q, sm_k, sd_b, sd_h, sd_q, sd_k,
                 HAS_DQ: tl.constexpr, HAS_DK: tl.constexpr, HAS_DV: tl.constexpr, MASK_KIND: tl.constexpr,
                 HAS_DMASK: tl.constexpr, CAUSAL: tl.constexpr, HAS_G: tl.constexpr, HAS_GO: tl.constexpr,
                 ACC: tl.constexpr, PREC: tl.constexpr):
    """One block's P, dS − c, GdS and GS (see the module's docstring)."""
    TANGENT: tl.constexpr = HAS_DQ or HAS_DK or HAS_DMASK
    s, ds, valid = _scores(q, dq, k, dk, MASK, DMASK, b, h, offs_m, offs_n, LQ, LK, scale,
                           sm_b, sm_h, sm_q, sm_k, sd_b, sd_h, sd_q, sd_k,
                           HAS_DQ, HAS_DK, MASK_KIND, HAS_DMASK, CAUSAL, TANGENT, ACC, PREC)
    p = tl.exp(s - lse[:, None])
    ds_c = tl.where(valid, ds - c[:, None], 0.0)
    gds = tl.zeros(s.shape, ACC)
    gp = tl.zeros(s.shape, ACC)
    if HAS_G:
        a = tl.dot(g, tl.trans(v), input_precision=PREC, out_dtype=ACC)
        gds = p * (a - r[:, None])
        gp = a * ds_c - r[:, None] * ds
        if HAS_DV:
            gp += tl.dot(g, tl.trans(dv), input_precision=PREC, out_dtype=ACC)
    if HAS_GO:
        gp += tl.dot(go, tl.trans(v), input_precision=PREC, out_dtype=ACC)
    gs = p * (gp - q_row[:, None])
    return p, ds_c, gds, gs


@triton.jit
def _query_block(Q, DQ, GRAD, GRAD_OUT, LSE, C, R, QROW, bh, offs_m, offs_d, offs_e, LQ, D, E,
                 HAS_DQ: tl.constexpr, HAS_G: tl.constexpr, HAS_GO: tl.constexpr, ACC: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr):
    """A query block's tiles for the backward: q, dq, G, Go (q and zeros standing in for absent
    ones) and its rows' lse (+inf past the end and in dead rows: P = 0), c, r and q_row."""
    row_ok = offs_m < LQ
    q = _rows(Q, bh * LQ, offs_m, offs_d, LQ, D)
    dq = q
    if HAS_DQ:
        dq = _rows(DQ, bh * LQ, offs_m, offs_d, LQ, D)
    g = tl.zeros([BLOCK_M, BLOCK_E], q.dtype)
    if HAS_G:
        g = _rows(GRAD, bh * LQ, offs_m, offs_e, LQ, E)
    go = g
    if HAS_GO:
        go = _rows(GRAD_OUT, bh * LQ, offs_m, offs_e, LQ, E)
    lse = tl.load(LSE + bh * LQ + offs_m, mask=row_ok, other=float("inf")).to(ACC)
    c = tl.load(C + bh * LQ + offs_m, mask=row_ok, other=0).to(ACC)
    r = tl.load(R + bh * LQ + offs_m, mask=row_ok, other=0).to(ACC)
    q_row = tl.load(QROW + bh * LQ + offs_m, mask=row_ok, other=0).to(ACC)
    return q, dq, g, go, lse, c, r, q_row


@triton.jit
def _backward_kv_kernel(Q, K, V, DQ, DK, DV, MASK, DMASK, GRAD, GRAD_OUT, LSE, C, R, QROW,
                        GK, GV, GDK, GDV,
                        sm_b, sm_h, sm_q, sm_k, sd_b, sd_h, sd_q, sd_k,
                        H, G, LQ, LK, D, E, scale,
                        HAS_DQ: tl.constexpr, HAS_DK: tl.constexpr, HAS_DV: tl.constexpr, MASK_KIND: tl.constexpr,
                        HAS_DMASK: tl.constexpr, CAUSAL: tl.constexpr, HAS_G: tl.constexpr, HAS_GO: tl.constexpr,
                        WANT_K: tl.constexpr, WANT_V: tl.constexpr, WANT_DK: tl.constexpr, WANT_DV: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
                        ACC: tl.constexpr, PREC: tl.constexpr):
    """Per key block of one key head: g_k, g_v, g_dk, g_dv over the queries of its G query heads."""
    pid_n = tl.program_id(0)
    bk = tl.program_id(1)  # b · Hkv + key head
    HKV = H // G
    b = bk // HKV
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    k = _rows(K, bk * LK, offs_n, offs_d, LK, D)
    v = _rows(V, bk * LK, offs_n, offs_e, LK, E)
    dk = k
    dv = v
    if HAS_DK:
        dk = _rows(DK, bk * LK, offs_n, offs_d, LK, D)
    if HAS_DV:
        dv = _rows(DV, bk * LK, offs_n, offs_e, LK, E)
    gk = tl.zeros([BLOCK_N, BLOCK_D], ACC)
    gdk = tl.zeros([BLOCK_N, BLOCK_D], ACC)
    gv = tl.zeros([BLOCK_N, BLOCK_E], ACC)
    gdv = tl.zeros([BLOCK_N, BLOCK_E], ACC)
    lo = 0
    if CAUSAL:
        lo = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M
    for j in range(0, G):
        h = (bk % HKV) * G + j
        bh = b * H + h
        for m0 in range(lo, LQ, BLOCK_M):
            offs_m = m0 + tl.arange(0, BLOCK_M)
            q, dq, g, go, lse, c, r, q_row = _query_block(Q, DQ, GRAD, GRAD_OUT, LSE, C, R, QROW, bh, offs_m, offs_d,
                                                          offs_e, LQ, D, E, HAS_DQ, HAS_G, HAS_GO, ACC, BLOCK_M,
                                                          BLOCK_E)
            p, ds_c, gds, gs = _block_grads(q, dq, k, dk, v, dv, g, go, lse, c, r, q_row, MASK, DMASK, b, h, offs_m,
                                            offs_n, LQ, LK, scale, sm_b, sm_h, sm_q, sm_k, sd_b, sd_h, sd_q, sd_k,
                                            HAS_DQ, HAS_DK, HAS_DV, MASK_KIND, HAS_DMASK, CAUSAL, HAS_G, HAS_GO,
                                            ACC, PREC)
            if WANT_V:
                if HAS_G:
                    gv += tl.dot(tl.trans((p * ds_c).to(g.dtype)), g, input_precision=PREC, out_dtype=ACC)
                if HAS_GO:
                    gv += tl.dot(tl.trans(p.to(go.dtype)), go, input_precision=PREC, out_dtype=ACC)
            if WANT_DV:
                gdv += tl.dot(tl.trans(p.to(g.dtype)), g, input_precision=PREC, out_dtype=ACC)
            if WANT_K:
                gk += tl.dot(tl.trans(gs.to(q.dtype)), q, input_precision=PREC, out_dtype=ACC)
                if HAS_DQ:
                    gk += tl.dot(tl.trans(gds.to(dq.dtype)), dq, input_precision=PREC, out_dtype=ACC)
            if WANT_DK:
                gdk += tl.dot(tl.trans(gds.to(q.dtype)), q, input_precision=PREC, out_dtype=ACC)
    d_ok = (offs_n[:, None] < LK) & (offs_d[None, :] < D)
    e_ok = (offs_n[:, None] < LK) & (offs_e[None, :] < E)
    d_ptrs = (bk * LK + offs_n[:, None]) * D + offs_d[None, :]
    e_ptrs = (bk * LK + offs_n[:, None]) * E + offs_e[None, :]
    if WANT_K:
        tl.store(GK + d_ptrs, (gk * scale).to(GK.dtype.element_ty), mask=d_ok)
    if WANT_DK:
        tl.store(GDK + d_ptrs, (gdk * scale).to(GDK.dtype.element_ty), mask=d_ok)
    if WANT_V:
        tl.store(GV + e_ptrs, gv.to(GV.dtype.element_ty), mask=e_ok)
    if WANT_DV:
        tl.store(GDV + e_ptrs, gdv.to(GDV.dtype.element_ty), mask=e_ok)


@triton.jit
def _backward_q_kernel(Q, K, V, DQ, DK, DV, MASK, DMASK, GRAD, GRAD_OUT, LSE, C, R, QROW, GQ, GDQ,
                       sm_b, sm_h, sm_q, sm_k, sd_b, sd_h, sd_q, sd_k,
                       H, G, LQ, LK, D, E, scale,
                       HAS_DQ: tl.constexpr, HAS_DK: tl.constexpr, HAS_DV: tl.constexpr, MASK_KIND: tl.constexpr,
                       HAS_DMASK: tl.constexpr, CAUSAL: tl.constexpr, HAS_G: tl.constexpr, HAS_GO: tl.constexpr,
                       WANT_Q: tl.constexpr, WANT_DQ: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
                       ACC: tl.constexpr, PREC: tl.constexpr):
    """Per query block of one query head: g_q and g_dq over its key blocks."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    kv = (b * (H // G) + h // G) * LK
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    row_ok = offs_m < LQ
    q, dq, g, go, lse, c, r, q_row = _query_block(Q, DQ, GRAD, GRAD_OUT, LSE, C, R, QROW, bh, offs_m, offs_d, offs_e,
                                                  LQ, D, E, HAS_DQ, HAS_G, HAS_GO, ACC, BLOCK_M, BLOCK_E)
    gq = tl.zeros([BLOCK_M, BLOCK_D], ACC)
    gdq = tl.zeros([BLOCK_M, BLOCK_D], ACC)
    hi = LK
    if CAUSAL:
        hi = tl.minimum(LK, (pid_m + 1) * BLOCK_M)
    for n0 in range(0, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        k = _rows(K, kv, offs_n, offs_d, LK, D)
        v = _rows(V, kv, offs_n, offs_e, LK, E)
        dk = k
        dv = v
        if HAS_DK:
            dk = _rows(DK, kv, offs_n, offs_d, LK, D)
        if HAS_DV:
            dv = _rows(DV, kv, offs_n, offs_e, LK, E)
        p, ds_c, gds, gs = _block_grads(q, dq, k, dk, v, dv, g, go, lse, c, r, q_row, MASK, DMASK, b, h, offs_m,
                                        offs_n, LQ, LK, scale, sm_b, sm_h, sm_q, sm_k, sd_b, sd_h, sd_q, sd_k,
                                        HAS_DQ, HAS_DK, HAS_DV, MASK_KIND, HAS_DMASK, CAUSAL, HAS_G, HAS_GO, ACC, PREC)
        if WANT_Q:
            gq += tl.dot(gs.to(k.dtype), k, input_precision=PREC, out_dtype=ACC)
            if HAS_DK:
                gq += tl.dot(gds.to(dk.dtype), dk, input_precision=PREC, out_dtype=ACC)
        if WANT_DQ:
            gdq += tl.dot(gds.to(k.dtype), k, input_precision=PREC, out_dtype=ACC)
    ptrs = (bh * LQ + offs_m[:, None]) * D + offs_d[None, :]
    ok = row_ok[:, None] & (offs_d[None, :] < D)
    if WANT_Q:
        tl.store(GQ + ptrs, (gq * scale).to(GQ.dtype.element_ty), mask=ok)
    if WANT_DQ:
        tl.store(GDQ + ptrs, (gdq * scale).to(GDQ.dtype.element_ty), mask=ok)


# Block sizes: (BLOCK_M, BLOCK_N) on a GPU by the larger head size (not yet tuned on one: the
# backward's key-block kernel holds four [BLOCK_N, D] accumulators), and for Triton's interpreter,
# where small blocks keep the tests' lengths short while crossing several blocks.
INTERPRETER_BLOCKS = (16, 16)


def _blocks(q: torch.Tensor, d: int) -> tuple[int, int]:
    if q.device.type != "cuda":
        return INTERPRETER_BLOCKS
    return (64, 64) if d <= 64 else (32, 32) if d <= 128 else (16, 32)


class _Call:
    """The checked, contiguous operands of one call and the kernels' shared arguments."""

    def __init__(self, q, k, v, mask, dq, dk, dv, dmask, causal, scale):
        if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
            raise RuntimeError(f"jvpc attention: q, k and v must be 4-d [B, H, L, D], got {list(q.shape)}, "
                               f"{list(k.shape)}, {list(v.shape)}")
        B, H, LQ, D = q.shape
        HKV, LK, E = k.shape[1], k.shape[2], v.shape[3]
        if k.shape[0] != B or v.shape[:3] != k.shape[:3] or k.shape[3] != D:
            raise RuntimeError(f"jvpc attention: q {list(q.shape)}, k {list(k.shape)} and v {list(v.shape)} "
                               "do not fit together")
        if HKV == 0 or H % HKV:
            raise RuntimeError(f"jvpc attention: the {H} query heads are not a multiple of the {HKV} key heads")
        if D > _MAX_HEAD or E > _MAX_HEAD:
            raise RuntimeError(f"jvpc attention: head sizes up to {_MAX_HEAD}, got {D} and {E}")
        if q.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64) or k.dtype != q.dtype \
                or v.dtype != q.dtype:
            raise RuntimeError(f"jvpc attention: q, k and v must have one floating dtype, got {q.dtype}, "
                               f"{k.dtype}, {v.dtype}")
        for name, t, like in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
            if t is not None and (t.shape != like.shape or t.dtype != like.dtype):
                raise RuntimeError(f"jvpc attention: {name} must have the shape {list(like.shape)} and dtype "
                                   f"{like.dtype} of its primal, got {list(t.shape)} {t.dtype}")
        self.B, self.H, self.G, self.LQ, self.LK, self.D, self.E = B, H, H // HKV, LQ, LK, D, E
        self.q, self.k, self.v = q.contiguous(), k.contiguous(), v.contiguous()
        self.dq, self.dk, self.dv = (None if t is None else t.contiguous() for t in (dq, dk, dv))
        self.acc = torch.float64 if q.dtype == torch.float64 else torch.float32
        if mask is not None and mask.dtype != torch.bool and not mask.is_floating_point():
            raise RuntimeError(f"jvpc attention: mask must be boolean or floating point, got {mask.dtype}")
        if dmask is not None and (mask is None or mask.dtype == torch.bool or not dmask.is_floating_point()):
            raise RuntimeError("jvpc attention: dmask is the floating-point tangent of a float mask, and there is none")
        self.mask_kind, self.mask, self.mask_strides = 0, None, (0, 0, 0, 0)
        if mask is not None:
            m = mask.view(torch.uint8) if mask.dtype == torch.bool else mask  # the same bytes, no copy
            self.mask_kind = 1 if mask.dtype == torch.bool else 2
            self.mask, self.mask_strides = self._scores_view(m, "mask")
        self.dmask, self.dmask_strides = None, (0, 0, 0, 0)
        if dmask is not None:
            self.dmask, self.dmask_strides = self._scores_view(dmask, "dmask")
        self.causal = bool(causal)
        self.scale = float(D ** -0.5 if scale is None else scale)
        self.block_m, self.block_n = _blocks(q, max(D, E))
        self.block_d = max(16, triton.next_power_of_2(D))
        self.block_e = max(16, triton.next_power_of_2(E))

    def _scores_view(self, m, name):
        try:
            m = m.expand(self.B, self.H, self.LQ, self.LK)
        except RuntimeError:
            raise RuntimeError(f"jvpc attention: {name} of shape {list(m.shape)} does not broadcast to the scores' "
                               f"[{self.B}, {self.H}, {self.LQ}, {self.LK}]") from None
        return m, tuple(m.stride())

    def flags(self):
        return dict(HAS_DQ=self.dq is not None, HAS_DK=self.dk is not None, HAS_DV=self.dv is not None,
                    MASK_KIND=self.mask_kind, HAS_DMASK=self.dmask is not None, CAUSAL=self.causal,
                    BLOCK_M=self.block_m, BLOCK_N=self.block_n, BLOCK_D=self.block_d, BLOCK_E=self.block_e,
                    ACC=tl.float64 if self.acc == torch.float64 else tl.float32, PREC="ieee")

    def common(self):
        """The tensors every kernel reads (absent ones stand in as q), then the mask strides and sizes."""
        q = self.q
        return ((q, self.k, self.v, self.dq if self.dq is not None else q, self.dk if self.dk is not None else q,
                 self.dv if self.dv is not None else q, self.mask if self.mask is not None else q,
                 self.dmask if self.dmask is not None else q),
                (*self.mask_strides, *self.dmask_strides, self.H, self.G, self.LQ, self.LK, self.D, self.E, self.scale))

    def rows(self):
        return torch.empty(self.B, self.H, self.LQ, dtype=self.acc, device=self.q.device)


def forward(q, k, v, mask=None, dq=None, dk=None, dv=None, dmask=None, causal=False, scale=None, *,
            out=None, lse=None, want_dout=True, want_c=False):
    """(out, lse, dout, c) in one pass; out and lse given are used as they are (the operator's case,
    where only dout and c are computed). dout is None unless wanted, c None unless wanted."""
    call = _Call(q, k, v, mask, dq, dk, dv, dmask, causal, scale)
    known = out is not None
    if known:
        out = out.contiguous()
        lse = lse.reshape(call.B, call.H, call.LQ).contiguous()
    else:
        out = torch.empty(call.B, call.H, call.LQ, call.E, dtype=q.dtype, device=q.device)
        lse = call.rows()
    dout = torch.empty_like(out) if want_dout else out
    c = call.rows() if want_c else lse
    tensors, sizes = call.common()
    grid = (triton.cdiv(call.LQ, call.block_m), call.B * call.H)
    if call.LQ and call.B * call.H:
        _forward_kernel[grid](*tensors, out, lse, dout, c, *sizes, KNOWN_LSE=known, WANT_DOUT=want_dout,
                              WANT_C=want_c, **call.flags())
    return out, lse, dout if want_dout else None, c if want_c else None


def backward(q, k, v, out, lse, dout=None, dq=None, dk=None, dv=None, mask=None, dmask=None, causal=False, scale=None,
             *, grad=None, grad_out=None, c=None, wanted=(True,) * 6):
    """Gradients (g_q, g_k, g_v, g_dq, g_dk, g_dv) from grad, that of dout, and grad_out, that of out
    (either may be None; dout is needed with grad). wanted says which to compute; a gradient not
    wanted, or of an absent tangent, is None. c, the forward's rowsum(P ⊙ dS), is recomputed if not
    given."""
    call = _Call(q, k, v, mask, dq, dk, dv, dmask, causal, scale)
    has_tangent = {3: call.dq, 4: call.dk, 5: call.dv}
    want = [bool(w) and (i < 3 or has_tangent[i] is not None) and (grad is not None or i in (0, 1, 2))
            for i, w in enumerate(wanted)]
    if grad is None and grad_out is None:
        want = [False] * 6
    lse = lse.reshape(call.B, call.H, call.LQ).to(call.acc)
    lse = torch.where(lse == float("-inf"), float("inf"), lse).contiguous()  # a dead row: P = 0
    out = out.contiguous()
    if grad is not None:
        if dout is None:
            raise RuntimeError("jvpc attention backward: the gradient of dout needs dout")
        grad = grad.contiguous()
        if c is None:
            c = forward(q, k, v, mask, dq, dk, dv, dmask, causal, scale, out=out, lse=lse, want_dout=False,
                        want_c=True)[3]
        r = (grad.to(call.acc) * out.to(call.acc)).sum(-1)
        q_row = (grad.to(call.acc) * dout.to(call.acc)).sum(-1) - r * c.to(call.acc)
    else:
        c, r, q_row = call.rows().zero_(), call.rows().zero_(), call.rows().zero_()
    if grad_out is not None:
        grad_out = grad_out.contiguous()
        q_row = q_row + (grad_out.to(call.acc) * out.to(call.acc)).sum(-1)
    c, r, q_row = (t.to(call.acc).contiguous() for t in (c, r, q_row))
    tensors, sizes = call.common()
    g_in = (grad if grad is not None else out, grad_out if grad_out is not None else out)
    flags = dict(HAS_G=grad is not None, HAS_GO=grad_out is not None, **call.flags())
    # Each kernel writes every row of what it computes (zeros where no query or key reaches it).
    grads = [torch.empty_like(t) if w else None
             for w, t in zip(want, (call.q, call.k, call.v, call.q, call.k, call.v))]
    stand_in = call.q
    if any(want[i] for i in (1, 2, 4, 5)) and call.LK and call.B * call.H:
        grid = (triton.cdiv(call.LK, call.block_n), call.B * (call.H // call.G))
        _backward_kv_kernel[grid](*tensors, *g_in, lse, c, r, q_row,
                                  *(grads[i] if want[i] else stand_in for i in (1, 2, 4, 5)), *sizes,
                                  WANT_K=want[1], WANT_V=want[2], WANT_DK=want[4], WANT_DV=want[5], **flags)
    if (want[0] or want[3]) and call.LQ and call.B * call.H:
        grid = (triton.cdiv(call.LQ, call.block_m), call.B * call.H)
        _backward_q_kernel[grid](*tensors, *g_in, lse, c, r, q_row,
                                 *(grads[i] if want[i] else stand_in for i in (0, 3)), *sizes,
                                 WANT_Q=want[0], WANT_DQ=want[3], **flags)
    return tuple(grads)


def attention_tangent(q, k, v, out, lse, dq, dk, dv, mask, dmask, causal, scale, block_q, block_k):
    """jvpc::attention_tangent's kernel: d(out) given out and lse (the block sizes are the ATen
    route's; the kernels choose their own)."""
    if dq is None and dk is None and dv is None and dmask is None:
        return torch.zeros_like(out)
    return forward(q, k, v, mask, dq, dk, dv, dmask, causal, scale, out=out, lse=lse)[2]


def attention_tangent_backward(grad, q, k, v, out, lse, dout, dq, dk, dv, mask, dmask, causal, scale, block_q,
                               block_k):
    """jvpc::attention_tangent_backward's kernel: the six gradients of d(out)'s, with zeros where a
    primal's gradient is zero and undefined ones for absent tangents, as the ATen route returns."""
    grads = backward(q, k, v, out, lse, dout, dq, dk, dv, mask, dmask, causal, scale, grad=grad)
    return tuple(g if g is not None else torch.zeros_like(t) if i < 3 else None
                 for i, (g, t) in enumerate(zip(grads, (q, k, v, q, k, v))))


_library = None


def register(dispatch_key: str = "CUDA") -> None:
    """Makes these kernels jvpc::attention_tangent's and jvpc::attention_tangent_backward's for
    dispatch_key (above the ATen route, which stays the CompositeExplicitAutograd kernel), and the
    fused attention of tangent_grad's O(L) route on that device. jvpc registers them for CUDA
    when it is imported; "CPU" runs the same route on the CPU in Triton's interpreter."""
    global _library
    if _library is None:
        _library = torch.library.Library("jvpc", "IMPL")
    _library.impl("attention_tangent", attention_tangent, dispatch_key)
    _library.impl("attention_tangent_backward", attention_tangent_backward, dispatch_key)
    DEVICES.add(dispatch_key.lower())
