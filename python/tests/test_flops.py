"""FlopCounterMode counts jvpc exactly: the seed's own method (../shared/seed, jvp_flops.py)
with jvpc.linearize in place of torch.func.linearize, on the CPU in float32."""

import json
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch import no_grad
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention
from torch.utils.flop_counter import FlopCounterMode

import jvpc
from jvpc import linearize
from models import SDPA_VARIANTS, block_case, mlp_case, sdpa_case


def get_flop_count(f, display_ops=True):
    flop_counter = FlopCounterMode(display=display_ops)
    with flop_counter:
        out = f()
    return flop_counter.get_total_flops(), out


def seed_inputs(bsz=1, model_dim=320, head_dim=64, seq_len=128):
    device = torch.device("cpu")
    dtype = torch.float32
    seed = 42
    gen = torch.Generator(device=device)
    heads = model_dim // head_dim
    return tuple(
        torch.randn(bsz, heads, seq_len, head_dim, device=device, dtype=dtype, generator=gen.manual_seed(seed + ix))
        for ix in range(6))


def test_seed_script_totals():
    q_p, q_t, k_p, k_t, v_p, v_t = seed_inputs()
    with sdpa_kernel(SDPBackend.MATH):
        with no_grad():
            flop_count_math_fwd, out_math_fwd = get_flop_count(partial(scaled_dot_product_attention, q_p, k_p, v_p))
        flop_count_linearize, (attn_out, jvp_fn) = get_flop_count(
            partial(linearize, scaled_dot_product_attention, q_p, k_p, v_p))
        flop_count_jvp_fn, out_jvp_fn = get_flop_count(partial(jvp_fn, q_t, k_t, v_t))
        later = [get_flop_count(partial(jvp_fn, q_t, k_t, v_t), display_ops=False)[0] for _ in range(2)]
        _, ref_jvp = torch.func.linearize(scaled_dot_product_attention, q_p, k_p, v_p)
        ref = ref_jvp(q_t, k_t, v_t)
    assert flop_count_math_fwd == 20_971_520
    assert flop_count_linearize == 20_971_520  # step 1 (PyTorch: 83,886,080)
    assert flop_count_jvp_fn == 41_943_040  # step 2 (PyTorch: 62,914,560)
    assert later == [41_943_040, 41_943_040]
    torch.testing.assert_close(attn_out, out_math_fwd)
    torch.testing.assert_close(out_jvp_fn, ref, rtol=1e-4, atol=1e-5)


def test_jvp_fn_runs_baddbmm_in_place_without_a_mode():
    """The tangent graph has 2 bmm + 2 baddbmm; without a mode the runtime reuses buffers, and
    with one it runs the forms FlopCounterMode counts. Both give the same numbers."""
    q_p, q_t, k_p, k_t, v_p, v_t = seed_inputs(seq_len=16)
    with sdpa_kernel(SDPBackend.MATH):
        _, jvp_fn = linearize(scaled_dot_product_attention, q_p, k_p, v_p)
    ops = jvp_fn.cost()["ops"]
    assert ops.get("aten::baddbmm") == 2 and ops.get("aten::bmm") == 2
    plain = jvp_fn(q_t, k_t, v_t)
    with FlopCounterMode(display=False) as mode:
        counted = jvp_fn(q_t, k_t, v_t)
    assert mode.get_total_flops() == jvp_fn.cost()["matmul_flops"]
    assert mode.get_flop_counts()["Global"].get(torch.ops.aten.baddbmm) is not None
    torch.testing.assert_close(plain, counted)


@pytest.mark.parametrize("case", ["mlp", "block"])
def test_counts_match_the_cost_model(case):
    f, _, primals = {"mlp": mlp_case, "block": block_case}[case](torch.float32)
    with FlopCounterMode(display=False) as mode:
        _, jvp_fn = linearize(f, *primals)
    assert mode.get_total_flops() == jvp_fn.report()["linearize"]["matmul_flops"]
    assert mode.get_total_flops() == jvp_fn.report()["forward"]["matmul_flops"]
    t = tuple(torch.randn_like(p) for p in primals)
    for _ in range(2):
        with FlopCounterMode(display=False) as mode:
            jvp_fn(*t)
        assert mode.get_total_flops() == jvp_fn.cost()["matmul_flops"]


