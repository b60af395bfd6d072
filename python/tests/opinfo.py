#!/usr/bin/env python3
"""jvpc against PyTorch's OpInfo database: every op with supports_forward_ad, every sample input,
float64, CPU; every floating tensor of the sample's input, args and kwargs gets a tangent.

Reference: torch.func.jvp; where the two disagree, central differences decide (LibTorch's forward
AD is wrong in places): a 3-point stencil at step 1e-6 or a 5-point one at 1e-3, whichever shows
jvpc within 1e-5 and closer than the reference. Both differentiate what OpInfo's own derivative
tests do: the op's outputs through the sample's output_process_fn_grad. Each sample is one of:
  matching  (relative error <= 1e-7 against the reference, or against central differences where
             the reference disagrees with them; tangents below 1e-5 of the outputs' magnitude
             count as that large, an absolute tolerance of 1e-12 of it, for zero derivatives;
             NaN or infinite entries of the reference must be jvpc's too and are left out, as
             are entries where f(x) is NaN)
  refused   (a clear jvpc.Error)
  wrong     (anything else; a crash or a hang of the op's subprocess counts every sample of it)
  excluded  (the reference itself fails, or the op is random)
Each op runs in a subprocess with a timeout. Prints the counts per op and a total.

  PYTHONPATH=build/python python3 scripts/opinfo.py [--ops sin,mm,...] [--timeout 120] [--json out.json]
Exit status 1 if any sample is wrong (CI runs a fixed subset: --ops-file scripts/opinfo-ci.txt, in
shards: ctest's python_opinfo_subset_K runs this file with --shard K/3).
"""

import argparse
import json
import os
import subprocess
import sys

REL = 1e-7
# Tangents smaller than FLOOR times the primal outputs' magnitude count as that large in the
# relative error: where the derivative is zero (corrcoef of two columns is ±1 everywhere), both
# jvpc and the reference return rounding noise, ~1e-16 of the output, whose relative difference
# means nothing. An absolute tolerance of REL·FLOOR = 1e-12 of the output's scale.
FLOOR = 1e-5


def magnitude(ts):
    """The largest finite |entry| of the tensors (0 if none)."""
    import torch
    return max((t[torch.isfinite(t)].abs().max().item() if torch.isfinite(t).any() else 0.0) for t in ts) if ts else 0.0


def rel_error(a, b, scale=0.0):
    num = max((x - y).abs().max().item() if x.numel() else 0.0 for x, y in zip(a, b)) if a else 0.0
    den = max(y.abs().max().item() if y.numel() else 0.0 for y in b) if b else 0.0
    return num / max(den, FLOOR * scale, 1e-300) if num else 0.0


def floating_leaves(tree):
    import torch
    from torch.utils import _pytree as pytree
    return [x for x in pytree.tree_leaves(tree) if isinstance(x, torch.Tensor) and x.is_floating_point()]


def run_sample(op, sample):
    import torch
    from torch.utils import _pytree as pytree
    import jvpc

    tree = (sample.input, sample.args, sample.kwargs)
    leaves, spec = pytree.tree_flatten(tree)
    slots = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor) and x.is_floating_point()]
    if not slots:
        return "excluded", "no floating input"
    primals = tuple(leaves[i].detach().clone() for i in slots)
    gen = torch.Generator().manual_seed(0)
    tangents = tuple(torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in primals)

    def f(*xs):
        ls = list(leaves)
        for i, x in zip(slots, xs):
            ls[i] = x
        inp, args, kwargs = pytree.tree_unflatten(ls, spec)
        # What OpInfo's own derivative tests differentiate: outputs made well defined (svd's
        # singular vectors up to sign and without full_matrices' extra columns, for one).
        out = sample.output_process_fn_grad(op(inp, *args, **kwargs))
        return tuple(floating_leaves(out))

    try:
        out, ref = torch.func.jvp(f, primals, tangents)
    except Exception as e:  # the reference fails
        return "excluded", "reference: " + str(e).splitlines()[0][:120] if str(e) else type(e).__name__
    if not ref:
        return "excluded", "no floating output"
    try:
        _, got = jvpc.jvp(f, primals, tangents)
    except jvpc.Error as e:
        if "is random" in str(e):
            return "excluded", "random"
        return "refused", str(e)[:160]
    except Exception as e:
        return "wrong", f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    got = tuple(got)
    if len(got) != len(ref) or any(g.shape != r.shape for g, r in zip(got, ref)):
        return "wrong", "shapes differ"
    scale = magnitude(out)
    # Entries where the reference is NaN or infinite are compared for equality (NaN to NaN) and
    # then left out; where jvpc differs there, central differences decide them with the rest.
    # Entries where f(x) itself is NaN have no derivative to compare (max_norm of a NaN column:
    # torch.func gives 0 there, jvpc NaN): left out as well.
    keep = [(torch.isfinite(r) | ~((g == r) | (g.isnan() & r.isnan()))) & ~o.isnan() for g, r, o in zip(got, ref, out)]

    def cut(ts):
        return tuple(t.where(k, 0) for t, k in zip(ts, keep))

    differ = any((k & ~torch.isfinite(r)).any() for k, r in zip(keep, ref))  # non-finite, and not jvpc's
    got, ref = cut(got), cut(ref)
    if not differ and rel_error(got, ref, scale) <= REL:
        return "matching", ""
    best = None
    for fd in central_differences(f, primals, tangents):
        fd = cut(fd)
        e_got, e_ref = rel_error(got, fd, scale), rel_error(ref, fd, scale)
        if e_got <= 1e-5 and e_got < e_ref:
            return "matching", f"reference off by {e_ref:.1e} from central differences"
        best = e_got if best is None else min(best, e_got)
    return "wrong", f"rel error {rel_error(got, ref, scale):.2e} vs reference, {best:.1e} vs central differences"


