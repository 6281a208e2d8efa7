"""First call (trace + compile + one step) of each method's step on a real model, against a
jitted first-order Adam step's, each in a fresh process so nothing is cached between rows.

The model and the steps are ``benchmarks/gpu.py``'s: all-MiniLM-L6-v2 fully fine-tuned
(103 leaves, batch 16 x 32), each method at its defaults through ``make_train_step``, and
Adam as ``jax.value_and_grad`` + ``optax.adam`` in one ``jax.jit``. Rows run interleaved,
``--repeats`` rounds, so every method sees the same machine; the table gives medians.

    python benchmarks/first_call.py [--methods adam mezo hizoo zo_muon] [--repeats 3]

``--steps N`` also times N steps after the first two (the median, in seconds a step), so
that a change that saves compile time shows what it costs each step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_METHODS = ("adam", "mezo", "hizoo", "fzoo", "lozo", "subzero", "zo_muon",
                   "zo_muon_r16")


def child(model_name: str, method: str, steps: int = 0) -> dict:
  import jax

  sys.path.insert(0, HERE)
  import gpu

  model = gpu.build(model_name)
  tx, step = gpu.make_step(method, model.loss_fn)
  state = tx.init(model.params)
  jax.block_until_ready(state)
  t = time.perf_counter()
  params, state, loss = jax.block_until_ready(step(model.params, state, *model.batch))
  out = dict(model=model_name, method=method, seconds=time.perf_counter() - t)
  if steps:
    params, state, loss = jax.block_until_ready(step(params, state, *model.batch))
    times = []
    for _ in range(steps):
      t = time.perf_counter()
      params, state, loss = jax.block_until_ready(step(params, state, *model.batch))
      times.append(time.perf_counter() - t)
    out["step_seconds"] = float(np.median(times))
  return out


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--model", default="minilm")
  ap.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS))
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--out", default=os.path.join(HERE, "results", "first_call.json"))
  ap.add_argument("--conditions", default="",
                  help="what else the machine ran (recorded with the rows)")
  ap.add_argument("--steps", type=int, default=0, help="also time this many steps")
  ap.add_argument("--child", nargs=3, metavar=("MODEL", "METHOD", "STEPS"),
                  help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.child:
    model_name, method, steps = args.child
    print(json.dumps(child(model_name, method, int(steps))))
    return
  sys.path.insert(0, HERE)
  from common import git_commit, machine, run_child, write_json

  # a persistent compilation cache would turn every round after the first into a cache hit
  os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)

  runs = {m: [] for m in args.methods}
  steps = {m: [] for m in args.methods}
  for _ in range(args.repeats):
    for m in args.methods:
      out = run_child(__file__, "--child", args.model, m, str(args.steps))
      runs[m].append(out["seconds"])
      if args.steps:
        steps[m].append(out["step_seconds"])
      print(f"{m}: {runs[m][-1]:.1f} s", flush=True)
  adam = float(np.median(runs["adam"])) if "adam" in runs else None
  rows = [dict(method=m, seconds=float(np.median(v)), runs=v,
               over_adam=float(np.median(v)) / adam if adam else None)
          for m, v in runs.items()]
  if args.steps:
    for r in rows:
      r["step_seconds"] = float(np.median(steps[r["method"]]))
  print(f"\n| step on {args.model} | first call, s (median of {args.repeats}) | x jitted Adam "
        "| a step, s |")
  print("|---|---|---|---|")
  for r in rows:
    ratio = f"{r['over_adam']:.1f}" if r["over_adam"] is not None else "-"
    each = f"{r['step_seconds']:.3f}" if "step_seconds" in r else "-"
    print(f"| {r['method']} | {r['seconds']:.1f} | {ratio} | {each} |")
  write_json(args.out, dict(machine=machine(), commit=git_commit(), date=time.strftime("%Y-%m-%d"),
                            conditions=args.conditions, model=args.model, rows=rows))


if __name__ == "__main__":
  main()
