"""What training code does inside the function jvpc traces: random ops (dropout, label dropout,
noise), tensors made by factories (zeros_like, a buffer filled by slices), autocast, and
qk-norm before hand-written attention. Each is checked against torch.func (float64 where the
numbers allow) or against eager with the same seed."""

import copy
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

import jvpc
from dit import DiT
from objectives import CHANNELS, OBJECTIVES, batches


def x64(*shape):
    return torch.randn(*shape, dtype=torch.float64)


class LabelDropoutNet(nn.Module):
    """A DiT-like conditioning path: class labels dropped at random for classifier-free guidance
    (`torch.rand(B) < p`), dropout in the MLP, and noise added in the forward."""

    def __init__(self, dim=8, classes=5):
        super().__init__()
        self.embed = nn.Embedding(classes + 1, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 16), nn.GELU(), nn.Dropout(0.3), nn.Linear(16, dim))
        self.classes = classes

    def forward(self, x, labels):
        drop = torch.rand(labels.shape[0]) < 0.4
        labels = torch.where(drop, torch.full_like(labels, self.classes), labels)
        h = x + self.embed(labels)
        return self.mlp(h) + 0.01 * torch.randn_like(h)


@pytest.fixture
def net():
    torch.manual_seed(0)
    return LabelDropoutNet().double().train()


def test_random_ops_jvp_uses_one_draw_as_torch_func(net):
    x, t, labels = x64(6, 8), x64(6, 8), torch.tensor([0, 1, 2, 3, 4, 0])
    f = lambda x: net(x, labels)  # noqa: E731
    torch.manual_seed(1)
    want_out, want_t = torch.func.jvp(f, (x,), (t,))
    want_next = torch.rand(4)
    torch.manual_seed(1)
    out, dout = jvpc.jvp(f, (x,), (t,))
    assert torch.equal(out, want_out)
    assert torch.allclose(dout, want_t, rtol=1e-12, atol=1e-12)
    assert torch.equal(torch.rand(4), want_next)  # the generator is where eager leaves it


def test_random_ops_jvp_fn_draws_nothing(net):
    x, t, labels = x64(6, 8), x64(6, 8), torch.tensor([0, 1, 2, 3, 4, 0])
    _, jvp_fn = jvpc.linearize(lambda x: net(x, labels), x)
    state = torch.get_rng_state()
    first = jvp_fn(t)
    assert torch.equal(jvp_fn(t), first)
    assert torch.equal(torch.get_rng_state(), state)


def test_compiled_program_draws_as_eager_at_every_call(net):
    x, t, labels = x64(6, 8), x64(6, 8), torch.tensor([0, 1, 2, 3, 4, 0])
    f = lambda x, labels: net(x, labels)  # noqa: E731
    prog = jvpc.compile(f, x, labels, argnums=0)
    for seed in (3, 4, 5):
        x2 = x64(6, 8)
        torch.manual_seed(seed)
        eager = f(x2, labels)
        eager_next = torch.rand(4)
        torch.manual_seed(seed)
        _, want_t = torch.func.jvp(lambda x: f(x, labels), (x2,), (t,))
        torch.manual_seed(seed)
        out, jvp_fn = prog(x2, labels)
        assert torch.equal(out, eager), seed
        assert torch.equal(torch.rand(4), eager_next), seed
        assert torch.allclose(jvp_fn(t), want_t, rtol=1e-12, atol=1e-12), seed


def test_dropout_in_a_compiled_training_step_gives_eager_gradients(net):
    x, labels = x64(6, 8), torch.tensor([0, 1, 2, 3, 4, 0])
    prog = jvpc.compile(lambda x: net(x, labels), x)
    torch.manual_seed(9)
    net(x, labels).square().sum().backward()
    want = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    torch.manual_seed(9)
    out, _ = prog(x)
    out.square().sum().backward()
    for p, w in zip(net.parameters(), want):
        assert torch.allclose(p.grad, w, rtol=1e-12, atol=1e-14)


def timestep_embedding(t, dim=8):
    """A sinusoidal embedding written as training code often writes it: a buffer made by a factory
    and filled by slices."""
    half = dim // 2
    freqs = torch.exp(-torch.arange(half, dtype=t.dtype) / half)
    args = t[:, None] * freqs[None]
    emb = torch.zeros(t.shape[0], dim, dtype=t.dtype)
    emb[:, :half] = torch.cos(args)
    emb[:, half:] = torch.sin(args)
    return emb


@pytest.mark.parametrize("f", [
    lambda x: torch.zeros_like(x) + x * 2,
    lambda x: torch.ones_like(x) * x.sin(),
    lambda x: torch.full_like(x, 3.0) * x + torch.ones(x.shape, dtype=x.dtype),
    lambda x: timestep_embedding(x[:, 0]) * x,
], ids=["zeros_like", "ones_like", "full_like_and_ones", "buffer_filled_by_slices"])
def test_factory_tensors(f):
    x, t = x64(4, 8), x64(4, 8)
    want_out, want_t = torch.func.jvp(f, (x,), (t,))
    out, jvp_fn = jvpc.linearize(f, x)
    assert torch.allclose(out, want_out) and torch.allclose(jvp_fn(t), want_t, rtol=1e-12, atol=1e-12)
    prog = jvpc.compile(f, x)
    for _ in range(2):
        x2 = x64(4, 8)
        want_out, want_t = torch.func.jvp(f, (x2,), (t,))
        out, jvp_fn = prog(x2)
        assert torch.allclose(out, want_out) and torch.allclose(jvp_fn(t), want_t, rtol=1e-12, atol=1e-12)


