"""The main demo: MeZO, HiZOO, HiZOO-L, FZOO and ZO-Muon against Adam, on the paper's test
functions and digits.

Methods are compared per forward pass, counted by the optimizer state: a MeZO step executes
two, a HiZOO step three (it also measures the loss at the point), an FZOO step with ``N``
probes ``N + 1``, a ZO-Muon step with 4 probes five. Tables and figures count forward
passes; first-order Adam, which has no such count (a forward and a backward pass a step),
is given in steps. Each method keeps one colour and line style in every figure (HiZOO-L
dashed, so that it does not hide HiZOO where their trajectories coincide).

1. The three 2-D test functions of the paper's Appendix C (float64): every method runs from
   the same start over a learning-rate grid and 5 seeds; the table gives the median number
   of forward passes to f < 0.1 at the fastest *robust* learning rate (every seed reached
   0.1 and was still below it at the last step), the (reached, stayed) counts there, and
   how many learning rates of the grid are robust. HiZOO uses the recommended settings
   (``hz.presets``: alpha = 0.5 / d, mu = 1e-2) with no per-function tuning; FZOO its
   defaults (8 probes). ZO-Muon is not run there: its subspace and orthogonalised step are
   for matrices, and the point is a 2-vector (it would take its vector rule, a one-sided
   MeZO).
2. A Flax MLP (26k parameters) on scikit-learn's digits (float32, batches of 64): MeZO,
   HiZOO, HiZOO-L (recommended settings), FZOO and ZO-Muon with the same budget of forward
   passes (10,000: MeZO 5,000 steps, HiZOO 3,334, FZOO with 16 probes 589, ZO-Muon 2,000)
   and first-order Adam (5,000 steps), at fixed learning rates, 3 seeds: MeZO's, HiZOO's
   and Adam's the best of the grids of notebooks/03_ablations.ipynb, chosen there at 5,000
   steps each (no run here goes past the step count its rate was chosen for; given 15,000
   passes, 7,500 steps, MeZO's rate diverged on all 3 seeds); FZOO's and ZO-Muon's their
   measured settings on digits (``hz.presets.measured(name, "digits")``, selected at
   40,000 passes). Final train loss, test accuracy and the wall-clock time of a step in
   forward passes. The tuned comparison, learning rates and decay schedules selected on a
   validation split, is docs/results/choosing.md.

Writes a results table (``results.md``, ``results.json``) and plots (``test_functions.png``,
``digits.png``) to ``--out``. A few minutes on 2 CPU cores.

    python examples/demo.py                # full budgets, writes outputs/demo/*
    python examples/demo.py --quick        # tiny budgets (CI smoke mode)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
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

# experiments/ (the research code behind the notebooks) lives beside examples/, uninstalled.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import digits as D  # noqa: E402
from experiments import problems as P  # noqa: E402
from experiments import report as R  # noqa: E402

# Learning rates of the digits runs: the best of each method's grid in
# notebooks/03_ablations.ipynb (chosen there on a held-out seed).
DIGITS_LR = {"MeZO": 2e-3, "HiZOO": 5e-3, "HiZOO-L": 5e-3, "Adam (first order)": 3e-3}
# The methods of 0.4 on digits at their measured settings (hz.presets.MEASURED["digits"]:
# the forward-pass-matched benchmark's selection, docs/results/choosing.md).
DIGITS_MEASURED = {"FZOO": "fzoo", "ZO-Muon": "zo_muon"}
# One colour and line style per method in every figure.
STYLES = {
    "Adam (first order)": dict(color="0.35", ls=":"),
    "MeZO": dict(color="C0"),
    "HiZOO": dict(color="C3", lw=2.4),  # wide under HiZOO-L's dashes where they coincide
    "HiZOO-L": dict(color="C1", ls="--", marker="x", lw=1.0),
    "FZOO": dict(color="C2"),
    "ZO-Muon": dict(color="C4"),
}


def digits_lr(name):
  """The learning rate of a digits method: the notebook's choice, or the measured one."""
  if name in DIGITS_MEASURED:
    return hz.presets.MEASURED["digits"][DIGITS_MEASURED[name]]["learning_rate"]
  return DIGITS_LR[name]


