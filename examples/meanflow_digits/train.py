#!/usr/bin/env python3
"""MeanFlow on real handwritten digits, with a JVP in every training step: one command, a few
minutes on a CPU, and digits to look at.

The data are scikit-learn's 1,797 digits (8x8, ten classes; they ship inside the package, so
nothing is downloaded). The model is a small class-conditional DiT (2x2 patches, adaLN-Zero
blocks; dit.py) that predicts MeanFlow's average velocity u(z, r, t | class). Each step draws a batch,
times t and r <= t and noise e, and forms z = (1 - t) x + t e and v = e - x; the JVP of u along
(v_cfg, 0, 1), with v_cfg the velocity with classifier-free guidance mixed in, gives du/dt, and
the loss is || u - stopgrad(v_cfg - (t - r) du/dt) ||², each sample's weighted by the inverse of
its own size (MeanFlow's adaptive weight; Geng et al. 2025). Class labels are dropped at random
(the null class), which the guidance in v_cfg needs.

--jvp picks how du/dt is computed: jvpc (a compiled program: `jvpc.compile` once, then one
forward per step, whose linear map gives the JVP), torch (torch.func.jvp on SDPA's math path,
as it has no forward AD of the fused kernels) or fd (central finite differences, two more
forwards without autograd, step 5e-3, what some training frameworks use instead). --compare
trains jvpc and torch from one seed and plots both.

It writes, in --out (default meanflow_digits/):
  samples.png    one-step and two-step samples, a row per class
  loss.png       the loss per step (with --compare: both sides, and their step times): the
                 squared error of the pairs with r = t, whose target is the velocity itself
  run.json       the settings, the losses, the step times, and the samples' accuracy
The accuracy: a logistic regression fitted on the real digits reads each generated sample; the
share it recognises as the class asked for (a model that learned nothing scores about 10%).

  PYTHONPATH=build/python python3 examples/meanflow_digits/train.py
  PYTHONPATH=build/python python3 examples/meanflow_digits/train.py --compare --steps 1000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from dit import DigitsDiT  # the model, beside this file

CLASSES = 10
NULL = CLASSES  # the label of "no class": dropped labels, unguided predictions


# --- the data --------------------------------------------------------------------------------

def digits():
    """scikit-learn's digits as [N, 1, 8, 8] in [-1, 1], and their labels."""
    from sklearn.datasets import load_digits
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 8.0 - 1.0
    return x, torch.tensor(d.target, dtype=torch.long)


def patches(x):  # [B, 1, 8, 8] -> [B, 16, 4]: 2x2 patches as tokens
    return x.unfold(2, 2, 2).unfold(3, 2, 2).reshape(x.shape[0], 16, 4)


def images(tokens):  # [B, 16, 4] -> [B, 1, 8, 8]
    return tokens.reshape(-1, 4, 4, 2, 2).permute(0, 1, 3, 2, 4).reshape(-1, 1, 8, 8)


# --- the JVP, three ways ---------------------------------------------------------------------

class JvpcStep:
    """jvpc: the model compiled once; each call runs its primal graph (the step's one forward,
    which autograd records) and the linear map at that point gives the JVP."""

    def __init__(self, model, z, r, t, y):
        import jvpc
        self.prog = jvpc.compile(model, z, r, t, y, argnums=(0, 1, 2))

    def __call__(self, model, z, r, t, y, tangents):
        u, jvp_fn = self.prog(z, r, t, y)
        return u, jvp_fn(*tangents)


class TorchStep:
    """torch.func.jvp, on SDPA's math path (its fused kernels have no forward AD)."""

    def __call__(self, model, z, r, t, y, tangents):
        with sdpa_kernel(SDPBackend.MATH):
            return torch.func.jvp(lambda z, r, t: model(z, r, t, y), (z, r, t), tangents)


class FiniteDifferenceStep:
    """Central differences: two more forwards without autograd, step eps."""

    def __init__(self, eps=5e-3):
        self.eps = eps

    def __call__(self, model, z, r, t, y, tangents):
        dz, dr, dt = tangents
        u = model(z, r, t, y)
        with torch.no_grad():
            e = self.eps
            plus = model(z + e * dz, r + e * dr, t + e * dt, y)
            minus = model(z - e * dz, r - e * dr, t - e * dt, y)
        return u, (plus - minus) / (2 * e)


def make_step(kind, model, batch):
    if kind == "jvpc":
        return JvpcStep(model, *batch)
    return TorchStep() if kind == "torch" else FiniteDifferenceStep()


# --- training --------------------------------------------------------------------------------

