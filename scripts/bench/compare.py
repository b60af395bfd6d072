"""Side-by-side table of jvpc and PyTorch from the JSON files scripts/bench/bench.sh writes.

    python3 scripts/bench/compare.py OUT_DIR [--markdown table.md] [--plot seq_sweep.png]

OUT_DIR holds jvpc_<name>.json (from build/jvpc_bench) and torch_<name>.json (from
torch_reference.py) per configuration. Ratios are jvpc / PyTorch: below 1 means jvpc spends less.
"""
import argparse
import glob
import json
import os
import re
import sys

import torch


def load_pairs(out_dir):
    pairs = {}
    for path in sorted(glob.glob(os.path.join(out_dir, "jvpc_*.json"))):
        name = os.path.basename(path)[len("jvpc_"):-len(".json")]
        other = os.path.join(out_dir, f"torch_{name}.json")
        if os.path.exists(other):
            with open(path) as a, open(other) as b:
                pairs[name] = (json.load(a), json.load(b))
    for path in sorted(glob.glob(os.path.join(out_dir, "*_*.json"))):
        side, name = os.path.basename(path)[:-len(".json")].split("_", 1)
        if name not in pairs:
            print(f"compare.py: {name}: only the {side} side has results; left out", file=sys.stderr)
    return pairs


def fmt_time(s):
    return f"{s * 1e3:.3f} ms" if s >= 1e-4 else f"{s * 1e6:.1f} µs"


def fmt_bytes(n):
    return f"{n:,} B" if n < 1024 else f"{n / 1024:,.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):,.2f} MiB"


def ratio(a, b):
    return f"{a / b:.3f}" if b else "—"


def row(label, a, b, key, fmt):
    """One quantity of two phases; a phase that failed shows its reason instead."""
    def cell(p):
        return fmt(p[key]) if key in p else p.get("unavailable", "—")
    return (label, cell(a), cell(b), ratio(a[key], b[key]) if key in a and key in b else "—")


def rows_for(j, t):
    jp, tp = j["phases"], t["phases"]
    flops = lambda n: f"{n:,}"  # noqa: E731
    rows = [
        row("matmul FLOPs, linearize", jp["linearize"], tp["linearize"], "matmul_flops", flops),
        row("matmul FLOPs, first jvp call", jp["jvp_fn_first"], tp["jvp_fn_first"], "matmul_flops", flops),
        row("matmul FLOPs, later jvp calls", jp["jvp_fn_later"], tp["jvp_fn_later"], "matmul_flops", flops),
        row("time, linearize", jp["linearize"], tp["linearize"], "time_s", fmt_time),
        row("time, first jvp call (PyTorch folds here)", jp["jvp_fn_first"], tp["jvp_fn_first"], "time_s", fmt_time),
        row("time per jvp call (later calls), vs eager jvp_fn", jp["jvp_fn_later"], tp["jvp_fn_later"], "time_s", fmt_time),
    ]
    for key, label in (("compiled_jvp_fn", "torch.compile(jvp_fn)"), ("cudagraph_jvp_fn", "CUDA-graphed jvp_fn")):
        rows.append(row(f"time per jvp call, vs {label}", jp["jvp_fn_later"], tp.get(key, {"unavailable": "not measured"}),
                        "time_s", fmt_time))
    rows += [
        row("time per call, LibTorch forward AD (C++) / PyTorch forward AD", jp["forward_ad"], tp["forward_ad"], "time_s",
            fmt_time),
        row("residual bytes held", j, t, "residual_bytes", fmt_bytes),
        ("  plus bytes aliasing the caller's inputs", fmt_bytes(j["aliased_input_bytes"]), fmt_bytes(t["aliased_input_bytes"]), "—"),
        row("peak bytes per later jvp call", jp["jvp_fn_later"], tp["jvp_fn_later"], "peak_bytes", fmt_bytes),
    ]
    alone = jp.get("matmuls_alone")
    if alone:  # jvpc against the floor of its own kernels, not against PyTorch
        rows.append((f"jvpc jvp call vs its {alone['kernels']} matmuls alone (same shapes, dtype): ratio jvpc / matmuls",
                     f"{fmt_time(jp['jvp_fn_later']['time_s'])} vs {fmt_time(alone['time_s'])}", "—",
                     ratio(jp["jvp_fn_later"]["time_s"], alone["time_s"])))
    compile_ = jp.get("compile")
    if compile_:  # jvpc's compile time: medians of interleaved pairs timed in one process
        n = compile_["runs"]
        rows += [
            (f"compile: forward (median of {n} interleaved pairs)", fmt_time(compile_["forward_s"]), "—", "—"),
            (f"compile: linearize call (same {n} pairs)", fmt_time(compile_["linearize_s"]), "—", "—"),
            (f"compile: linearize minus forward (median of the {n} differences)",
             fmt_time(compile_["linearize_minus_forward_s"]), "—", "—"),
        ]
    prog = jp.get("program_linearize")
    if prog:  # compile once, linearize anywhere (compiler/api/program.h): the primal graph alone
        n = prog["runs"]
        held = prog["residual_bytes"] + prog["forward_peak_bytes"]
        rows += [
            row("matmul FLOPs, linearize at a new point, compiled program", prog, tp["linearize"], "matmul_flops", flops),
            row("time, linearize at a new point, compiled program (vs torch.func.linearize)", prog, tp["linearize"],
                "time_s", fmt_time),
            (f"  ...against the plain forward in the same process (medians of {n} interleaved pairs): "
             "ratio program / forward", f"{fmt_time(prog['time_s'])} vs {fmt_time(prog['forward_s'])}", "—",
             ratio(prog["time_s"], prog["forward_s"])),
            ("  ...peak bytes of that linearize vs residuals + the forward's peak",
             f"{fmt_bytes(prog['peak_bytes'])} vs {fmt_bytes(held)}", "—", ratio(prog["peak_bytes"], held)),
        ]
    return rows


