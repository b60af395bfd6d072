#!/usr/bin/env python3
"""jvpc's jvp_fn from Python beside PyTorch's, in one process.

For one configuration (the functions and inputs of torch_reference.py, which are those of
examples/sdpa.cpp and examples/block.cpp), it linearizes once with jvpc.linearize and once with
torch.func.linearize, compiles PyTorch's jvp_fn with torch.compile and jvpc's tangent graph with
Inductor (backend="inductor"), and then times the four jvp_fn calls in interleaved rounds (one
call of each per round, in a rotating order, after a warm-up), so that all meet the same machine
state; the two compiled sides' compile times (their first calls) are printed apart. It prints the median time of each and
the ratios to PyTorch's eager jvp_fn.

The floor: a fourth timed call, "matmuls alone", runs only the matmul kernels of jvpc's tangent
graph (the nodes the graph holds, on operands of their sizes, strides and dtype, into
preallocated outputs), in the same rotation. It is the floor of any jvp_fn that does that
arithmetic: FlopCounterMode must count the same matmul FLOPs in it as in jvpc's call (checked),
and jvpc's call and PyTorch's later calls run those same FLOPs. The script prints jvpc / floor,
floor / eager, the machine's matmul throughput at those shapes (FLOPs / floor time) and the time a
target ratio to eager (--target, default 0.4) would need beside the floor's.

At --seq-len 1 the calls are almost free of arithmetic, so jvpc's median there is its fixed cost
per call from Python. --profile prints torch.profiler's per-op table of jvpc's calls (where a
call spends the time beyond its matmuls). --device cuda times on the GPU (synchronized around
every call; float16 by default, as the seed's script); without one it refuses.

Under contention: --busy N starts N processes that each spin on a core once set-up is done, and
--nice K lowers this process's priority first, as a training loop's DataLoader workers or a build
beside it would (`--seq-len 1 --busy 2 --nice 19` on two cores).

Calls are timed in grad mode, as the seed's script calls jvp_fn and as torch_reference.py times
it (jvpc's call runs without autograd either way); --no-grad times them under torch.no_grad().

  PYTHONPATH=build/python python3 scripts/bench/python_bench.py --config sdpa
  PYTHONPATH=build/python python3 scripts/bench/python_bench.py --config sdpa --seq-len 1
  PYTHONPATH=build/python python3 scripts/bench/python_bench.py --config sdpa --seq-len 1 --busy 2 --nice 19
  PYTHONPATH=build/python python3 scripts/bench/python_bench.py --config block
  PYTHONPATH=build/python python3 scripts/bench/python_bench.py --config sdpa --device cuda --skip-compile
"""
import argparse
import contextlib
import json
import os
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_reference as ref  # noqa: E402

import jvpc  # noqa: E402

warnings.filterwarnings("ignore")

# The ops whose FLOPs the cost model counts as matmul FLOPs (ir/ops.cpp).
MATMULS = set(jvpc._C.matmul_ops())
GRAPH_DTYPES = {aten: getattr(torch, python) for aten, python in jvpc._C.dtype_names()}  # a graph JSON's dtypes


def matmul_kernels_run(call, device):
    """The names of the matmul kernels one call runs, in order, from torch.profiler: which of the
    graph's matmuls the runtime runs in place (aten::baddbmm_ into a dead input's buffer)."""
    inplace = {m + "_" for m in MATMULS}
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities) as prof:
        call()
        ref.sync(device)
    return [e.name for e in sorted(prof.events(), key=lambda e: e.time_range.start)
            if e.name in MATMULS or e.name in inplace]