def sample_times(B, gen):
    """t and r <= t: a quarter of the pairs with r = t (plain flow matching), the rest apart,
    from a logit-normal draw, as MeanFlow's recipe."""
    a = torch.sigmoid(torch.randn(B, generator=gen) - 0.4)
    b = torch.sigmoid(torch.randn(B, generator=gen) - 0.4)
    t, r = torch.maximum(a, b), torch.minimum(a, b)
    same = torch.rand(B, generator=gen) < 0.75
    return torch.where(same, t, r), t


def train(kind, args, data, seed):
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    x_all, y_all = data
    model = DigitsDiT(args.width, args.depth, args.heads, CLASSES)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 100))
    B = args.batch

    def batch():
        i = torch.randint(0, x_all.shape[0], (B,), generator=gen)
        x, y = patches(x_all[i]), y_all[i].clone()
        y[torch.rand(B, generator=gen) < args.label_dropout] = NULL  # for classifier-free guidance
        e = torch.randn(x.shape, generator=gen)
        r, t = sample_times(B, gen)
        z = (1 - t)[:, None, None] * x + t[:, None, None] * e
        return x, y, e, r, t, z

    x, y, e, r, t, z = batch()
    step = make_step(kind, model, (z, r, t, y))
    losses, times = [], []
    progress = _progress(args.steps, f"{kind:5}", args.quiet)
    for s in range(args.steps):
        x, y, e, r, t, z = batch()
        t0 = time.perf_counter()
        v = e - x
        if args.guidance != 1.0:  # v_cfg = w·v + (1 − w)·u(z, t, t | null), where a label is kept
            with torch.no_grad():
                u_null = model(z, t, t, torch.full_like(y, NULL))
            keep = (y != NULL)[:, None, None]
            v = torch.where(keep, args.guidance * v + (1 - args.guidance) * u_null, v)
        u, dudt = step(model, z, r, t, y, (v, torch.zeros_like(r), torch.ones_like(t)))
        target = v - (t - r)[:, None, None] * dudt
        # MeanFlow's adaptive weight: each sample's squared error divided by its own (detached)
        # size, which keeps the large errors of early training from blowing up the steps.
        err = ((u - target.detach()) ** 2).mean(dim=(1, 2))
        loss = (err / (err.detach() + 1e-3)).mean()
        # What the curve shows: the squared error where r = t, whose target is the (guided)
        # velocity itself; where r < t the target moves with the model's own du/dt.
        raw = err[r == t].mean() if bool((r == t).any()) else err.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        times.append(time.perf_counter() - t0)
        losses.append(raw.item())
        progress.update(1)
        if s % 10 == 0:
            progress.set_postfix(loss=f"{sum(losses[-10:]) / len(losses[-10:]):.4f}",
                                 steps_per_s=f"{1 / (sum(times[-10:]) / len(times[-10:])):.1f}")
    progress.close()
    return model, losses, times


def _progress(total, desc, quiet):
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, disable=quiet, file=sys.stderr, dynamic_ncols=True)


# --- sampling and judging --------------------------------------------------------------------

@torch.no_grad()
def generate(model, labels, steps, guidance, gen):
    """Samples in `steps` jumps of the average velocity from noise at t = 1 to t = 0."""
    z = torch.randn(labels.shape[0], 16, 4, generator=gen)
    grid = torch.linspace(1.0, 0.0, steps + 1)
    for k in range(steps):
        t = torch.full((labels.shape[0],), float(grid[k]))
        r = torch.full((labels.shape[0],), float(grid[k + 1]))
        u = model(z, r, t, labels)
        z = z - (t - r)[:, None, None] * u
    return images(z).clamp(-1, 1)


def accuracy(classifier, samples, labels):
    flat = ((samples + 1) * 8).reshape(samples.shape[0], -1).numpy()  # back to the 0..16 scale
    return float((classifier.predict(flat) == labels.numpy()).mean())


def fit_classifier():
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression
    d = load_digits()
    return LogisticRegression(max_iter=2000).fit(d.data, d.target)


