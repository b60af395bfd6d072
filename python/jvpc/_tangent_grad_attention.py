"""Attention in O(L) memory inside tangent_grad's backward (torch.func's vjp of jvp).

Under `o_l_attention()`, F.scaled_dot_product_attention runs as `_Attention`, an autograd.Function
whose forward is the fused kernel that returns the output and its row logsumexp, whose backward is
that kernel's backward, and whose jvp is jvpc::attention_tangent (runtime/attention_tangent.h)
with jvpc::attention_tangent_backward as its derivative (`_Tangent`), which recomputes P block by
block; so the vjp of the jvp holds no Lq x Lk tensor: torch.func differentiates the jvp through
`_Tangent` and the forward through `_Attention`'s backward.

The fused kernel with a logsumexp is the CPU flash kernel on the CPU (float32, float64, bfloat16,
float16; head sizes of q, k and v equal), and on a device in triton_devices() (CUDA, where Triton is
there) _attention_triton's kernels, which also take a head size of v unlike q's (up to 256); there
jvpc::attention_tangent and its backward run in those kernels too. Everything else takes SDPA's
math path, as without this mode: dropout, other devices, 3-d or 5-d inputs, is_causal together
with a mask, a float mask of another dtype, and a float mask computed from the function's inputs
or weights (inside torch.func's transforms every such tensor may carry a gradient, which neither
the fused kernel's backward nor jvpc::attention_tangent's propagates). A boolean mask takes the
O(L) route.
"""

from __future__ import annotations

import inspect
import sys

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from . import _C  # registers the jvpc operators

# The block sizes linearize uses.
BLOCK_Q, BLOCK_K = _C.ATTENTION_BLOCK_Q, _C.ATTENTION_BLOCK_K
_aten = torch.ops.aten


def triton_devices() -> set[str]:
    """The devices whose attention runs in _attention_triton's kernels (its register() names them):
    none while that module, which needs Triton, has not been imported."""
    kernels = sys.modules.get(f"{__package__}._attention_triton")
    return kernels.DEVICES if kernels is not None else set()


_SDPA = inspect.signature(lambda query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                          enable_gqa=False: None)


class _Attention(torch.autograd.Function):
    """(q, k, v, float mask or None) -> (out, lse) by the CPU flash kernel; lse is not differentiable."""

    @staticmethod
    def forward(q, k, v, mask, causal, scale):
        if q.device.type in triton_devices():
            from . import _attention_triton
            return _attention_triton.forward(q, k, v, mask, causal=causal, scale=scale, want_dout=False)[:2]
        return _aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=mask, scale=scale)

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, mask, causal, scale = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, mask, out, lse)
        ctx.save_for_forward(q, k, v, mask, out, lse)
        ctx.causal, ctx.scale = causal, scale
        ctx.mark_non_differentiable(lse)

    @staticmethod
    def backward(ctx, g_out, _g_lse):
        q, k, v, mask, out, lse = ctx.saved_tensors
        if q.device.type in triton_devices():
            from . import _attention_triton
            g = _attention_triton.backward(q, k, v, out, lse, mask=mask, causal=ctx.causal, scale=ctx.scale,
                                           grad_out=g_out, wanted=(True, True, True, False, False, False))[:3]
            return *g, None, None, None
        g = _aten._scaled_dot_product_flash_attention_for_cpu_backward(
            g_out.contiguous(), q, k, v, out, lse, 0.0, ctx.causal, attn_mask=mask, scale=ctx.scale)
        return *g, None, None, None

    @staticmethod
    def jvp(ctx, dq, dk, dv, dmask, _causal, _scale):
        q, k, v, mask, out, lse = ctx.saved_tensors
        return _Tangent.apply(q, k, v, out, lse, dq, dk, dv, mask, dmask, ctx.causal, ctx.scale), None


class _Tangent(torch.autograd.Function):
    """jvpc::attention_tangent with jvpc::attention_tangent_backward as its backward. The operator's
    own Autograd kernel is a C++ torch::autograd::Function, which functorch's transforms refuse;
    this Function is the same derivative in the form they accept. out and lse get no gradient
    (by-products of the forward at q, k, v); a mask and dmask get none either."""

    @staticmethod
    def forward(q, k, v, out, lse, dq, dk, dv, mask, dmask, causal, scale):
        return torch.ops.jvpc.attention_tangent(q, k, v, out, lse, dq, dk, dv, mask, dmask, causal, scale, BLOCK_Q,
                                                BLOCK_K)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:10], output)
        ctx.causal, ctx.scale = inputs[10:]

    @staticmethod
    def backward(ctx, g):
        q, k, v, out, lse, dq, dk, dv, mask, dmask, dout = ctx.saved_tensors
        gq, gk, gv, gdq, gdk, gdv = torch.ops.jvpc.attention_tangent_backward(
            g.contiguous(), q, k, v, out, lse, dout, dq, dk, dv, mask, dmask, ctx.causal, ctx.scale, BLOCK_Q, BLOCK_K)
        return gq, gk, gv, None, None, gdq, gdk, gdv, None, None, None, None


def _o_l_call(args, kwargs):
    """(q, k, v, float mask or None, causal, scale) where the O(L) route covers the call, else None."""
    try:
        a = _SDPA.bind(*args, **kwargs).arguments
    except TypeError:
        return None
    q, k, v, mask = a["query"], a["key"], a["value"], a.get("attn_mask")
    causal, scale = a.get("is_causal", False), a.get("scale")
    if a.get("dropout_p", 0.0) != 0.0 or not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        return None
    device, triton = q.device.type, triton_devices()
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or not (device == k.device.type == v.device.type) \
            or device not in triton | {"cpu"}:
        return None
    heads_fit = q.shape[-1] == k.shape[-1] == v.shape[-1] or (
        device in triton and q.shape[-1] == k.shape[-1] and max(q.shape[-1], v.shape[-1]) <= 256)
    if q.dtype not in (torch.float32, torch.float64, torch.bfloat16, torch.float16) or k.dtype != q.dtype \
            or v.dtype != q.dtype or not heads_fit:
        return None
    hq, hkv = q.shape[1], k.shape[1]
    if v.shape[1] != hkv or (hq != hkv and not (a.get("enable_gqa", False) and hq % hkv == 0)):
        return None
    if mask is not None:
        if causal or not isinstance(mask, torch.Tensor) or mask.device.type != device:
            return None
        if mask.dtype == torch.bool:
            mask = torch.zeros_like(mask, dtype=q.dtype).masked_fill(~mask, float("-inf"))
        elif mask.dtype != q.dtype or mask.requires_grad or torch._C._functorch.is_functorch_wrapped_tensor(mask):
            return None  # its gradient would not be propagated
    return q, k, v, mask, bool(causal), float(q.shape[-1] ** -0.5 if scale is None else scale)


class o_l_attention(TorchFunctionMode):
    """Runs F.scaled_dot_product_attention as _Attention where the O(L) route covers it."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            call = _o_l_call(args, kwargs)
            if call is not None:
                return _Attention.apply(*call)[0]
        return func(*args, **kwargs)
