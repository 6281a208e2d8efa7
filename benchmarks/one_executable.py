"""Why the lean step is several executables: a MeZO step as one donated executable.

The lever studied: perturb in place inside a single jitted step (params donated, the
reference's +mu, -2mu, +mu sequence), with and without ``lax.optimization_barrier``
between the passes to order them and let XLA free buffers. Compared by compiled
``memory_analysis()`` with ``hz.make_train_step`` (several donated executables), as extra
peak memory over a forward pass in param bytes (4 x 4096^2 float32, 64 rows, the
``hz.fast_gaussian`` sampler throughout).

    python benchmarks/one_executable.py [--out benchmarks/results/one_executable.json]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from common import (  # noqa: E402
  MEMORY_SIZES,
  batch,
  compiled_peak,
  machine,
  mlp_loss,
  mlp_params,
  nbytes,
  write_json,
)

import hizoo_jax as hz  # noqa: E402

MU, LR = 1e-3, 1e-6


def perturb(tree, key, scale):
  leaves, treedef = jax.tree.flatten(tree)
  keys = jax.random.split(key, len(leaves))
  return treedef.unflatten([x + scale * hz.fast_gaussian(k, x.shape, x.dtype)
                            for x, k in zip(leaves, keys, strict=True)])


def one_executable_step(params, key, x, y, barrier):
  """MeZO in one executable: theta+mu z, theta-mu z, then restore and update in one pass."""
  fence = jax.lax.optimization_barrier if barrier else (lambda t: t)
  p = perturb(params, key, MU)
  p, lp = fence((p, mlp_loss(p, x, y)))
  p = perturb(p, key, -2 * MU)
  p, lm = fence((p, mlp_loss(p, x, y)))
  g = (lp - lm) / (2 * MU)
  return perturb(p, key, MU - LR * g), (lp + lm) / 2


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--out", default="benchmarks/results/one_executable.json")
  args = ap.parse_args()
  params = mlp_params(MEMORY_SIZES)
  x, y = batch(MEMORY_SIZES, 64)
  pb = nbytes(params)
  fwd = compiled_peak(jax.jit(mlp_loss).lower(params, x, y).compile())
  rows = {}
  for barrier in (False, True):
    c = jax.jit(one_executable_step, donate_argnums=(0,), static_argnums=(4,)).lower(
        params, jax.random.key(0), x, y, barrier).compile()
    rows[f"one executable, donated{', optimization_barrier' if barrier else ''}"] = (
        (compiled_peak(c) - fwd) / pb)
  # the lean step's passes, measured as in benchmarks/memory.py
  tx = hz.mezo(LR, mu=MU)
  state = tx.init(params)
  lean = hz.make_train_step(tx, mlp_loss).executables(params, state)
  z = jnp.zeros((), jnp.float32)
  peaks = [
      fwd + nbytes(state),
      compiled_peak(lean.perturb_inplace.lower(params, state, 1.0).compile()),
      compiled_peak(lean.update_params.lower(params, state, z, z, z, True).compile()),
      compiled_peak(lean.update_state.lower(state, params, z, z, z).compile()) + pb,
  ]
  rows["hz.make_train_step (several donated executables)"] = (max(peaks) - fwd) / pb
  write_json(args.out, dict(machine=machine(), param_bytes=pb, extra=rows))
  print("MeZO, extra peak over a forward pass (param bytes, compiled):\n")
  print("| step | extra |")
  print("|---|---|")
  for name, v in rows.items():
    print(f"| {name} | {v:.2f} |")
  print(f"\nwrote {args.out}")


if __name__ == "__main__":
  main()
