#!/usr/bin/env python3
"""jvpc on whole models (python/tests/model_zoo.py: timm and diffusers, random weights) beside
PyTorch, in one process, on one thread by default.

For each model it measures, as medians of interleaved rounds (every timed call once per round,
in a rotating order, after a warm-up, so that all meet the same machine state):
  forward       the model's eager forward (no autograd), the unit of the ratios;
  linearize     jvpc.linearize(f, *primals, argnums=...), f reaching the model as users write it
                (so jvp_fn checks its weights before each call: jvpc/_weights.py), and its ratio
                to the forward; "cached": a second call with cache=True at a new point (trace and
                fold only);
  jvp_fn        jvpc's linear map, against torch.func.jvp (eager, math SDPA backend) and against
                torch.compile(torch.func.jvp) (--skip-compile leaves it out and the next);
  inductor      jvp_fn of jvpc.linearize(..., backend="inductor"): the same tangent graph compiled
                by Inductor (its compile time in the model's notes);
  new point     prog(x2) then jvp_fn(t) of a jvpc.compile'd program, against torch.func.jvp at x2;
the matmul FLOPs of each side (FlopCounterMode) and the peak memory each allocates above what it
started with (torch_reference.py's peak_bytes: the profiler's allocations and frees in order on
the CPU, the allocator's peak on CUDA).

With --hvp, Hessian-vector products of the loss mean(f(x)²) in the model's first differentiated
argument instead: the gradient torch.func.grad (the unit), jvpc.jvp(torch.func.grad(loss)) (a
trace and a linearization per call), the HVP map of jvpc.linearize(torch.func.grad(loss), x) at
one point, and torch.func.jvp(torch.func.grad(loss)) (math SDPA backend).

UNet2DModel has no torch.func column: torch.func.jvp fails in its group_norm.

  PYTHONPATH=build/python python3 scripts/bench/models_bench.py
  PYTHONPATH=build/python python3 scripts/bench/models_bench.py --models vit,dit --rounds 20 --json out.json
  PYTHONPATH=build/python python3 scripts/bench/models_bench.py --hvp --models vit,resnet,dit
"""
import argparse
import json
import os
import subprocess
import sys
import warnings

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The networks (model_zoo.py) are the tests' fixtures, in python/tests.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "tests"))
from model_zoo import MODELS, build, partial, tangents_for  # noqa: E402
from torch_reference import interleaved_medians, matmul_flops, peak_bytes  # noqa: E402

import jvpc  # noqa: E402

warnings.filterwarnings("ignore")


def on_math(f):
    def g(*args):
        with sdpa_kernel(SDPBackend.MATH):
            return f(*args)
    return g


def measure(name, args):
    case = build(name, getattr(torch, args.dtype), size="bench")
    case.module.to(args.device)
    move = lambda xs: tuple(x.to(args.device) for x in xs)  # noqa: E731
    case.primals, case.point2 = move(case.primals), move(case.point2)
    g = partial(case)
    x = tuple(case.primals[i] for i in case.argnums)
    t = move(tangents_for(case))
    x2 = tuple(case.point2[i] for i in case.argnums)
    row = {"model": name}

    f, argnums = case.f, case.argnums  # as users call jvpc: the model's weights reached and checked
    _, jvp_fn = jvpc.linearize(f, *case.primals, argnums=argnums)
    prog = jvpc.compile(f, *case.primals, argnums=argnums)
    jvpc.linearize(f, *case.primals, argnums=argnums, cache=True)  # then linearized again at new points

    calls = {
        "forward": lambda: f(*case.primals),
        "linearize": lambda: jvpc.linearize(f, *case.primals, argnums=argnums),
        "linearize cached": lambda: jvpc.linearize(f, *case.point2, argnums=argnums, cache=True),
        "jvp_fn": lambda: jvp_fn(*t),
        "new point": lambda: prog(*case.point2)[1](*t),
    }
    if case.torch_func_jvp:
        ref = on_math(g)
        ref2 = on_math(partial(case, case.point2))
        calls["torch.func.jvp"] = lambda: torch.func.jvp(ref, x, t)
        calls["torch.func.jvp new point"] = lambda: torch.func.jvp(ref2, x2, t)
    if not args.skip_compile:
        _, jvp_ind = jvpc.linearize(f, *case.primals, argnums=argnums, backend="inductor")
        done = len(jvpc._inductor.compile_ms())
        jvp_ind(*t)  # compiles
        row["inductor_compile_ms"] = sum(jvpc._inductor.compile_ms()[done:])
        calls["jvp_fn inductor"] = lambda: jvp_ind(*t)
        if case.torch_func_jvp:
            compiled = torch.compile(lambda *xt: torch.func.jvp(ref, xt[:len(x)], xt[len(x):]))
            try:
                compiled(*x, *t)
                calls["compiled torch.func.jvp"] = lambda: compiled(*x, *t)
            except Exception as e:  # noqa: BLE001  (reported, not fatal)
                row["compile_error"] = str(e).splitlines()[0][:120]
    device = torch.device(args.device)
    with torch.no_grad():
        secs = interleaved_medians(calls, args.warmup, args.rounds, device)
    row["ms"] = {k: v * 1e3 for k, v in secs.items()}
    row["flops"] = {"forward": matmul_flops(on_math(lambda: g(*x))), "jvp_fn": matmul_flops(lambda: jvp_fn(*t)),
                    "new point": matmul_flops(calls["new point"]), "linearize": matmul_flops(calls["linearize"])}
    row["peak_bytes"] = {"jvp_fn": peak_bytes(lambda: jvp_fn(*t), device),
                         "new point": peak_bytes(calls["new point"], device)}
    if case.torch_func_jvp:
        row["flops"]["torch.func.jvp"] = matmul_flops(calls["torch.func.jvp"])
        row["peak_bytes"]["torch.func.jvp"] = peak_bytes(calls["torch.func.jvp"], device)
    phases = jvpc.linearize(f, *case.primals, argnums=argnums)[1].report()["phases_ms"]
    row["linearize_phases_ms"] = phases
    return row


