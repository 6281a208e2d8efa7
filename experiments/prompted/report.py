"""The prompted-SmolLM2 table (PROTOCOL.md) from its runs: each arm tuned at budgets B and
B/2 on the tuning seeds, compared with tuned MeZO on the confirming seeds.

    python -m experiments.prompted.report [--budget 400] [--runs] [--figure F] [--page P]

``--page docs/results/prompted.md`` rewrites the page's generated part for ``--k`` (between
its ``prompted-table`` markers: :func:`markers`) and ``--figure`` draws every run's
validation curve.

A run's value at a budget ``b`` is its validation cross-entropy at its last evaluation
within ``b`` forward passes. A constant-rate run serves every budget it reaches (its
trajectory does not depend on its length); a scheduled run serves only the budget it was
scheduled for (its last evaluation, within 5% of ``b``). An arm's configuration at ``b`` is
the one with the lowest mean over the tuning seeds; the comparisons then use the seeds the
chosen configurations share beyond those, paired by seed, with bootstrap and Student-t
intervals of the mean paired difference (the tuning seeds' differences are kept apart).
"""

from __future__ import annotations

import argparse
import os
from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

import hizoo_jax as hz
from experiments import table

HERE = os.path.dirname(os.path.abspath(__file__))
TABLE = os.path.join(HERE, "results" + table.SUFFIX)
TUNING_SEEDS = (0, 1)


def config(r: dict) -> tuple:
  """What a run's arm is tuned over (everything but the seed): a hashable tuple."""
  sched = r["schedule"] if r["schedule"] == "constant" else f"{r['schedule']}/T{r['steps']}"
  opts = tuple(sorted((r.get("options") or {}).items()))
  alpha = r["alpha"] if r["arm"].startswith("hizoo") else None
  return (r["arm"], sched, r["lr"], r["mu"], alpha, opts, r["mode"])


def label(c: tuple) -> str:
  arm, sched, lr, mu, alpha, opts, _ = c
  parts = [arm, f"lr {lr:g}", sched.split("/")[0]]
  if alpha is not None:
    parts.append(f"α {alpha:g}")
  parts += [f"{k} {v}" for k, v in opts]
  return ", ".join(parts)


# First-order Adam's step is a forward and a backward pass: counted as three forward passes.
ADAM_PASSES_PER_STEP = 3


def point_at(r: dict, budget: float) -> dict | None:
  """The evaluation of run ``r`` that serves ``budget`` passes, or None if none does: a
  constant-rate run's last evaluation within the budget, if that is at least 95% of it; a
  scheduled run's final evaluation, if the schedule ended within 5% of the budget."""
  points = r["curve"]
  if r["schedule"] == "constant":
    within = [c for c in points if c["passes"] <= budget]
    if not within or within[-1]["passes"] < 0.95 * budget:
      return None
    return within[-1]
  return points[-1] if abs(points[-1]["passes"] - budget) <= 0.05 * budget else None


def value_at(r: dict, budget: float) -> float | None:
  """Validation CE of run ``r`` at ``budget`` passes (:func:`point_at`'s evaluation), or None;
  a non-finite CE (a diverged run) counts as infinite."""
  last = point_at(r, budget)
  if last is None:
    return None
  return float(last["ce"]) if np.isfinite(last["ce"]) else float("inf")


def test_at(records: Iterable[dict], config_: tuple, budget: float,
            metric: str = "accuracy") -> dict[int, float]:
  """``{seed: test accuracy}`` (or ``metric``: ``"ce"``) of configuration ``config_``'s runs
  at ``budget``, for the runs whose evaluation there scored the test file (``run.py
  --test``)."""
  out = {}
  for r in records:
    if config(r) == config_:
      at = point_at(r, budget)
      if at is not None and "test" in at:
        out[r["seed"]] = float(at["test"][metric])
  return out


def select(records: Iterable[dict], **where) -> list[dict]:
  return [r for r in records if all(r.get(k) == v for k, v in where.items())]


def by_config(records: Iterable[dict], budget: float) -> dict[tuple, dict[int, float]]:
  """``{config: {seed: CE at budget}}`` over the runs that serve the budget."""
  out: dict[tuple, dict[int, float]] = defaultdict(dict)
  for r in records:
    v = value_at(r, budget)
    if v is not None:
      out[config(r)][r["seed"]] = v
  return out


