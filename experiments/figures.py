"""Every figure of docs/results/ that comes from a results table, regenerated in one command.

    python -m experiments.figures            # all of them, into docs/results/figures/
    python -m experiments.figures --list     # the files it writes

The figures of the notebooks (``notebooks/figures/``) come from the notebooks themselves.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

from experiments import table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIGURES = os.path.join(ROOT, "docs", "results", "figures")

# docs/results/choosing.md: (table, the tuned baseline's table, task, seeds besides the grid's)
CHOOSING = (
    ("sst2_long_ft_fzoo", "sst2_long_ft_cosine", "sst2_ft_full", (1, 2)),
    ("sst2_short_hizoo", "sst2_short_mezo_constant", "sst2_ft_full", ()),
    ("digits_compose_fzoo", "digits_mezo", "digits", ()),
    ("digits_oracle_refresh_sched", "digits_mezo", "digits", ()),
)
SST2 = ("sst2_loss.png", "sst2_long.png")  # docs/results/sst2.md, from experiments/sst2
MINILM = "minilm_loss_curve.png"  # docs/results/minilm.md, the example's saved run
PROMPTED = "prompted_lora_k16.png"  # docs/results/prompted.md, experiments/prompted
PROMPTED_K512 = "prompted_lora_k512.png"  # the same page's k = 512 task


def choosing_name(name: str, baseline: str, task: str) -> str:
  return f"choosing_{name}_vs_{baseline}_{task}.png"


def files() -> list[str]:
  return [*(choosing_name(n, b, t) for n, b, t, _ in CHOOSING), *SST2, MINILM, PROMPTED,
          PROMPTED_K512]


def _example(name: str):
  path = os.path.join(ROOT, "examples", f"{name}.py")
  spec = importlib.util.spec_from_file_location(name, path)
  mod = importlib.util.module_from_spec(spec)
  sys.path.insert(0, os.path.dirname(path))  # the example imports its sibling helpers
  spec.loader.exec_module(mod)
  return mod


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--list", action="store_true", help="print the files and stop")
  p.add_argument("--out", default=FIGURES)
  a = p.parse_args(argv)
  if a.list:
    print("\n".join(files()))
    return
  os.makedirs(a.out, exist_ok=True)
  from experiments.choose import harness, report

  for name, baseline, task, extra in CHOOSING:
    report.plot_versus(name, baseline, harness.RESULTS, task,
                       os.path.join(a.out, choosing_name(name, baseline, task)), extra)
  from experiments.sst2 import report as sst2

  sst2.FIG = a.out
  runs = sst2.load_all()
  sst2.plots(runs)
  sst2.long_plots(runs)
  extra_png = os.path.join(a.out, "sst2_hizoo_mean_h.png")  # a plot the page does not show
  if os.path.exists(extra_png):
    os.remove(extra_png)
  saved = table.find(os.path.join(ROOT, "experiments", "examples" + table.SUFFIX), "minilm")
  ex = _example("finetune_minilm")
  ex.plot(saved["results"]["runs"], saved["results"]["args"]["window"],
          os.path.join(a.out, MINILM), "MiniLM-L6 + LoRA on the SST-2 subset: HiZOO against MeZO")
  from experiments.prompted import report as prompted

  prompted.figure(prompted.read(), os.path.join(a.out, PROMPTED), budget=400)
  prompted.figure(prompted.read(k=512), os.path.join(a.out, PROMPTED_K512), budget=400)
  for f in files():
    print(os.path.relpath(os.path.join(a.out, f), ROOT))


if __name__ == "__main__":
  main()
