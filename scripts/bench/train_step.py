#!/usr/bin/env python3
"""A training step with a JVP inside, jvpc beside PyTorch, in one process.

For each size of a small DiT (examples/meanflow_digits/dit.py) and each objective
(python/tests/objectives.py; MeanFlow: the JVP along (v, 0, 1), the loss through u; sCM in
TrigFlow form: the JVP along (dx_t/dt, 1, 1), the loss through F), the sides below train their
own copy of the same network (same initial weights, AdamW, the same batches):

  jvpc          jvpc.compile(net, ...) once; per step prog.jvp((z, r, t), tangents), which is
                prog(z, r, t) (the step's one forward, which autograd records) and its jvp_fn(...),
                then loss.backward(), opt.step()
  func eager    torch.func.jvp(net, ...) on SDPA's math path (the fused kernels have no forward AD),
                then loss.backward(), opt.step()
  compiled      the same torch step's loss under torch.compile (--skip-compile leaves it out)
  jvpc inductor the jvpc step with jvpc.compile(..., backend="inductor"): each jvp_fn's tangent
                graph compiled by Inductor, once (--skip-compile leaves it out)
  jvpc compiled the jvpc step under torch.compile: prog.jvp(...) is one opaque
                operator in the compiled graph, whose backward runs the network again by torch.func
                (jvpc/_in_compile.py); Inductor compiles the rest of the step (--skip-compile
                leaves it out)
  plain (no JVP)       the floor: the same forward and backward with a regression loss, no JVP
  finite differences   the JVP by central differences (step 5e-3, two more forwards without
                autograd), as some training frameworks take it
Besides the times, each row gives jvpc's step as a multiple of the others, and the JVP's error
against torch.func's in float64 at the first batch: jvpc's and central differences', in float32
and under autocast to bfloat16.

Steps are timed in interleaved rounds (one step of each side per round, in rotating order) after
warm-up steps; the table gives median time per step, the time of each side's first step (with its
compilation, where torch.compile or Inductor compiles then), FlopCounterMode's FLOPs of one step
(forward, JVP and backward), the peak of CPU memory allocated during one step (torch.profiler's
memory records, op by op: what the allocator hands out, jvpc's kernels included), each side's ratio to
func eager, and the losses of the first steps side by side (which must agree: the script exits 1
where they do not), and the norms of their JVPs (the sCM loss is normalised, nearly constant: the
JVP norms are what shows a tangent gone wrong). The long size traces attention through the CPU's fused kernel and takes the
O(L) tangent form (residual_budget=0). The trainer size has a public MeanFlow trainer's shape: RMSNorm
on each head's q and k, and class labels (10, each dropped to the null class with probability 0.1 for
classifier-free guidance) embedded into the conditioning: a primal without a tangent on every side.

--autocast bf16 runs every side's step (and jvpc's compile) under torch.autocast("cpu",
dtype=torch.bfloat16), as mixed-precision training wraps its forward; the losses must then agree
to bfloat16's tolerance (--loss-rtol 2e-2 unless given).
  PYTHONPATH=build/python python3 scripts/bench/train_step.py
  PYTHONPATH=build/python python3 scripts/bench/train_step.py --sizes small --rounds 3 --skip-compile
  PYTHONPATH=build/python python3 scripts/bench/train_step.py --sizes small --autocast bf16 --skip-compile
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import statistics
import sys
import time
import warnings

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The network is the MeanFlow example's (examples/meanflow_digits/dit.py); the objectives are the
# tests' (python/tests/objectives.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "meanflow_digits"))
from dit import DiT  # noqa: E402
from objectives import CHANNELS, OBJECTIVES, batches  # noqa: E402

import jvpc  # noqa: E402

warnings.filterwarnings("ignore")

# name: (d, depth, heads, batch, tokens, O(L) form, DiT's other settings)
SIZES = {
    "small": (64, 2, 4, 4, 256, False, {}),
    "medium": (128, 4, 4, 4, 256, False, {}),
    "long": (64, 2, 4, 1, 2048, True, {}),
    "trainer": (64, 2, 4, 8, 256, False, {"classes": 10, "qk_norm": True}),
}


def network(size):
    """The size's DiT, with seed 0's weights."""
    d, depth, heads, _, _, _, settings = SIZES[size]
    torch.manual_seed(0)
    return DiT(CHANNELS, d, depth, heads, **settings)


def size_batches(size, n, seed):
    """n batches of the size's shape: (x0, e, r, t), and the labels y after them where it has classes."""
    _, _, _, B, L, _, settings = SIZES[size]
    return batches(n, B, L, seed=seed, classes=settings.get("classes"))


