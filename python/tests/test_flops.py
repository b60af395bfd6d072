"""FlopCounterMode counts jvpc exactly: the seed's own method (../shared/seed, jvp_flops.py)
with jvpc.linearize in place of torch.func.linearize, on the CPU in float32."""

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
    extra q·kᵀ, counted); the mode counts the flash kernel itself as 0, as its registry does."""
    q, k, v = seed_inputs(seq_len=32)[::2]
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        with FlopCounterMode(display=False) as mode:
            _, jvp_fn = linearize(scaled_dot_product_attention, q, k, v)
    rep = jvp_fn.report()
    q_kt = 2 * q.numel() * q.shape[-2]
    assert rep["linearize"]["matmul_flops"] == rep["forward"]["matmul_flops"] + q_kt
    assert mode.get_total_flops() == q_kt
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