def test_factory_tensors_hit_the_cache():
    def f(x):
        return timestep_embedding(x[:, 0]) * torch.ones_like(x)

    for _ in range(2):
        _, jvp_fn = jvpc.linearize(f, x64(4, 8), cache=True)
    assert "cache" in jvp_fn.report()["phases_ms"]  # a hit: the trace and fold only


class QkNormAttention(nn.Module):
    """RMSNorm on q and k of a transposed projection, then attention by hand (as public DiT
    trainers write it with qk_norm=True)."""

    def __init__(self, dim=8, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, z):
        b, n, d = z.shape
        q, k, v = self.qkv(z).view(b, n, 3, self.heads, d // self.heads).unbind(2)
        q = F.rms_norm(q.transpose(1, 2), (d // self.heads,))
        k = F.rms_norm(k.transpose(1, 2), (d // self.heads,))
        v = v.transpose(1, 2)
        a = (q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5).softmax(-1) @ v
        return a.transpose(1, 2).reshape(b, n, d)


@pytest.mark.parametrize("budget", [None, 0], ids=["default", "o_l"])
def test_qk_norm_before_attention_by_hand(budget):
    torch.manual_seed(0)
    m = QkNormAttention().double()
    z, t = x64(2, 5, 8), x64(2, 5, 8)
    options = jvpc.LinearizeOptions()
    if budget is not None:
        options.residual_budget = budget
    want_out, want_t = torch.func.jvp(m, (z,), (t,))
    out, dout = jvpc.jvp(m, (z,), (t,), options=options)
    assert torch.allclose(out, want_out) and torch.allclose(dout, want_t, rtol=1e-10, atol=1e-12)
    _, jvp_fn = jvpc.compile(m, z, options=options)(z)
    assert torch.allclose(jvp_fn(t), want_t, rtol=1e-10, atol=1e-12)


def bf16_close(got, want, scale):
    """Within bfloat16's tolerance: a few units in the last place of the largest value."""
    return (got.float() - want.float()).abs().max().item() <= 2 ** -6 * scale


class SmallBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin1, self.norm, self.lin2 = nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 16)

    def forward(self, x):
        h = self.norm(F.gelu(self.lin1(x)))
        return (h @ h.T / 4).softmax(-1) @ self.lin2(h)


@pytest.mark.parametrize("where", ["around", "inside"])
def test_autocast_bf16_as_torch_func(where):
    torch.manual_seed(0)
    m = SmallBlock()
    x, t = torch.randn(8, 16), torch.randn(8, 16)
    f = m
    if where == "inside":
        def f(x):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return m(x)
    around = torch.autocast("cpu", dtype=torch.bfloat16, enabled=where == "around")
    with around:
        want_out, want_t = torch.func.jvp(f, (x,), (t,))
        out, dout = jvpc.jvp(f, (x,), (t,))
        prog = jvpc.compile(f, x)
        out_p, jvp_fn = prog(x)
        dout_p = jvp_fn(t)
    assert out.dtype == out_p.dtype == want_out.dtype == torch.bfloat16
    assert torch.equal(out, want_out)  # autocast's casts, recorded as they ran
    if os.environ.get("JVPC_BACKEND") == "inductor":  # fused: bfloat16 rounding where Inductor's kernels end
        assert bf16_close(out_p, want_out, want_out.float().abs().max().item())
    else:
        assert torch.equal(out_p, want_out)
    scale = want_t.float().abs().max().item()
    assert bf16_close(dout, want_t, scale) and bf16_close(dout_p, want_t, scale)


def test_a_jvp_fn_called_under_autocast_runs_its_graph_as_traced():
    lin = nn.Linear(4, 5)
    x, t = torch.randn(3, 4), torch.randn(3, 4)
    out, jvp_fn = jvpc.linearize(lin, x)
    want = jvp_fn(t)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = jvp_fn(t)
    assert got.dtype == torch.float32 and torch.equal(got, want)


def test_jacfwd_randomness_as_torch_func():
    f = lambda x: F.dropout(x.sin(), 0.5, training=True)  # noqa: E731
    x = x64(5)
    with pytest.raises(jvpc.Error, match=r"random operation \(aten::bernoulli.p\) while randomness='error'"):
        jvpc.jacfwd(f)(x)
    with pytest.raises(jvpc.Error, match="randomness='different' would draw per column"):
        jvpc.jacfwd(f, randomness="different")(x)
    torch.manual_seed(2)
    want = torch.func.jacfwd(f, randomness="same")(x)
    torch.manual_seed(2)
    got = jvpc.jacfwd(f, randomness="same")(x)
    assert torch.allclose(got, want, rtol=1e-12, atol=0)
    assert (got.diagonal() == 0).any() and (got.diagonal() != 0).any()  # a mask was drawn


def test_the_same_tensor_as_several_primals():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).double()
    q, t1, t2, t3 = x64(2, 5, 8), x64(2, 5, 8), x64(2, 5, 8), x64(2, 5, 8)
    def f(a, b, c):
        with sdpa_kernel(SDPBackend.MATH):  # torch.func has no forward AD of the fused kernels
            return mha(a, b, c, need_weights=False)[0]

    want_out, want_t = torch.func.jvp(f, (q, q, q), (t1, t2, t3))
    out, dout = jvpc.jvp(f, (q, q, q), (t1, t2, t3))
    assert torch.allclose(out, want_out) and torch.allclose(dout, want_t, rtol=1e-10, atol=1e-12)
    prog = jvpc.compile(f, q, q, q)
    q2 = x64(2, 5, 8)
    _, want_t = torch.func.jvp(f, (q2, q2, q2), (t1, t2, t3))
    _, jvp_fn = prog(q2, q2, q2)
    assert torch.allclose(jvp_fn(t1, t2, t3), want_t, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("objective", ["meanflow", "scm"])
def test_a_training_step_under_bf16_autocast_as_torch_funcs(objective):
    # The training-step benchmark's objectives (objectives.py) on its DiT, the step under autocast
    # to bfloat16 as mixed-precision training runs it: the losses and the weights' gradients agree
    # with torch.func.jvp's under the same autocast, to bfloat16's tolerance.
    torch.manual_seed(0)
    net = DiT(CHANNELS, 32, 2, 2)
    batch = next(batches(1, 2, 16, seed=3))
    make, loss_of = OBJECTIVES[objective]
    primals, tangents, aux = make(*batch)
    losses, grads = [], []
    for side in ("jvpc", "torch"):
        m = copy.deepcopy(net)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if side == "jvpc":
                out, jvp_fn = jvpc.compile(m, *primals)(*primals)
                dout = jvp_fn(*tangents)
            else:
                with sdpa_kernel(SDPBackend.MATH):
                    out, dout = torch.func.jvp(m, primals, tangents)
            loss = loss_of(out, dout, aux, batch[2], batch[3])
        loss.backward()
        losses.append(loss.item())
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters()]))
    assert out.dtype == torch.bfloat16
    assert abs(losses[0] - losses[1]) <= 2e-2 * abs(losses[1])
    assert (grads[0] - grads[1]).norm() <= 2e-2 * grads[1].norm()


class BatchNormTrainer:
    """A trainer that reaches its model through itself: the buffers are found, bound by name and
    written at every call."""

    def __init__(self):
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.GELU(), nn.Linear(6, 4)).double().train()

    def forward(self, z):
        return self.model(z)


