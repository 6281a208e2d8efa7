"""Tables and plots of the SST-2 study from its table ``results.jsonl.gz`` (whatever has
finished).

    python -m experiments.sst2.report     # writes experiments/sst2/tables.md, the figures, and
                                          # the tables of NOTES.md and docs/results/sst2.md
                                          # (between <!-- BEGIN name --> / <!-- END name -->)
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict

import numpy as np

from experiments import table

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIG = os.path.join(ROOT, "docs", "results", "figures")
WINDOW = 50
SEED_STYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)))  # seeds 0-4
MEZO_LR = {"lora": 5e-4, "ft": 1e-5, "prefix": 1e-3}  # the study's MeZO lr per tuning mode
NAMES = {"probe": "linear probe", "adam": "first-order Adam", "mezo": "MeZO",
         "hizoo": "HiZOO (α = 1e-3)", "mezo_hctl": "MeZO, lr / mean H(t) of HiZOO",
         "blockh": "per-tensor curvature (power 1)",
         "blockh_sqrt": "per-tensor curvature (power ½)",
         "hizoo_preset": "HiZOO presets (μ = 1e-2, α = 0.5/d)",
         "hizoo_paper": "HiZOO paper (α = 1e-8)",
         "hizoo_l": "HiZOO-L (α = 1e-3)", "zo_adam": "ZO-Adam"}


def smooth(x, w=WINDOW):
  x = np.asarray(x, np.float64)
  c = np.cumsum(np.insert(x, 0, 0.0))
  n = np.minimum(np.arange(1, len(x) + 1), w)
  return (c[1:] - c[np.arange(1, len(x) + 1) - n]) / n


def load_all():
  return [{**r, "id": r["key"]} for r in table.read(os.path.join(HERE, "results" + table.SUFFIX))]


def ms(xs, fmt="{:.1f}", scale=100.0):
  xs = [scale * x for x in xs]
  if not xs:
    return "–"
  if len(xs) == 1:
    return fmt.format(xs[0])
  sd = fmt.replace("+", "").format(np.std(xs, ddof=1))
  return f"{fmt.format(np.mean(xs))} ± {sd}"


def group(runs, **match):
  out = [r for r in runs if all(r["config"].get(k) == v for k, v in match.items())]
  return sorted(out, key=lambda r: r["config"]["seed"])


def steps_to(curve, target):
  """First step (1-based) >= WINDOW (a full moving-average window) with curve <= target."""
  hit = np.nonzero(curve[WINDOW - 1:] <= target)[0] + WINDOW - 1
  return int(hit[0]) + 1 if hit.size else None


def references(runs):
  rows = ["| reference | k | seeds | steps | test acc % (mean ± sd) | val acc % | train CE |",
          "|---|---|---|---|---|---|---|"]
  for k in (16, 512):
    for m in ("probe", "adam"):
      g = group(runs, method=m, k=k, mode="lora")
      if not g:
        continue
      seeds = ", ".join(str(r["config"]["seed"]) for r in g)
      rows.append(f"| {NAMES[m]} | {k} | {len(g)} ({seeds})"
                  f" | {g[0]['config']['steps']}"
                  f" | {ms([r['final']['test']['accuracy'] for r in g])}"
                  f" | {ms([r['final']['val']['accuracy'] for r in g])}"
                  f" | {np.mean([r['final']['train']['ce'] for r in g]):.4f} |")
  return "\n".join(rows)


GRID_METHODS = ("mezo", "hizoo", "blockh", "blockh_sqrt", "hizoo_preset")


def grid(runs, steps=300):
  rows = ["| method | lr | final train loss (MA-50) | val CE | val acc % | test acc % | s/step |",
          "|---|---|---|---|---|---|---|"]
  for m in GRID_METHODS:
    for r in sorted(group(runs, method=m, k=512, seed=0, steps=steps, mode="lora"),
                    key=lambda r: r["config"]["lr"]):
      fin = smooth([x for x in r["losses"] if np.isfinite(x)])[-1]
      div = f" (diverged at step {r['diverged_at']})" if "diverged_at" in r else ""
      rows.append(f"| {NAMES[m]} | {r['config']['lr']:g} | {fin:.4f}{div} |"
                  f" {r['final']['val']['ce']:.4f} | {100 * r['final']['val']['accuracy']:.1f} |"
                  f" {100 * r['final']['test']['accuracy']:.1f} | {r['sec_per_step']:.3f} |")
  return "\n".join(rows)


MAIN = (  # (key, label, predicate on a result) of the main comparison (study.MAIN)
    ("mezo", NAMES["mezo"], lambda r: r["config"]["method"] == "mezo"
     and r["config"]["lr"] == 5e-4),
    ("hizoo", NAMES["hizoo"], lambda r: r["config"]["method"] == "hizoo"
     and r["config"]["lr"] == 1.5e-3),
    ("mezo_hctl", NAMES["mezo_hctl"], lambda r: r["config"]["method"] == "mezo_hctl"),
    ("blockh", "per-tensor curvature (power ½, κ = 4)", lambda r: "_k4v2_" in r["id"]),
    ("blockh_v1", "per-tensor curvature, first estimator (went NaN)",
     lambda r: "_k4_" in r["id"]),
)


LONG = 5000  # the long budget (study.LONG_STEPS)


def is_main(r, k=512, steps=(600, LONG), mode="lora"):
  c = r["config"]
  steps = (steps,) if isinstance(steps, int) else steps
  return (c["k"] == k and c["steps"] in steps and c["mode"] == mode
          and any(pred(r) for _, _, pred in MAIN))


def _budget(runs, k, steps, mode):
  """The runs of one (k, steps, mode), and the probe and MeZO run of each seed."""
  base = [r for r in runs if r["config"]["k"] == k and r["config"]["steps"] == steps
          and r["config"]["mode"] == mode]
  probe = {r["config"]["seed"]: r for r in group(runs, method="probe", k=k, mode="lora")}
  mezo = {r["config"]["seed"]: r for r in base if MAIN[0][2](r)}
  return base, probe, mezo


def _minus_probe(g, probe):
  """Final test accuracy minus the probe's of the same seed (the same k-shot sample)."""
  return [r["final"]["test"]["accuracy"] - probe[r["config"]["seed"]]["final"]["test"]["accuracy"]
          for r in g if r["config"]["seed"] in probe]