def tune(records: Iterable[dict], budget: float, seeds: Sequence[int] = TUNING_SEEDS
         ) -> tuple[tuple, float] | None:
  """The configuration with the lowest mean CE at ``budget`` over ``seeds`` (those that ran
  on every tuning seed), and that mean; None if none did."""
  scores = {c: float(np.mean([v[s] for s in seeds]))
            for c, v in by_config(records, budget).items() if all(s in v for s in seeds)}
  if not scores:
    return None
  best = min(scores, key=scores.get)
  return best, float(scores[best])


def interior(records: Iterable[dict], best: tuple, budget: float,
             seeds: Sequence[int] = TUNING_SEEDS) -> bool:
  """Whether the chosen learning rate has a tried neighbour on both sides (same other
  settings): the grid held the best value inside."""
  rates = {c[2] for c, v in by_config(records, budget).items()
           if c[:2] == best[:2] and c[3:] == best[3:] and all(s in v for s in seeds)}
  return min(rates) < best[2] < max(rates)


def bootstrap(diffs: Sequence[float], n: int = 10_000, seed: int = 0) -> tuple[float, float]:
  """95% percentile interval of the mean of ``diffs`` over ``n`` resamples."""
  d = np.asarray(diffs, np.float64)
  rng = np.random.default_rng(seed)
  means = d[rng.integers(0, len(d), (n, len(d)))].mean(1)
  return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def t_interval(diffs: Sequence[float]) -> tuple[float, float]:
  """95% Student-t interval of the mean of ``diffs`` (wider than the bootstrap's at a few
  seeds, where resampling them understates the spread)."""
  from scipy import stats

  d = np.asarray(diffs, np.float64)
  half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
  return float(d.mean() - half), float(d.mean() + half)


def paired(a: dict[int, float], b: dict[int, float],
           exclude: Sequence[int] = TUNING_SEEDS) -> dict | None:
  """Mean of ``a - b`` over their shared seeds less ``exclude`` (the seeds the choice was
  made on), its bootstrap and t intervals, and the differences by seed."""
  seeds = sorted((set(a) & set(b)) - set(exclude))
  if not seeds:
    return None
  d = [a[s] - b[s] for s in seeds]
  nan = (float("nan"), float("nan"))
  lo, hi = bootstrap(d) if len(d) > 1 else nan
  t_lo, t_hi = t_interval(d) if len(d) > 1 else nan
  return {"mean": float(np.mean(d)), "lo": lo, "hi": hi, "t_lo": t_lo, "t_hi": t_hi,
          "seeds": seeds, "diffs": d}


def reach(records: Iterable[dict], target: dict[int, float]) -> dict[tuple, dict[int, float]]:
  """``{config: {seed: passes}}``: the first evaluation at which each run's CE is at or
  below ``target[seed]`` (inf if none)."""
  out: dict[tuple, dict[int, float]] = defaultdict(dict)
  for r in records:
    if r["seed"] in target:
      hit = [c["passes"] for c in r["curve"] if c["ce"] <= target[r["seed"]]]
      first = float(hit[0]) if hit else float("inf")
      # runs of one configuration and seed of different lengths share a trajectory
      out[config(r)][r["seed"]] = min(first, out[config(r)].get(r["seed"], float("inf")))
  return out


def summary(records: Sequence[dict], budget: float) -> list[dict]:
  """One row per arm: its tuned configuration at B and at B/2, the mean CE there over its
  seeds, and the paired difference of each to tuned MeZO at B."""
  arms = sorted({r["arm"] for r in records})
  mezo = tune(select(records, arm="mezo"), budget)
  ref = by_config(select(records, arm="mezo"), budget)[mezo[0]] if mezo else {}
  ref_test = test_at(select(records, arm="mezo"), mezo[0], budget) if mezo else {}
  rows = []
  for arm in arms:
    runs = select(records, arm=arm)
    row = {"arm": arm}
    for name, b in (("B", budget), ("B/2", budget / 2)):
      best = tune(runs, b)
      if best is None:
        continue
      values = by_config(runs, b)[best[0]]
      row[name] = {"config": best[0], "label": label(best[0]), "tuning_mean": best[1],
                   "interior": interior(runs, best[0], b), "values": values,
                   "vs_mezo_B": paired(values, ref),
                   "vs_mezo_B_tuning": paired(values, ref, exclude=())}
      test = test_at(runs, best[0], b)
      if test:
        # the test file chose nothing, so every seed that scored it counts
        row[name]["test"] = test
        row[name]["test_ce"] = test_at(runs, best[0], b, "ce")
        row[name]["test_vs_mezo_B"] = paired(test, ref_test, exclude=())
    # passes to tuned MeZO's CE at B, of the configuration that gets there first (median
    # over the tuning seeds, then the seeds' passes in order: where no configuration gets
    # there on every seed, the one that does on most, soonest), whatever its own budget
    hits = {c: v for c, v in reach(runs, ref).items() if all(s in v for s in TUNING_SEEDS)}
    if hits:
      first = min(hits, key=lambda c: (np.median([hits[c][s] for s in TUNING_SEEDS]),
                                        sorted(hits[c][s] for s in TUNING_SEEDS)))
      row["reach"] = {"label": label(first), "passes": hits[first]}
    rows.append(row)
  return rows


