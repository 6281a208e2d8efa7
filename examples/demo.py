"""The main demo: the paper's test functions, MeZO vs HiZOO vs HiZOO-L vs Adam.

For each of the three 2-D test functions of the paper's Appendix C, every method runs from
the same start with a grid of learning rates (and, for HiZOO, of smoothing factors) over 5
seeds; the table gives the median number of steps to reach f < 0.1 at each method's best
setting, and how many seeds got there. The plot shows the 2-D trajectories and loss curves
of seed 0 at those settings. Everything runs in float64 on the CPU in well under a minute.

    python examples/demo.py                # full grid, writes outputs/demo/*
    python examples/demo.py --quick        # smaller grid (CI smoke mode)
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax

jax.config.update("jax_enable_x64", True)

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from tqdm import tqdm  # noqa: E402

import hizoo_jax as hz  # noqa: E402
from hizoo_jax import problems as P  # noqa: E402

ALPHAS = (0.01, 0.1, 0.3)


def methods(alphas=ALPHAS):
  return {
      "Adam (first order)": (optax.adam, [dict(first_order=True)]),
      "MeZO": (hz.mezo, [{}]),
      "HiZOO (paper est.)": (hz.hizoo, [dict(hessian_smoothing=a) for a in alphas]),
      "HiZOO (unbiased est.)": (
          hz.hizoo, [dict(hessian_smoothing=a, estimator="unbiased") for a in alphas]),
      "HiZOO-L": (hz.hizoo_l, [dict(hessian_smoothing=a, matrix=True, min_dim_size_to_factor=1)
                               for a in alphas]),
  }


def _counts(r):
  """(seeds that reached f < 0.1, seeds below 0.1 at the last step, seeds)."""
  reached = int(np.isfinite(r.sweep.steps_to(0.1)[r.lr_index]).sum())
  stayed = int((r.sweep.losses[r.lr_index, :, -1] < 0.1).sum())
  return reached, stayed, r.sweep.losses.shape[1]


def table(results):
  names = list(dict.fromkeys(r.method for r in results))
  fns = list(dict.fromkeys(r.function for r in results))
  by = {(r.method, r.function): r for r in results}
  lines = [
      "| method | " + " | ".join(f"{f}: steps (reached, stayed) | lr, alpha" for f in fns)
      + " |",
      "|---|" + "---|---|" * len(fns),
  ]
  for m in names:
    cells = []
    for f in fns:
      r = by[(m, f)]
      reached, stayed, n = _counts(r)
      steps = "never" if not np.isfinite(r.steps) else f"{r.steps:g}"
      alpha = r.options.get("hessian_smoothing")
      setting = f"{r.learning_rate:.3g}" + (f", {alpha:g}" if alpha is not None else "")
      cells += [f"{steps} ({reached}/{n}, {stayed}/{n})", setting]
    lines.append(f"| {m} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def plot(results, path):
  fns = list(dict.fromkeys(r.function for r in results))
  fig, axes = plt.subplots(2, len(fns), figsize=(5 * len(fns), 9))
  colors = dict(zip(dict.fromkeys(r.method for r in results), plt.cm.tab10.colors, strict=False))
  for j, fname in enumerate(fns):
    f = P.FUNCTIONS[fname]
    rs = [r for r in results if r.function == fname]
    pts = np.concatenate([r.sweep.xs[r.lr_index, 0] for r in rs])
    start_loss = float(f(np.asarray(P.START[fname])))
    pts = pts[np.asarray(f(pts)) <= 2 * start_loss]  # frame the region, not a blow-up
    lo, hi = np.percentile(pts, [0.5, 99.5], axis=0)
    pad = 0.15 * (hi - lo) + 0.1
    gx, gy = np.meshgrid(np.linspace(lo[0] - pad[0], hi[0] + pad[0], 300),
                         np.linspace(lo[1] - pad[1], hi[1] + pad[1], 300))
    fz = np.asarray(f(np.stack([gx, gy], -1)))
    ax = axes[0, j]
    ax.contour(gx, gy, np.log10(fz + 1e-3), levels=25, cmap="Greys", linewidths=0.6)
    for r in rs:
      xs = r.sweep.xs[r.lr_index, 0]
      ax.plot(xs[:, 0], xs[:, 1], ".-", ms=2, lw=0.8, color=colors[r.method], label=r.method)
    ax.plot(*P.START[fname], "ko")
    ax.plot(*P.MINIMUM[fname], "r*", ms=12)
    ax.set_xlim(gx.min(), gx.max())
    ax.set_ylim(gy.min(), gy.max())
    ax.set_title(f"{fname}: trajectories (seed 0, best setting)")
    ax = axes[1, j]
    for r in rs:
      ax.semilogy(np.maximum(r.sweep.losses[r.lr_index, 0], 1e-12), color=colors[r.method],
                  label=f"{r.method} ({'never' if not np.isfinite(r.steps) else int(r.steps)})")
    ax.axhline(0.1, color="k", ls=":", lw=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("f")
    ax.set_title(f"{fname}: loss (median steps to 0.1 in legend)")
    ax.legend(fontsize=7)
  axes[0, 0].legend(fontsize=7, loc="best")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--quick", action="store_true", help="small grid (smoke test)")
  ap.add_argument("--steps", type=int, default=3000)
  ap.add_argument("--seeds", type=int, default=5)
  ap.add_argument("--out", default="outputs/demo")
  args = ap.parse_args()
  steps, seeds = (600, 3) if args.quick else (args.steps, args.seeds)
  lrs = 10.0 ** np.arange(-3, 0.01, 1.0) if args.quick else 10.0 ** np.arange(-5, 0.01, 0.5)
  alphas = (0.3,) if args.quick else ALPHAS
  os.makedirs(args.out, exist_ok=True)

  ms = methods(alphas)
  total = 3 * sum(len(c) for _, c in ms.values())
  t0 = time.perf_counter()
  with tqdm(total=total, desc="test functions", unit="sweep", mininterval=2.0) as bar:
    def tick(label):
      bar.set_postfix_str(label[:40])
      bar.update(1)

    results = P.compare(ms, steps=steps, learning_rates=lrs, seeds=seeds, progress=tick)
  elapsed = time.perf_counter() - t0

  md = table(results)
  header = (f"Steps to f < 0.1: median over {seeds} seeds at the best learning rate of "
            f"{len(lrs)} ({lrs.min():g}..{lrs.max():g}) and best alpha of {alphas}, "
            f"{steps} steps max, float64. (reached, stayed): seeds that reached f < 0.1 at "
            "that setting, and seeds still below 0.1 at the last step.")
  print("\n" + header + "\n\n" + md + "\n")
  print(f"({elapsed:.1f} s on {jax.device_count()} {jax.default_backend()} device(s))")
  plot(results, os.path.join(args.out, "test_functions.png"))
  with open(os.path.join(args.out, "test_functions.md"), "w") as fh:
    fh.write(header + "\n\n" + md + "\n")
  with open(os.path.join(args.out, "test_functions.json"), "w") as fh:
    json.dump([dict(method=r.method, function=r.function,
                    median_steps=None if not np.isfinite(r.steps) else r.steps,
                    seeds_reached=_counts(r)[0], seeds_stayed=_counts(r)[1],
                    learning_rate=r.learning_rate,
                    options={k: v for k, v in r.options.items()}) for r in results],
              fh, indent=1)
  print(f"wrote {args.out}/test_functions.png, .md, .json")


if __name__ == "__main__":
  main()
