"""Compiled temporaries of the lean step on a TinyLlama-1.1B-shaped decoder, in param bytes.

The step of each method (``hz.<method>(1e-6)`` through ``hz.make_train_step``) is lowered
and compiled for abstract float32 params (``nnx.eval_shape``: nothing is allocated, so it
runs on a laptop), and its temporaries plus non-aliased outputs beyond those of a forward
pass are divided by the params' bytes, as ``tests/helpers.py::lean_step_extra`` does at top
level. Run it twice to compare XLA:CPU's schedulers::

    python benchmarks/lowrank_memory.py --out benchmarks/results/lowrank_memory_default.json
    XLA_FLAGS=--xla_cpu_enable_concurrency_optimized_scheduler=false \\
      python benchmarks/lowrank_memory.py --out benchmarks/results/lowrank_memory_memsched.json

Compiling SubZero's and ZO-Muon's steps takes minutes each on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gpu  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from common import machine  # noqa: E402
from flax import nnx  # noqa: E402

import hizoo_jax as hz  # noqa: E402
from hizoo_jax.models import llama, peft  # noqa: E402


def transient(compiled) -> int:
  m = compiled.memory_analysis()
  return m.temp_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--methods", nargs="+", default=["mezo", "subzero", "zo_muon"])
  p.add_argument("--batch", type=int, default=1)
  p.add_argument("--length", type=int, default=128)
  p.add_argument("--out", default=None)
  p.add_argument("--user-jit", action="store_true",
                 help="also compile the step traced into a user's donating jit")
  args = p.parse_args(argv)
  cfg = gpu.LLAMA_1B
  model = nnx.eval_shape(lambda: llama.LlamaForCausalLM(
      cfg, param_dtype=jnp.float32, dtype=jnp.float32, rngs=nnx.Rngs(0)))
  graphdef, params, frozen = peft.split_trainable(model, "ft")
  loss_fn = peft.make_loss_fn(graphdef, gpu.next_token_loss)
  ids = jax.ShapeDtypeStruct((args.batch, args.length), jnp.int32)
  leaves = jax.tree.leaves(params)
  nbytes = sum(x.size * x.dtype.itemsize for x in leaves)
  fwd = transient(jax.jit(loss_fn).lower(params, frozen, ids, ids).compile())
  out = {"machine": machine(), "xla_flags": os.environ.get("XLA_FLAGS", ""),
         "model": "TinyLlama-1.1B-shaped decoder, float32, full fine-tuning",
         "batch": [args.batch, args.length], "param_bytes": nbytes,
         "largest_leaf_fraction": max(x.size * x.dtype.itemsize for x in leaves) / nbytes,
         "forward_transient_bytes": fwd, "methods": {}}
  for name in args.methods:
    tx = getattr(hz, name)(1e-6)
    state = jax.eval_shape(tx.init, params)
    t0 = time.perf_counter()
    compiled = hz.make_train_step(tx, loss_fn).lower(params, state, frozen, ids, ids).compile()
    out["methods"][name] = {"extra_param_bytes": (transient(compiled) - fwd) / nbytes,
                            "compile_seconds": time.perf_counter() - t0}
    print(f"{name}: {out['methods'][name]['extra_param_bytes']:.4f} param bytes beyond a "
          f"forward pass (compiled in {out['methods'][name]['compile_seconds']:.0f} s)",
          flush=True)
    if args.user_jit:
      step = hz.make_train_step(tx, loss_fn)
      user = jax.jit(lambda p, s, f, i, step=step: step(p, s, f, i, i), donate_argnums=(0, 1))
      extra = (transient(user.lower(params, state, frozen, ids).compile()) - fwd) / nbytes
      out["methods"][name]["extra_param_bytes_in_user_jit"] = extra
      print(f"{name}: {extra:.4f} param bytes in a user's jit", flush=True)
  if args.out:
    with open(args.out, "w") as fh:
      json.dump(out, fh, indent=1)


if __name__ == "__main__":
  main()
