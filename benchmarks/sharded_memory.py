"""Per-device memory of the sharded (FSDP) lean step vs one device, compiled analysis.

Model: 4 layers of 4096 x 4096 float32 (256 MiB), 64 rows, on 8 devices (virtual CPU
devices unless real ones are present): params and optimizer state split on their first
axis over 8 ("fsdp"). ``memory_analysis()`` gives the bytes one device holds (arguments +
outputs - aliased + temporaries) for the forward pass (plus the optimizer state, which is
alive beside it) and for the whole lean step, on one device and per device over 8.

    python benchmarks/sharded_memory.py [--out benchmarks/results/sharded_memory.json]
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + " --xla_force_host_platform_device_count=8").strip()

import argparse  # noqa: E402
import sys  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import numpy as np  # noqa: E402
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
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import hizoo_jax as hz  # noqa: E402

OPTIMIZERS = {"MeZO": lambda: hz.mezo(1e-6), "HiZOO": lambda: hz.hizoo(1e-6),
              "HiZOO-L": lambda: hz.hizoo_l(1e-6)}


def peaks(step, params, state, x, y):
  return {
      "forward": compiled_peak(jax.jit(mlp_loss).lower(params, x, y).compile())
      + nbytes(state) / len(jax.tree.leaves(params)[0].sharding.device_set),
      "step": compiled_peak(step.lower(params, state, x, y).compile()),
  }


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--out", default="benchmarks/results/sharded_memory.json")
  args = ap.parse_args()
  n = 8
  mesh = Mesh(np.array(jax.devices()[:n]), ("fsdp",))
  params = mlp_params(MEMORY_SIZES)
  x, y = batch(MEMORY_SIZES, 64)
  shard = lambda a: NamedSharding(mesh, P("fsdp") if a.shape[0] % n == 0 else P())
  p_sh = jax.tree.map(shard, params)
  rows = []
  print(f"{n} {jax.default_backend()} devices; params {nbytes(params) / 2**20:.0f} MiB; MiB "
        "per device of the forward pass (plus the optimizer state) and of the lean step\n")
  print("| optimizer | program | one device | FSDP over 8, per device | ratio |")
  print("|---|---|---|---|---|")
  for name, make in OPTIMIZERS.items():
    tx = make()
    state = tx.init(params)
    one = peaks(hz.make_train_step(tx, mlp_loss), params, state, x, y)
    sp = jax.device_put(params, p_sh)
    ss = jax.device_put(state, hz.state_shardings(state, params, p_sh))
    xs = jax.device_put(x, NamedSharding(mesh, P()))
    ys = jax.device_put(y, NamedSharding(mesh, P()))
    sharded = peaks(hz.make_train_step(tx, mlp_loss, param_shardings=p_sh), sp, ss, xs, ys)
    rows.append(dict(optimizer=name, one_device=one, fsdp_per_device=sharded,
                     ratio=one["step"] / sharded["step"]))
    for k in one:
      print(f"| {name} | {k} | {one[k] / 2**20:.1f} | {sharded[k] / 2**20:.1f} | "
            f"{one[k] / sharded[k]:.2f} |")
  write_json(args.out, dict(machine=machine(), devices=n, rows=rows))
  print("\nThe step's own buffers split 8 ways; the forward pass inside it also holds what "
        "XLA gathers of the weight shards for its matmuls (FSDP).")
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