def measure_hvp(name, args):
    case = build(name, getattr(torch, args.dtype), size="bench")
    case.module.to(args.device)
    primals = [p.to(args.device) for p in case.primals]
    i = case.argnums[0]

    def loss(xi):
        return case.f(*primals[:i], xi, *primals[i + 1:]).pow(2).mean()

    x = primals[i]
    v = torch.randn(x.shape, generator=torch.Generator().manual_seed(3), dtype=x.dtype).to(x.device)
    grad = torch.func.grad(loss)
    _, hvp_fn = jvpc.linearize(grad, x)
    calls = {
        "grad": lambda: grad(x),
        "jvpc.jvp(grad)": lambda: jvpc.jvp(grad, (x,), (v,)),
        "linearized hvp_fn": lambda: hvp_fn(v),
    }
    if case.torch_func_jvp:
        ref = on_math(grad)
        calls["torch.func.jvp(grad)"] = lambda: torch.func.jvp(ref, (x,), (v,))
    secs = interleaved_medians(calls, args.warmup, args.rounds, torch.device(args.device))
    return {"model": name, "ms": {k: s * 1e3 for k, s in secs.items()}}


def hvp_table(rows) -> str:
    out = ["| model | grad ms | jvpc.jvp(grad) ms (× grad) | linearized hvp_fn ms (× grad) "
           "| torch.func.jvp(grad) ms (× grad) | torch.func / jvpc.jvp | torch.func / hvp_fn |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ms = r["ms"]
        g, j, h, t = ms["grad"], ms["jvpc.jvp(grad)"], ms["linearized hvp_fn"], ms.get("torch.func.jvp(grad)")
        tf = "n/a" if t is None else f"{t:.2f} ({t / g:.2f}x)"
        out.append(f"| {r['model']} | {g:.2f} | {j:.2f} ({j / g:.2f}x) | {h:.2f} ({h / g:.2f}x) | {tf} "
                   f"| {'n/a' if t is None else f'{t / j:.2f}'} | {'n/a' if t is None else f'{t / h:.2f}'} |")
    return "\n".join(out)


def mib(b):
    return f"{b / 2**20:.2f}"


def table(rows) -> str:
    out = ["| model | forward ms | linearize ms (× fwd) | cached (× fwd) | jvp_fn ms | jvp_fn inductor ms "
           "| torch.func.jvp ms | compiled ms | new point ms | torch.func.jvp there ms "
           "| matmul GFLOP fwd / jvp_fn / torch | peak MiB jvp_fn / torch |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ms, fl, pk = r["ms"], r["flops"], r["peak_bytes"]
        fwd = ms["forward"]
        get = lambda d, k, f: f(d[k]) if k in d else "n/a"  # noqa: E731
        out.append(
            f"| {r['model']} | {fwd:.2f} | {ms['linearize']:.1f} ({ms['linearize'] / fwd:.1f}x) "
            f"| {ms['linearize cached']:.1f} ({ms['linearize cached'] / fwd:.1f}x) | {ms['jvp_fn']:.2f} "
            f"| {get(ms, 'jvp_fn inductor', lambda v: f'{v:.2f}')} "
            f"| {get(ms, 'torch.func.jvp', lambda v: f'{v:.2f}')} "
            f"| {get(ms, 'compiled torch.func.jvp', lambda v: f'{v:.2f}')} | {ms['new point']:.2f} "
            f"| {get(ms, 'torch.func.jvp new point', lambda v: f'{v:.2f}')} "
            f"| {fl['forward'] / 1e9:.3f} / {fl['jvp_fn'] / 1e9:.3f} / "
            f"{get(fl, 'torch.func.jvp', lambda v: f'{v / 1e9:.3f}')} "
            f"| {mib(pk['jvp_fn'])} / {get(pk, 'torch.func.jvp', mib)} |")
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--skip-compile", action="store_true", help="leave out torch.compile(torch.func.jvp)")
    p.add_argument("--hvp", action="store_true", help="Hessian-vector products (jvp of grad) instead")
    p.add_argument("--json", help="also write the measurements here")
    args = p.parse_args(argv)
    names = [m for m in args.models.split(",") if m]
    for m in names:
        if m not in MODELS:
            p.error(f"unknown model {m!r} (known: {', '.join(MODELS)})")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device")
    if args.rounds < 1 or args.warmup < 0 or args.threads < 1:
        p.error("--rounds and --threads must be positive, --warmup not negative")
    torch.set_num_threads(args.threads)
    rows = [(measure_hvp if args.hvp else measure)(m, args) for m in names]
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"models_bench.py {' '.join(sys.argv[1:])}  (torch {torch.__version__}, {args.threads} thread(s), "
          f"{args.dtype}, {args.device}; uptime: {load})\n")
    print(hvp_table(rows) if args.hvp else table(rows))
    for r in [] if args.hvp else rows:
        if "compile_error" in r:
            print(f"\n{r['model']}: torch.compile(torch.func.jvp) failed: {r['compile_error']}")
        print(f"\n{r['model']} linearize phases (ms): " +
              ", ".join(f"{k} {v:.1f}" for k, v in r["linearize_phases_ms"].items()) +
              (f"; Inductor's compile of the tangent graph {r['inductor_compile_ms'] / 1e3:.1f} s"
               if "inductor_compile_ms" in r else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"uptime": load, "args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
