"""Floating-point drift of the in-place restore, float32 vs bfloat16, against exact restore.

The in-place lean step restores ``theta`` as ``((theta + d) - 2 d) + d`` with
``d = mu H^{-1/2} z``, three roundings per step, like the reference PyTorch trainer. With
learning rate 0 an exact step leaves ``theta`` unchanged, so the change after T steps is
pure restore drift. Reported: RMS of ``theta_T - theta_0`` relative to RMS(theta), and in
units of the params' ulp at their typical magnitude; next to it, the RMS size of one
update ``lr * g`` at lr = 1e-4 (what the drift competes with).

    python benchmarks/drift.py [--out benchmarks/results/drift.json]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from common import batch, machine, mlp_loss, mlp_params, write_json  # noqa: E402

import hizoo_jax as hz  # noqa: E402

SIZES = [1024, 1024, 1024, 1024]
CHECKPOINTS = (1, 10, 100, 300)


def rms(tree):
  leaves = [np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(tree)]
  return float(np.sqrt(np.mean(np.concatenate(leaves) ** 2)))


def drift(dtype, restore, mu=1e-3):
  params0 = mlp_params(SIZES, dtype)
  x, y = batch(SIZES, 64, dtype)
  tx = hz.hizoo(0.0, mu=mu, hessian_smoothing=1e-8)
  step = hz.make_train_step(tx, mlp_loss, restore=restore, donate=False)
  params, state = params0, tx.init(params0)
  out = {}
  for t in range(1, max(CHECKPOINTS) + 1):
    params, state, _ = step(params, state, x, y)
    if t in CHECKPOINTS:
      diff = jax.tree.map(lambda a, b: np.asarray(a, np.float64) - np.asarray(b, np.float64),
                          params, params0)
      out[t] = rms(diff)
  return out, rms(params0)


def update_size(dtype, lr=1e-4):
  params = mlp_params(SIZES, dtype)
  x, y = batch(SIZES, 64, dtype)
  tx = hz.scale_by_hizoo(mu=1e-3, hessian_smoothing=1e-8)
  g, _ = tx.update(None, tx.init(params), params, value_fn=lambda p: mlp_loss(p, x, y))
  return lr * rms(g)


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--out", default="benchmarks/results/drift.json")
  args = ap.parse_args()
  res = dict(machine=machine(), rows=[])
  print("| params | restore | " + " | ".join(f"after {t} steps" for t in CHECKPOINTS)
        + " | ulp at RMS(theta) | one update at lr=1e-4 |")
  print("|---|---|" + "---|" * (len(CHECKPOINTS) + 2))
  for dtype in (jnp.float32, jnp.bfloat16):
    step_size = update_size(dtype)
    for restore in ("inplace", "exact"):
      d, scale = drift(dtype, restore)
      ulp = float(np.spacing(np.asarray(scale, np.float32))) if dtype == jnp.float32 else \
          float(2.0 ** (np.floor(np.log2(scale)) - 7))
      res["rows"].append(dict(dtype=jnp.dtype(dtype).name, restore=restore, rms_theta=scale,
                              ulp=ulp, drift=d, update_rms=step_size))
      cells = " | ".join(f"{v / scale:.1e} ({v / ulp:.2g} ulp)" for v in d.values())
      print(f"| {jnp.dtype(dtype).name} | {restore} | {cells} | {ulp:.1e} | "
            f"{step_size:.1e} ({step_size / ulp:.2g} ulp) |")
  write_json(args.out, res)
  print(f"\nRMS(theta) = {scale:.3g}; drift is RMS(theta_T - theta_0) / RMS(theta).")
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
