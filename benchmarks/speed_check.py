"""Step time in forward passes of the default step, for comparing two versions side by side.

The rows that the performance targets name (12.6M-param MLP, 1024 rows): MeZO, HiZOO, and
HiZOO with ``hessian_update_every=10`` (whole cycles), each timed alternately with a forward
pass (median and quartiles of 7 paired ratios after 2 warm-up pairs). To compare a version
checked out elsewhere, put it first on ``PYTHONPATH``; pin to one core on a shared machine::

    git worktree add /tmp/old v0.1.0-commit
    PYTHONPATH=/tmp/old taskset -c 0 python benchmarks/speed_check.py
    taskset -c 0 python benchmarks/speed_check.py
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from common import SPEED_SIZES, batch, mlp_loss, mlp_params, quartiles, time_paired  # noqa: E402

import hizoo_jax as hz  # noqa: E402


def main():
  params = mlp_params(SPEED_SIZES)
  x, y = batch(SPEED_SIZES, 1024)
  fwd = jax.jit(mlp_loss)
  out = {"version": hz.__version__}
  rows = (("MeZO", lambda: hz.mezo(1e-6), 1), ("HiZOO", lambda: hz.hizoo(1e-6), 1),
          ("HiZOO k=10", lambda: hz.hizoo(1e-6, hessian_update_every=10), 10))
  for name, make, per in rows:
    tx = make()
    box = {"p": jax.tree.map(jnp.copy, params), "s": tx.init(params)}
    step = hz.make_train_step(tx, mlp_loss)

    def call(step=step, box=box, per=per):
      for _ in range(per):
        box["p"], box["s"], loss = step(box["p"], box["s"], x, y)
      jax.block_until_ready((box["p"], loss))

    _, _, ratios = time_paired(call, lambda: jax.block_until_ready(fwd(params, x, y)),
                               repeats=7, warmup=2)
    out[name] = [v / per for v in quartiles(ratios)]
    print(f"{name}: {out[name][1]:.2f} fwd (quartiles {out[name][0]:.2f}-{out[name][2]:.2f})",
          flush=True)
  print(json.dumps(out))


if __name__ == "__main__":
  main()