def main_table(runs, k=512, steps=600, mode="lora"):
  """Seeds paired with MeZO's: its final MA-50 loss of the same seed is the target."""
  base, probe, mezo = _budget(runs, k, steps, mode)
  rows = ["| method | lr | seeds | test acc % | Δ test acc vs probe (pts) | test acc % "
          "(val-selected) | train CE: start → end (all k-shot) | final loss MA-50 | steps to "
          f"MeZO's final MA-50 loss (per seed) | forward passes to it / MeZO's 2 × {steps} |"
          " s/step |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
  summary = {}
  for key, label, pred in MAIN:
    g = sorted([r for r in base if pred(r)], key=lambda r: r["config"]["seed"])
    if not g:
      continue
    acc = [r["final"]["test"]["accuracy"] for r in g]
    sel = [r["selected"]["test"]["accuracy"] for r in g]
    dprobe = _minus_probe(g, probe)
    fins = [smooth(r["losses"])[-1] for r in g]
    hits, ratios = [], []
    for r in g:
      s = r["config"]["seed"]
      if s not in mezo:
        hits.append("?")
        continue
      target = smooth(mezo[s]["losses"])[-1]
      h = steps_to(smooth(r["losses"]), target)
      hits.append("never" if h is None else str(h))
      if h is not None:
        ratios.append(h * r["forwards_per_step"] / (steps * mezo[s]["forwards_per_step"]))
    lrs = sorted({r["config"]["lr"] for r in g})
    rat = (f"{np.median(ratios):.2f} (reached {len(ratios)}/{len(g)})" if ratios
           else f"– (reached 0/{len(g)})")
    ce0 = np.mean([r["init"]["train"]["ce"] for r in g])
    ce1 = np.mean([r["final"]["train"]["ce"] for r in g])
    rows.append(f"| {label} | {', '.join(f'{x:g}' for x in lrs)} | {len(g)} "
                f"({', '.join(str(r['config']['seed']) for r in g)}) | {ms(acc)} |"
                f" {ms(dprobe, '{:+.1f}')} | {ms(sel)} | {ce0:.4f} → {ce1:.4f} |"
                f" {np.mean(fins):.4f} | {', '.join(hits)} | {rat} |"
                f" {np.median([r['sec_per_step'] for r in g]):.3f} |")
    summary[key] = {"acc": acc, "dprobe": dprobe, "ratios": ratios, "n": len(g),
                    "seeds": [r["config"]["seed"] for r in g], "train_ce": [ce0, ce1]}
  return "\n".join(rows), summary


def best_train_ce(r):
  """(step, CE) of the lowest training CE over the evaluations (the whole k-shot set)."""
  ev = [(e["step"], e["train_ce"]) for e in r.get("evals", []) if "train_ce" in e]
  return min(ev, key=lambda t: t[1]) if ev else None


def long_table(runs, k=512, steps=LONG, mode="lora"):
  """The long budget, scored on the whole k-shot training set at every evaluation (every 500
  steps): MeZO's lowest training CE of the run is the target, as its final one can sit above
  it where MeZO has destabilised."""
  base, probe, mezo = _budget(runs, k, steps, mode)
  rows = ["| method | lr | seeds | test acc % (final) | Δ vs probe (pts) | test acc % "
          "(val-selected) | train CE at the end (per seed) | lowest train CE (step) |"
          " step reaching MeZO's lowest train CE (per seed) | forward passes to it / MeZO's |"
          " s/step |", "|---|---|---|---|---|---|---|---|---|---|---|"]
  for _, label, pred in MAIN[:3]:
    g = sorted([r for r in base if pred(r)], key=lambda r: r["config"]["seed"])
    if not g:
      continue
    dprobe = _minus_probe(g, probe)
    hits, ratios = [], []
    for r in g:
      s = r["config"]["seed"]
      if s not in mezo:
        hits.append("?")
        continue
      m_step, m_ce = best_train_ce(mezo[s])
      h = next((e["step"] for e in r["evals"] if e.get("train_ce", np.inf) <= m_ce), None)
      hits.append("never" if h is None else str(h))
      if h is not None:
        ratios.append(h * r["forwards_per_step"] / (m_step * mezo[s]["forwards_per_step"]))
    best = [best_train_ce(r) for r in g]
    end_ce = [r["final"]["train"]["ce"] for r in g]
    rat = (f"{np.median(ratios):.2f} (reached {len(ratios)}/{len(g)})" if ratios
           else f"– (reached 0/{len(g)})")
    rows.append(
        f"| {label} | {', '.join(f'{x:g}' for x in sorted({r['config']['lr'] for r in g}))} |"
        f" {len(g)} ({', '.join(str(r['config']['seed']) for r in g)}) |"
        f" {ms([r['final']['test']['accuracy'] for r in g])} | {ms(dprobe, '{:+.1f}')} |"
        f" {ms([r['selected']['test']['accuracy'] for r in g])} |"
        f" {', '.join(f'{ce:.3f}' for ce in end_ce)} |"
        f" {', '.join(f'{c:.3f} ({st})' for st, c in best)} | {', '.join(hits)} | {rat} |"
        f" {np.median([r['sec_per_step'] for r in g]):.3f} |")
  return "\n".join(rows)


def extras(runs):
  rows = ["| method | mode | k | steps | lr | seeds | test acc % | Δ vs probe (pts) |"
          " Δ vs MeZO (pts) | train CE | final loss MA-50 | s/step |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  probe = {(r["config"]["k"], r["config"]["seed"]): r for r in runs
           if r["config"]["method"] == "probe"}
  # MeZO at the study's lr of each mode, same (mode, k, steps, seed): the paired comparison
  mezo = {(c["mode"], c["k"], c["steps"], c["seed"]): r for r in runs
          for c in [r["config"]] if c["method"] == "mezo" and c["lr"] == MEZO_LR[c["mode"]]}
  seen = defaultdict(list)
  for r in runs:
    c = r["config"]
    if c["method"] == "probe" or (c["method"] == "adam"):
      continue
    if is_main(r) or (c["k"] == 512 and c["mode"] == "lora" and c["steps"] == 300
                      and c["method"] in GRID_METHODS):
      continue
    seen[(c["method"], c["mode"], c["k"], c["steps"], c["lr"])].append(r)
  for (m, mode, k, steps, lr), g in sorted(seen.items()):
    if steps == 300 and k == 512 and mode == "lora":
      continue  # grid table
    d = [r["final"]["test"]["accuracy"]
         - probe[(k, r["config"]["seed"])]["final"]["test"]["accuracy"]
         for r in g if (k, r["config"]["seed"]) in probe]
    dm = [r["final"]["test"]["accuracy"] - mezo[key]["final"]["test"]["accuracy"]
          for r in g for key in [(mode, k, steps, r["config"]["seed"])]
          if key in mezo and mezo[key] is not r]
    rows.append(f"| {NAMES[m]} | {mode} | {k} | {steps} | {lr:g} | {len(g)} |"
                f" {ms([r['final']['test']['accuracy'] for r in g])} | {ms(d, '{:+.1f}')} |"
                f" {ms(dm, '{:+.1f}') if dm else '–'} |"
                f" {np.mean([r['final']['train']['ce'] for r in g]):.4f} |"
                f" {np.mean([smooth(r['losses'])[-1] for r in g]):.4f} |"
                f" {np.median([r['sec_per_step'] for r in g]):.3f} |")
  return "\n".join(rows)


def curvature(runs):
  rows = []
  for r in runs:
    bc = r.get("block_curvature")
    if not bc or "_k4v2_" not in r["id"]:
      continue
    h, se, s = np.array(bc["h"]), np.array(bc["rel_se"]), np.array(bc["scales"])
    names = [n.replace("['backbone']", "").replace("['attention']", "") for n in bc["names"]]
    order = np.argsort(-h)
    top = ", ".join(f"{names[i]} {h[i]:.3g} (±{100 * se[i]:.0f}%)" for i in order[:3])
    low = ", ".join(f"{names[i]} {h[i]:.3g} (±{100 * se[i]:.0f}%)" for i in order[-3:])
    rows.append(f"- `{r['id']}`: scales s_b in [{s.min():.3g}, {s.max():.3g}], median relative "
                f"s.e. {100 * np.median(se):.0f}%; largest h: {top}; smallest: {low}")
  return "\n".join(rows)


def long_plots(runs, steps=LONG):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
  for i, (_, label, pred) in enumerate(MAIN[:3]):
    g = [r for r in runs if is_main(r, steps=steps) and pred(r)]
    for j, r in enumerate(g):
      st = [e["step"] for e in r["evals"]]
      kw = dict(color=f"C{i}", lw=1, alpha=0.8,
                label=f"{label}" if j == 0 else None, ls=SEED_STYLES[j % 5])
      ax[0].plot([0] + st, [r["init"]["train"]["ce"]] + [e["train_ce"] for e in r["evals"]],
                 **kw)
      ax[1].plot([0] + st, [100 * r["init"]["val"]["accuracy"]]
                 + [100 * e["accuracy"] for e in r["evals"]], **kw)
    if pred is MAIN[1][2]:
      for j, r in enumerate(g):
        if r.get("mean_h"):
          ax[2].plot(r["mean_h"], color="C1", lw=1, ls=SEED_STYLES[j % 5],
                     label=f"seed {r['config']['seed']}")
  ax[0].set_ylabel("training CE, whole k-shot set")
  ax[1].set_ylabel("validation accuracy %")
  ax[2].set_ylabel("mean H(t) of HiZOO")
  for a in ax:
    a.set_xlabel("step")
    a.grid(alpha=0.3)
    if a.get_lines():
      a.legend(fontsize=7)
  ax[0].set_title(f"SST-2 k = 512, LoRA, {steps} steps (line style = seed)")
  fig.tight_layout()
  fig.savefig(os.path.join(FIG, "sst2_long.png"), dpi=110)
  plt.close(fig)


def plots(runs, steps=600):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  os.makedirs(FIG, exist_ok=True)
  fig, ax = plt.subplots(1, 2, figsize=(12, 4.2))
  for i, (_, label, pred) in enumerate(MAIN[:4]):
    g = [r for r in runs if is_main(r, steps=steps) and pred(r)]
    curves = np.array([smooth(r["losses"]) for r in g if len(r["losses"]) == steps])
    if len(curves) == 0:
      continue
    x = np.arange(1, steps + 1) * g[0]["forwards_per_step"]
    ax[0].plot(np.arange(1, steps + 1), curves.mean(0), color=f"C{i}",
               label=f"{label} ({len(curves)} seeds)")
    ax[1].plot(x, curves.mean(0), color=f"C{i}", label=label)
  for a, xl in zip(ax, ("step", "forward passes"), strict=True):
    a.set_xlabel(xl)
    a.set_ylabel(f"training CE (MA-{WINDOW}, mean over seeds)")
    a.grid(alpha=0.3)
  if ax[0].get_lines():
    ax[0].legend(fontsize=8)
  ax[0].set_title("SST-2 k = 512, MiniLM-L6 LoRA, LP-initialised head")
  fig.tight_layout()
  fig.savefig(os.path.join(FIG, "sst2_loss.png"), dpi=110)
  plt.close(fig)
  g = [r for r in runs if is_main(r, steps=steps) and MAIN[1][2](r) and r.get("mean_h")]
  if g:
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for r in g:
      ax.plot(r["mean_h"], lw=1, label=f"seed {r['config']['seed']}")
    ax.set_xlabel("step")
    ax.set_ylabel("mean H(t) of HiZOO")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(FIG, "sst2_hizoo_mean_h.png"), dpi=110)
    plt.close(fig)


