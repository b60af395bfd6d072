#!/usr/bin/env python3
"""jvpc's jvp_fn from Python beside PyTorch's, in one process.

For one configuration (the functions and inputs of torch_reference.py, which are those of
examples/sdpa.cpp and examples/block.cpp), it linearizes once with jvpc.linearize and once with
torch.func.linearize, compiles PyTorch's jvp_fn with torch.compile, and then times the three
jvp_fn calls in interleaved rounds (one call of each per round, in a rotating order, after a
warm-up), so that all three meet the same machine state. It prints the median time of each and
the ratios to PyTorch's eager jvp_fn. A fourth timed call, "matmuls alone", runs only the matmul
kernels of jvpc's tangent graph (same sizes, strides and dtype, into preallocated outputs): the
floor of any jvp_fn that does that arithmetic. At --seq-len 1 the calls are almost free of
arithmetic, so jvpc's median there is its fixed cost per call from Python.

  PYTHONPATH=build/python python3 scripts/bench/python_bench.py --config sdpa
  PYTHONPATH=build/python python3 scripts/bench/python_bench.py --config sdpa --seq-len 1
  PYTHONPATH=build/python python3 scripts/bench/python_bench.py --config block
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

warnings.filterwarnings("ignore")

# The ops whose FLOPs the cost model counts as matmul FLOPs (compiler/cost/cost_model.cpp).
MATMULS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::convolution", "jvpc::attention_tangent"}


def matmuls_alone(graph_json, seed):
    """A callable that runs only the tangent graph's matmul kernels, on operands of the same sizes,
    strides and dtypes (random values) and into preallocated outputs where the op has an out=
    form: the floor a call cannot go under without doing less arithmetic. Returns (call, count)."""
    g = json.loads(graph_json)
    metas = {v["id"]: v["meta"] for v in g["inputs"]}
    for n in g["nodes"]:
        for o in n["outputs"]:
            metas[o["id"]] = o["meta"]
    gen = torch.Generator().manual_seed(seed)

    def tensor(meta):
        dtype = getattr(torch, {"Float": "float32", "Double": "float64", "Half": "float16",
                                "BFloat16": "bfloat16", "Bool": "bool", "Long": "int64"}[meta["dtype"]])
        t = torch.empty_strided(meta["sizes"], meta["strides"], dtype=dtype, device=meta["device"])
        if dtype.is_floating_point:
            t.copy_(torch.randn(t.shape, generator=gen).to(dtype))
        else:
            t.zero_()
        return t

    calls = []
    for n in g["nodes"]:
        if n["op"] not in MATMULS:
            continue
        ns, name = n["op"].split("::")
        base, _, overload = name.partition(".")
        packet = getattr(getattr(torch.ops, ns), base)
        schema = getattr(packet, overload or "default")._schema
        args, kwargs = [], {}
        for a, spec in zip(schema.arguments, n["args"]):
            (kind, value), = spec.items()
            v = tensor(metas[value]) if kind == "tensor" else None if kind == "none" else value
            if a.kwarg_only:
                kwargs[a.name] = v
            else:
                args.append(v)
        if not overload and hasattr(packet, "out"):
            out = tensor(n["outputs"][0]["meta"])
            calls.append(lambda op=packet.out, a=args, k=kwargs, o=out: op(*a, **k, out=o))
        else:
            calls.append(lambda op=getattr(packet, overload or "default"), a=args, k=kwargs: op(*a, **k))

    def run():
        for c in calls:
            c()
    return run, len(calls)


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
    floor, n_matmuls = matmuls_alone(jvpc_fn.to_json(), ref.TANGENT_SEED)

    reference = calls["torch.func eager"]()
    for name, call in calls.items():  # the same tangent map, before any timing
        got = call()
        if name == "jvpc":  # the same structure as torch.func's (a tensor out)
            if not isinstance(got, torch.Tensor):
                sys.exit(f"python_bench: jvpc's jvp_fn returned {type(got).__name__}, not a tensor")
        err = (got - reference).abs().max().item() / max(reference.abs().max().item(), 1e-30)
        if err > 1e-4:
            sys.exit(f"python_bench: {name} differs from torch.func's jvp_fn (relative error {err:.2e})")

    floor_name = f"jvpc's {n_matmuls} matmuls alone"
    calls[floor_name] = floor
    names = list(calls)
    with torch.no_grad():
        med = ref.interleaved_medians(calls, args.warmup, args.rounds)
    base = med["torch.func eager"]
    config = (f"{args.config}: bsz {args.bsz}, model dim {args.model_dim}, head dim {args.head_dim}, "
              f"seq {args.seq_len}{', causal' if args.causal else ''}, float32, CPU, torch {torch.__version__}, "
              f"{torch.get_num_threads()} threads, {args.rounds} interleaved rounds")
    print(config)
    w = max(len(n) for n in names) + 2
    print(f"{'jvp_fn call':<{w}}{'median':>12}{'vs torch.func eager':>22}")
    for n in names:
        print(f"{n:<{w}}{med[n] * 1e6:>10.1f} us{med[n] / base:>22.3f}")
    if args.json:
        out = {"config": config, "median_s": med, "ratio_to_torch_func_eager": {n: med[n] / base for n in names}}
        with open(args.json + ".tmp", "w") as fh:
            json.dump(out, fh, indent=1)
        os.replace(args.json + ".tmp", args.json)


if __name__ == "__main__":
    main()
