"""Tables and plots of the "choosing a method" study from its result files (seconds).

    python -m experiments.choose.report --table digits_mezo     # Markdown to stdout + PNG
    python -m experiments.choose.report --table digits_hizoo --versus digits_mezo

For each grid and schedule of a table: every learning rate's final validation loss (mean
over the seeds that finished; what tuning selects on), final training-set loss, test
accuracy (scored once at the end; never used to select), diverged runs, seconds per forward
pass; the selected learning rate is marked and must be interior to the grid (the runner
widens it until it is). Then the tuned schedules against each other: each schedule's best
run per seed and the forward passes it takes to reach the final training loss of the tuned
baseline (the best schedule) of the same seed, as a paired ratio. The plot is the training
loss against forward passes of each schedule's selected learning rate, one line per seed.
``--versus BASELINE`` adds the table the issue asks for: every selected row (and HiZOO's
step-size control) against the tuned baseline of the same task, paired by seed.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

if __package__ in (None, ""):
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__)))))

from experiments.choose import harness, run, tasks  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(harness.HERE))
FIGURES = os.path.join(ROOT, "docs", "results", "figures")


def fp_to_reach(res: dict, target: float) -> int | None:
  """Forward passes at the first evaluation whose training-set loss is <= ``target``
  (resolution: the run's evaluation interval), or None if it never gets there."""
  for e in res["curve"]:
    v = e["train_loss"]
    if v is not None and np.isfinite(v) and v <= target:
      return int(e["fp"])
  return None


def fp_to_reach_interpolated(res: dict, target: float) -> float | None:
  """Like :func:`fp_to_reach`, but linear in forward passes between the last evaluation
  above ``target`` and the first at or below it: a finer estimate than the evaluation
  grid when the loss falls steadily between two evaluations (it assumes nothing else)."""
  prev = None
  for e in res["curve"]:
    v = e["train_loss"]
    if v is None or not np.isfinite(v):
      prev = None
      continue
    if v <= target:
      if prev is None:  # the first finite evaluation already reaches it
        return float(e["fp"])
      return prev[0] + (prev[1] - target) / (prev[1] - v) * (e["fp"] - prev[0])
    prev = (float(e["fp"]), float(v))
  return None


def _fmt(x, spec=".4f"):
  return "—" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def _mean_sd(xs, spec=".4f", scale=1.0):
  xs = [x * scale for x in xs if x is not None and math.isfinite(x)]
  if not xs:
    return "—"
  if len(xs) == 1:
    return format(xs[0], spec)
  return f"{format(np.mean(xs), spec)} ± {format(np.std(xs, ddof=1), spec)}"


def grid_exponents(grid: run.Grid, schedule: str, results: str) -> list[int]:
  """The grid's exponents plus any the runner widened to (that have a result)."""
  exps = set(grid.exponents)
  for e in range(min(exps) - 6, max(exps) + 7):
    if any(run.load(grid.config(e, schedule, s), results) for s in grid.seeds):
      exps.add(e)
  return sorted(exps)


def schedule_table(grid: run.Grid, schedule: str, results: str):
  """Markdown rows of one schedule's learning rates; returns (text, best exponent)."""
  exps = grid_exponents(grid, schedule, results)
  best, means = run.select(grid, schedule, exps, results)
  lines = [f"**{grid.task}, {grid.method}{grid.tag}, {schedule}** ({len(grid.seeds)} seeds, "
           f"{grid.budget:,} forward passes)", "",
           "| lr | seeds done | val loss (selection) | train loss | test acc % | diverged |"
           " s / forward pass |", "|---|---|---|---|---|---|---|"]
  for e in exps:
    rs = [run.load(grid.config(e, schedule, s), results) for s in grid.seeds]
    rs = [r for r in rs if r is not None]
    if not rs:
      continue
    vals = [run.val_loss(r) for r in rs]
    mark = " **(selected)**" if e == best else ""
    acc = [(r["test"] or {}).get("test_accuracy") for r in rs]
    spf = [r["sec_per_fp"] for r in rs if r["sec_per_fp"]]
    lines.append(
        f"| {run.lr_of(e):.3g}{mark} | {len(rs)}/{len(grid.seeds)} | "
        f"{_mean_sd([v if math.isfinite(v) else None for v in vals])} | "
        f"{_mean_sd([r['final']['train_loss'] for r in rs])} | "
        f"{_mean_sd([a for a in acc if a is not None], '.1f', 100.0)} | "
        f"{sum(r['diverged_at_step'] is not None for r in rs)} | "
        f"{_fmt(float(np.median(spf)) if spf else None, '.2e')} |")
  if best is not None:
    edge = best in (min(exps), max(exps))
    below = max((e for e in exps if e < best), default=None)
    above = min((e for e in exps if e > best), default=None)
    lines.append("")
    lines.append(f"Selected lr {run.lr_of(best):.3g}: "
                 f"{'AT THE EDGE of the grid (widen it)' if edge else 'interior'} "
                 f"(nearest neighbours' val loss: {_fmt(means.get(below))} at "
                 f"{_fmt(run.lr_of(below) if below is not None else None, '.3g')}, "
                 f"{_fmt(means.get(above))} at "
                 f"{_fmt(run.lr_of(above) if above is not None else None, '.3g')}).")
  else:
    lines.append("")
    lines.append("Selection pending: not every run of the grid has finished.")
  return "\n".join(lines), best


def compare_schedules(grid: run.Grid, bests: dict, results: str):
  """Paired comparison of the tuned schedules: forward passes to the baseline's final
  training loss (per seed), final losses and test accuracy."""
  done = {sch: e for sch, e in bests.items() if e is not None}
  if len(done) < 2:
    return ""
  runs = {sch: {s: run.load(grid.config(e, sch, s), results) for s in grid.seeds}
          for sch, e in done.items()}
  base = min(done, key=lambda sch: np.mean([run.val_loss(r) for r in runs[sch].values()]))
  lines = [f"Tuned schedules, paired by seed. Baseline: {base} at lr "
           f"{run.lr_of(done[base]):.3g} (lowest mean validation loss). Ratio: forward passes to "
           "reach the baseline's final training loss of the same seed, over the baseline's "
           "budget (evaluation interval "
           f"{grid.eval_every:,}; \"never\": not within the budget; \"start\": the start "
           "already reaches it).", "",
           "| schedule | lr | val loss | train loss | test acc % | ratio per seed |",
           "|---|---|---|---|---|---|"]
  for sch, rs in runs.items():
    ratios = []
    for s, r in rs.items():
      b = runs[base][s]
      target = b["final"]["train_loss"]
      hit = fp_to_reach(r, target) if target is not None else None
      ratios.append(_ratio(hit, b))
    vals = list(rs.values())
    lines.append(
        f"| {sch}{' (baseline)' if sch == base else ''} | {run.lr_of(done[sch]):.3g} | "
        f"{_mean_sd([run.val_loss(r) for r in vals])} | "
        f"{_mean_sd([r['final']['train_loss'] for r in vals])} | "
        f"{_mean_sd([(r['test'] or {}).get('test_accuracy') for r in vals], '.1f', 100.0)} | "
        f"{', '.join(ratios)} |")
  return "\n".join(lines)


def _mean_hit(runs, target: float) -> float:
  """Mean over runs of the interpolated forward passes to reach ``target`` (a run that
  never does: infinite)."""
  hits = [fp_to_reach_interpolated(r, target) if r is not None else None for r in runs]
  return float(np.mean([math.inf if h is None else h for h in hits]))


def select_to_target(grid: run.Grid, schedule: str, exps, results: str, target: float):
  """The exponent whose runs reach ``target`` in the fewest forward passes on average over
  the grid's seeds; None while a run is missing or where none reaches it."""
  means = {}
  for e in exps:
    runs = [run.load(grid.config(e, schedule, s), results) for s in grid.seeds]
    if any(r is None for r in runs):
      return None
    means[e] = _mean_hit(runs, target)
  best = min(means, key=lambda e: (means[e], e)) if means else None
  return None if best is None or math.isinf(means[best]) else best


def selected_runs(name: str, results: str, task: str | None = None,
                  extra_seeds: tuple = (), target: float | None = None) -> list:
  """``[(label, lr, {seed: result})]``: every grid x schedule of table ``name`` (on ``task``,
  if given) at its selected learning rate, each HiZOO grid followed by its step-size control;
  grids whose selection is pending are left out. ``extra_seeds``: seeds outside the grid's
  (run by another table at the selected rate, e.g. ``sst2_short_seeds``) whose results are
  added where they exist, as are the grid's own ``confirm_seeds``; the selection itself
  uses the grid's seeds only. ``target``:
  select the learning rate that reaches this training loss in the fewest forward passes
  (:func:`select_to_target`; the validation loss where none reaches it)."""
  rows = []
  for grid in run.TABLES[name]:
    if task is not None and grid.task != task:
      continue
    for sch in grid.schedules:
      exps = grid_exponents(grid, sch, results)
      best, _ = run.select(grid, sch, exps, results)
      if target is not None and best is not None:
        fastest = select_to_target(grid, sch, exps, results, target)
        best = best if fastest is None else fastest
      if best is None:
        continue
      label = f"{grid.method}{grid.tag} {sch}"
      runs = {s: run.load(grid.config(best, sch, s), results) for s in grid.seeds}
      for s in (*grid.confirm_seeds, *extra_seeds):
        if s not in runs and (r := run.load(grid.config(best, sch, s), results)) is not None:
          runs[s] = r
      rows.append((label, run.lr_of(best), runs))
      if grid.control:
        ctl = {s: run.load(grid.control_config(best, sch, s), results) for s in grid.seeds}
        ctl = {s: r for s, r in ctl.items() if r is not None}
        if ctl:
          rows.append((f"  control: MeZO, lr / mean H(t) of {label}", run.lr_of(best), ctl))
  return rows


def _ratio(hit, baseline_run) -> str:
  """``hit / budget``; "never" (not within the budget); "start" where the start already
  reaches the baseline's final loss (the baseline ended no lower than it started)."""
  if hit is None:
    return "never"
  return "start" if hit == 0 else f"{hit / baseline_run['forward_passes']:.2f}"


def _target_ratio(r, b, target) -> tuple[str, str]:
  """Forward passes of run ``r`` to reach ``target`` over the baseline run ``b``'s (on the
  evaluation grid, and interpolated); "never" where ``r`` does not reach it, "—" where the
  baseline does not."""
  out = []
  for fn in (fp_to_reach, fp_to_reach_interpolated):
    bh, hit = fn(b, target), fn(r, target)
    out.append("—" if not bh else "never" if hit is None else f"{hit / bh:.2f}")
  return out[0], out[1]


def baseline_task(task: str) -> str:
  """The task whose runs pair with ``task``'s by seed: itself, or the task it declares
  (``paired_with``: the same data, batches and start, another trainable subset)."""
  return getattr(tasks.TASKS.get(task), "paired_with", None) or task


def tuned_baseline(baseline: str, results: str, task: str, extra_seeds: tuple = (),
                   target: float | None = None):
  """``(label, lr, {seed: result})`` of table ``baseline``'s tuned row for ``task``'s runs
  to pair with: of its selected rows on :func:`baseline_task`, the lowest mean validation
  loss (with ``target``: the fastest to it); ``None`` where none is selected yet."""
  base_rows = selected_runs(baseline, results, baseline_task(task), extra_seeds, target)
  if not base_rows:
    return None
  if target is None:
    return min(base_rows, key=lambda r: np.mean([run.val_loss(x) for x in r[2].values()]))
  return min(base_rows, key=lambda r: _mean_hit(r[2].values(), target))


def versus(name: str, baseline: str, results: str, extra_seeds: tuple = (),
           target: float | None = None) -> str:
  """Every selected row of table ``name`` against the tuned baseline (the lowest mean
  validation loss among table ``baseline``'s selected rows on the same task), paired by
  seed: forward passes to reach the baseline's final training loss of the same seed, over
  the baseline's forward passes, on the evaluation grid and interpolated between the two
  evaluations around the crossing. ``extra_seeds``: see :func:`selected_runs`.

  ``target``: a fixed training loss instead (for tasks such as the test functions, where
  the tuned runs end at the float's resolution): forward passes to reach it over the
  baseline's forward passes to reach it, seed by seed."""
  tasks_ = sorted({g.task for g in run.TABLES[name]})
  out = []
  for task in tasks_:
    base = tuned_baseline(baseline, results, task, extra_seeds, target)
    if base is None:
      out.append(f"{task}: the baseline table {baseline} has no selection yet.")
      continue
    b_label, b_lr, b_runs = base
    what = ("the baseline's final training loss of the same seed over the baseline's "
            "forward passes (\"never\": not within the budget; \"start\": the start "
            "already reaches it, the baseline ended no lower than it began)"
            if target is None else
            f"training loss {target:g} over the baseline's forward passes to reach it, same "
            "seed (\"never\": not within the budget); each grid's learning rate, and the "
            "baseline, selected as the fastest to that loss (mean over seeds)")
    lines = [f"**{task}**: against the tuned baseline {b_label} at lr {b_lr:.3g} "
             f"({baseline}). Ratio: forward passes to reach {what}, at the first evaluation "
             "that reaches it and interpolated linearly between the two evaluations around "
             "the crossing.", "",
             "| method | lr | val loss | train loss | test acc % | ratio per seed | "
             "interpolated | state bytes | s / forward pass |",
             "|---|---|---|---|---|---|---|---|---|"]
    paired = []
    for i, (label, lr, rs) in enumerate([(f"{b_label} (baseline)", b_lr, b_runs),
                                         *selected_runs(name, results, task, extra_seeds,
                                                        target)]):
      if i:  # every row but the baseline's own
        paired.append((label, paired_differences(rs, b_runs)))
      ratios, interp = [], []
      for s, r in sorted(rs.items()):
        b = b_runs.get(s)
        if r is None or b is None or b["final"]["train_loss"] is None:
          ratios.append("—")
          interp.append("—")
          continue
        if target is not None:
          grid_ratio, interp_ratio = _target_ratio(r, b, target)
          ratios.append(grid_ratio)
          interp.append(interp_ratio)
          continue
        hit = fp_to_reach(r, b["final"]["train_loss"])
        ratios.append(_ratio(hit, b))
        hit = fp_to_reach_interpolated(r, b["final"]["train_loss"])
        interp.append(_ratio(hit, b))
      vals = [r for r in rs.values() if r is not None]
      spf = [r["sec_per_fp"] for r in vals if r["sec_per_fp"]]
      lines.append(
          f"| {label} | {lr:.3g} | {_mean_sd([run.val_loss(r) for r in vals])} | "
          f"{_mean_sd([r['final']['train_loss'] for r in vals])} | "
          f"{_mean_sd([(r['test'] or {}).get('test_accuracy') for r in vals], '.1f', 100.0)}"
          f" | {', '.join(ratios)} | {', '.join(interp)} | "
          f"{vals[0]['state_bytes'] if vals else '—'} | "
          f"{_fmt(float(np.median(spf)) if spf else None, '.2e')} |")
    for label, diffs in paired:
      text = _paired_text(label.strip(), diffs)
      if text:
        lines += ["", text]
    out.append("\n".join(lines))
  return "\n\n".join(out)


def paired_differences(runs: dict, base_runs: dict) -> dict:
  """Method minus baseline, seed by seed, over the seeds both ran: ``{measure: (seeds,
  differences)}`` for the final training and validation loss, the test loss and the test
  accuracy (in points). A per-seed difference removes what the pair shares (the probe
  start, the batch order, the validation split), so its spread, not the spread of either
  run, is what bounds a mean difference: the standard error of the mean of ``n`` paired
  differences is their standard deviation over ``sqrt(n)``."""
  out = {}
  getters = {"train CE": lambda r: r["final"]["train_loss"],
             "val CE": run.val_loss,
             "test CE": lambda r: (r.get("test") or {}).get("test_loss", math.nan),
             "test acc (points)": lambda r: 100.0 * (r.get("test") or {}).get(
                 "test_accuracy", math.nan)}
  for measure, get in getters.items():
    seeds, diffs = [], []
    for s in sorted(set(runs) & set(base_runs)):
      r, b = runs[s], base_runs[s]
      if r is None or b is None:
        continue
      try:
        d = float(get(r)) - float(get(b))
      except (TypeError, KeyError):
        continue
      if math.isfinite(d):
        seeds.append(s)
        diffs.append(d)
    if diffs:
      out[measure] = (seeds, diffs)
  return out


def _diff_spec(measure: str) -> str:
  return "+.1f" if "points" in measure else "+.4f"


def mean_se_text(measure: str, d) -> str:
  """``"mean ± standard error"`` of the paired differences ``d`` of ``measure`` (their mean
  alone for one seed), to the digits the report prints."""
  spec = _diff_spec(measure)
  text = format(float(np.mean(d)), spec)
  if len(d) > 1:
    text += " ± " + format(float(np.std(d, ddof=1)) / math.sqrt(len(d)), spec[1:])
  return text


def _paired_text(label: str, diffs: dict) -> str:
  """One line: each measure's mean paired difference, its standard error and the per-seed
  differences (measures with fewer than two paired seeds are left out)."""
  parts = []
  for measure, (seeds, d) in diffs.items():
    if len(d) < 2:
      continue
    spec = _diff_spec(measure)
    parts.append(f"{measure} {mean_se_text(measure, d)} "
                 f"(seeds {', '.join(map(str, seeds))}: "
                 f"{', '.join(format(x, spec) for x in d)})")
  if not parts:
    return ""
  return (f"Paired differences, {label} minus the baseline (mean ± standard error of the "
          f"mean): " + "; ".join(parts) + ".")


def plot_versus(name: str, baseline: str, results: str, task: str, path: str,
                extra_seeds: tuple = ()) -> None:
  """Training-set loss against forward passes: the tuned baseline and every selected row
  of table ``name`` on ``task``, one line per seed."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  base_rows = selected_runs(baseline, results, baseline_task(task), extra_seeds)
  if not base_rows:
    return
  b = min(base_rows, key=lambda r: np.mean([run.val_loss(x) for x in r[2].values()]))
  rows = [(f"{b[0]} (baseline)", b[1], b[2]), *selected_runs(name, results, task, extra_seeds)]
  fig, ax = plt.subplots(figsize=(8, 4.8))
  for i, (label, lr, rs) in enumerate(rows):
    for j, r in enumerate(x for x in rs.values() if x is not None):
      pts = [(c["fp"], c["train_loss"]) for c in r["curve"]
             if c["train_loss"] is not None and np.isfinite(c["train_loss"])]
      ax.plot(*zip(*pts, strict=True), color=f"C{i}", lw=1.6 if i == 0 else 1.0,
              ls="-" if i == 0 or "control" not in label else "--", alpha=0.85,
              label=f"{label.strip()}, lr {lr:.3g}" if j == 0 else None)
  ax.set_xlabel("forward passes")
  ax.set_ylabel("training-set loss")
  ax.set_yscale("log")
  ax.set_title(f"{task}: {name} against {baseline}")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def plot(grid: run.Grid, bests: dict, results: str, path: str) -> None:
  """Training-set loss against forward passes at each schedule's selected lr."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(7, 4.2))
  for i, (sch, e) in enumerate(bests.items()):
    if e is None:
      continue
    for j, s in enumerate(grid.seeds):
      r = run.load(grid.config(e, sch, s), results)
      if r is None:
        continue
      fp = [c["fp"] for c in r["curve"]]
      tl = [c["train_loss"] for c in r["curve"]]
      ax.plot(fp, tl, color=f"C{i}", lw=1.2, alpha=0.85,
              label=f"{sch}, lr {run.lr_of(e):.3g}" if j == 0 else None)
  ax.set_xlabel("forward passes")
  ax.set_ylabel("training-set loss")
  ax.set_yscale("log")
  ax.set_title(f"{grid.task}: {grid.method}{grid.tag}, tuned lr per schedule")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def report(name: str, results: str = harness.RESULTS, figures: str | None = FIGURES) -> str:
  """The Markdown report of table ``name`` (and its PNGs in ``figures`` unless None)."""
  parts = [run.progress(name, results)]
  for k, grid in enumerate(run.TABLES[name]):
    bests = {}
    for sch in grid.schedules:
      text, bests[sch] = schedule_table(grid, sch, results)
      parts.append(text)
    comp = compare_schedules(grid, bests, results)
    if comp:
      parts.append(comp)
    if figures and any(e is not None for e in bests.values()):
      os.makedirs(figures, exist_ok=True)
      png = os.path.join(figures, f"choosing_{name}{'_' + str(k) if k else ''}.png")
      plot(grid, bests, results, png)
      parts.append(f"(plot: {os.path.relpath(png, ROOT)})")
  return "\n\n".join(parts)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--table", action="append", default=[], help=f"of {sorted(run.TABLES)}")
  p.add_argument("--results", default=harness.RESULTS)
  p.add_argument("--no-plot", action="store_true")
  p.add_argument("--versus", default=None,
                 help="also compare each table's selected rows with this baseline table's")
  p.add_argument("--extra-seeds", type=int, nargs="*", default=[],
                 help="with --versus: also pair these seeds where another table ran them at "
                      "the selected learning rates (e.g. sst2_short_seeds: 1 2)")
  p.add_argument("--target", type=float, default=None,
                 help="with --versus: forward passes to reach this training loss, over the "
                      "baseline's (instead of to reach the baseline's final loss)")
  a = p.parse_args(argv)
  extra = tuple(a.extra_seeds)
  for name in a.table or ["digits_mezo"]:
    print(report(name, a.results, None if a.no_plot else FIGURES))
    if a.versus:
      print("\n" + versus(name, a.versus, a.results, extra, a.target))
      if not a.no_plot:
        for task in sorted({g.task for g in run.TABLES[name]}):
          png = os.path.join(FIGURES, f"choosing_{name}_vs_{a.versus}_{task}.png")
          plot_versus(name, a.versus, a.results, task, png, extra)
          print(f"(plot: {os.path.relpath(png, ROOT)})")


if __name__ == "__main__":
  main()