def matmuls_alone(graph_json, seed, kernels_run=()):
    """Callables that run only the tangent graph's matmul kernels, on operands of the same sizes,
    strides and dtypes (random values): the floor a call cannot go under without doing less
    arithmetic. Returns (timed, counted, kernels):
      timed:   each kernel as the runtime runs it: in place where `kernels_run` (the profiled
               call's matmul kernels, in graph order) names the in-place form (aten::baddbmm_,
               accumulating into a preallocated operand), else into a preallocated out= tensor;
      counted: the same kernels out of place (out=), the forms FlopCounterMode counts (it knows
               no baddbmm_), as jvpc's call runs them under a dispatch mode;
      kernels: each node's op and operand sizes, in graph order, "(in place)" where timed so."""
    g = json.loads(graph_json)
    metas = {v["id"]: v["meta"] for v in g["inputs"]}
    for n in g["nodes"]:
        for o in n["outputs"]:
            metas[o["id"]] = o["meta"]
    gen = torch.Generator().manual_seed(seed)

    def tensor(meta):
        dtype = GRAPH_DTYPES[meta["dtype"]]
        t = torch.empty_strided(meta["sizes"], meta["strides"], dtype=dtype, device=meta["device"])
        if dtype.is_floating_point:
            t.copy_(torch.randn(t.shape, generator=gen).to(dtype))
        else:
            t.zero_()
        return t

    nodes = [n for n in g["nodes"] if n["op"] in MATMULS]
    run_names = list(kernels_run) if len(kernels_run) == len(nodes) else [n["op"] for n in nodes]
    timed, counted, kernels = [], [], []
    for n, ran in zip(nodes, run_names):
        ns, name = n["op"].split("::")
        base, _, overload = name.partition(".")
        packet = getattr(getattr(torch.ops, ns), base)
        schema = getattr(packet, overload or "default")._schema
        args, kwargs, shapes = [], {}, []
        for a, spec in zip(schema.arguments, n["args"]):
            (kind, value), = spec.items()
            v = tensor(metas[value]) if kind == "tensor" else None if kind == "none" else value
            if kind == "tensor":
                shapes.append("x".join(map(str, metas[value]["sizes"])))
            if a.kwarg_only:
                kwargs[a.name] = v
            else:
                args.append(v)
        inplace = ran == n["op"] + "_" and not overload and hasattr(getattr(torch.ops, ns), base + "_")
        kernels.append(f"{n['op']}({', '.join(shapes)}){' (in place)' if inplace else ''}")
        if not overload and hasattr(packet, "out"):
            out = tensor(n["outputs"][0]["meta"])
            counted.append(lambda op=packet.out, a=args, k=kwargs, o=out: op(*a, **k, out=o))
        else:
            counted.append(lambda op=getattr(packet, overload or "default"), a=args, k=kwargs: op(*a, **k))
        if inplace:  # accumulates into its own copy of the first operand, call after call
            op_ = getattr(getattr(torch.ops, ns), base + "_").default
            timed.append(lambda op=op_, a=[args[0].clone()] + args[1:], k=kwargs: op(*a, **k))
        else:
            timed.append(counted[-1])

    def run(calls):
        def call():
            for c in calls:
                c()
        return call
    return run(timed), run(counted), kernels


def add_device_args(p):
    """--device and --dtype, shared with batched_bench.py."""
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=list(ref.DTYPES), help="default: float32 on the CPU, float16 on CUDA")


def check_device_args(p, args):
    """Refuses --device cuda without a GPU, in one line; fills in the default dtype."""
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device here (torch.cuda.is_available() is False)")
    args.dtype = args.dtype or ("float16" if args.device == "cuda" else "float32")


def tolerance_for(dtype):
    """The relative error two computations of the same tangent map may differ by in `dtype`."""
    return 1e-4 if dtype in (torch.float32, torch.float64) else 2e-2


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ref.add_config_args(p)
    add_device_args(p)
    p.add_argument("--rounds", type=int, default=200, help="interleaved rounds timed (medians reported)")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--skip-compile", action="store_true", help="leave the compiled sides out: torch.compile(jvp_fn) and jvpc with backend=\"inductor\"")
    p.add_argument("--no-grad", action="store_true",
                   help="time the calls under torch.no_grad() (default: grad mode on, as the seed's script)")
    p.add_argument("--target", type=float, default=0.4, help="a target ratio of jvpc to torch.func eager, "
                   "set beside the floor (default: 0.4)")
    p.add_argument("--profile", type=int, metavar="CALLS", default=0,
                   help="also print torch.profiler's per-op table over this many jvpc calls")
    p.add_argument("--busy", type=int, default=0, metavar="N",
                   help="time beside N processes that each spin on a core (started after set-up)")
    p.add_argument("--nice", type=int, default=0, metavar="K",
                   help="lower this process's priority by K before timing (as `nice -n K`)")
    p.add_argument("--json", metavar="OUT.json")
    args = p.parse_args(argv)
    ref.check_config(p, args)
    check_device_args(p, args)
    if args.rounds < 1 or args.warmup < 0 or args.profile < 0 or args.busy < 0 or not 0 <= args.nice <= 19:
        p.error("--rounds must be at least 1, --warmup, --profile and --busy at least 0, --nice from 0 to 19")
    if not 0 < args.target < float("inf"):
        p.error(f"--target must be a ratio above 0, not {args.target}")
    return args


def relative_error(got, want):
    return (got.double() - want.double()).abs().max().item() / max(want.double().abs().max().item(), 1e-30)


