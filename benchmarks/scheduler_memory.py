"""Compiled temporaries of the lean step beyond a forward pass, in param bytes, for every
composition of ``tests/test_engine.py`` and every method, on its MLP of four 256 x 256
float32 matrices (``tests.helpers.lean_step_extra``, top level and in a user's jit; the
larger is printed). Run it under both of XLA:CPU's schedulers::

    python benchmarks/scheduler_memory.py --out benchmarks/results/scheduler_memory_default.json
    XLA_FLAGS=--xla_cpu_enable_concurrency_optimized_scheduler=false \\
      python benchmarks/scheduler_memory.py --out benchmarks/results/scheduler_memory_memsched.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax.numpy as jnp  # noqa: E402

import hizoo_jax as hz  # noqa: E402
from hizoo_jax._src import curvature  # noqa: E402
from tests import test_engine as engine  # noqa: E402
from tests.helpers import lean_step_extra  # noqa: E402

METHODS = {
    "fzoo": lambda: hz.fzoo(1e-2), "sparse_mezo": lambda: hz.sparse_mezo(1e-2),
    "lozo_r2": lambda: hz.lozo(1e-2, rank=2),
    "lozo_m_r2": lambda: hz.lozo(1e-2, rank=2, momentum=0.9),
    "subzero_r8": lambda: hz.subzero(1e-2, rank=8), "zo_muon_r64": lambda: hz.zo_muon(1e-2),
    "forward_gradient": lambda: hz.forward_gradient(1e-2),
}
# Compositions whose mask or partition is written for test_engine's smaller params.
SKIP = ("masked", "multi_transform", "multi_transform_zo_in_group")


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--out", default=None)
  args = p.parse_args(argv)
  curvature.BLOCK_ELEMENTS = 8192  # as the engine's memory test: 8 row blocks a leaf
  params = engine.mlp((256,) * 5, jnp.float32)
  x = jnp.zeros((8, 256), jnp.float32)
  out = {"xla_flags": os.environ.get("XLA_FLAGS", ""), "param_bytes": {}}
  for name, make in {**engine.COMPOSITIONS, **METHODS}.items():
    if name in SKIP:
      continue
    extra = max(lean_step_extra(make(), engine.loss_fn, params, x, x).values())
    out["param_bytes"][name] = extra
    print(f"{name:28s} {extra:.3f}", flush=True)
  if args.out:
    with open(args.out, "w") as fh:
      json.dump(out, fh, indent=1)


if __name__ == "__main__":
  main()
