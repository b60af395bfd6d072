#!/usr/bin/env python3
"""jvpc.linearize(f, *primals, argnums=...) against the eager forward f(*primals) on whole models
(model_zoo.py, size "bench"; f reaches the model, whose weights linearize stamps), in one
process, one thread: the pipeline verifying its input and output only (the default) beside
verify_each (after every pass), each with Python's cyclic GC on and paused (gc.disable()) around
the call (--default-only: the default alone). Thread CPU time (time.thread_time, which the
machine's load moves less than wall time), medians of interleaved rounds in a rotating order after 2 warm-up rounds; the forward is
timed as the mean of 3 calls per round. Prints each median and its ratio to the forward."""

import argparse
import gc
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The networks (model_zoo.py) are the tests' fixtures, in python/tests.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "tests"))
import jvpc  # noqa: E402
from model_zoo import MODELS, build  # noqa: E402


def linearize(g, x, argnums, verify_each, gc_paused):
    opts = jvpc.LinearizeOptions()
    opts.verify_each = verify_each

    def call():
        was_on = gc.isenabled()
        if gc_paused:
            gc.disable()
        try:
            return jvpc.linearize(g, *x, argnums=argnums, options=opts)
        finally:
            if was_on:
                gc.enable()
    return call


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="vit,dit", help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--default-only", action="store_true",
                    help="time only linearize's default (input and output verified, the GC on) beside the forward")
    ap.add_argument("--phases", action="store_true",
                    help="also print the medians of each linearize's phases (report()['phases_ms'], wall ms)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    for name in args.models.split(","):
        case = build(name, torch.float32, size="bench")
        g, x = case.f, case.primals
        calls = {"forward": lambda: g(*x)}
        for each in (False,) if args.default_only else (False, True):
            for paused in (False,) if args.default_only else (False, True):
                label = ("verify_each" if each else "input+output") + (", gc paused" if paused else "")
                calls[label] = linearize(g, x, case.argnums, each, paused)
        names, times = list(calls), {n: [] for n in calls}
        phases: dict = {}
        for r in range(2 + args.rounds):
            for n in names[r % len(names):] + names[:r % len(names)]:
                reps = 3 if n == "forward" else 1
                t0 = time.thread_time()
                for _ in range(reps):
                    result = calls[n]()
                if r >= 2:
                    times[n].append((time.thread_time() - t0) / reps)
                    if n == "input+output":
                        for phase, ms in result[1].report()["phases_ms"].items():
                            phases.setdefault(phase, []).append(ms)
        med = {n: statistics.median(v) * 1e3 for n, v in times.items()}
        print(name + ": " + "; ".join(f"{n} {m:.1f} ms ({m / med['forward']:.2f}x)" for n, m in med.items()),
              flush=True)
        if args.phases:
            print(f"  {name} phases (input+output, wall ms): " +
                  ", ".join(f"{p} {statistics.median(v):.2f}" for p, v in phases.items()), flush=True)


if __name__ == "__main__":
    main()
