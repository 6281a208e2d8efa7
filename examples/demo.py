"""The main demo: MeZO vs HiZOO vs HiZOO-L vs Adam, on the paper's test functions and digits.

1. The three 2-D test functions of the paper's Appendix C (float64): every method runs from
   the same start over a learning-rate grid and 5 seeds; the table gives the median number
   of steps to f < 0.1 at the fastest *robust* learning rate (every seed reached 0.1 and was
   still below it at the last step), the (reached, stayed) counts there, and how many
   learning rates of the grid are robust. HiZOO uses the recommended settings
   (``hz.presets``: alpha = 0.5 / d, mu = 1e-2) with no per-function tuning.
2. A Flax MLP (26k parameters) on scikit-learn's digits (float32, batches of 64): MeZO,
   HiZOO, HiZOO-L (recommended settings) and first-order Adam at fixed learning rates (the
   best of the grids of notebooks/03_ablations.ipynb), 3 seeds; final train loss, test
   accuracy and the wall-clock time of a step in forward passes.

Writes a results table (``results.md``, ``results.json``) and plots (``test_functions.png``,
``digits.png``) to ``--out``. About 2 minutes on 2 CPU cores.

    python examples/demo.py                # full budgets, writes outputs/demo/*
    python examples/demo.py --quick        # tiny budgets (CI smoke mode)
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax

jax.config.update("jax_enable_x64", True)  # the test functions run in float64

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from tqdm import tqdm  # noqa: E402

import hizoo_jax as hz  # noqa: E402
from hizoo_jax import digits as D  # noqa: E402
from hizoo_jax import problems as P  # noqa: E402

# Learning rates of the digits runs: the best of each method's grid in
# notebooks/03_ablations.ipynb (chosen there on a held-out seed).
DIGITS_LR = {"MeZO": 2e-3, "HiZOO": 5e-3, "HiZOO-L": 5e-3, "Adam (first order)": 3e-3}


def test_function_methods():
  rec = hz.presets.recommended(np.zeros(2))  # alpha = 0.25, mu = 1e-2
  return {
      "Adam (first order)": (optax.adam, [dict(first_order=True)]),
      "MeZO": (hz.mezo, [{}]),
      "HiZOO": (hz.hizoo, [rec]),
      "HiZOO-L": (hz.hizoo_l, [{**rec, "matrix": True, "min_dim_size_to_factor": 1}]),
  }


def digits_methods():
  return {
      "MeZO": (hz.mezo, False),
      "HiZOO": (hz.presets.hizoo, False),
      "HiZOO-L": (hz.presets.hizoo_l, False),
      "Adam (first order)": (optax.adam, True),
  }


def n_robust(sw):
  n = sw.losses.shape[1]
  return int(((sw.reached() == n) & (sw.stayed() == n)).sum())


def test_function_table(results):
  fns = list(dict.fromkeys(r.function for r in results))
  by = {(r.method, r.function): r for r in results}
  lines = ["| method | " + " | ".join(f"{f}: steps (reached, stayed) | lr | robust lrs"
                                      for f in fns) + " |",
           "|---|" + "---|---|---|" * len(fns)]
  for m in dict.fromkeys(r.method for r in results):
    cells = []
    for f in fns:
      r = by[(m, f)]
      reached, stayed, n = r.counts()
      steps = "never" if not np.isfinite(r.steps) else f"{r.steps:g}"
      cells += [f"{steps} ({reached}/{n}, {stayed}/{n}){'' if r.robust else ' ⚠'}",
                f"{r.learning_rate:.3g}", str(n_robust(r.sweep))]
    lines.append(f"| {m} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def plot_test_functions(results, path):
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
    ax.set_title(f"{fname}: trajectories (seed 0)")
    ax = axes[1, j]
    for r in rs:
      label = f"{r.method} ({'never' if not np.isfinite(r.steps) else int(r.steps)})"
      ax.semilogy(np.maximum(r.sweep.losses[r.lr_index, 0], 1e-16), color=colors[r.method],
                  lw=1, label=label)
    ax.axhline(0.1, color="k", ls=":", lw=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("f")
    ax.set_title(f"{fname}: loss (median steps to 0.1)")
    ax.legend(fontsize=7)
  axes[0, 0].legend(fontsize=7, loc="best")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def run_digits(steps, seeds, eval_every, bar):
  data = D.load_data()
  out = {}
  for name, (factory, first_order) in digits_methods().items():
    runs = []
    tx = factory(DIGITS_LR[name])  # one transformation: the seeds share its compiled step
    for seed in seeds:
      done = [0]

      def tick(step, done=done):
        bar.update(step - done[0])
        done[0] = step

      h = D.train(tx, data, steps=steps, seed=seed,
                  first_order=first_order, eval_every=eval_every, progress=tick)
      bar.update(steps - done[0])  # a diverged run stops early
      runs.append(h)
    out[name] = runs
  return data, out


def step_times(data, repeats):
  graphdef, params = D.init_model(0)
  loss = D.make_loss(graphdef)
  steps = {}
  for name, (factory, first_order) in digits_methods().items():
    tx = factory(1e-3)
    make = D.first_order_step if first_order else hz.make_train_step
    steps[name] = (make(tx, loss), tx.init(params))
  return D.time_steps(steps, loss, params, (data.x_train[:64], data.y_train[:64]),
                      repeats=repeats)


def digits_table(runs, times):
  lines = ["| method | lr | final train loss, median [min, max] | test accuracy %, median "
           "[min, max] | diverged | step time (forward passes) |", "|---|---|---|---|---|---|"]
  for name, hs in runs.items():
    tl = np.array([h.train_loss[-1] for h in hs])
    acc = 100 * np.array([h.test_accuracy[-1] for h in hs])
    ok = np.isfinite(tl)

    def span(v, fmt, ok=ok):
      v = v[ok]
      return "—" if not v.size else f"{np.median(v):{fmt}} [{v.min():{fmt}}, {v.max():{fmt}}]"

    lines.append(f"| {name} | {DIGITS_LR[name]:g} | {span(tl, '.3f')} | {span(acc, '.1f')} | "
                 f"{sum(h.diverged for h in hs)}/{len(hs)} | {times[name]:.1f} |")
  return "\n".join(lines)


def plot_digits(runs, path):
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
  for (name, hs), color in zip(runs.items(), plt.cm.tab10.colors, strict=False):
    steps = hs[0].steps
    for ax, key in zip(axes, ("train_loss", "test_accuracy"), strict=True):
      v = np.array([getattr(h, key) for h in hs], dtype=float)
      ax.plot(steps, np.nanmedian(v, 0), color=color, label=f"{name} (lr {DIGITS_LR[name]:g})")
      ax.fill_between(steps, np.nanmin(v, 0), np.nanmax(v, 0), color=color, alpha=0.15, lw=0)
  axes[0].set_yscale("log")
  axes[0].set_title(f"digits MLP: train loss (median, range over {len(hs)} seeds)")
  axes[1].set_title("test accuracy")
  axes[1].set_ylim(0.5, 1.0)
  for ax in axes:
    ax.set_xlabel("step")
  axes[0].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--quick", action="store_true", help="tiny budgets (smoke test)")
  ap.add_argument("--steps", type=int, default=3000, help="test-function steps")
  ap.add_argument("--seeds", type=int, default=5, help="test-function seeds")
  ap.add_argument("--digits-steps", type=int, default=5000)
  ap.add_argument("--digits-seeds", type=int, default=3)
  ap.add_argument("--out", default="outputs/demo")
  args = ap.parse_args()
  quick = args.quick
  steps, seeds = (400, 3) if quick else (args.steps, args.seeds)
  lrs = 10.0 ** np.arange(-3, 0.01, 1.0) if quick else 10.0 ** np.arange(-5, 0.01, 0.5)
  d_steps, d_seeds = (200, (0,)) if quick else (args.digits_steps, tuple(range(args.digits_seeds)))
  d_eval = 100 if quick else 500
  os.makedirs(args.out, exist_ok=True)
  t_start = time.perf_counter()

  # 1. The test functions.
  ms = test_function_methods()
  with tqdm(total=3 * len(ms), desc="test functions", unit="sweep", mininterval=1.0) as bar:
    def tick(label):
      bar.set_postfix_str(label[:30])
      bar.update(1)

    results = P.compare(ms, steps=steps, learning_rates=lrs, seeds=seeds, robust=True,
                        progress=tick)
  t_functions = time.perf_counter() - t_start
  tf_md = test_function_table(results)
  tf_head = (f"Steps to f < 0.1 (float64): median over {seeds} seeds at the fastest robust "
             f"learning rate of {len(lrs)} ({lrs.min():g}..{lrs.max():g}), at most {steps} "
             "steps; (reached, stayed): seeds that reached f < 0.1, and seeds still below it at "
             "the last step; robust lrs: learning rates of the grid at which all seeds reached "
             "and stayed (⚠: none; the fastest median is shown).")
  print("\n" + tf_head + "\n\n" + tf_md + "\n", flush=True)
  plot_test_functions(results, os.path.join(args.out, "test_functions.png"))

  # 2. The digits MLP.
  with tqdm(total=len(digits_methods()) * len(d_seeds) * d_steps, desc="digits MLP",
            unit="step", unit_scale=True, mininterval=1.0) as bar:
    data, runs = run_digits(d_steps, d_seeds, d_eval, bar)
  times = step_times(data, repeats=3 if quick else 7)
  d_md = digits_table(runs, times)
  d_head = (f"Digits MLP (26 122 params, float32, batches of 64, {d_steps} steps, seeds "
            f"{list(d_seeds)}); step time: median wall-clock of a step over one forward pass "
            f"({1e6 * times['forward_seconds']:.0f} µs) at batch 64.")
  print("\n" + d_head + "\n\n" + d_md + "\n")
  plot_digits(runs, os.path.join(args.out, "digits.png"))
  elapsed = time.perf_counter() - t_start
  print(f"({elapsed:.0f} s in all, test functions {t_functions:.0f} s, on {jax.device_count()} "
        f"{jax.default_backend()} device(s))")

  with open(os.path.join(args.out, "results.md"), "w") as fh:
    fh.write(tf_head + "\n\n" + tf_md + "\n\n" + d_head + "\n\n" + d_md + "\n")
  with open(os.path.join(args.out, "results.json"), "w") as fh:
    json.dump(dict(
        test_functions=[dict(method=r.method, function=r.function, robust=r.robust,
                             median_steps=None if not np.isfinite(r.steps) else r.steps,
                             seeds_reached=r.counts()[0], seeds_stayed=r.counts()[1],
                             robust_lrs=n_robust(r.sweep), learning_rate=r.learning_rate,
                             options={k: v for k, v in r.options.items()}) for r in results],
        digits={name: dict(learning_rate=DIGITS_LR[name],
                           final_train_loss=[float(h.train_loss[-1]) for h in hs],
                           test_accuracy=[float(h.test_accuracy[-1]) for h in hs],
                           step_time_forward_passes=times[name]) for name, hs in runs.items()},
        seconds=elapsed), fh, indent=1)
  print(f"wrote {args.out}/results.md, results.json, test_functions.png, digits.png")


if __name__ == "__main__":
  main()