@pytest.mark.parametrize("reach", ["module", "trainer"])
def test_batch_norm_state_is_written_at_every_call_as_eager_writes_it(reach):
    eager, traced = BatchNormTrainer(), BatchNormTrainer()
    x, t = x64(8, 4), x64(8, 4)
    prog = jvpc.compile(traced.model if reach == "module" else (lambda z: traced.forward(z)), x)
    bn, bn_eager = traced.model[1], eager.model[1]
    assert int(bn.num_batches_tracked) == 0  # compiling writes nothing
    for step in range(4):
        xs = x64(8, 4)
        # torch.func's reference runs the forward again: on a copy made inside it (torch.func refuses
        # to write buffers captured from outside), whose statistics it updates.
        _, want_t = torch.func.jvp(lambda z: copy.deepcopy(eager).forward(z), (xs,), (t,))
        want = eager.forward(xs)
        out, jvp_fn = prog(xs)
        torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(jvp_fn(t), want_t, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(bn.running_mean, bn_eager.running_mean, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(bn.running_var, bn_eager.running_var, rtol=1e-12, atol=1e-14)
        assert int(bn.num_batches_tracked) == int(bn_eager.num_batches_tracked) == step + 1
    traced.model.eval()
    eager.model.eval()  # a sampling step: traced again, reading the running statistics
    xs = x64(8, 4)
    torch.testing.assert_close(prog(xs)[0], eager.forward(xs), rtol=1e-12, atol=1e-12)
    assert prog.num_graphs == 2



@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_cuda_autocast_as_torch_func(dtype):
    torch.manual_seed(0)
    m = SmallBlock().cuda()
    x, t = torch.randn(8, 16, device="cuda"), torch.randn(8, 16, device="cuda")
    with torch.autocast("cuda", dtype=dtype):
        want_out, want_t = torch.func.jvp(m, (x,), (t,))
        out, dout = jvpc.jvp(m, (x,), (t,))
        out_p, jvp_fn = jvpc.compile(m, x)(x)
        dout_p = jvp_fn(t)
    assert out.dtype == want_out.dtype == dtype
    assert torch.equal(out, want_out) and torch.equal(out_p, want_out)
    scale = want_t.float().abs().max().item()
    assert bf16_close(dout, want_t, scale) and bf16_close(dout_p, want_t, scale)
