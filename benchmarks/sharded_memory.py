"""Per-device memory of the sharded (FSDP) lean step vs one device, compiled analysis.

Model: 4 layers of 4096 x 4096 float32 (256 MiB), 64 rows, on 8 devices (virtual CPU
devices unless real ones are present): params and optimizer state split on their first
axis over 8 ("fsdp"). For every lean pass, ``memory_analysis()`` gives the bytes one
device holds (arguments + outputs - aliased + temporaries); the table compares the
largest pass with the single-device figure.

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
import jax.numpy as jnp  # noqa: E402
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


def pass_peaks(step, params, state, x, y):
  ex = step.executables(params, state)
  z = jnp.zeros((), jnp.float32)
  return {
      "forward": compiled_peak(ex.fwd.lower(params, x, y).compile()),
      "perturb": compiled_peak(ex.perturb_inplace.lower(params, state, 1.0).compile()),
      "update_params": compiled_peak(ex.update_params.lower(params, state, z, z, z)
                                     .compile()),
      "update_state": compiled_peak(ex.update_state.lower(state, params, z, z, z).compile()),
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
        "per device of the largest lean pass (forward, perturb, update_params, "
        "update_state), each plus the state or params it does not take\n")
  print("| optimizer | pass | one device | FSDP over 8, per device | ratio |")
  print("|---|---|---|---|---|")
  for name, make in OPTIMIZERS.items():
    tx = make()
    state = tx.init(params)
    one = pass_peaks(hz.make_train_step(tx, mlp_loss), params, state, x, y)
    sp = jax.device_put(params, p_sh)
    ss = jax.device_put(state, hz.state_shardings(state, params, p_sh))
    xs = jax.device_put(x, NamedSharding(mesh, P()))
    ys = jax.device_put(y, NamedSharding(mesh, P()))
    sharded = pass_peaks(hz.make_train_step(tx, mlp_loss, param_shardings=p_sh), sp, ss, xs, ys)
    # the passes not taking the state (or params) still have it alive on the device
    s1, s8 = nbytes(state), nbytes(state) / n
    one["forward"] += s1
    sharded["forward"] += s8
    one["update_state"] += nbytes(params)
    sharded["update_state"] += nbytes(params) / n
    a, b = max(one.values()), max(sharded.values())
    rows.append(dict(optimizer=name, one_device=one, fsdp_per_device=sharded, ratio=a / b))
    for k in one:
      print(f"| {name} | {k} | {one[k] / 2**20:.1f} | {sharded[k] / 2**20:.1f} | "
            f"{one[k] / sharded[k]:.2f} |")
    print(f"| {name} | **step (largest pass)** | {a / 2**20:.1f} | {b / 2**20:.1f} | "
          f"{a / b:.2f} |")
  write_json(args.out, dict(machine=machine(), devices=n, rows=rows))
  print("\nThe zeroth-order passes hold exactly 1/8 per device; the forward pass also "
        "holds what XLA gathers of the weight shards for its matmuls (FSDP).")
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