def test_function_methods():
  rec = hz.presets.recommended(np.zeros(2))  # alpha = 0.25, mu = 1e-2
  return {
      "Adam (first order)": (optax.adam, [dict(first_order=True)]),
      "MeZO": (hz.mezo, [{}]),
      "HiZOO": (hz.hizoo, [rec]),
      "HiZOO-L": (hz.hizoo_l, [{**rec, "matrix": True, "min_dim_size_to_factor": 1}]),
      "FZOO": (hz.fzoo, [{}]),
  }


def _measured(method):
  def factory(learning_rate):
    return hz.presets.measured(method, "digits", learning_rate=learning_rate)

  return factory


def digits_methods():
  return {
      "MeZO": (hz.mezo, False),
      "HiZOO": (hz.presets.hizoo, False),
      "HiZOO-L": (hz.presets.hizoo_l, False),
      **{name: (_measured(method), False) for name, method in DIGITS_MEASURED.items()},
      "Adam (first order)": (optax.adam, True),
  }


def passes_per_step(data):
  """Forward passes a step of each zeroth-order digits method executes, read from its
  state's counter after one step on the MLP (None for first-order Adam)."""
  graphdef, params = D.init_model(0)
  loss = D.make_loss(graphdef)
  out = {}
  for name, (factory, first_order) in digits_methods().items():
    if first_order:
      out[name] = None
      continue
    tx = factory(1e-3)
    p = jax.tree.map(jax.numpy.copy, params)  # the step donates its params
    _, state, _ = hz.make_train_step(tx, loss)(p, tx.init(p), data.x_train[:64],
                                               data.y_train[:64])
    out[name] = int(hz.forward_passes(state))
  return out


def run_digits(data, plan, seeds, eval_every, bar):
  """``plan``: steps per method."""
  out = {}
  for name, (factory, first_order) in digits_methods().items():
    runs, steps = [], plan[name]
    tx = factory(digits_lr(name))  # one transformation: the seeds share its compiled step
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
  return out


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


def digits_table(runs, times, plan, costs):
  lines = ["| method | lr | forward passes (steps) | final train loss, median [min, max] | "
           "test accuracy %, median [min, max] | diverged | step time (forward passes) |",
           "|---|---|---|---|---|---|---|"]
  for name, hs in runs.items():
    s = R.summarize(hs)
    budget = (f"{plan[name]:,} steps (backprop)" if costs[name] is None
              else f"{plan[name] * costs[name]:,} ({plan[name]:,})")
    lines.append(f"| {name} | {digits_lr(name):g} | {budget} | {s['loss']} | {s['acc']} | "
                 f"{s['diverged']} | {times[name]:.1f} |")
  return "\n".join(lines)


