"""Tables and plots shared by the notebooks and ``examples/demo.py``.

Test functions (:mod:`experiments.problems`): :func:`n_robust`, :func:`functions_table`,
:func:`plot_functions`. Digits runs (:mod:`experiments.digits`): :func:`first_below`,
:func:`summarize`, :func:`band`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np

from experiments import problems as P


def n_robust(sw: P.Sweep, threshold: float = 0.1) -> int:
  """How many learning rates of a sweep are robust: every seed reached and stayed below."""
  n = sw.losses.shape[1]
  return int(((sw.reached(threshold) == n) & (sw.stayed(threshold) == n)).sum())


def _cell(r: P.Result, passes: bool = False) -> str:
  reached, stayed, n = r.counts()
  if not np.isfinite(r.steps):
    value = "never"
  elif passes and r.passes is not None:
    value = f"{r.passes:g}"
  else:
    value = f"{r.steps:g}" + (" steps" if passes else "")
  flag = "" if r.robust else " ⚠"
  return (f"{value} ({reached}/{n}, {stayed}/{n}){flag} | {r.learning_rate:.3g} | "
          f"{n_robust(r.sweep)}")


def functions_table(results: Sequence[P.Result], passes: bool = False) -> str:
  """A Markdown table: per method and function, steps (reached, stayed) | lr | robust lrs.

  With ``passes`` the first column counts forward passes (the state's counter: steps times
  the passes a step executes), so that methods of different step costs compare; a
  first-order method, which has no count, stays in steps, marked so.
  """
  fns = list(dict.fromkeys(r.function for r in results))
  names = list(dict.fromkeys(r.method for r in results))
  by = {(r.method, r.function): r for r in results}
  unit = "forward passes" if passes else "steps"
  head = "| method | " + " | ".join(f"{f}: {unit} (reached, stayed) | lr | robust lrs"
                                   for f in fns)
  lines = [head + " |", "|---|" + "---|---|---|" * len(fns)]
  for m in names:
    lines.append(f"| {m} | " + " | ".join(_cell(by[(m, f)], passes) for f in fns) + " |")
  return "\n".join(lines)


def plot_functions(results: Sequence[P.Result], path: str, styles: dict | None = None,
                   passes: bool = False):
  """Trajectories over the contours (top) and loss curves (bottom), seed 0, each method at
  its chosen learning rate; saved to ``path``. Returns the figure.

  ``styles``: per method, keyword arguments of ``plot`` (``color``, ``ls``, ``marker``;
  default: the tab10 colours in order). ``passes``: the loss curves against forward passes
  (steps times the passes a step executed; a first-order method, which has no count,
  against steps, as its label says) instead of steps."""
  fns = list(dict.fromkeys(r.function for r in results))
  fig, axes = plt.subplots(2, len(fns), figsize=(5 * len(fns), 9), squeeze=False)
  methods = list(dict.fromkeys(r.method for r in results))
  if styles is None:
    styles = {m: dict(color=c) for m, c in zip(methods, plt.cm.tab10.colors, strict=False)}
  line = {m: {k: v for k, v in styles[m].items() if k != "marker"} for m in methods}
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
      style = {"marker": ".", "ls": "-", "lw": 0.8, **styles[r.method]}
      ax.plot(xs[:, 0], xs[:, 1], ms=2 if style["marker"] == "." else 3, label=r.method,
              **style)
    ax.plot(*P.START[fname], "ko")
    ax.plot(*P.MINIMUM[fname], "r*", ms=12)
    ax.set_xlim(gx.min(), gx.max())
    ax.set_ylim(gy.min(), gy.max())
    ax.set_title(f"{fname}: trajectories (seed 0)")
    ax = axes[1, j]
    for r in rs:
      losses = np.maximum(r.sweep.losses[r.lr_index, 0], 1e-16)
      cost = r.passes_per_step if passes else None
      x = np.arange(len(losses)) * (1.0 if cost is None else cost)
      reach = r.steps if cost is None else r.passes
      unit = " steps" if passes and cost is None else ""
      label = f"{r.method} ({'never' if not np.isfinite(reach) else f'{reach:,.0f}'}{unit})"
      ax.semilogy(x, losses, label=label, **{"lw": 1, **line[r.method]})
    ax.axhline(0.1, color="k", ls=":", lw=0.8)
    ax.set_xlabel("forward passes (first-order: steps)" if passes else "step")
    ax.set_ylabel("f")
    ax.set_title(f"{fname}: loss (median {'forward passes' if passes else 'steps'} to 0.1)")
    ax.legend(fontsize=7)
  axes[0, 0].legend(fontsize=7, loc="best")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  return fig


def first_below(h, level: float) -> float:
  """The first evaluated step at which a digits run's train loss is below ``level``."""
  hit = np.nonzero(h.train_loss < level)[0]
  return h.steps[hit[0]] if hit.size else np.inf


def summarize(runs) -> dict:
  """Final train loss and test accuracy of a digits method's runs (one per seed), as
  ``median [min, max]`` strings over the finite values; divergences; the median first step
  with train loss < 0.5; the fastest run's seconds."""
  tl = np.array([h.train_loss[-1] for h in runs])
  acc = np.array([h.test_accuracy[-1] for h in runs])
  div = sum(h.diverged for h in runs)
  fin = np.isfinite(tl)
  hit = np.median([first_below(h, 0.5) for h in runs])

  def span(v, fmt):
    v = v[np.isfinite(v)]
    return "—" if not v.size else f"{np.median(v):{fmt}} [{v.min():{fmt}}, {v.max():{fmt}}]"

  return dict(loss=span(tl, ".3f"), acc=span(100 * acc, ".1f"), diverged=f"{div}/{len(runs)}",
              hit="never" if not np.isfinite(hit) else f"{hit:g}",
              sec=np.min([h.seconds for h in runs]), fin=fin)


def band(ax, runs, key: str, color, label: str, x_scale: float = 1.0, ls: str = "-") -> None:
  """Median line and min-max band over seeds of a history field (``train_loss``, ...);
  ``x_scale`` multiplies the step counts (e.g. by the forward passes a step executes);
  ``ls``: the median line's style."""
  steps = runs[0].steps * x_scale
  v = np.array([getattr(h, key) for h in runs], dtype=float)
  with warnings.catch_warnings():  # steps after every seed diverged are all-NaN: not drawn
    warnings.simplefilter("ignore", RuntimeWarning)
    ax.plot(steps, np.nanmedian(v, 0), color=color, lw=1.5, ls=ls, label=label)
    ax.fill_between(steps, np.nanmin(v, 0), np.nanmax(v, 0), color=color, alpha=0.15, lw=0)