def load_averages(out_dir):
    """{configuration: {"jvpc": load, "PyTorch": load}}: the 1-minute load average as each side
    started, from the load.txt bench.sh writes (lines "NAME (SIDE)|LOAD"); empty without one."""
    loads = {}
    try:
        with open(os.path.join(out_dir, "load.txt")) as f:
            for line in f:
                m = re.match(r"^(\S+) \((jvpc|PyTorch)\)\|([0-9.]+)$", line.strip())
                if m:
                    loads.setdefault(m.group(1), {})[m.group(2)] = float(m.group(3))
    except OSError:
        pass
    return loads


def load_line(load):
    """The load each side met, for a table's heading; the two sides run one after the other."""
    if not load:
        return []
    sides = ", ".join(f"{side} {load[side]:.2f}" for side in ("jvpc", "PyTorch") if side in load)
    return [f"Load average (1 min) as each side started: {sides} (each side runs in its own process, one after "
            "the other: the time ratios read both loads).", ""]


def same_config(name, j, t):
    """Both sides must have measured the same configuration (their descriptions differ only in
    how the backend is named)."""
    if j["config"].replace("backend=", "") != t["config"]:
        sys.exit(f"compare.py: {name}: jvpc measured '{j['config']}' but PyTorch '{t['config']}'")


def markdown(pairs, loads=None):
    loads = loads or {}
    lines = []
    for name, (j, t) in pairs.items():
        same_config(name, j, t)
        if name.startswith("seq"):
            continue
        lines += [f"**{name}**: {j['config']} — {j['device']}", ""] + load_line(loads.get(name))
        lines += ["| quantity | jvpc | PyTorch | jvpc / PyTorch |", "|---|---:|---:|---:|"]
        lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows_for(j, t)]
        lines.append("")
    sweep = sorted(((int(re.sub(r"\D", "", n)), j, t) for n, (j, t) in pairs.items() if n.startswith("seq")),
                   key=lambda x: x[0])
    if sweep:
        lines += ["**time per jvp call against sequence length** (sdpa, seed sizes otherwise)", "",
                  "| seq | jvpc | PyTorch jvp_fn | ratio | LibTorch forward AD (C++) |", "|---:|---:|---:|---:|---:|"]
        for s, j, t in sweep:
            _, a, b, r = row("", j["phases"]["jvp_fn_later"], t["phases"]["jvp_fn_later"], "time_s", fmt_time)
            ad = j["phases"]["forward_ad"]
            lines.append(f"| {s} | {a} | {b} | {r} | {fmt_time(ad['time_s']) if 'time_s' in ad else ad.get('unavailable')} |")
        lines.append("")
        swept = [(s, loads[f"seq{s}"]) for s, _, _ in sweep if f"seq{s}" in loads]
        if swept:
            lines += ["Load average (1 min) as each side started, jvpc / PyTorch: " + ", ".join(
                f"seq {s} {ld.get('jvpc', float('nan')):.2f} / {ld.get('PyTorch', float('nan')):.2f}"
                for s, ld in swept) + ".", ""]
    return "\n".join(lines)


def plot(pairs, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: no plot", file=sys.stderr)
        return
    sweep = sorted(((int(re.sub(r"\D", "", n)), j, t) for n, (j, t) in pairs.items() if n.startswith("seq")),
                   key=lambda x: x[0])
    if not sweep:
        return
    seq = [s for s, _, _ in sweep]

    def ms(phase):  # a failed phase leaves a gap
        return phase["time_s"] * 1e3 if "time_s" in phase else float("nan")

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(seq, [ms(j["phases"]["jvp_fn_later"]) for _, j, _ in sweep], "o-", label="jvpc jvp call")
    ax.plot(seq, [ms(t["phases"]["jvp_fn_later"]) for _, _, t in sweep], "s-", label="PyTorch linearize's jvp_fn")
    ax.plot(seq, [ms(t["phases"]["forward_ad"]) for _, _, t in sweep], "^--", label="PyTorch forward AD")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length")
    ax.set_ylabel("time per call (ms, median)")
    ax.set_title(f"SDPA JVP, {sweep[0][1]['device']}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--markdown")
    p.add_argument("--plot")
    args = p.parse_args()
    pairs = load_pairs(args.out_dir)
    if not pairs:
        sys.exit(f"compare.py: no jvpc_*.json / torch_*.json pairs in {args.out_dir}")
    table = markdown(pairs, load_averages(args.out_dir))
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(f"torch {torch.__version__}\n\n{table}\n")
    if args.plot:
        plot(pairs, args.plot)


if __name__ == "__main__":
    main()