def save_samples(path, rows):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n = rows[0][1].shape[0] // CLASSES
    fig, axes = plt.subplots(CLASSES, 2 * n + 1, figsize=(2 * n + 1, CLASSES), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for j, (title, samples) in enumerate(rows):
        for c in range(CLASSES):
            for i in range(n):
                axes[c, j * (n + 1) + i].imshow(samples[c * n + i, 0].numpy(), cmap="gray_r", vmin=-1, vmax=1)
        axes[0, j * (n + 1)].set_title(title, loc="left", fontsize=9)
    fig.tight_layout()
    _save_figure(fig, path)


def save_losses(path, runs):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2 if len(runs) > 1 else 1, figsize=(10 if len(runs) > 1 else 6, 4), squeeze=False)
    for kind, (losses, times) in runs.items():
        smooth = [sum(losses[max(0, i - 24):i + 1]) / len(losses[max(0, i - 24):i + 1]) for i in range(len(losses))]
        axes[0, 0].plot(smooth, label=kind)
        if len(runs) > 1:
            axes[0, 1].plot([1e3 * s for s in times], label=f"{kind} (median {1e3 * sorted(times)[len(times) // 2]:.1f} ms)")
    axes[0, 0].set(xlabel="step", ylabel="loss at r = t (mean of 25 steps)", yscale="log", title="MeanFlow on digits")
    axes[0, 0].legend()
    if len(runs) > 1:
        axes[0, 1].set(xlabel="step", ylabel="ms per step", title="step time")
        axes[0, 1].legend()
    fig.tight_layout()
    _save_figure(fig, path)


def _save_figure(fig, path):
    import matplotlib.pyplot as plt
    tmp = f"{path}.tmp.png"  # whole or absent: written aside, then renamed into place
    fig.savefig(tmp, dpi=80)
    plt.close(fig)
    os.replace(tmp, path)


def write_json(path, record):
    with open(f"{path}.tmp", "w") as fh:
        json.dump(record, fh, indent=1)
    os.replace(f"{path}.tmp", path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--jvp", choices=["jvpc", "torch", "fd"], default="jvpc", help="how du/dt is computed")
    p.add_argument("--compare", action="store_true", help="train jvpc and torch from one seed, plot both")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--label-dropout", type=float, default=0.1, help="share of labels dropped for guidance")
    p.add_argument("--guidance", type=float, default=2.0, help="classifier-free guidance in the target (1: none)")
    p.add_argument("--samples", type=int, default=6, help="samples per class in the picture")
    p.add_argument("--judge", type=int, default=100, help="samples per class the classifier reads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, help="torch.set_num_threads")
    p.add_argument("--out", default="meanflow_digits", help="folder for samples.png, loss.png and run.json")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    if args.steps < 1 or args.batch < 2 or args.samples < 1 or args.judge < 1:
        p.error("--steps and --samples and --judge must be at least 1, --batch at least 2")
    if args.width % args.heads or args.width % 2:
        p.error(f"--width ({args.width}) must be even and a multiple of --heads ({args.heads})")
    if not 0 <= args.label_dropout < 1:
        p.error("--label-dropout must be in [0, 1)")
    if args.threads:
        torch.set_num_threads(args.threads)
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        p.error(f"--out: '{args.out}' exists and is not a folder")
    os.makedirs(args.out, exist_ok=True)

    data = digits()
    kinds = ["jvpc", "torch"] if args.compare else [args.jvp]
    runs, models = {}, {}
    t0 = time.perf_counter()
    for kind in kinds:
        models[kind], losses, times = train(kind, args, data, args.seed)
        runs[kind] = (losses, times)
    train_s = time.perf_counter() - t0

    classifier = fit_classifier()
    gen = torch.Generator().manual_seed(args.seed + 1)
    record = {"settings": vars(args), "torch": torch.__version__, "threads": torch.get_num_threads(),
              "train_seconds": train_s, "sides": {}}
    model = models[kinds[0]]
    picture_labels = torch.arange(CLASSES).repeat_interleave(args.samples)
    rows = [(f"{k} step{'s' if k > 1 else ''}", generate(model, picture_labels, k, args.guidance, gen)) for k in (1, 2)]
    save_samples(os.path.join(args.out, "samples.png"), rows)
    save_losses(os.path.join(args.out, "loss.png"), runs)
    judged = torch.arange(CLASSES).repeat_interleave(args.judge)
    for kind in kinds:
        losses, times = runs[kind]
        acc = {f"{k}_step": accuracy(classifier, generate(models[kind], judged, k, args.guidance, gen), judged)
               for k in (1, 2)}
        record["sides"][kind] = {"losses": losses, "step_seconds": times,
                                 "median_step_ms": 1e3 * sorted(times)[len(times) // 2], "accuracy": acc}
        print(f"{kind:5}: loss {sum(losses[:25]) / 25:.4f} -> {sum(losses[-25:]) / 25:.4f} over {len(losses)} steps, "
              f"median step {record['sides'][kind]['median_step_ms']:.1f} ms, samples recognised as their class: "
              f"{100 * acc['1_step']:.1f}% (one step), {100 * acc['2_step']:.1f}% (two steps)")
    write_json(os.path.join(args.out, "run.json"), record)
    print(f"wrote {args.out}/samples.png, loss.png and run.json ({train_s:.0f} s of training)")


if __name__ == "__main__":
    main()
