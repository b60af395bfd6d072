#!/usr/bin/env python3
"""What a compiled program's checks cost per call (python/jvpc/_guards.py), on whole models.

For each model of model_zoo.py (bench size), it compiles the model with jvpc.compile and times,
in thread CPU time (medians): the eager forward, a program call, the part of the call spent in
Python before the primal graph runs (the primals' checks, the weights read by name, the guards:
_Traced.bind), and the guards alone (Guards.failure), with how many values and hook dictionaries
they check.

  PYTHONPATH=build/python python3 scripts/bench/guard_cost.py --models dit,vit --threads 1
"""

import argparse
import os
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The networks (model_zoo.py) are the tests' fixtures, in python/tests.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "tests"))
import model_zoo  # noqa: E402

import jvpc  # noqa: E402

warnings.filterwarnings("ignore")


def median_thread_time(fn, repeats, warmup=10):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.thread_time()
        fn()
        times.append(time.thread_time() - t0)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="dit,vit", help="comma-separated: " + ", ".join(model_zoo.MODELS))
    p.add_argument("--repeats", type=int, default=200, help="timed repeats of the checks (calls: a quarter)")
    p.add_argument("--threads", type=int, help="torch.set_num_threads")
    args = p.parse_args()
    for name in args.models.split(","):
        if name not in model_zoo.MODELS:
            p.error(f"unknown model {name!r} (models: {', '.join(model_zoo.MODELS)})")
    if args.repeats < 4:
        p.error("--repeats must be at least 4")
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.2f}")
    print("| model | forward ms | program call ms | before the graph µs | guards µs | guards / call | values | hook dicts |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.models.split(","):
        case = model_zoo.build(name, size="bench")
        prog = jvpc.compile(case.f, *case.primals, argnums=case.argnums)
        traced = prog._graphs[0]
        forward = median_thread_time(lambda: case.f(*case.primals), args.repeats // 4)
        call = median_thread_time(lambda: prog(*case.primals), args.repeats // 4)
        bind = median_thread_time(lambda: traced.bind(case.primals), args.repeats)
        guards = median_thread_time(traced.guards.failure, args.repeats)
        if prog.num_graphs != 1:
            sys.exit(f"guard_cost.py: {name}: the program traced again ({prog.num_graphs} graphs)")
        print(f"| {name} | {forward * 1e3:.2f} | {call * 1e3:.2f} | {bind * 1e6:.0f} | {guards * 1e6:.1f} | "
              f"{guards / call:.1%} | {len(traced.guards._entries) + len(traced.guards._cells)} | "
              f"{len(traced.guards._hooks)} |")


if __name__ == "__main__":
    main()
