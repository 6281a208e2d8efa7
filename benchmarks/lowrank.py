"""Step time of the low-rank methods in forward passes, on the speed benchmark's MLP.

The 12.6M-param MLP of benchmarks/speed.py (1024 rows), the default (lean) step of each
method at its reference defaults, timed alternately with a jitted forward pass (median and
quartiles of the paired ratios after 2 warm-up pairs); MeZO for comparison. Prints a table
and writes benchmarks/results/lowrank.json::

    taskset -c 0 python benchmarks/lowrank.py
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from common import (  # noqa: E402
    SPEED_SIZES,
    batch,
    machine,
    mlp_loss,
    mlp_params,
    quartiles,
    time_paired,
    write_json,
)

import hizoo_jax as hz  # noqa: E402

ROWS = (  # name, optimizer, forward passes a step
    ("MeZO", lambda: hz.mezo(1e-6), 2),
    ("LOZO (rank 2, nu 50)", lambda: hz.lozo(1e-6), 2),
    ("LOZO-M (rank 2, nu 50, beta 0.9)", lambda: hz.lozo(1e-6, momentum=0.9), 2),
    ("SubZero (rank 8, T 2000)", lambda: hz.subzero(1e-6), 2),
    ("ZO-Muon (rank 64, q 4, nu 100)", lambda: hz.zo_muon(1e-6), 5),
)


def main(repeats=7):
  params = mlp_params(SPEED_SIZES)
  x, y = batch(SPEED_SIZES, 1024)
  fwd = jax.jit(mlp_loss)
  out = {"machine": machine(), "version": hz.__version__, "sizes": SPEED_SIZES, "rows": 1024,
         "repeats": repeats, "results": {}}
  print("| step | ms | forward passes | quartiles | floor |\n|---|---|---|---|---|")
  for name, make, floor in ROWS:
    tx = make()
    box = {"p": jax.tree.map(jnp.copy, params), "s": tx.init(params)}
    step = hz.make_train_step(tx, mlp_loss)

    def call(step=step, box=box):
      box["p"], box["s"], loss = step(box["p"], box["s"], x, y)
      jax.block_until_ready((box["p"], loss))

    t_step, _, ratios = time_paired(call, lambda: jax.block_until_ready(fwd(params, x, y)),
                                    repeats=repeats, warmup=2)
    q = quartiles(ratios)
    out["results"][name] = {"ms": 1e3 * t_step, "ratio_quartiles": q, "floor": floor}
    print(f"| {name} | {1e3 * t_step:.1f} | **{q[1]:.2f}** | {q[0]:.2f}–{q[2]:.2f} | {floor} |",
          flush=True)
  write_json(os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                          "lowrank.json"), out)


if __name__ == "__main__":
  main()
