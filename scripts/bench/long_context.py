#!/usr/bin/env python3
"""The long-context benchmark: the JVP of attention at 2k to 32k tokens, under a memory limit.

Attention B1 H16 D64 float32 (H4 at L = 32768), four rows per length:
  torch.func.linearize   PyTorch, the math backend (LibTorch has no forward AD for the fused kernels)
  forward AD             PyTorch's torch.autograd.forward_ad, the math backend
  jvpc P                 jvpc_bench --residual-budget inf (the tangent holds the probabilities P)
  jvpc O(L)              jvpc_bench --residual-budget 0 (jvpc::attention_tangent)
jvpc runs on the fused CPU kernel (--backend auto): the math path's forward is O(L²) itself.

Each configuration runs in its own process: one linearize (where the row has one), one untimed
warm-up jvp call and three timed ones. A watchdog polls the child's resident memory (VmRSS) and
kills it when it passes --limit, or when the machine's available memory falls under --reserve (the
OOM killer is never reached); such a run reads "does not fit", at the stage it reached, and the
row's configurations with as many scores (H·L²) or more are not run (they read "does not fit"). Peak RSS is
the kernel's own high-water mark of the child (wait4's ru_maxrss) where it finished, else the
largest VmRSS the watchdog saw. A run also stops at --timeout, and runs that would start after
--max-minutes are not run.

  python3 scripts/bench/long_context.py --jvpc-bench build/jvpc_bench --out build/bench-long
      [--lengths 2048,4096,8192,16384,32768] [--limit 16GiB] [--max-minutes 30]
Writes OUT/long_<row>_<L>.json per run, OUT/long_table.md and OUT/long_memory.png (matplotlib).
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

ROWS = ["torch_linearize", "torch_forward_ad", "jvpc_p", "jvpc_ol"]
LABELS = {"torch_linearize": "PyTorch torch.func.linearize (math)", "torch_forward_ad": "PyTorch forward AD (math)",
          "jvpc_p": "jvpc P (auto)", "jvpc_ol": "jvpc O(L) (auto)"}
HEAD_DIM = 64
STAGE = "long_context: stage "  # a child's progress line on stderr


def heads_for(seq):
    return 4 if seq >= 32768 else 16


def parse_size(text):
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    return int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)


# ----------------------------------------------------------------------------------------------
# The PyTorch children


def torch_child(args):
    import torch
    import torch.nn.functional as F
    from torch.autograd import forward_ad as fwAD
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    shape = (1, args.heads, args.seq_len, HEAD_DIM)
    q, k, v = (torch.randn(shape) for _ in range(3))
    gen = torch.Generator().manual_seed(1)
    tq, tk, tv = (torch.randn(shape, generator=gen) for _ in range(3))

    def f(q, k, v):
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v)

    result = {"row": args.child, "seq": args.seq_len, "heads": args.heads}
    if args.child == "torch_linearize":
        t0 = time.perf_counter()
        _, jvp_fn = torch.func.linearize(f, q, k, v)
        result["linearize_s"] = time.perf_counter() - t0
        print(STAGE + "linearized", file=sys.stderr, flush=True)

        def call():
            return jvp_fn(tq, tk, tv)
    else:
        def call():
            with fwAD.dual_level():
                out = f(fwAD.make_dual(q, tq), fwAD.make_dual(k, tk), fwAD.make_dual(v, tv))
                return fwAD.unpack_dual(out).tangent

    with torch.no_grad():
        call()  # warm-up
        print(STAGE + "called", file=sys.stderr, flush=True)
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
    result["jvp_times_s"] = times
    result["jvp_time_s"] = statistics.median(times)
    with open(args.json, "w") as fh:
        json.dump(result, fh, indent=1)


# ----------------------------------------------------------------------------------------------
# The watchdog


def rss_bytes(pid):
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def available_bytes():
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 1 << 62


def run_limited(cmd, log_path, limit, reserve, timeout):
    """Runs cmd under the watchdog: (status, peak_rss_bytes, seconds, stages)."""
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
    seen, status = 0, None
    while True:
        pid, wstatus, usage = os.wait4(child.pid, os.WNOHANG)
        if pid:
            peak = max(seen, usage.ru_maxrss * 1024)
            if status is None:
                status = "ok" if os.waitstatus_to_exitcode(wstatus) == 0 else "failed"
            break
        seen = max(seen, rss_bytes(child.pid))
        if status is None:
            if seen > limit:
                status = "does not fit"
            elif available_bytes() < reserve:
                status = "does not fit (the machine ran low)"
            elif time.monotonic() - t0 > timeout:
                status = "timed out"
            if status:
                os.kill(child.pid, signal.SIGKILL)
        time.sleep(0.02)
    with open(log_path) as fh:
        text = fh.read()
    stages = {line[len(STAGE):].strip() for line in text.splitlines() if line.startswith(STAGE)}
    if "jvpc_bench: linearized" in text:
        stages.add("linearized")
    if "jvpc_bench: warm-up call in" in text:
        stages.add("called")
    # The calls a stopped run finished (jvpc_bench prints each).
    done = [float(line.split()[-2]) for line in text.splitlines() if line.startswith("jvpc_bench: timed call in")]
    if done:
        stages.add("timed " + " ".join(f"{t:.1f}" for t in done))
    if status == "failed":
        status = "failed: " + (text.strip().splitlines() or ["?"])[-1][:160]
    return status, peak, time.monotonic() - t0, stages


# ----------------------------------------------------------------------------------------------
# The table and the plot


def gib(b):
    return f"{b / (1 << 30):.2f} GiB"


def table(results, limit, note):
    lines = [f"Memory limit {gib(limit)} of resident memory per run (watchdog on VmRSS). {note}", "",
             "| L | H | row | linearize | jvp call | peak RSS | time per jvp call | P alone |",
             "|---:|---:|---|---|---|---:|---:|---:|"]
    for r in results:
        has_lin = r["row"] != "torch_forward_ad"
        lin = "—" if not has_lin else ("fits" if "linearized" in r["stages"] or r["status"] == "ok" else r["status"])
        if r["status"] == "ok":
            call = "fits"
        elif "called" in r["stages"]:  # stopped later: a call did fit
            timed = [st for st in r["stages"] if st.startswith("timed ")]
            call = f"fits ({r['status']} after the warm-up call" + (
                f" and timed calls of {timed[0][6:]} s)" if timed else ")")
        else:
            call = "not reached" if has_lin and lin != "fits" else r["status"]
        timed = [float(x) for st in r["stages"] if st.startswith("timed ") for x in st.split()[1:]]
        t = (f"{r['jvp_time_s']:.3f} s" if "jvp_time_s" in r else
             f"{statistics.median(timed):.1f} s ({len(timed)} of 3 calls)" if timed else "—")
        p_alone = 4 * r["heads"] * r["seq"] ** 2
        lines.append(f"| {r['seq']} | {r['heads']} | {LABELS[r['row']]} | {lin} | {call} | "
                     f"{gib(r['peak_rss']) if r['peak_rss'] else '—'} | {t} | {gib(p_alone)} |")
    return "\n".join(lines) + "\n"


def plot(results, limit, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: no plot", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for row, marker in zip(ROWS, "os^D"):
        pts = [r for r in results if r["row"] == row and r["peak_rss"]]
        # A run stopped for time after a call still measured what a call takes.
        ok = [r for r in pts if r["status"] == "ok" or "called" in r["stages"]]
        bad = [r for r in pts if r["status"].startswith("does not fit")]
        line, = ax.plot([r["seq"] for r in ok], [r["peak_rss"] / (1 << 30) for r in ok], marker + "-",
                        label=LABELS[row])
        if bad:
            ax.plot([r["seq"] for r in bad], [r["peak_rss"] / (1 << 30) for r in bad], "x", color=line.get_color(),
                    markersize=9)
    ax.axhline(limit / (1 << 30), color="grey", linestyle=":", label="limit (x: killed, does not fit)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length L (H16; H4 at 32768)")
    ax.set_ylabel("peak RSS (GiB)")
    ax.set_title("JVP of attention, B1 D64 float32, CPU", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jvpc-bench", default="build/jvpc_bench")
    p.add_argument("--out", default="build/bench-long")
    p.add_argument("--lengths", default="2048,4096,8192,16384,32768")
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--limit", default="16GiB", help="resident memory per run")
    p.add_argument("--reserve", default="1GiB", help="kill a run when the machine's available memory falls under this")
    p.add_argument("--timeout", type=float, default=900, help="seconds per run")
    p.add_argument("--max-minutes", type=float, default=30, help="runs that would start later are not run")
    p.add_argument("--note", default="", help="a line for the table (the machine's load)")
    p.add_argument("--threads", type=int, help="OMP_NUM_THREADS for every run (default: the machine's default)")
    p.add_argument("--replot", action="store_true", help="only the table and plot again, from OUT/long_results.json")
    p.add_argument("--child", choices=["torch_linearize", "torch_forward_ad"], help=argparse.SUPPRESS)
    p.add_argument("--seq-len", type=int, help=argparse.SUPPRESS)
    p.add_argument("--heads", type=int, help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return torch_child(args)

    limit, reserve = parse_size(args.limit), parse_size(args.reserve)
    if args.replot:
        with open(os.path.join(args.out, "long_results.json")) as fh:
            results = [{**r, "stages": set(r["stages"])} for r in json.load(fh)]
        md = table(results, limit, args.note)
        with open(os.path.join(args.out, "long_table.md"), "w") as fh:
            fh.write(md)
        plot(results, limit, os.path.join(args.out, "long_memory.png"))
        print(md)
        return 0
    os.makedirs(args.out, exist_ok=True)
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    start = time.monotonic()
    too_big = {}  # row -> H·L² of a configuration that did not fit: larger ones are not run
    results = []
    for seq in [int(s) for s in args.lengths.split(",")]:
        heads = heads_for(seq)
        for row in args.rows.split(","):
            name = f"long_{row}_{seq}"
            out_json = os.path.join(args.out, name + ".json")
            if os.path.exists(out_json):
                os.remove(out_json)
            if row.startswith("torch"):
                cmd = [sys.executable, os.path.abspath(__file__), "--child", row, "--seq-len", str(seq), "--heads",
                       str(heads), "--json", out_json]
            else:
                cmd = [args.jvpc_bench, "sdpa", "--bsz", "1", "--model-dim", str(heads * HEAD_DIM), "--head-dim",
                       str(HEAD_DIM), "--seq-len", str(seq), "--dtype", "float32", "--device", "cpu", "--backend",
                       "auto", "--residual-budget", "inf" if row == "jvpc_p" else "0", "--lean", "--warmup", "1",
                       "--repeats", "3", "--json", out_json]
            r = {"row": row, "seq": seq, "heads": heads}
            if row in too_big and heads * seq * seq >= too_big[row][0]:
                r.update(status=f"does not fit (not run: L={too_big[row][1]} did not, with fewer scores)", peak_rss=0,
                         stages=set(), seconds=0)
            elif (time.monotonic() - start) / 60 > args.max_minutes:
                r.update(status="not run (time)", peak_rss=0, stages=set(), seconds=0)
            else:
                status, peak, secs, stages = run_limited(cmd, os.path.join(args.out, name + ".log"), limit, reserve,
                                                         args.timeout)
                r.update(status=status, peak_rss=peak, stages=stages, seconds=secs)
                if status.startswith("does not fit") and row not in too_big:
                    too_big[row] = (heads * seq * seq, seq)
                if status == "ok":
                    with open(out_json) as fh:
                        r.update({k: v for k, v in json.load(fh).items() if k in ("jvp_time_s", "linearize_s")})
            print(f"[long] L={seq} H={heads} {row}: {r['status']}, peak RSS {gib(r['peak_rss'])}, "
                  f"{r.get('jvp_time_s', float('nan')):.3f} s per call, {r['seconds']:.0f} s", file=sys.stderr,
                  flush=True)
            results.append(r)
    note = args.note + f" Whole run: {(time.monotonic() - start) / 60:.1f} min."
    if args.threads:
        note += f" OMP_NUM_THREADS={args.threads} in every run."
    md = table(results, limit, note)
    with open(os.path.join(args.out, "long_table.md"), "w") as fh:
        fh.write(md)
    with open(os.path.join(args.out, "long_results.json"), "w") as fh:
        json.dump([{**r, "stages": sorted(r["stages"])} for r in results], fh, indent=1)
    plot(results, limit, os.path.join(args.out, "long_memory.png"))
    print(md)


if __name__ == "__main__":
    sys.exit(main())
