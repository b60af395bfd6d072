#!/usr/bin/env python3
"""Peak memory of attention's tangent backward: jvpc::attention_tangent's O(L) backward against
torch.func's vjp of jvp on SDPA's math path, at long sequence lengths.

One step per run: the forward (attention's output and the tangent d(out) of q, k, v along
dq, dk, dv) and the backward of d(out) against a random gradient, to q, k, v, dq, dk, dv.
  jvpc O(L)  the CPU flash kernel for out and lse, jvpc::attention_tangent (blocks 256 x 512),
             dout.backward(G): jvpc::attention_tangent_backward
  math       torch.func.vjp of torch.func.jvp of F.scaled_dot_product_attention (math backend)
With --step, the same for a training step with tangent_grad on a one-block attention model
(width H·D, causal; x [1, L, H·D]): out, dout = jvp(model, x, dx), then
(dout² + out·dout).sum().backward() to x, dx and the weights.
  jvpc O(L)  jvpc.jvp(..., tangent_grad=True) with residual_budget=0
  math       torch.func.jvp on the math backend
Each run is its own process; its peak is the kernel's high-water mark of resident memory
(ru_maxrss), less the resident memory just before the step (torch and the inputs). The math
path's extra memory over that is reported as a multiple of one score tensor, B·H·Lq·Lk·4 bytes,
and the lengths it is not run at (--math-lengths) read what that multiple would need there.

  python3 scripts/bench/attention_backward_memory.py [--lengths 8192,16384] [--math-lengths 8192]
      [--heads 2] [--dim 64] [--causal] [--step] [--threads 1]
Prints a markdown table.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time


def rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def child(row, L, H, D, causal):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "python"))
    import jvpc  # noqa: F401  (registers jvpc::attention_tangent)

    torch.set_num_threads(int(os.environ["BENCH_THREADS"]))
    gen = torch.Generator().manual_seed(0)
    q, k, v, dq, dk, dv, g = (torch.randn(1, H, L, D, generator=gen) for _ in range(7))
    if row.startswith("step"):
        return step(row, L, H, D, base=rss_bytes())
    base = rss_bytes()
    t0 = time.perf_counter()
    if row == "jvpc":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
        xs = [t.requires_grad_() for t in (q, k, v, dq, dk, dv)]
        dout = torch.ops.jvpc.attention_tangent(q, k, v, out, lse, dq, dk, dv, None, None, causal, D ** -0.5, 256,
                                                512)
        dout.backward(g)
        grads = [x.grad for x in xs]
    else:
        def tangent(q, k, v, dq, dk, dv):
            return torch.func.jvp(lambda *a: F.scaled_dot_product_attention(*a, is_causal=causal), (q, k, v),
                                  (dq, dk, dv))[1]

        with sdpa_kernel(SDPBackend.MATH):
            _, vjp = torch.func.vjp(tangent, q, k, v, dq, dk, dv)
            grads = vjp(g)
    seconds = time.perf_counter() - t0
    assert all(x.isfinite().all() for x in grads)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"extra": peak - base, "seconds": seconds}))


def step(row, L, H, D, base):
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import jvpc

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.out = nn.Linear(H * D, 3 * H * D), nn.Linear(H * D, H * D)

        def forward(self, x):
            q, k, v = self.qkv(x).view(1, L, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return x + self.out(a.transpose(1, 2).reshape(1, L, H * D))

    torch.manual_seed(0)
    net = Attention()
    x, dx = (torch.randn(1, L, H * D, requires_grad=True) for _ in range(2))
    t0 = time.perf_counter()
    if row == "step_jvpc":
        opts = jvpc.LinearizeOptions()
        opts.residual_budget = 0
        out, dout = jvpc.jvp(net, (x,), (dx,), tangent_grad=True, options=opts)
    else:
        with sdpa_kernel(SDPBackend.MATH):
            out, dout = torch.func.jvp(net, (x,), (dx,))
    (dout.square().sum() + (out * dout).sum()).backward()
    seconds = time.perf_counter() - t0
    assert x.grad.isfinite().all() and dx.grad.isfinite().all()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"extra": peak - base, "seconds": seconds}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--lengths", default="8192,16384", help="sequence lengths (Lq = Lk) for jvpc")
    ap.add_argument("--math-lengths", default="8192", help="the lengths the math path runs at")
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--step", action="store_true", help="a tangent_grad training step on a one-block model")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: many small block kernels time steadily on a shared machine)")
    ap.add_argument("--child", nargs=2, metavar=("ROW", "L"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child[0], int(a.child[1]), a.heads, a.dim, a.causal)
    try:
        lengths = [int(x) for x in a.lengths.split(",")]
        math_lengths = [int(x) for x in a.math_lengths.split(",") if x]
    except ValueError:
        ap.error("--lengths and --math-lengths are comma-separated integers")
    if min(lengths + math_lengths + [a.heads, a.dim, a.threads]) < 1:
        ap.error("lengths, --heads, --dim and --threads must be positive")
    score = lambda L: a.heads * L * L * 4  # noqa: E731  (B = 1, float32)

    def run(row, L):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", row, str(L), "--heads", str(a.heads), "--dim",
               str(a.dim)] + (["--causal"] if a.causal else [])
        r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "BENCH_THREADS": str(a.threads)})
        if r.returncode != 0:
            sys.exit(f"attention_backward_memory: {row} at L {L} failed: {r.stderr.strip().splitlines()[-1:]}")
        return json.loads(r.stdout.strip().splitlines()[-1])

    gib = lambda b: f"{b / 2**30:.2f} GiB"  # noqa: E731
    what = "tangent_grad step, one causal attention block" if a.step else "causal" if a.causal else "no mask"
    print(f"B 1, H {a.heads}, D {a.dim}, float32, {what}, {a.threads} thread(s); "
          f"peak resident memory of one forward + backward, over what was resident before it\n", flush=True)
    print("| L | jvpc O(L) | time | math path | time | math / one score tensor (B·H·L²·4) |")
    print("|---|---|---|---|---|---|", flush=True)
    multiple = None
    for L in lengths:
        j = run("step_jvpc" if a.step else "jvpc", L)
        if L in math_lengths:
            m = run("step_math" if a.step else "math", L)
            multiple = m["extra"] / score(L)
            math = (gib(m["extra"]), f"{m['seconds']:.1f} s", f"{multiple:.1f}")
        elif multiple is not None:
            math = (f"not run: {multiple:.1f} x {gib(score(L))} = {gib(multiple * score(L))}", "", "")
        else:
            math = ("not run", "", "")
        print(f"| {L} | {gib(j['extra'])} | {j['seconds']:.1f} s | {math[0]} | {math[1]} | {math[2]} |", flush=True)


if __name__ == "__main__":
    main()