def central_differences(f, primals, tangents):
    """Two estimates of the directional derivative: the 3-point stencil at step 1e-6, and the
    5-point one at step 1e-3 (error O(h⁴)), for outputs so large (logcumsumexp of 1e4) that
    rounding swamps the first (an error of eps·|f|/h)."""
    def at(h):
        return f(*(p + h * t for p, t in zip(primals, tangents)))

    h = 1e-6
    plus, minus = at(h), at(-h)
    yield tuple((a - b) / (2 * h) for a, b in zip(plus, minus))
    h = 1e-3
    p1, m1, p2, m2 = at(h), at(-h), at(2 * h), at(-2 * h)
    yield tuple((8 * (a - b) - (c - d)) / (12 * h) for a, b, c, d in zip(p1, m1, p2, m2))


def worker(name):
    import torch
    import jvpc  # noqa: F401
    from torch.testing._internal.common_methods_invocations import op_db

    counts = {"matching": 0, "refused": 0, "wrong": 0, "excluded": 0}
    notes = {}
    for op in op_db:
        if f"{op.name}.{op.variant_test_name}".rstrip(".") != name:
            continue
        for sample in op.sample_inputs("cpu", torch.float64, requires_grad=False):
            try:
                cls, why = run_sample(op, sample)
            except Exception as e:
                cls, why = "wrong", f"{type(e).__name__}: {e}"[:160]
            counts[cls] += 1
            if why and cls != "matching":
                notes.setdefault(cls, why)
    print(json.dumps({"counts": counts, "notes": notes}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", help="comma-separated op names (name.variant), default: all with forward AD")
    ap.add_argument("--ops-file", help="a file with one op name per line")
    ap.add_argument("--timeout", type=float, default=180, help="seconds per op")
    ap.add_argument("--json", help="write the per-op results here")
    ap.add_argument("--shard", metavar="K/N", help="run the K-th of N interleaved parts of the ops (1/3, 2/3, 3/3)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    shard = None
    if a.shard:
        try:
            k, n = (int(v) for v in a.shard.split("/"))
        except ValueError:
            ap.error(f"--shard: expected K/N, such as 1/3, not {a.shard!r}")
        if not 1 <= k <= n:
            ap.error(f"--shard: K must be from 1 to N, not {a.shard!r}")
        shard = (k, n)
    if a.worker:
        return worker(a.worker)
    if a.ops:
        ops = a.ops.split(",")
    elif a.ops_file:
        ops = [l.strip() for l in open(a.ops_file) if l.strip() and not l.startswith("#")]
    else:
        from torch.testing._internal.common_methods_invocations import op_db
        ops = sorted({f"{op.name}.{op.variant_test_name}".rstrip(".") for op in op_db if op.supports_forward_ad})
    if shard:
        ops = ops[shard[0] - 1::shard[1]]
    total = {"matching": 0, "refused": 0, "wrong": 0, "excluded": 0}
    results = {}
    print(f"{'op':40} {'match':>6} {'refused':>7} {'wrong':>6} {'excl':>5}  note")
    for name in ops:
        try:
            p = subprocess.run([sys.executable, __file__, "--worker", name], capture_output=True, text=True,
                               timeout=a.timeout, env=os.environ)
            line = p.stdout.strip().splitlines()[-1] if p.returncode == 0 and p.stdout.strip() else None
            r = json.loads(line) if line else {"counts": {"wrong": 1}, "notes": {"wrong": f"crashed (exit {p.returncode}): "
                                                                                   + (p.stderr.strip().splitlines() or [''])[-1][:120]}}
        except subprocess.TimeoutExpired:
            r = {"counts": {"wrong": 1}, "notes": {"wrong": f"timed out after {a.timeout:.0f} s"}}
        c = {k: r["counts"].get(k, 0) for k in total}
        for k in total:
            total[k] += c[k]
        results[name] = r
        note = r["notes"].get("wrong") or r["notes"].get("refused") or ""
        print(f"{name:40} {c['matching']:6} {c['refused']:7} {c['wrong']:6} {c['excluded']:5}  {note[:90]}", flush=True)
    considered = sum(total.values()) - total["excluded"]
    cover = total["matching"] / considered if considered else 0.0
    print(f"{'total':40} {total['matching']:6} {total['refused']:7} {total['wrong']:6} {total['excluded']:5}  "
          f"coverage {100 * cover:.1f}% (matching / not excluded)")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"total": total, "ops": results}, fh, indent=1)
    return 1 if total["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
