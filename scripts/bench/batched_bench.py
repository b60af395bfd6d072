#!/usr/bin/env python3
"""Many tangents per call: jvpc's batched tangent graph beside K single calls and PyTorch's vmap.

For one configuration (torch_reference.py's functions and inputs: the seed's attention or the
block), it linearizes once with jvpc and once with torch.func.linearize and, for each K, times
in interleaved rounds (one call of each per round, in a rotating order, after a warm-up):
  jvpc batched      torch.func.vmap(jvpc jvp_fn)(K tangents): one call of the batched tangent graph
  jvpc K calls      jvpc's jvp_fn called K times
  torch vmap        torch.func.vmap(torch.func.linearize's jvp_fn)(K tangents)
It prints the median time per tangent of each, and each as a ratio to one jvpc call (the median
time of jvpc K calls divided by K). The three agree (checked before timing).

The floor: a fourth timed call, "matmuls alone", runs only the matmul kernels of the batched
tangent graph for K (its nodes, on operands of their sizes, strides and dtype, in place where the
runtime runs them in place, else into preallocated outputs; python_bench.py's matmuls_alone), in
the same rotation. FlopCounterMode must count the same matmul FLOPs in it as in the batched call
(checked: K times one call's at the seed). It is the floor of any batched call that does that
arithmetic in those kernels: the script prints it per tangent beside one jvpc call, and the
batched call beside it.

  PYTHONPATH=build/python python3 scripts/bench/batched_bench.py --config sdpa
  PYTHONPATH=build/python python3 scripts/bench/batched_bench.py --config block --tangents 1,4,16
  PYTHONPATH=build/python python3 scripts/bench/batched_bench.py --config sdpa --device cuda   # float16
"""
import argparse
import json
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_reference as ref  # noqa: E402

import jvpc  # noqa: E402
from python_bench import (add_device_args, check_device_args, matmul_kernels_run, matmuls_alone,  # noqa: E402
                          relative_error, tolerance_for)

warnings.filterwarnings("ignore")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ref.add_config_args(p)
    p.add_argument("--tangents", default="1,4,16,64", help="comma-separated K")
    p.add_argument("--rounds", type=int, default=30, help="interleaved rounds timed per K (medians reported)")
    p.add_argument("--warmup", type=int, default=3)
    add_device_args(p)
    p.add_argument("--json", metavar="OUT.json")
    args = p.parse_args()
    ref.check_config(p, args)
    check_device_args(p, args)
    if args.rounds < 1 or args.warmup < 0:
        p.error("--rounds must be at least 1, --warmup at least 0")
    try:
        ks = [int(k) for k in args.tangents.split(",")]
    except ValueError:
        p.error(f"--tangents: a comma-separated list of integers, not {args.tangents!r}")
    if any(k < 1 for k in ks):
        p.error("--tangents: each K must be at least 1")
    heads = args.model_dim // args.head_dim
    make = ref.make_sdpa if args.config == "sdpa" else ref.make_block
    f, shapes, scales, offsets = make(args, heads)
    device, dtype = torch.device(args.device), ref.DTYPES[args.dtype]
    primals = ref.random_tensors(shapes, scales, offsets, ref.SEED, dtype, device)
    _, jvpc_fn = jvpc.linearize(f, *primals)
    _, torch_fn = torch.func.linearize(f, *primals)

    rows = []
    for k in ks:
        gen = torch.Generator().manual_seed(ref.TANGENT_SEED + k)
        batch = tuple(torch.randn(k, *s, generator=gen).to(device, dtype) for s in shapes)
        calls = {
            "jvpc batched": lambda: torch.func.vmap(jvpc_fn)(*batch),
            "jvpc K calls": lambda: [jvpc_fn(*(t[i] for t in batch)) for i in range(k)],
            "torch vmap": lambda: torch.func.vmap(torch_fn)(*batch),
        }
        floor, floor_counted, kernels = matmuls_alone(jvpc_fn._lin.batched_graph(k).to_json(), ref.TANGENT_SEED + k,
                                                      matmul_kernels_run(calls["jvpc batched"], device))
        flops = {"jvpc batched": ref.matmul_flops(calls["jvpc batched"]), "matmuls alone": ref.matmul_flops(floor_counted)}
        if flops["matmuls alone"] != flops["jvpc batched"]:
            sys.exit(f"batched_bench: the batched graph's matmuls alone count {flops['matmuls alone']:,} matmul FLOPs, "
                     f"the batched call {flops['jvpc batched']:,} at K={k}: not the same arithmetic")
        calls["matmuls alone"] = floor
        with torch.no_grad():
            want = torch.func.vmap(torch_fn)(*batch)
            for name in ("jvpc batched", "jvpc K calls"):
                got = calls[name]()
                got = torch.stack(got) if isinstance(got, list) else got
                err = relative_error(got, want)
                if err > tolerance_for(dtype):
                    sys.exit(f"batched_bench: {name} differs from torch vmap at K={k} (relative error {err:.2e})")
            names = list(calls)
            med = ref.interleaved_medians(calls, args.warmup, args.rounds, device)
        per = {n: med[n] / k for n in names}
        rows.append({"K": k, "per_tangent_s": per, "ratio_to_one_jvpc_call": {n: per[n] / per["jvpc K calls"] for n in names},
                     "matmul_flops": flops["jvpc batched"], "floor_kernels": kernels,
                     "batched_over_floor": per["jvpc batched"] / per["matmuls alone"]})

    config = (f"{args.config}: bsz {args.bsz}, model dim {args.model_dim}, head dim {args.head_dim}, "
              f"seq {args.seq_len}{', causal' if args.causal else ''}, {args.dtype}, {ref.device_name(device)}, "
              f"torch {torch.__version__}, "
              f"{torch.get_num_threads()} threads, {args.rounds} interleaved rounds per K")
    print(config)
    print(f"{'K':>4}  {'time per tangent (us)':>64}  {'vs one jvpc call':>42}  {'batched /':>10}")
    print(f"{'':>4}  {'jvpc batched':>16}{'jvpc K calls':>16}{'torch vmap':>16}{'matmuls alone':>16}"
          f"  {'jvpc batched':>14}{'torch vmap':>14}{'matmuls':>14}  {'matmuls':>10}")
    for row in rows:
        t, q = row["per_tangent_s"], row["ratio_to_one_jvpc_call"]
        print(f"{row['K']:>4}  {t['jvpc batched'] * 1e6:>16.1f}{t['jvpc K calls'] * 1e6:>16.1f}"
              f"{t['torch vmap'] * 1e6:>16.1f}{t['matmuls alone'] * 1e6:>16.1f}  {q['jvpc batched']:>14.3f}"
              f"{q['torch vmap']:>14.3f}{q['matmuls alone']:>14.3f}  {row['batched_over_floor']:>10.3f}")
    print("matmuls alone: the batched graph's matmul kernels only (the same FLOPs, checked): "
          + "; ".join(f"K={row['K']} {row['matmul_flops']:,} FLOPs" for row in rows))
    if args.json:
        with open(args.json + ".tmp", "w") as fh:
            json.dump({"config": config, "rows": rows}, fh, indent=1)
        os.replace(args.json + ".tmp", args.json)


if __name__ == "__main__":
    main()