def profile_table(call, calls, device):
    """torch.profiler's per-op self time over `calls` calls (warm), as a table."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(calls):
            call()
        ref.sync(device)
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=20)


def main(argv=None):
    args = parse_args(argv)
    heads = args.model_dim // args.head_dim
    make = ref.make_sdpa if args.config == "sdpa" else ref.make_block
    f, shapes, scales, offsets = make(args, heads)
    device, dtype = torch.device(args.device), ref.DTYPES[args.dtype]
    primals = ref.random_tensors(shapes, scales, offsets, ref.SEED, dtype, device)
    tangents = ref.random_tensors(shapes, [1.0] * len(shapes), [0.0] * len(shapes), ref.TANGENT_SEED, dtype, device)

    _, jvpc_fn = jvpc.linearize(f, *primals)
    _, torch_fn = torch.func.linearize(f, *primals)
    calls = {"jvpc": lambda: jvpc_fn(*tangents), "torch.func eager": lambda: torch_fn(*tangents)}
    compile_s = {}
    if not args.skip_compile:
        compiled = torch.compile(torch_fn)
        calls["torch.compile(jvp_fn)"] = lambda: compiled(*tangents)
        _, inductor_fn = jvpc.linearize(f, *primals, backend="inductor")
        calls["jvpc, backend=inductor"] = lambda: inductor_fn(*tangents)
        # Compilation happens at the first call of each: timed here, reported apart.
        for name in ("torch.compile(jvp_fn)", "jvpc, backend=inductor"):
            t0 = time.perf_counter()
            calls[name]()
            ref.sync(device)
            compile_s[name] = time.perf_counter() - t0
    floor, floor_counted, kernels = matmuls_alone(jvpc_fn.to_json(), ref.TANGENT_SEED,
                                                  matmul_kernels_run(calls["jvpc"], device))

    reference = calls["torch.func eager"]()
    tolerance = tolerance_for(dtype)
    for name, call in calls.items():  # the same tangent map, before any timing
        got = call()
        if name == "jvpc":  # the same structure as torch.func's (a tensor out)
            if not isinstance(got, torch.Tensor):
                sys.exit(f"python_bench: jvpc's jvp_fn returned {type(got).__name__}, not a tensor")
        err = relative_error(got, reference)
        if err > tolerance:
            sys.exit(f"python_bench: {name} differs from torch.func's jvp_fn (relative error {err:.2e})")

    # The floor does the same arithmetic as the calls it is set beside: FlopCounterMode counts it.
    flops = {"jvpc": ref.matmul_flops(calls["jvpc"]), "torch.func eager": ref.matmul_flops(calls["torch.func eager"])}
    floor_name = f"jvpc's {len(kernels)} matmuls alone"
    flops[floor_name] = ref.matmul_flops(floor_counted)
    if flops[floor_name] != flops["jvpc"]:
        sys.exit(f"python_bench: the matmuls alone count {flops[floor_name]:,} matmul FLOPs, jvpc's call "
                 f"{flops['jvpc']:,}: not the same arithmetic")
    calls[floor_name] = floor
    names = list(calls)
    mode = torch.no_grad() if args.no_grad else contextlib.nullcontext()
    with ref.beside_busy_processes(args.busy, args.nice) as load, mode:
        med = ref.interleaved_medians(calls, args.warmup, args.rounds, device)
    base, floor_s = med["torch.func eager"], med[floor_name]
    threads = f"{torch.get_num_threads()} threads" if device.type == "cpu" else ref.device_name(device)
    config = (f"{args.config}: bsz {args.bsz}, model dim {args.model_dim}, head dim {args.head_dim}, "
              f"seq {args.seq_len}{', causal' if args.causal else ''}, {args.dtype}, {device.type.upper()}, "
              f"torch {torch.__version__}, {threads}, {args.rounds} interleaved rounds"
              f"{', no_grad' if args.no_grad else ', grad mode'}"
              f"{f', beside {args.busy} busy processes' if args.busy else ''}"
              f"{f', nice {args.nice}' if args.nice else ''}, load {load:.2f}")
    gflops = flops[floor_name] / floor_s / 1e9
    target_s = args.target * base
    print(config)
    w = max(len(n) for n in names) + 2
    print(f"{'jvp_fn call':<{w}}{'median':>12}{'vs torch.func eager':>22}{'matmul FLOPs':>16}")
    for n in names:
        f_n = f"{flops[n]:,}" if n in flops else "(not counted)"
        print(f"{n:<{w}}{med[n] * 1e6:>10.1f} us{med[n] / base:>22.3f}{f_n:>16}")
    print(f"floor: jvpc / matmuls alone {med['jvpc'] / floor_s:.3f}, matmuls alone / torch.func eager "
          f"{floor_s / base:.3f}")
    print(f"matmul throughput at these shapes: {flops[floor_name]:,} FLOPs in {floor_s * 1e6:.1f} us = "
          f"{gflops:.1f} GFLOP/s ({'; '.join(kernels)})")
    print(f"target {args.target}x torch.func eager: {target_s * 1e6:.1f} us per call, "
          f"{'below' if target_s < floor_s else 'above'} the {floor_s * 1e6:.1f} us the matmuls alone take "
          f"(it would need {flops[floor_name] / target_s / 1e9:.1f} GFLOP/s with nothing else in the call)")
    for n, sec in compile_s.items():
        print(f"compile time (its first call): {n} {sec:.1f} s")
    if args.profile:
        print(f"\ntorch.profiler over {args.profile} jvpc calls:")
        with mode:
            print(profile_table(calls["jvpc"], args.profile, device))
    if args.json:
        out = {"config": config, "median_s": med, "ratio_to_torch_func_eager": {n: med[n] / base for n in names},
               "matmul_flops": flops, "floor": {"name": floor_name, "kernels": kernels, "time_s": floor_s,
                                                "gflops_per_s": gflops, "jvpc_over_floor": med["jvpc"] / floor_s,
                                                "floor_over_eager": floor_s / base},
               "target": {"ratio": args.target, "time_s": target_s, "below_floor": target_s < floor_s},
               "compile_s": compile_s}
        with open(args.json + ".tmp", "w") as fh:
            json.dump(out, fh, indent=1)
        os.replace(args.json + ".tmp", args.json)


if __name__ == "__main__":
    main()