def _seeds(n: int) -> str:
  return f"{n} seed" if n == 1 else f"{n} seeds"


def _paired_cell(p: dict | None, scale: float = 1.0, digits: int = 4) -> str:
  """A paired difference: its mean, bootstrap and t intervals, and each seed's."""
  if p is None:
    return ""
  f = lambda x: f"{scale * x:+.{digits}f}"  # noqa: E731
  by_seed = ", ".join(f(x) for x in p["diffs"])
  if len(p["seeds"]) < 2:
    return f"{f(p['mean'])} (seed {p['seeds'][0]})"
  return (f"{f(p['mean'])} [{f(p['lo'])}, {f(p['hi'])}; {f(p['t_lo'])}, {f(p['t_hi'])}] "
          f"(seeds {', '.join(map(str, p['seeds']))}: {by_seed})")


def markdown(rows: Sequence[dict], budget: float) -> str:
  """The summary as a Markdown table."""
  lines = [f"| arm | tuned at B = {budget:g} passes | CE at B | B minus MeZO at B, confirming "
           "seeds (bootstrap; t 95%) | tuned at B/2 | CE at B/2 | B/2 minus MeZO at B | "
           "passes to MeZO's CE at B |", "|---|---|---|---|---|---|---|---|"]
  for row in rows:
    cells = [row["arm"]]
    for name in ("B", "B/2"):
      if name not in row:
        cells += ["", "", ""]
        continue
      r = row[name]
      flag = "" if r["interior"] else " (edge)"
      reference = row["arm"] == "mezo" and name == "B"
      cells += [r["label"] + flag,
                f"{np.mean(list(r['values'].values())):.4f} ({_seeds(len(r['values']))})",
                "(the reference)" if reference else _paired_cell(r["vs_mezo_B"])]
    hit = row.get("reach")
    if hit is not None and all(np.isinf(list(hit["passes"].values()))):
      cells.append("not within B")
    else:
      cells.append("" if hit is None else ", ".join(
          f"{v:g}" for _, v in sorted(hit["passes"].items())) + f" ({hit['label']})")
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def test_markdown(rows: Sequence[dict], budget: float) -> str:
  """Test accuracy of each arm's configurations tuned at B and B/2, and each one's paired
  difference with tuned MeZO at B in points (the seeds both scored), a Markdown table."""
  def cell(r: dict | None) -> str:
    if r is None or "test" not in r:
      return ""
    acc = list(r["test"].values())
    ce = np.mean(list(r["test_ce"].values()))
    return f"{np.mean(acc):.4f} (CE {ce:.4f}; {_seeds(len(acc))})"

  def diff(r: dict | None, reference: bool = False) -> str:
    if reference:
      return "(the reference)"
    return "" if r is None else _paired_cell(r.get("test_vs_mezo_B"), 100, 1)

  lines = ["| arm | test accuracy, tuned at B | minus MeZO at B, points (bootstrap; t 95%) | "
           "test accuracy, tuned at B/2 | minus MeZO at B, points |", "|---|---|---|---|---|"]
  for row in rows:
    b, half = row.get("B"), row.get("B/2")
    if not any(r is not None and "test" in r for r in (b, half)):
      continue
    lines.append(f"| {row['arm']} | {cell(b)} | {diff(b, row['arm'] == 'mezo')} | "
                 f"{cell(half)} | {diff(half)} |")
  return "\n".join(lines)