def labelled(net, batch):
    """net as a function of the differentiated primals (z, r, t), the batch's labels (if any) bound."""
    return lambda *primals: net(*primals, *batch[4:])


AUTOCAST = {"none": None, "bf16": torch.bfloat16}


def precision(autocast):
    """The context a step runs in: autocast to `autocast`'s dtype on the CPU, or nothing."""
    dtype = AUTOCAST[autocast]
    return torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext()


class Side:
    def __init__(self, name, net, step, autocast="none"):
        self.name, self.net, self._step, self.autocast = name, net, step, autocast
        self.opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
        self.times, self.losses, self.jvp_norms = [], [], []

    def step(self, batch):
        self.opt.zero_grad(set_to_none=True)
        with precision(self.autocast):
            loss, dout = self._step(batch)
        loss.backward()
        self.opt.step()
        return loss.detach(), dout.detach().norm()


def make_sides(size, objective, skip_compile, autocast="none"):
    _, _, _, B, L, long_form, _ = SIZES[size]
    make, loss_of = OBJECTIVES[objective]
    net = network(size)
    x0, e, r, t, *labels = next(size_batches(size, 1, seed=99))
    primals, _, _ = make(x0, e, r, t)
    options = jvpc.LinearizeOptions()
    if long_form:
        options.residual_budget = 0  # the O(L) form of the attention's tangent
    def program(backend="interpreter"):  # a copy of the network and its program
        jnet = copy.deepcopy(net)
        with precision(autocast):  # traced as it runs: under the autocast its steps run in
            # z, r and t differentiated; the labels (integers) are primals without a tangent
            return jnet, jvpc.compile(jnet, *primals, *labels, argnums=(0, 1, 2), options=options, backend=backend)

    def jvpc_step(prog):  # prog.jvp: the program's call and its jvp_fn's (one operator under torch.compile)
        def step(batch):
            primals, tangents, aux = make(*batch[:4])
            out, dout = prog.jvp(primals + batch[4:], tangents)
            return loss_of(out, dout, aux, batch[2], batch[3]), dout
        return step

    def torch_step(net):
        def step(batch):
            primals, tangents, aux = make(*batch[:4])
            with sdpa_kernel(SDPBackend.MATH):
                out, dout = torch.func.jvp(labelled(net, batch), primals, tangents)
            return loss_of(out, dout, aux, batch[2], batch[3]), dout
        return step

    def plain_step(net):  # the floor: the same forward and backward, a regression loss, no JVP
        def step(batch):
            primals, tangents, aux = make(*batch[:4])
            out = labelled(net, batch)(*primals)
            target = tangents[0]  # a tensor of the output's shape: v (MeanFlow), dx_t/dt (sCM)
            return ((out - target) ** 2).mean(), torch.zeros_like(out)
        return step

    def fd_step(net, eps=FD_EPS):  # the JVP by central differences: two more forwards, no autograd
        def step(batch):
            primals, tangents, aux = make(*batch[:4])
            f = labelled(net, batch)
            with sdpa_kernel(SDPBackend.MATH):
                out = f(*primals)
            dout = central_differences(f, primals, tangents, eps)
            return loss_of(out, dout, aux, batch[2], batch[3]), dout
        return step

    jnet, prog = program()
    sides = [Side("jvpc", jnet, jvpc_step(prog), autocast)]
    enet = copy.deepcopy(net)
    sides.append(Side("func eager", enet, torch_step(enet), autocast))
    pnet, fnet = copy.deepcopy(net), copy.deepcopy(net)
    sides.append(Side("plain (no JVP)", pnet, plain_step(pnet), autocast))
    sides.append(Side("finite differences", fnet, fd_step(fnet), autocast))
    if not skip_compile:
        cnet = copy.deepcopy(net)
        sides.append(Side("compiled", cnet, torch.compile(torch_step(cnet)), autocast))
        inet, iprog = program("inductor")
        sides.append(Side("jvpc inductor", inet, jvpc_step(iprog), autocast))
        cjnet, cprog = program()
        # fullgraph=True compiles it too (python/tests/test_in_torch_compile.py); here the FLOP count's
        # dispatch mode, under which Dynamo compiles nothing, runs it eagerly as the other compiled side.
        sides.append(Side("jvpc compiled", cjnet, torch.compile(jvpc_step(cprog)), autocast))
    return sides, (B, L), prog


