"""Batched tangents: vmap(jvp_fn) is one call of the batched tangent graph, which
FlopCounterMode counts exactly; jvpc.jacfwd matches torch.func.jacfwd, chunked or not."""
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

import jvpc
from models import mlp_case


def math_sdpa(q, k, v):
    with sdpa_kernel(SDPBackend.MATH):
        return scaled_dot_product_attention(q, k, v)


class CountMatmuls(TorchDispatchMode):
    """Counts the matmul kernels that run (bmm, baddbmm, mm, addmm)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._overloadpacket in (torch.ops.aten.bmm, torch.ops.aten.baddbmm, torch.ops.aten.mm,
                                    torch.ops.aten.addmm):
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_vmap_is_one_batched_call_and_flop_counter_mode_counts_it():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 5, 32, 64, generator=gen, dtype=torch.float64) for _ in range(3))
    _, jvp_fn = jvpc.linearize(math_sdpa, q, k, v)
    batch = tuple(torch.randn(6, 1, 5, 32, 64, generator=gen, dtype=torch.float64) for _ in range(3))
    got = torch.func.vmap(jvp_fn)(*batch)
    want = torch.stack([jvp_fn(*(t[i] for t in batch)) for i in range(6)])
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    with CountMatmuls() as one:
        jvp_fn(*(t[0] for t in batch))
    with CountMatmuls() as batched:
        torch.func.vmap(jvp_fn)(*batch)
    assert batched.count == one.count > 0  # one call for the six tangents, not six
    with FlopCounterMode(display=False) as mode:
        torch.func.vmap(jvp_fn)(*batch)
    cost = jvp_fn._lin.batched_cost_json(6)
    import json
    assert mode.get_total_flops() == json.loads(cost)["matmul_flops"] == 6 * jvp_fn.cost()["matmul_flops"]
    assert jvp_fn._lin.batched_unrolled(6) == []


def test_the_first_vmap_call_at_a_new_k_counts_only_its_own_kernels():
    # The first call at a K compiles the batched graph inside the vmap rule: its shape inference
    # on Meta tensors is not counted (functorch's layers once restored FlopCounterMode's key
    # there, and the first call read three times its FLOPs).
    q, k, v = (torch.randn(1, 5, 128, 64) for _ in range(3))
    _, jvp_fn = jvpc.linearize(math_sdpa, q, k, v)
    for K in (3, 7):
        batch = tuple(torch.randn(K, 1, 5, 128, 64) for _ in range(3))
        for _ in range(2):  # the first call (compiles) and the next
            with FlopCounterMode(display=False) as mode:
                torch.func.vmap(jvp_fn)(*batch)
            assert mode.get_total_flops() == K * 41_943_040


def test_jacfwd_matches_torch_func_jacfwd():
    f, _, primals = mlp_case(torch.float64)
    for argnums in (0, (0, 1)):
        want = torch.func.jacfwd(f, argnums=argnums)(*primals)
        for chunk in (None, 7):
            got = jvpc.jacfwd(f, argnums=argnums, chunk_size=chunk)(*primals)
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_jacfwd_has_aux():
    x = torch.randn(3, 4, dtype=torch.float64)

    def f(x):
        y = x.sin() * x
        return y.sum(0), y.detach()

    jac, aux = jvpc.jacfwd(f, has_aux=True)(x)
    want, want_aux = torch.func.jacfwd(f, has_aux=True)(x)
    torch.testing.assert_close(jac, want)
    torch.testing.assert_close(aux, want_aux)


def test_batched_graph_keeps_the_seeds_four_products():
    """The batched tangent graph (jvp_fn._lin.batched_graph(K)) of the seed's attention: each product
    one product with K folded in, the sums still accumulated in their baddbmm (no add)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 5, 128, 64, generator=gen) for _ in range(3))
    _, jvp_fn = jvpc.linearize(math_sdpa, q, k, v)
    text = str(jvp_fn._lin.batched_graph(16))
    assert text.count("aten::bmm(") == 2 and text.count("aten::baddbmm(") == 2
    assert "aten::add.Tensor(" not in text
    assert jvp_fn._lin.batched_graph(16).to_json() == jvp_fn._lin.batched_graph(16).to_json()  # cached per K