def fill_page(path, blocks):
  """Replaces each ``<!-- BEGIN name -->...<!-- END name -->`` block of ``path``."""
  if not os.path.exists(path):
    return
  with open(path) as fh:
    text = fh.read()
  for name, body in blocks.items():
    text = re.sub(rf"(<!-- BEGIN {name} -->\n).*?(<!-- END {name} -->)",
                  lambda m, body=body: m.group(1) + body.strip() + "\n" + m.group(2), text,
                  flags=re.S)
  with open(path, "w") as fh:
    fh.write(text)


def main():
  runs = load_all()
  table, summary = main_table(runs)
  blocks = {"references": references(runs), "grid": grid(runs), "main": table,
            "long": long_table(runs), "extras": extras(runs), "curvature": curvature(runs)}
  text = []
  for name, body in blocks.items():
    text += [f"## {name}\n", body, ""]
  with open(os.path.join(HERE, "tables.md"), "w") as fh:
    fh.write("\n".join(text) + "\n")
  with open(os.path.join(HERE, "summary.json"), "w") as fh:
    json.dump(summary, fh, indent=1)
  fill_page(os.path.join(HERE, "NOTES.md"), blocks)  # the lab notes: every table
  fill_page(os.path.join(ROOT, "docs", "results", "sst2.md"), blocks)  # the page: two of them
  plots(runs)
  long_plots(runs)
  print("\n".join(text))


if __name__ == "__main__":
  main()