FD_EPS = 5e-3  # the step one public training framework takes


@torch.no_grad()
def central_differences(net, primals, tangents, eps):
    plus = net(*(p + eps * t for p, t in zip(primals, tangents)))
    minus = net(*(p - eps * t for p, t in zip(primals, tangents)))
    return (plus - minus) / (2 * eps)


def jvp_errors(size, objective):
    """Relative errors (‖got − exact‖ / ‖exact‖) of the JVP at the first batch against torch.func's
    in float64: jvpc's and central differences' (step FD_EPS) in float32, and central differences
    under autocast to bfloat16."""
    long_form = SIZES[size][5]
    make, _ = OBJECTIVES[objective]
    net = network(size)
    batch = next(size_batches(size, 1, seed=1))
    primals, tangents, _ = make(*batch[:4])
    with sdpa_kernel(SDPBackend.MATH):
        exact = torch.func.jvp(labelled(copy.deepcopy(net).double(), batch), tuple(p.double() for p in primals),
                               tuple(t.double() for t in tangents))[1]

    def err(got):
        return ((got.double() - exact).norm() / exact.norm()).item()

    options = jvpc.LinearizeOptions()
    if long_form:
        options.residual_budget = 0
    f, labels = labelled(net, batch), batch[4:]
    with torch.no_grad():
        got = {"jvpc float32": err(jvpc.jvp(net, primals + labels, tangents, argnums=(0, 1, 2), options=options)[1]),
               "finite differences float32": err(central_differences(f, primals, tangents, FD_EPS))}
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got["finite differences bf16"] = err(central_differences(f, primals, tangents, FD_EPS))
            got["jvpc bf16"] = err(jvpc.jvp(net, primals + labels, tangents, argnums=(0, 1, 2), options=options)[1])
    return got


