#!/usr/bin/env python3
"""What PyTorch spends to linearize attention and a transformer block.

The PyTorch side of jvpc's benchmark: the same functions as jvpc's examples (examples/sdpa.cpp,
examples/block.cpp), run through torch.func.linearize and the other forward-mode routes. For each
phase it records the matmul FLOPs FlopCounterMode counts in one execution (the profiler's count for
compiled code), the median time and the peak memory of one execution; it also reports the bytes
the linearized function keeps alive. It prints a table and, with --json, writes the numbers.

  PYTHONPATH=build/python python3 scripts/bench/torch_reference.py --config sdpa [--causal] [--json OUT.json]
  PYTHONPATH=build/python python3 scripts/bench/torch_reference.py --config block --seq-len 64 --model-dim 128

jvpc's module gives it only the list of matmul ops whose FLOPs it counts.
"""
import argparse
import contextlib
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import warnings

import torch
from torch.autograd import forward_ad as fwAD
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

import jvpc  # only its list of matmul ops: this side runs PyTorch alone

# The functions are the tests' (python/tests/models.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "tests"))
import models  # noqa: E402

# torch.fx's constant folding (inside linearize) warns on every call about a get_attr it inserts.
warnings.filterwarnings("ignore", message="Attempted to insert a get_attr Node")

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}
ONE_OFF_SAMPLES = 5  # fresh linearize instances timed for the one-off phases
# The ops whose FLOPs count as matmul FLOPs: jvpc's list (ir/ops.cpp), as the profiler names them.
MATMUL_OPS = set(jvpc._C.matmul_ops())
SEED, TANGENT_SEED = 0, 1  # SEED is the default --seed of jvpc's examples


# ----------------------------------------------------------------------------------------------
# The functions and their inputs (the math of examples/sdpa.cpp and examples/block.cpp, in
# python/tests/models.py)


def make_sdpa(args, heads):
    def f(q, k, v):
        return models.attention(q, k, v, args.causal)

    shape = (args.bsz, heads, args.seq_len, args.head_dim)
    return f, [shape, shape, shape], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]


def make_block(args, heads):
    f = models.block_fn(args.bsz, args.seq_len, args.model_dim, args.head_dim, args.causal)
    spec = models.block_inputs(args.bsz, args.seq_len, args.model_dim)
    return f, [p[0] for p in spec], [p[1] for p in spec], [p[2] for p in spec]


