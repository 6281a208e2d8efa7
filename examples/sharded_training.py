"""Zeroth-order training on a device mesh: data parallel, FSDP, or both.

Runs unchanged on 8 virtual CPU devices, on GPUs and on TPUs:

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python examples/sharded_training.py
    python examples/sharded_training.py --mode fsdp --optimizer hizoo_l   # real devices

A teacher MLP defines a regression task; a student MLP is trained with a lean HiZOO /
HiZOO-L / MeZO step (``hz.make_train_step`` with ``param_shardings``). The mesh is
``("data", "fsdp")``: ``--mode dp`` puts all devices on "data" (replicated params, the
batch split, only the scalar losses cross devices), ``--mode fsdp`` all on "fsdp" (params
and optimizer state split on their first axis, each device drawing only its shard's
noise), ``--mode both`` half and half. It prints the losses and, per device, the memory
of the compiled passes next to the single-device figure.

Multi-host (one process per host, e.g. a TPU pod slice or several GPU nodes): start every
process with the same command and ``--distributed``; ``jax.distributed.initialize()``
reads the coordinator from the environment (or pass ``--coordinator``, ``--num-processes``,
``--process-id``). Every process uses the same seed, so all of them draw the same noise
and the same global batch, of which each feeds only the rows its devices hold
(``jax.make_array_from_process_local_data``): the run is the same whatever the number of processes
(``tests/test_multihost.py`` runs it as 2 processes and as 1 and compares, via ``--save``).

Takes about a minute on 2 CPU cores (``--smoke``: seconds).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import hizoo_jax as hz


def mlp_params(sizes, key, scale=1.0):
  params = {}
  for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
    key, k = jax.random.split(key)
    params[f"l{i}"] = {"w": scale * jax.random.normal(k, (a, b)) / np.sqrt(a),
                       "b": jnp.zeros((b,))}
  return params


def mlp(params, x, gather=False):
  """``gather``: under a mesh with Explicit axes (``jax.make_mesh``'s default), gather each
  FSDP-sharded layer for its matmul, as an FSDP forward pass does."""
  for i in range(len(params)):
    w, b = params[f"l{i}"]["w"], params[f"l{i}"]["b"]
    if gather:
      w, b = jax.sharding.reshard(w, P()), jax.sharding.reshard(b, P())
    x = x @ w + b
    if i < len(params) - 1:
      x = jax.nn.gelu(x)
  return x


def loss_fn(params, x, y):
  return jnp.mean((mlp(params, x, gather=True) - y) ** 2)


def make_mesh(mode: str) -> Mesh:
  """A ("data", "fsdp") mesh of every device, with Explicit axes (jax.make_mesh's
  default, where JAX sharding is going): shardings are part of the arrays' types."""
  n = jax.device_count()
  if mode == "dp":
    shape = (n, 1)
  elif mode == "fsdp":
    shape = (1, n)
  else:
    data = 2 if n % 2 == 0 and n > 1 else 1
    shape = (data, n // data)
  return jax.make_mesh(shape, ("data", "fsdp"))


def param_shardings(params, mesh: Mesh):
  """Leaves split on their first axis over "fsdp" when it divides it, else replicated."""
  n = mesh.shape["fsdp"]

  def spec(x):
    return NamedSharding(mesh, P("fsdp") if n > 1 and x.shape[0] % n == 0 else P())

  return jax.tree.map(spec, params)


def pass_memory(step, params, state, batch):
  """The step's per-device footprint: arguments + new outputs + temporaries."""
  m = step.lower(params, state, *batch).compile().memory_analysis()
  return (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
          + m.temp_size_in_bytes)


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--mode", choices=("dp", "fsdp", "both"), default="both")
  ap.add_argument("--optimizer", choices=("hizoo", "hizoo_l", "mezo"), default="hizoo")
  ap.add_argument("--width", type=int, default=512)
  ap.add_argument("--batch", type=int, default=256)
  ap.add_argument("--steps", type=int, default=300)
  ap.add_argument("--lr", type=float, default=None)
  ap.add_argument("--seed", type=int, default=0, help="the same on every process")
  ap.add_argument("--smoke", action="store_true", help="tiny and fast (CI)")
  ap.add_argument("--distributed", action="store_true", help="jax.distributed.initialize()")
  ap.add_argument("--coordinator", default=None)
  ap.add_argument("--num-processes", type=int, default=None)
  ap.add_argument("--process-id", type=int, default=None)
  ap.add_argument("--no-memory", action="store_true", help="skip the per-device memory report")
  ap.add_argument("--save", default=None,
                  help="write the losses and the final params and Hessian (.npz, process 0)")
  args = ap.parse_args()
  if args.smoke:
    args.width, args.batch, args.steps = 64, 64, 20
  if args.distributed:
    jax.distributed.initialize(args.coordinator, args.num_processes, args.process_id)

  mesh = make_mesh(args.mode)
  jax.set_mesh(mesh)
  print(f"{jax.process_count()} process(es), {jax.device_count()} {jax.default_backend()} "
        f"device(s), mesh {dict(mesh.shape)}")
  sizes = [32, args.width, args.width, args.width, 8]
  teacher = mlp_params(sizes, jax.random.key(1234))
  probe = np.random.default_rng(1234).standard_normal((4096, sizes[0])).astype(np.float32)
  target_scale = float(jnp.sqrt(jnp.mean(mlp(teacher, probe) ** 2)))  # unit-RMS targets
  params = mlp_params(sizes, jax.random.key(args.seed))
  lr = args.lr or 1e-3
  make = {"hizoo": hz.hizoo, "hizoo_l": hz.hizoo_l, "mezo": hz.mezo}[args.optimizer]
  kw = {} if args.optimizer == "mezo" else dict(hessian_smoothing=1e-4)
  tx = make(lr, mu=1e-3, seed=args.seed, **kw)

  p_sh = param_shardings(params, mesh)
  batch_sh = NamedSharding(mesh, P("data"))
  state = tx.init(params)
  params = jax.device_put(params, p_sh)
  state = jax.device_put(state, hz.state_shardings(state, params, p_sh))
  step = hz.make_train_step(tx, loss_fn, param_shardings=p_sh, batch_sharding=batch_sh)

  rng = np.random.default_rng(args.seed)  # the same global batches on every process
  # the rows of the global batch this process's devices hold (all of them when the batch
  # is replicated, e.g. --mode fsdp)
  held = [i[0].indices(args.batch) for i in
          batch_sh.addressable_devices_indices_map((args.batch, 1)).values()]
  mine = slice(min(a for a, _, _ in held), max(b for _, b, _ in held))

  def next_batch():
    x = rng.standard_normal((args.batch, sizes[0])).astype(np.float32)[mine]
    y = np.asarray(mlp(teacher, x)) / target_scale
    return (jax.make_array_from_process_local_data(batch_sh, x, (args.batch, x.shape[1])),
            jax.make_array_from_process_local_data(batch_sh, y, (args.batch, y.shape[1])))

  batch = next_batch()
  n_params = sum(x.size for x in jax.tree.leaves(params))
  if not args.no_memory:
    per_device = pass_memory(step, params, state, batch)
    print(f"{args.optimizer}: {n_params / 1e6:.2f}M params; largest compiled pass holds "
          f"{per_device / 2**20:.1f} MiB per device "
          f"(params alone: {n_params * 4 / 2**20:.1f} MiB unsharded)")

  t0 = time.perf_counter()
  losses = []
  for i in range(args.steps):
    params, state, loss = step(params, state, *batch)
    losses.append(float(loss))
    if i % max(1, args.steps // 10) == 0 or i == args.steps - 1:
      print(f"step {i:4d}  loss {losses[-1]:.4f}")
    batch = next_batch()
  jax.block_until_ready(params)
  print(f"{args.steps} steps in {time.perf_counter() - t0:.1f} s; params still sharded as "
        f"{params['l0']['w'].sharding.spec}")
  if args.save:
    save(args.save, losses, params, state)


def save(path, losses, params, state):
  """Losses, params and (HiZOO) Hessian as flat float64 arrays, gathered on every process."""
  from jax.experimental import multihost_utils

  out = {"losses": np.asarray(losses, np.float64)}
  trees = {"param": params}
  if (h := hz.get_hessian(state)) is not None:
    trees["hessian"] = h
  for prefix, tree in trees.items():
    for path_, leaf in jax.tree_util.tree_leaves_with_path(tree):
      name = prefix + "".join(f"/{getattr(k, 'key', k)}" for k in path_)
      out[name] = np.asarray(multihost_utils.process_allgather(leaf, tiled=True), np.float64)
  if jax.process_index() == 0:
    np.savez(path, **out)


if __name__ == "__main__":
  main()
