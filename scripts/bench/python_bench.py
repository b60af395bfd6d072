#!/usr/bin/env python3
"""jvpc's jvp_fn from Python beside PyTorch's, in one process.

For one configuration (the functions and inputs of torch_reference.py, which are those of
examples/sdpa.cpp and examples/block.cpp), it linearizes once with jvpc.linearize and once with
torch.func.linearize, compiles PyTorch's jvp_fn with torch.compile, and then times the three
jvp_fn calls in interleaved rounds (one call of each per round, in a rotating order, after a
warm-up), so that all three meet the same machine state. It prints the median time of each and
the ratios to PyTorch's eager jvp_fn. At --seq-len 1 the calls are almost free of arithmetic, so
jvpc's median there is its fixed cost per call from Python.

  PYTHONPATH=build/python python3 scripts/bench/python_bench.py --config sdpa
  PYTHONPATH=build/python python3 scripts/bench/python_bench.py --config sdpa --seq-len 1
  PYTHONPATH=build/python python3 scripts/bench/python_bench.py --config block
"""
import argparse
import json
import os
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_reference as ref  # noqa: E402

import jvpc  # noqa: E402

warnings.filterwarnings("ignore")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ref.add_config_args(p)
    p.add_argument("--rounds", type=int, default=200, help="interleaved rounds timed (medians reported)")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--skip-compile", action="store_true", help="leave torch.compile(jvp_fn) out")
    p.add_argument("--json", metavar="OUT.json")
    args = p.parse_args()
    ref.check_config(p, args)
    heads = args.model_dim // args.head_dim
    make = ref.make_sdpa if args.config == "sdpa" else ref.make_block
    f, shapes, scales, offsets = make(args, heads)
    device, dtype = torch.device("cpu"), torch.float32
    primals = ref.random_tensors(shapes, scales, offsets, ref.SEED, dtype, device)
    tangents = ref.random_tensors(shapes, [1.0] * len(shapes), [0.0] * len(shapes), ref.TANGENT_SEED, dtype, device)

    _, jvpc_fn = jvpc.linearize(f, *primals)
    _, torch_fn = torch.func.linearize(f, *primals)
    calls = {"jvpc": lambda: jvpc_fn(*tangents), "torch.func eager": lambda: torch_fn(*tangents)}
    if not args.skip_compile:
        compiled = torch.compile(torch_fn)
        calls["torch.compile(jvp_fn)"] = lambda: compiled(*tangents)

    reference = calls["torch.func eager"]()
    for name, call in calls.items():  # the same tangent map, before any timing
        got = call()
        err = (got - reference).abs().max().item() / max(reference.abs().max().item(), 1e-30)
        if err > 1e-4:
            sys.exit(f"python_bench: {name} differs from torch.func's jvp_fn (relative error {err:.2e})")

    names = list(calls)
    times = {n: [] for n in names}
    with torch.no_grad():
        for r in range(args.warmup + args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for n in order:
                t0 = time.perf_counter()
                calls[n]()
                dt = time.perf_counter() - t0
                if r >= args.warmup:
                    times[n].append(dt)
    med = {n: statistics.median(times[n]) for n in names}
    base = med["torch.func eager"]
    config = (f"{args.config}: bsz {args.bsz}, model dim {args.model_dim}, head dim {args.head_dim}, "
              f"seq {args.seq_len}{', causal' if args.causal else ''}, float32, CPU, torch {torch.__version__}, "
              f"{torch.get_num_threads()} threads, {args.rounds} interleaved rounds")
    print(config)
    print(f"{'jvp_fn call':<24}{'median':>12}{'vs torch.func eager':>22}")
    for n in names:
        print(f"{n:<24}{med[n] * 1e6:>10.1f} us{med[n] / base:>22.3f}")
    if args.json:
        out = {"config": config, "median_s": med, "ratio_to_torch_func_eager": {n: med[n] / base for n in names}}
        with open(args.json + ".tmp", "w") as fh:
            json.dump(out, fh, indent=1)
        os.replace(args.json + ".tmp", args.json)


if __name__ == "__main__":
    main()