def random_tensors(shapes, scales, offsets, seed, dtype, device):
    """Drawn like jvpc's examples: float64 normals from one seeded CPU generator, scaled, shifted,
    then cast and moved, so every device and dtype sees the same numbers."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen, dtype=torch.float64).mul_(scale).add_(offset).to(device, dtype)
            for shape, scale, offset in zip(shapes, scales, offsets)]


# ----------------------------------------------------------------------------------------------
# Measurement tools


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_once(fn, device):
    """Seconds of one fn() call: CUDA events on a GPU, perf_counter on the CPU."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def interleaved_medians(calls, warmup, rounds, device=None):
    """Median seconds of each of `calls` (name -> fn), one call of each per round in an order
    that rotates from round to round, after `warmup` untimed rounds (time_once: perf_counter on
    the CPU, CUDA events with a synchronization around each call on a GPU)."""
    device = device or torch.device("cpu")
    names = list(calls)
    times = {n: [] for n in names}
    for r in range(warmup + rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            dt = time_once(calls[n], device)
            if r >= warmup:
                times[n].append(dt)
    return {n: statistics.median(times[n]) for n in names}


@contextlib.contextmanager
def beside_busy_processes(busy, nice):
    """Runs the block beside `busy` processes that spin on a core each (a DataLoader's workers, a
    build), this process lowered by `nice` for the rest of its life: every thread it has (OpenMP's
    workers included: on Linux a priority is a thread's) and those it starts later. Yields the load
    average read after the spinners started."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        if nice:
            for tid in os.listdir("/proc/self/task"):
                os.setpriority(os.PRIO_PROCESS, int(tid), min(19, os.getpriority(os.PRIO_PROCESS, int(tid)) + nice))
        time.sleep(1.0 if busy else 0.0)  # the spinners are running before the first timed call
        yield os.getloadavg()[0]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def median_time(fn, device, warmup, repeats):
    for _ in range(warmup):
        fn()
    sync(device)
    return statistics.median(time_once(fn, device) for _ in range(repeats))


def matmul_flops(fn):
    """FLOPs FlopCounterMode counts in one fn() call (it counts only the matmul-family ops)."""
    counter = FlopCounterMode(display=False)
    with counter:
        fn()
    return counter.get_total_flops()


def peak_bytes(fn, device):
    """Peak bytes allocated during one fn() call, above what was allocated before it.

    CUDA: the caching allocator's max_memory_allocated, reset before the call, minus
    memory_allocated before it.
    CPU: the profiler with profile_memory=True records every CPU allocation and free made while it
    runs (size, and a negative size for a free). The peak of the running sum of those sizes, in time
    order, is the peak above the starting point; frees of blocks allocated before the call only lower
    the sum. The raw events come from the profiler's event tree (`experimental_event_tree`):
    `prof.events()` folds allocations into their op's `cpu_memory_usage` and keeps only loose ones as
    `[memory]` events, so its order is lost.
    """
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
    sizes = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == torch._C._profiler._EventType.Allocation:
            sizes.append((node.start_time_ns, node.extra_fields.alloc_size))
        stack.extend(node.children)
    running = peak = 0
    for _, size in sorted(sizes):
        running += size
        peak = max(peak, running)
    return peak


def profiler_matmul_flops(fn):
    """FLOPs of the matmul-family ops the profiler records in one fn() call, for compiled code.

    FlopCounterMode cannot count torch.compile'd code: under a TorchDispatchMode dynamo does not run
    the compiled graph, and it marks the function's code object to be skipped from then on, so every
    later call of the compiled function (and of any other torch.compile(jvp_fn)) runs eagerly. The
    profiler is no dispatch mode; inductor calls its matmuls as aten ops (extern kernels), which the
    profiler records with their FLOPs (for eager code this gives FlopCounterMode's numbers).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profile(activities=[ProfilerActivity.CPU], with_flops=True, record_shapes=True) as prof:
            fn()
    return sum(e.flops for e in prof.events() if e.name in MATMUL_OPS)


def measure_repeated(fn, device, args, count_flops=matmul_flops):
    return {"matmul_flops": count_flops(fn), "time_s": median_time(fn, device, args.warmup, args.repeats),
            "peak_bytes": peak_bytes(fn, device)}


def reachable_tensors(root):
    """The real tensors reachable from `root` through Python references.

    linearize returns a closure `jvp_fn` whose cells hold a torch.fx FoldedGraphModule; that module
    keeps the primals and everything computed from them as attributes: `_tensor_constant*` buffers of
    its `const_subgraph_module` (aliases of the primals, before folding) and, after the first call,
    the `_FX_CONST_FOLDED_ATTRS` ParameterList the folding fills. Rather than hard-coding those names,
    follow every reference gc.get_referents reports (closure cells, partial args, module
    __dict__/_parameters/_buffers, containers, fx nodes' meta, ...) from `root`, not entering
    modules, classes or module globals. FakeTensors (the tracing metadata on fx nodes) and meta
    tensors (with --causal, one folded attribute is the mask's zero tangent moved to "meta") own no
    memory and are skipped.
    """
    module_dicts = {id(m.__dict__) for m in list(sys.modules.values()) if hasattr(m, "__dict__")}
    seen, found, stack = set(), [], [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or id(obj) in module_dicts or isinstance(obj, (type, type(sys))):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor) and not isinstance(obj, torch._subclasses.FakeTensor) \
                and obj.device.type != "meta":
            found.append(obj)
        stack.extend(gc.get_referents(obj))
    return found


def residuals(jvp_fn, primals):
    """(bytes, storages) jvp_fn keeps that are not the primals' storage, and the bytes that are.
    Each storage counts once, with its full size."""
    primal_ptrs = {p.untyped_storage().data_ptr() for p in primals}
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in reachable_tensors(jvp_fn)}
    own = {ptr: n for ptr, n in storages.items() if ptr not in primal_ptrs}
    aliased = sum(n for ptr, n in storages.items() if ptr in primal_ptrs)
    return sum(own.values()), len(own), aliased


# ----------------------------------------------------------------------------------------------
# The phases


def collected(value):
    """A linearized function sits in a reference cycle: free each sample's before the next."""
    gc.collect()
    return value


def guarded(name, fn):
    """A phase that fails is reported as unavailable, with its error; the others still run."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - any failure of PyTorch's is a result to report
        message = f"failed: {type(e).__name__}: {e}".splitlines()[0].replace("|", "/")[:160]
        print(f"phase {name}: {message}", file=sys.stderr)
        return {"unavailable": message}


def phase_linearize(f, primals, device):
    def fresh():
        return torch.func.linearize(f, *primals)

    times = [collected(time_once(fresh, device)) for _ in range(ONE_OFF_SAMPLES)]
    return {"matmul_flops": matmul_flops(fresh), "time_s": statistics.median(times),
            "peak_bytes": peak_bytes(fresh, device)}


def phase_jvp_fn_first(f, primals, tangents, device):
    """The first jvp_fn call, which also runs linearize's deferred constant folding; each
    measurement uses a fresh linearize so that it really is the first call."""
    def first_call(measure):
        _, jvp_fn = torch.func.linearize(f, *primals)
        return measure(lambda: jvp_fn(*tangents))

    times = [collected(first_call(lambda fn: time_once(fn, device))) for _ in range(ONE_OFF_SAMPLES)]
    return {"matmul_flops": first_call(matmul_flops), "time_s": statistics.median(times),
            "peak_bytes": first_call(lambda fn: peak_bytes(fn, device))}


def phase_jvp_fn_later(jvp_fn, tangents, device, args):
    return measure_repeated(lambda: jvp_fn(*tangents), device, args)


def phase_func_jvp(f, primals, tangents, device, args):
    return measure_repeated(lambda: torch.func.jvp(f, tuple(primals), tuple(tangents)), device, args)


def phase_forward_ad(f, primals, tangents, device, args):
    def run():
        with fwAD.dual_level():
            out = f(*[fwAD.make_dual(p, t) for p, t in zip(primals, tangents)])
            return fwAD.unpack_dual(out)

    return measure_repeated(run, device, args)


def phase_forward(f, primals, device, args):
    def run():
        with torch.no_grad():
            return f(*primals)

    return measure_repeated(run, device, args)


def unavailable(error):
    """The record of a phase that could not run: the error's type and first line."""
    first_line = (str(error).strip().splitlines() or [""])[0]
    return {"unavailable": f"{type(error).__name__}: {first_line}"[:300]}


class CompileTimeout(BaseException):  # not an Exception: torch.compile catches those internally
    pass


def phase_compiled_jvp_fn(jvp_fn, tangents, device, args):
    """torch.compile(jvp_fn); the first call (the compilation) runs under a SIGALRM time limit.
    Its FLOPs come from the profiler, never FlopCounterMode (see profiler_matmul_flops)."""
    def on_alarm(signum, frame):
        raise CompileTimeout(f"compilation took over {args.compile_timeout} s")

    compiled = torch.compile(jvp_fn)
    previous = signal.signal(signal.SIGALRM, on_alarm)
    try:
        signal.alarm(args.compile_timeout)
        try:
            compile_s = time_once(lambda: compiled(*tangents), device)
        finally:
            signal.alarm(0)
        result = measure_repeated(lambda: compiled(*tangents), device, args, profiler_matmul_flops)
        result["compile_s"] = compile_s
        return result
    except (Exception, CompileTimeout) as e:  # a failed or timed-out compilation is a result, not a crash
        torch._dynamo.reset()
        return unavailable(e)
    finally:
        signal.signal(signal.SIGALRM, previous)


def phase_cudagraph_jvp_fn(jvp_fn, tangents, device, args):
    """jvp_fn captured into a CUDA graph over static tangent buffers, then replayed.

    matmul_flops are those of the ops recorded at capture (a replay dispatches no ops to count);
    peak_bytes is the peak during capture: the graph's private memory pool, which stays allocated
    for replays (a replay itself allocates nothing).
    """
    if device.type != "cuda":
        return {"unavailable": "CUDA graphs need a GPU"}
    try:
        static = [t.clone() for t in tangents]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                jvp_fn(*static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()

        def capture():
            with torch.cuda.graph(graph):
                jvp_fn(*static)

        counter = FlopCounterMode(display=False)
        with counter:
            capture_peak = peak_bytes(capture, device)
        return {"matmul_flops": counter.get_total_flops(),
                "time_s": median_time(graph.replay, device, args.warmup, args.repeats),
                "peak_bytes": capture_peak}
    except Exception as e:
        return unavailable(e)


# ----------------------------------------------------------------------------------------------


def device_name(device):
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown cpu"


def add_config_args(p):
    """The configuration flags (those of jvpc's examples), shared with python_bench.py."""
    p.add_argument("--config", choices=["sdpa", "block"], required=True)
    p.add_argument("--bsz", type=int, default=1)
    p.add_argument("--model-dim", type=int, default=320)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--causal", action="store_true")


def check_config(p, args):
    if args.model_dim % args.head_dim:
        p.error("--model-dim must be a multiple of --head-dim")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_config_args(p)
    p.add_argument("--dtype", choices=list(DTYPES), help="default: float16 on CUDA, float32 on the CPU")
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available")
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--compile-timeout", type=int, default=300, help="seconds allowed for torch.compile")
    p.add_argument("--skip-compile", action="store_true", help="do not measure torch.compile (it takes seconds to minutes)")
    p.add_argument("--json", metavar="OUT.json")
    args = p.parse_args()
    check_config(p, args)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.dtype = args.dtype or ("float16" if args.device == "cuda" else "float32")
    return args


def main():
    args = parse_args()
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    heads = args.model_dim // args.head_dim
    causal = " causal" if args.causal else ""
    if args.config == "sdpa":
        f, shapes, scales, offsets = make_sdpa(args, heads)
        config = f"sdpa bsz={args.bsz} heads={heads} seq={args.seq_len} head_dim={args.head_dim}{causal}"
    else:
        f, shapes, scales, offsets = make_block(args, heads)
        config = f"block bsz={args.bsz} seq={args.seq_len} model_dim={args.model_dim} heads={heads}{causal}"
    config += f" {args.dtype} {device.type} math"
    primals = random_tensors(shapes, scales, offsets, SEED, dtype, device)
    tangents = random_tensors(shapes, [1.0] * len(shapes), [0.0] * len(shapes), TANGENT_SEED, dtype, device)

    started = time.perf_counter()
    phases = {"linearize": guarded("linearize", lambda: phase_linearize(f, primals, device)),
              "jvp_fn_first": guarded("jvp_fn_first", lambda: phase_jvp_fn_first(f, primals, tangents, device))}
    residual_before = residual_after = residual_count = aliased = 0
    try:
        _, jvp_fn = torch.func.linearize(f, *primals)
        residual_before, _, _ = residuals(jvp_fn, primals)
        jvp_fn(*tangents)
        residual_after, residual_count, aliased = residuals(jvp_fn, primals)
    except Exception:  # noqa: BLE001 - reported by the phases that need jvp_fn
        jvp_fn = None
    needs_jvp_fn = {"unavailable": phases["jvp_fn_first"].get("unavailable", "no jvp_fn")}
    phases["jvp_fn_later"] = (guarded("jvp_fn_later", lambda: phase_jvp_fn_later(jvp_fn, tangents, device, args))
                              if jvp_fn else needs_jvp_fn)
    phases["func_jvp"] = guarded("func_jvp", lambda: phase_func_jvp(f, primals, tangents, device, args))
    phases["forward_ad"] = guarded("forward_ad", lambda: phase_forward_ad(f, primals, tangents, device, args))
    phases["forward"] = guarded("forward", lambda: phase_forward(f, primals, device, args))
    phases["compiled_jvp_fn"] = ({"unavailable": "not measured (--skip-compile)"} if args.skip_compile
                                 else guarded("compiled_jvp_fn", lambda: phase_compiled_jvp_fn(jvp_fn, tangents, device, args))
                                 if jvp_fn else needs_jvp_fn)
    phases["cudagraph_jvp_fn"] = (guarded("cudagraph_jvp_fn", lambda: phase_cudagraph_jvp_fn(jvp_fn, tangents, device, args))
                                  if jvp_fn else needs_jvp_fn)

    result = {"config": config, "torch": torch.__version__, "device": device_name(device), "phases": phases,
              "residual_bytes": residual_after, "residual_bytes_before_first_call": residual_before,
              "aliased_input_bytes": aliased, "residual_tensors": residual_count}

    print(f"{config}  (torch {torch.__version__}, {result['device']})")
    print(f"{'phase':<18}{'matmul FLOPs':>16}{'time (ms)':>12}{'peak (KiB)':>12}")
    for name, r in phases.items():
        if "unavailable" in r:
            print(f"{name:<18}  unavailable: {r['unavailable']}")
        else:
            print(f"{name:<18}{r['matmul_flops']:>16,}{r['time_s'] * 1e3:>12.3f}{r['peak_bytes'] / 1024:>12.1f}")
    print(f"residuals: {residual_after:,} bytes in {residual_count} storages after the first call "
          f"({residual_before:,} before it); aliased primal inputs: {aliased:,} bytes")
    print(f"measured in {time.perf_counter() - started:.1f} s")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1)
            out.write("\n")


if __name__ == "__main__":
    main()