def peak_bytes(fn):
    """Peak of CPU memory allocated (and not yet freed) while fn runs, from torch.profiler."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    # Each op's own allocations net of its frees, and the frees outside ops ("[memory]"), in order.
    events = sorted((e for e in prof.events() if e.self_cpu_memory_usage), key=lambda e: e.time_range.start)
    live = peak = 0
    for e in events:
        live += e.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


def flops(fn):
    with FlopCounterMode(display=False) as fc:
        fn()
    return fc.get_total_flops()


def run(size, objective, args):
    sides, (B, L), prog = make_sides(size, objective, args.skip_compile, args.autocast)
    n = args.warmup + args.rounds
    data = list(size_batches(size, n + 2, seed=1))
    failed = {}
    for i in range(n):
        batch = data[i]
        order = sides[i % len(sides):] + sides[:i % len(sides)]
        for s in order:
            t0 = time.perf_counter()
            try:
                loss, norm = s.step(batch)
            except Exception as e:  # noqa: BLE001  (torch.compile's side: reported, not fatal)
                if s.name not in ("compiled", "jvpc compiled", "jvpc inductor"):
                    raise
                failed[s.name] = str(e).splitlines()[0][:200]
                sides.remove(s)
                continue
            dt = time.perf_counter() - t0
            s.losses.append(loss.item())
            s.jvp_norms.append(norm.item())
            if i == 0:
                s.first_s = dt  # with the compilation, where the side compiles at its first step
            if i >= args.warmup:
                s.times.append(dt)
    # FLOPs and peak memory of one more step each (not timed); the weights move on alike.
    row = {"size": size, "objective": objective, "B": B, "L": L, "sides": {}, "failed": failed}
    for k, s in enumerate(sides):
        f = flops(lambda: s.step(data[n]))
        p = peak_bytes(lambda: s.step(data[n + 1]))
        row["sides"][s.name] = {"median_s": statistics.median(s.times), "first_s": s.first_s, "flops": f,
                                "peak_bytes": p,
                                "losses": s.losses[:args.show_losses], "jvp_norms": s.jvp_norms[:args.show_losses]}
    ref = sides[1]
    exact = [s for s in sides if s.name in ("jvpc", "func eager", "compiled", "jvpc compiled", "jvpc inductor")]
    agree = all(abs(a - b) <= args.loss_rtol * abs(b) for s in exact
                for a, b in zip(s.losses + s.jvp_norms, ref.losses + ref.jvp_norms))
    row["losses_agree"] = agree
    row["jvp_errors"] = jvp_errors(size, objective)
    j = row["sides"]["jvpc"]["median_s"]
    row["jvpc_over"] = {name: j / s["median_s"] for name, s in row["sides"].items() if name != "jvpc"}
    row["tangent_form"] = "O(L)" if "attention_tangent" in prog.tangent_graph.to_text() else "P"
    return row


def table(rows, header):
    out = [header, "",
           "| size | objective | B×L | form | side | ms/step | ×eager | first step s | GFLOP/step | ×eager | peak MiB | losses (first steps) | ‖JVP‖ (first steps) |",
           "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        e = r["sides"]["func eager"]
        for name, s in r["sides"].items():
            losses = ", ".join(f"{x:.5g}" for x in s["losses"])
            norms = ", ".join(f"{x:.5g}" for x in s["jvp_norms"])
            out.append(f"| {r['size']} | {r['objective']} | {r['B']}×{r['L']} | {r['tangent_form']} | {name} | "
                       f"{1e3 * s['median_s']:.1f} | {s['median_s'] / e['median_s']:.2f} | {s['first_s']:.2f} | "
                       f"{s['flops'] / 1e9:.3f} | "
                       f"{s['flops'] / e['flops']:.2f} | {s['peak_bytes'] / 2**20:.1f} | {losses} | {norms} |")
        for name, why in r["failed"].items():
            out.append(f"| {r['size']} | {r['objective']} | {r['B']}×{r['L']} | | {name} | failed: {why} | | | | | | | |")
    for r in rows:
        ratios = ", ".join(f"{1 / v:.2f}x faster than {k}" if v < 1 else f"{v:.2f}x {k}"
                           for k, v in r["jvpc_over"].items())
        errors = ", ".join(f"{k} {v:.1e}" for k, v in r["jvp_errors"].items())
        out.append(f"\n{r['size']}/{r['objective']}: jvpc's step is {ratios}; the JVP's relative error against "
                   f"float64: {errors}")
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="small,medium,long", help="comma-separated: " + ", ".join(SIZES))
    p.add_argument("--objectives", default="meanflow,scm", help="comma-separated: " + ", ".join(OBJECTIVES))
    p.add_argument("--rounds", type=int, default=7, help="timed rounds (one step per side each)")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds first (compilation happens there)")
    p.add_argument("--show-losses", type=int, default=3, help="losses of the first steps shown per side")
    p.add_argument("--loss-rtol", type=float, help="relative agreement the losses and JVP norms must reach "
                   "(default 1e-3; 2e-2 under --autocast bf16)")
    p.add_argument("--autocast", choices=list(AUTOCAST), default="none",
                   help="run each step under torch.autocast on the CPU to this dtype")
    p.add_argument("--skip-compile", action="store_true", help="leave out the torch.compile side")
    p.add_argument("--threads", type=int, help="torch.set_num_threads")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    for name in args.sizes.split(","):
        if name not in SIZES:
            p.error(f"unknown size {name!r} (sizes: {', '.join(SIZES)})")
    for name in args.objectives.split(","):
        if name not in OBJECTIVES:
            p.error(f"unknown objective {name!r} (objectives: {', '.join(OBJECTIVES)})")
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.loss_rtol is None:
        args.loss_rtol = 2e-2 if args.autocast == "bf16" else 1e-3
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for size in args.sizes.split(","):
        for objective in args.objectives.split(","):
            rows.append(run(size, objective, args))
            print(table(rows[-1:], f"{size}/{objective} done, load average {os.getloadavg()[0]:.2f}"), flush=True)
    load = os.getloadavg()
    dtype = "float32" if args.autocast == "none" else f"float32 under autocast to {args.autocast}"
    print(table(rows, f"torch {torch.__version__}, {torch.get_num_threads()} threads, {dtype}, CPU; "
                      f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; medians of {args.rounds} rounds"))
    if args.json:
        with open(args.json + ".tmp", "w") as f:
            json.dump(rows, f, indent=1)
        os.replace(args.json + ".tmp", args.json)
    bad = [f"{r['size']}/{r['objective']}" for r in rows if not r["losses_agree"]]
    if bad:
        print(f"train_step.py: error: the sides' losses disagree for {', '.join(bad)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
