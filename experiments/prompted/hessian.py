"""HiZOO's diagonal Hessian at the end of each of the table's HiZOO runs, from their last
checkpoints (``ckpt/``, kept by the machine that ran them): the quantiles of H and of the
step's scale H^-1/2 over every trainable coordinate, written to ``hessian.json``.

    python -m experiments.prompted.hessian

HiZOO starts H at 1 and moves it by α a step toward each step's curvature estimate, so H
far from 1 means the preconditioner acts; H^-1/2 below 1 everywhere means it acts as a
smaller learning rate.
"""

from __future__ import annotations

import argparse
import json
import os

import jax
import numpy as np

from hizoo_jax.models import checkpoint

HERE = os.path.dirname(os.path.abspath(__file__))
QUANTILES = (0.0, 0.01, 0.5, 0.99, 1.0)


def summary(directory: str) -> dict:
  """Quantiles of H and H^-1/2 in the checkpoint in ``directory``, and its step."""
  ckpt = checkpoint.Checkpointer(directory)
  try:
    tree = ckpt.restore(ckpt.shapes())
    step = ckpt.latest_step()
  finally:
    ckpt.close()
  state = tree["opt_state"][0]  # hz.hizoo's chain: the estimate's state first
  h = np.concatenate([np.asarray(x, np.float64).ravel()
                      for x in jax.tree.leaves(state["method"]["hessian"])])
  q = lambda v: [float(x) for x in np.quantile(v, QUANTILES)]  # noqa: E731
  return {"step": int(step), "coordinates": int(h.size), "quantiles": list(QUANTILES),
          "hessian": q(h), "scale": q(1 / np.sqrt(h))}


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--ckpt-dir", default=os.path.join(HERE, "ckpt"))
  p.add_argument("--out", default=os.path.join(HERE, "hessian.json"))
  a = p.parse_args(argv)
  out = {}
  for key in sorted(os.listdir(a.ckpt_dir)):
    if key.startswith("hizoo") and os.path.isdir(os.path.join(a.ckpt_dir, key)):
      out[key] = summary(os.path.join(a.ckpt_dir, key))
      print(key, {k: [f"{x:.4g}" for x in v] for k, v in out[key].items()
                  if k in ("hessian", "scale")})
  with open(a.out, "w") as fh:
    json.dump(out, fh, indent=1)
    fh.write("\n")


if __name__ == "__main__":
  main()