def runs(records: Sequence[dict], budget: float, parts: int = 4) -> str:
  """Every run's validation CE (accuracy) at ``budget * i / parts`` passes, a Markdown table
  (the table's progress, before every configuration has its tuning seeds)."""
  marks = [budget * (i + 1) / parts for i in range(parts)]
  lines = ["| run | seed | " + " | ".join(f"{m:g}" for m in marks) + " |",
           "|---|---|" + "---|" * parts]
  for r in sorted(records, key=lambda r: (label(config(r)), r["seed"])):
    cells = []
    for m in marks:
      at = [c for c in r["curve"] if 0.95 * m <= c["passes"] <= m]
      cells.append(f"{at[-1]['ce']:.4f} ({at[-1]['accuracy']:.3f})" if at else "")
    if any(cells):
      name = f"{label(config(r))}, {r['steps']} steps"
      lines.append(f"| {name} | {r['seed']} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def figure(records: Sequence[dict], path: str, budget: float) -> None:
  """Every run's validation CE against forward passes, one panel per tuning seed: one colour
  per arm, the line style by the run's rate within its arm (solid the highest, dashes
  shortening below it), crosses for a scheduled rate's evaluations; the CE axis stops at
  1.25 times the start, so a diverging run leaves the top of the panel."""

  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  arms = sorted({r["arm"] for r in records})
  colours = dict(zip(arms, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
  confirmed = confirmed_curves(records, budget)
  panels = len(TUNING_SEEDS) + bool(confirmed)
  fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 8.5), sharey=True, squeeze=False)
  if confirmed:
    ax = axes[0][-1]
    for (arm, name), (passes, ces) in confirmed.items():
      ax.plot(passes, ces.mean(0), marker="o", ms=3, color=colours[arm],
              label=f"{name} (mean of {len(ces)} seeds)")
      ax.fill_between(passes, ces.min(0), ces.max(0), color=colours[arm], alpha=0.15)
    ax.set_title("configurations tuned at B, every seed run (band: min to max)")
    ax.set_xlabel("forward passes")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  for ax, seed in zip(axes[0], TUNING_SEEDS, strict=False):
    for arm in arms:
      runs = select(records, arm=arm, seed=seed)
      rates = sorted({r["lr"] for r in runs})
      styles = ([":", "--", "-.", "-"] * len(rates))[-len(rates):]
      for r in sorted(runs, key=lambda r: (r["lr"], str(r.get("alpha")), -r["steps"])):
        points = [c for c in r["curve"] if c["passes"] <= budget and np.isfinite(c["ce"])]
        if len(points) < 2:
          continue
        constant = r["schedule"] == "constant"
        ax.plot([c["passes"] for c in points], [c["ce"] for c in points],
                marker="o" if constant else "x", ms=3 if constant else 5,
                color=colours[arm], ls=styles[rates.index(r["lr"])],
                label=label(config(r)))
    starts = [r["curve"][0]["ce"] for r in records if r["seed"] == seed and r["curve"]]
    if starts:
      ax.set_ylim(top=1.25 * max(starts))
    ax.set_title(f"seed {seed}")
    ax.set_xlabel("forward passes of 16 rows"
                  + (f" (Adam: {ADAM_PASSES_PER_STEP} a step)" if "adam" in arms else ""))
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    # below the panel: the runs' lines fill it
    ax.legend(unique.values(), unique.keys(), fontsize=7, ncol=2, loc="upper center",
              bbox_to_anchor=(0.5, -0.14))
  axes[0][0].set_ylabel("validation cross-entropy")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def confirmed_curves(records: Sequence[dict], budget: float
                     ) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
  """``{(arm, label): (passes, CE by seed and evaluation)}`` of each arm's configuration tuned
  at ``budget``, where it has run beyond the tuning seeds: the evaluations every seed's run
  has, up to the budget (a seed's NaN after it diverged makes the mean stop there)."""
  out = {}
  for row in summary(records, budget):
    b = row.get("B")
    if b is None or not set(b["values"]) - set(TUNING_SEEDS):
      continue
    runs = {}
    for r in records:
      if config(r) == b["config"]:
        points = [c for c in r["curve"] if c["passes"] <= budget]
        if r["seed"] not in runs or len(points) > len(runs[r["seed"]]):
          runs[r["seed"]] = points
    n = min(len(p) for p in runs.values())
    passes = np.array([c["passes"] for c in next(iter(runs.values()))[:n]], np.float64)
    ces = np.array([[c["ce"] for c in runs[s][:n]] for s in sorted(runs)], np.float64)
    out[(row["arm"], b["label"])] = (passes, ces)
  return out


BEGIN, END = "<!-- prompted-table -->", "<!-- /prompted-table -->"


def markers(k: int = 16) -> tuple[str, str]:
  """Where the page's generated part for ``k`` training sentences per class begins and
  ends: :data:`BEGIN` and :data:`END` for k = 16, the table's first task."""
  return (BEGIN, END) if k == 16 else (f"<!-- prompted-table k{k} -->",
                                       f"<!-- /prompted-table k{k} -->")


def compute(records: Sequence[dict]) -> str:
  """What the recorded runs cost: core-hours of training steps (each run's seconds a step,
  on one core, times the steps it ran: a diverged run counted to its last finite evaluation)
  and the evaluations besides them. A rerun that scored the test file replaced its record,
  so it counts once."""
  ran = [max(c["step"] for c in r["curve"] if np.isfinite(c["ce"])) for r in records]
  hours = sum(r["sec_per_step"] * n for r, n in zip(records, ran, strict=True)) / 3600
  evals = sum(len(r["curve"]) for r in records)
  tests = sum("test" in c for r in records for c in r["curve"])
  sentences = {2 * r["val_per_class"] for r in records}
  return (f"{len(records)} runs recorded over {len({r['seed'] for r in records})} seeds: "
          f"{hours:.1f} core-hours of training steps (each run's seconds a step on one core "
          f"times the steps it ran), {evals} evaluations of "
          f"{' or '.join(map(str, sorted(sentences)))} validation sentences and {tests} of "
          "the test file's 872 besides.")


def page_block(records: Sequence[dict], budget: float) -> str:
  """The page's generated part: the summary, then every run at B/4 .. B."""
  if not records:
    return "No run recorded yet."
  rows = summary(records, budget)
  tests = test_markdown(rows, budget)
  return "\n\n".join([
      compute(records),
      markdown(rows, budget),
      *(["Test accuracy (GLUE dev, 872 sentences; zero-shot 0.752), scored at the "
         "evaluation that serves each budget, on every seed that ran it:", tests]
        if tests.count("\n") > 1 else []),
      "Validation CE (accuracy) of every run evaluated at a quarter of B or a multiple of it:",
      runs(records, budget)])


def write_page(path: str, block: str, k: int = 16) -> None:
  """Replaces the part of the page between :func:`markers` of ``k`` with ``block``."""
  begin, end = markers(k)
  with open(path, encoding="utf-8") as fh:
    text = fh.read()
  if begin not in text or end not in text:
    raise ValueError(f"{path} has no {begin} ... {end} block to rewrite")
  head, rest = text.split(begin, 1)
  tail = rest.split(end, 1)[1]
  with open(path, "w", encoding="utf-8") as fh:
    fh.write(f"{head}{begin}\n{block}\n{end}{tail}")


def read(path: str = TABLE, *, start_layer: int = 0, k: int = 16,
         batch_size: int = 16) -> list[dict]:
  """The records of one table: one start layer, k, whole-sentence rows. Passes are counted
  in passes over ``batch_size`` rows: a run at another batch size is an arm of its own
  (``mezo_batch32``), each of its passes counted as ``its batch / batch_size`` passes, so
  that a budget reads the same number of sentences in every arm, and first-order Adam's
  steps counted as :data:`ADAM_PASSES_PER_STEP` passes each. FZOO without its
  normalisation (``normalize: false``) is the arm ``fzoo_unnormalised``."""
  out = []
  for r in table.read(path):
    if (r.get("start_layer", 0) != start_layer or r["k"] != k
        or r.get("rows") != "sentences"):
      continue
    scale = r["batch_size"] / batch_size
    if r["arm"] == "adam":  # its record counts steps; a step is worth three passes
      passes = [ADAM_PASSES_PER_STEP * c["step"] * scale for c in r["curve"]]
    else:
      passes = [c["passes"] * scale for c in r["curve"]]
    r = {**r, "curve": [{**c, "passes": n} for c, n in zip(r["curve"], passes, strict=True)]}
    if r["batch_size"] != batch_size:
      r["arm"] = f"{r['arm']}_batch{r['batch_size']}"
    if r["arm"] == "fzoo" and not (r.get("options") or {}).get("normalize", True):
      r["arm"] = "fzoo_unnormalised"  # an ablation, tuned as an arm of its own
    out.append(r)
  return out


MEASURED_TASK = "smollm2_prompted_lora"
MEASURED_WHAT = ("SmolLM2-135M-Instruct prompted on GLUE SST-2 whole sentences (chat template, "
                 "label words), LoRA rank 8 on every layer's query and value projections, "
                 "k = {k} per class, batch 16, {budget:g} forward passes, tuned on seeds 0 "
                 "and 1 (experiments/prompted, docs/results/prompted.md)")


def measured_task(k: int = 16) -> str:
  """The ``hz.presets.measured`` task of the table at ``k``: :data:`MEASURED_TASK` for
  k = 16, its first task."""
  return MEASURED_TASK if k == 16 else f"{MEASURED_TASK}_k{k}"


def measured_settings(records: Sequence[dict], budget: float) -> dict[str, dict]:
  """The settings the table selects at B, in ``hizoo_jax/measured.json``'s form: each
  arm that ``hz.presets.measured`` can build whose configuration was chosen on both tuning
  seeds at a constant rate with tried rates on both sides of it. Arms still being tuned, and
  those that are not a library method (Adam), are left out."""
  out = {}
  for row in summary(records, budget):
    b = row.get("B")
    if row["arm"] not in hz.presets.ALIASES or b is None or not b["interior"]:
      continue
    arm, sched, lr, mu, alpha, opts, _ = b["config"]
    if sched != "constant":  # measured.json holds a learning rate, not a schedule
      continue
    kw = {"learning_rate": lr, "mu": mu}
    if alpha is not None:
      kw["hessian_smoothing"] = alpha
    if arm in ("fzoo", "zo_muon") and "num_directions" not in dict(opts):
      # the probes it ran with, pinned: a step is one pass more than its probes
      kw["num_directions"] = passes_per_step(records, b["config"]) - 1
    out[arm] = {**kw, **RUN_DEFAULTS.get(arm, {}), **dict(opts)}
  return out


# The library defaults the table's runs took where their records name no option (they do not
# store resolved options), pinned so that a later change of default leaves the measured
# setting the one that ran.
RUN_DEFAULTS = {"zo_muon": {"layout": "flax"},
                "lozo": {"layout": "flax", "resample_every": 50}}


def passes_per_step(records: Sequence[dict], config_: tuple) -> int:
  """Forward passes a step of configuration ``config_``'s runs (the same in every run)."""
  rates = {round(c["passes"] / c["step"]) for r in records if config(r) == config_
           for c in r["curve"] if c["step"] and np.isfinite(c["ce"])}
  if len(rates) != 1:
    raise ValueError(f"{label(config_)}: passes a step {sorted(rates)}, not one number")
  return rates.pop()


def write_measured(path: str, methods: dict[str, dict], budget: float, k: int = 16) -> None:
  """Sets ``measured.json``'s task :func:`measured_task` of ``k`` to ``methods`` (the other
  tasks kept as they are)."""
  import json

  with open(path, encoding="utf-8") as fh:
    data = json.load(fh)
  data["tasks"][measured_task(k)] = {"what": MEASURED_WHAT.format(k=k, budget=budget),
                                     "methods": methods}
  with open(path, "w", encoding="utf-8") as fh:
    json.dump(data, fh, indent=1)
    fh.write("\n")


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--table", default=TABLE)
  p.add_argument("--budget", type=float, default=400)
  p.add_argument("--start-layer", type=int, default=0)
  p.add_argument("--k", type=int, default=16)
  p.add_argument("--batch-size", type=int, default=16)
  p.add_argument("--runs", action="store_true", help="also every run at B/4, B/2, 3B/4, B")
  p.add_argument("--figure", help="draw every run's validation curve to this file")
  p.add_argument("--page", help="rewrite this page's generated part")
  p.add_argument("--measured", help=f"write the tuned settings as task {MEASURED_TASK!r} "
                 "(at another --k, that name and _k<k>) of this measured.json "
                 "(hizoo_jax/measured.json: hz.presets.measured)")
  a = p.parse_args(argv)
  records = read(a.table, start_layer=a.start_layer, k=a.k, batch_size=a.batch_size)
  rows = summary(records, a.budget)
  print(markdown(rows, a.budget))
  print()
  print(test_markdown(rows, a.budget))
  if a.runs:
    print()
    print(runs(records, a.budget))
  if a.figure:
    figure(records, a.figure, a.budget)
  if a.page:
    write_page(a.page, page_block(records, a.budget), a.k)
  if a.measured:
    methods = measured_settings(records, a.budget)
    if not methods:
      p.error("no arm is tuned yet (both tuning seeds, a rate tried on each side)")
    write_measured(a.measured, methods, a.budget, a.k)
    print(f"{a.measured}: {measured_task(a.k)} = {methods}")


if __name__ == "__main__":
  main()