def plot_digits(runs, costs, path):
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
  for name, hs in runs.items():
    color, ls = STYLES[name]["color"], STYLES[name].get("ls", "-")
    scale, note = (1, " (x: steps)") if costs[name] is None else (costs[name], "")
    R.band(axes[0], hs, "train_loss", color, f"{name} (lr {digits_lr(name):g}){note}", scale,
           ls)
    R.band(axes[1], hs, "test_accuracy", color, name + note, scale, ls)
  axes[0].set_yscale("log")
  axes[0].set_title(f"digits MLP: train loss (median, range over {len(hs)} seeds)")
  axes[1].set_title("test accuracy")
  axes[1].set_ylim(0.5, 1.0)
  for ax in axes:
    ax.set_xlabel("forward passes (first-order Adam: steps)")
  axes[0].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--quick", action="store_true", help="tiny budgets (smoke test)")
  ap.add_argument("--steps", type=int, default=3000, help="test-function steps")
  ap.add_argument("--seeds", type=int, default=5, help="test-function seeds")
  ap.add_argument("--digits-passes", type=int, default=10000,
                  help="forward passes of each zeroth-order digits run")
  ap.add_argument("--adam-steps", type=int, default=5000,
                  help="steps of the first-order Adam digits run")
  ap.add_argument("--digits-seeds", type=int, default=3)
  ap.add_argument("--out", default="outputs/demo")
  args = ap.parse_args()
  quick = args.quick
  steps, seeds = (400, 3) if quick else (args.steps, args.seeds)
  lrs = 10.0 ** np.arange(-3, 0.01, 1.0) if quick else 10.0 ** np.arange(-5, 0.01, 0.5)
  d_passes, adam_steps, d_seeds = ((600, 200, (0,)) if quick else
                                   (args.digits_passes, args.adam_steps,
                                    tuple(range(args.digits_seeds))))
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
  tf_md = R.functions_table(results, passes=True)
  tf_head = (f"Forward passes to f < 0.1 (float64; first-order Adam: steps): median over "
             f"{seeds} seeds at the fastest robust "
             f"learning rate of {len(lrs)} ({lrs.min():g}..{lrs.max():g}), at most {steps} "
             "steps; (reached, stayed): seeds that reached f < 0.1, and seeds still below it at "
             "the last step; robust lrs: learning rates of the grid at which all seeds reached "
             "and stayed (⚠: none; the fastest median is shown).")
  print("\n" + tf_head + "\n\n" + tf_md + "\n", flush=True)
  plt.close(R.plot_functions(results, os.path.join(args.out, "test_functions.png"),
                             styles=STYLES, passes=True))

  # 2. The digits MLP.
  data = D.load_data()
  costs = passes_per_step(data)
  plan = {name: adam_steps if cost is None else -(-d_passes // cost)
          for name, cost in costs.items()}
  with tqdm(total=sum(plan.values()) * len(d_seeds), desc="digits MLP",
            unit="step", unit_scale=True, mininterval=1.0) as bar:
    runs = run_digits(data, plan, d_seeds, d_eval, bar)
  times = step_times(data, repeats=3 if quick else 7)
  d_md = digits_table(runs, times, plan, costs)
  d_head = (f"Digits MLP (26 122 params, float32, batches of 64, {d_passes:,} forward passes "
            f"for each zeroth-order method, {adam_steps:,} steps for first-order Adam, seeds "
            f"{list(d_seeds)}); step time: median wall-clock of a step over one forward pass "
            f"({1e6 * times['forward_seconds']:.0f} µs) at batch 64.")
  print("\n" + d_head + "\n\n" + d_md + "\n")
  plot_digits(runs, costs, os.path.join(args.out, "digits.png"))
  elapsed = time.perf_counter() - t_start
  print(f"({elapsed:.0f} s in all, test functions {t_functions:.0f} s, on {jax.device_count()} "
        f"{jax.default_backend()} device(s))")

  with open(os.path.join(args.out, "results.md"), "w") as fh:
    fh.write(tf_head + "\n\n" + tf_md + "\n\n" + d_head + "\n\n" + d_md + "\n")
  with open(os.path.join(args.out, "results.json"), "w") as fh:
    json.dump(dict(
        test_functions=[dict(method=r.method, function=r.function, robust=r.robust,
                             median_steps=None if not np.isfinite(r.steps) else r.steps,
                             passes_per_step=r.passes_per_step,
                             seeds_reached=r.counts()[0], seeds_stayed=r.counts()[1],
                             robust_lrs=R.n_robust(r.sweep), learning_rate=r.learning_rate,
                             options={k: v for k, v in r.options.items()}) for r in results],
        digits={name: dict(learning_rate=digits_lr(name), steps=plan[name],
                           passes_per_step=costs[name],
                           final_train_loss=[float(h.train_loss[-1]) for h in hs],
                           test_accuracy=[float(h.test_accuracy[-1]) for h in hs],
                           step_time_forward_passes=times[name]) for name, hs in runs.items()},
        seconds=elapsed), fh, indent=1)
  print(f"wrote {args.out}/results.md, results.json, test_functions.png, digits.png")


if __name__ == "__main__":
  main()
