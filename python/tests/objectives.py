"""The MeanFlow and sCM objectives on DiT (examples/meanflow_digits/dit.py) and their batches:
those of the training-step benchmark (scripts/bench/train_step.py) and of the tests that take a
step of it.

MeanFlow: the JVP along (v, 0, 1), the loss through u; sCM in TrigFlow form: the JVP along
(dx_t/dt, 1, 1), the loss through F. Each objective is (make, loss): make(x0, e, r, t) gives the
JVP's primals, tangents and what the loss needs besides, loss(out, dout, aux, r, t) the loss.
With classes, a batch also holds labels y, each replaced by the null class (classes) with
probability drop, as classifier-free guidance trains: a primal of the network without a tangent.
"""

import math

import torch

CHANNELS = 4


def batches(n, B, L, seed=0, classes=None, drop=0.1):
    """(x0, e, r, t), and y after them with classes."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        x0 = torch.randn(B, L, CHANNELS, generator=g)
        e = torch.randn(B, L, CHANNELS, generator=g)
        t = torch.rand(B, generator=g) * 0.98 + 0.01
        r = t * torch.rand(B, generator=g)
        if classes is None:
            yield x0, e, r, t
            continue
        y = torch.randint(classes, (B,), generator=g)
        yield x0, e, r, t, torch.where(torch.rand(B, generator=g) < drop, classes, y)


# Each objective: (primals, tangents) of the JVP from a batch, and the loss from (out, dout).
def meanflow(x0, e, r, t):
    z = (1 - t)[:, None, None] * x0 + t[:, None, None] * e
    v = e - x0
    return (z, r, t), (v, torch.zeros_like(r), torch.ones_like(t)), v


def meanflow_loss(u, dudt, v, r, t):
    u_tgt = v - (t - r)[:, None, None] * dudt
    return ((u - u_tgt.detach()) ** 2).mean()


def scm(x0, e, r, t):
    ang = t * (math.pi / 2)
    c, s = ang.cos()[:, None, None], ang.sin()[:, None, None]
    x_t = c * x0 + s * e
    dxdt = c * e - s * x0
    return (x_t, t, t.clone()), (dxdt, torch.ones_like(t), torch.ones_like(t)), (x_t, dxdt)  # r = t: no jump


def scm_loss(F, dFdt, aux, r, t):
    x_t, dxdt = aux
    ang = t * (math.pi / 2)
    c, s = ang.cos()[:, None, None], ang.sin()[:, None, None]
    g = -c * c * (F - dxdt) - c * s * (x_t + dFdt)
    g = g / (g.norm(dim=(1, 2), keepdim=True) + 0.1)
    return ((F - (F + g).detach()) ** 2).mean()


OBJECTIVES = {"meanflow": (meanflow, meanflow_loss), "scm": (scm, scm_loss)}