CASES = [("sdpa_" + name, lambda dt, fl=flags: sdpa_case(dt, **fl)) for name, flags in SDPA_VARIANTS]
CASES += [("mlp", mlp_case), ("block", block_case),
          ("layer_norm_softmax", lambda dt: (lambda x, w: F.layer_norm(F.gelu(x @ w), (8,)).softmax(-1), None,
                                             (torch.randn(4, 8, dtype=dt), torch.randn(8, 8, dtype=dt))))]


@pytest.mark.parametrize("name,make", CASES, ids=[c[0] for c in CASES])
def test_graph_traced_under_a_mode_equals_the_one_without(name, make):
    """Composites decompose differently when a dispatch mode is active (isTensorSubclassLike);
    the tracer turns the modes off for them, and on for the kernels it records."""
    f, _, primals = make(torch.float32)
    plain = jvpc.trace(f, *primals).to_json()
    with FlopCounterMode(display=False):
        under_mode = jvpc.trace(f, *primals).to_json()
    assert under_mode == plain
    _, a = linearize(f, *primals)
    with FlopCounterMode(display=False):
        _, b = linearize(f, *primals)
    assert a.to_json() == b.to_json()


def test_fused_cpu_kernel_counts_what_runs():
    """With the CPU flash kernel jvpc rebuilds the probabilities once at linearize time (one
    extra q·kᵀ, counted); the mode counts the flash kernel itself as its registry does: with
    jvpc's formula where it has a rule for the kernel (torch 2.15), as 0 where it has none (2.11)."""
    q, k, v = seed_inputs(seq_len=32)[::2]
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        with FlopCounterMode(display=False) as mode:
            _, jvp_fn = linearize(scaled_dot_product_attention, q, k, v)
    rep = jvp_fn.report()
    q_kt = 2 * q.numel() * q.shape[-2]
    assert rep["linearize"]["matmul_flops"] == rep["forward"]["matmul_flops"] + q_kt
    flash_rule = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu in mode.flop_registry
    assert mode.get_total_flops() == q_kt + (rep["forward"]["matmul_flops"] if flash_rule else 0)
    t = tuple(torch.randn_like(p) for p in (q, k, v))
    with FlopCounterMode(display=False) as mode:
        jvp_fn(*t)
    assert mode.get_total_flops() == jvp_fn.cost()["matmul_flops"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_replay_falls_back_to_eager_under_a_mode():
    q_p, q_t, k_p, k_t, v_p, v_t = (t.cuda() for t in seed_inputs())
    with sdpa_kernel(SDPBackend.MATH):
        _, jvp_fn = linearize(scaled_dot_product_attention, q_p, k_p, v_p)
    for _ in range(3):  # eager, capture, replay
        jvp_fn(q_t, k_t, v_t)
    with FlopCounterMode(display=False) as mode:
        jvp_fn(q_t, k_t, v_t)
    assert mode.get_total_flops() == 41_943_040


def o_l_linearize(f, *primals):
    """linearize with every attention in the O(L) form (jvpc::attention_tangent)."""
    opts = jvpc.LinearizeOptions()
    opts.residual_budget = 0
    out, jvp_fn = linearize(f, *primals, options=opts)
    assert jvp_fn.cost()["ops"].get("jvpc::attention_tangent") == 1
    return out, jvp_fn


def test_attention_tangent_counted_exactly_at_the_seed_size():
    """The O(L) tangent runs its bmms inside one operator; the mode counts it by jvpc's formula:
    2·B·H·Lq·Lk·(3D + 2Dv) per call (q·kᵀ, dq·kᵀ, q·dkᵀ, (P⊙dS)·v, P·dv)."""
    q_p, q_t, k_p, k_t, v_p, v_t = seed_inputs()
    f = scaled_dot_product_attention
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # the CPU fused kernel
        _, jvp_fn = o_l_linearize(f, q_p, k_p, v_p)
    B, H, L, D = q_p.shape
    expected = 2 * B * H * L * L * (3 * D + 2 * D)
    assert expected == 52_428_800
    assert jvp_fn.cost()["matmul_flops"] == expected
    counts = []
    for _ in range(3):  # the first call and later ones
        with FlopCounterMode(display=False) as mode:
            got = jvp_fn(q_t, k_t, v_t)
        counts.append(mode.get_total_flops())
        assert mode.get_flop_counts()["Global"] == {torch.ops.jvpc.attention_tangent: expected}
    assert counts == [expected] * 3
    with sdpa_kernel(SDPBackend.MATH):
        _, ref = torch.func.jvp(f, (q_p, k_p, v_p), (q_t, k_t, v_t))
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


def profiled_bmm_flops(call):
    """FLOPs of the aten::bmm kernels that ran inside call, as the profiler records them (nested)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True) as prof:
        call()
    events = [e for e in prof.events() if e.name == "aten::bmm"]
    assert events
    return sum(e.flops for e in events)


def o_l_attention(causal, kv_heads, tangents):
    """Flash attention (L 600: several query and key blocks) linearized at residual budget 0, with
    tangents for the inputs named in `tangents`: the generator (for the tangents to follow), q, k
    and v, the argnums and jvp_fn."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 600, 8, generator=gen)
    k, v = (torch.randn(1, kv_heads, 600, 8, generator=gen) for _ in range(2))

    def f(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=kv_heads != 2)

    argnums = tuple("qkv".index(c) for c in tangents)
    opts = jvpc.LinearizeOptions()
    opts.residual_budget = 0
    _, jvp_fn = linearize(f, q, k, v, argnums=argnums, options=opts)
    return gen, (q, k, v), argnums, jvp_fn


@pytest.mark.parametrize("causal,kv_heads,tangents", [(False, 2, "qkv"), (True, 2, "qkv"), (True, 1, "qkv"),
                                                      (False, 2, "v"), (True, 2, "qk")])
def test_attention_tangent_count_is_the_kernels_that_ran(causal, kv_heads, tangents):
    """Several query and key blocks (L 600 > block sizes 256 and 512), the causal skip, grouped
    heads, absent tangents: the mode's count equals the bmms the kernel ran (the profiler sees
    them nested inside the operator) and the cost model's."""
    gen, (q, k, v), argnums, jvp_fn = o_l_attention(causal, kv_heads, tangents)
    assert jvp_fn.cost()["ops"].get("jvpc::attention_tangent") == 1
    t = tuple(torch.randn_like((q, k, v)[i]) for i in argnums)
    ran = profiled_bmm_flops(lambda: jvp_fn(*t))
    for _ in range(2):
        with FlopCounterMode(display=False) as mode:
            jvp_fn(*t)
        assert mode.get_total_flops() == ran
    assert ran == jvp_fn.cost()["matmul_flops"]


@pytest.mark.parametrize("causal,kv_heads,tangents", [(False, 2, "qkv"), (True, 1, "qkv"), (False, 2, "v"),
                                                      (True, 2, "qk")])
def test_batched_attention_tangent_counted_exactly_under_vmap(causal, kv_heads, tangents):
    """vmap(jvp_fn) at residual budget 0 runs jvpc::attention_tangent.batched once: the mode counts
    it by the formula, the score recompute once and the tangents' bmms K times, which is the bmms
    the kernel ran and the cost model's figure for the batched graph."""
    gen, (q, k, v), argnums, jvp_fn = o_l_attention(causal, kv_heads, tangents)
    K = 3
    batch = tuple(torch.randn(K, *(q, k, v)[i].shape, generator=gen) for i in argnums)
    batched_cost = json.loads(jvp_fn._lin.batched_cost_json(K))
    assert batched_cost["ops"].get("jvpc::attention_tangent.batched") == 1
    single = jvp_fn.cost()["matmul_flops"]
    assert single < batched_cost["matmul_flops"] < K * single  # the recompute is shared
    ran = profiled_bmm_flops(lambda: torch.func.vmap(jvp_fn)(*batch))
    for _ in range(2):
        with FlopCounterMode(display=False) as mode:
            got = torch.func.vmap(jvp_fn)(*batch)
        assert mode.get_flop_counts()["Global"] == {torch.ops.jvpc.attention_tangent: ran}  # by packet
    assert ran == batched_cost["matmul_flops"]
    want = torch.stack([jvp_fn(*(t[i] for t in batch)) for i in range(K)])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
