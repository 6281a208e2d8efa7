"""Compiled memory of a step on the 1.1B-parameter bfloat16 Llama, on any machine.

The params are abstract (``nnx.eval_shape``): nothing is allocated or run, so a 2-core CPU
compiles the step of a model it could not comfortably hold and reads ``memory_analysis()``
of the executable (arguments, outputs, aliased, temporaries) against the jitted forward
pass of the same batch (4 x 256 tokens, ``benchmarks/gpu.py``'s ``llama1b``):

    python benchmarks/llama1b_memory.py [--methods mezo hizoo] [--out FILE]
    python benchmarks/llama1b_memory.py --model tiny     # llama.tiny_config(), for tests

Each method is compiled with ``restore="exact"`` (the default for 16-bit params: it keeps
theta and perturbs a separate buffer, one more params-worth) and ``restore="inplace"``
(adds the perturbation back; no extra buffer, but in bfloat16 theta drifts by rounding,
see "Floating-point drift of the in-place reconstruction" in
benchmarks/RESULTS.md). The temporaries beyond the forward pass's are
what the step adds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import jax.numpy as jnp
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu  # noqa: E402

import hizoo_jax as hz  # noqa: E402
from hizoo_jax.models import llama, peft  # noqa: E402


def analysis(compiled) -> dict:
  mem = compiled.memory_analysis()
  return dict(argument=mem.argument_size_in_bytes, output=mem.output_size_in_bytes,
              alias=mem.alias_size_in_bytes, temp=mem.temp_size_in_bytes)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--methods", nargs="+", default=["mezo", "hizoo"])
  ap.add_argument("--model", choices=("llama1b", "tiny"), default="llama1b")
  ap.add_argument("--out", default=None)
  args = ap.parse_args(argv)
  cfg, shape = (gpu.LLAMA_1B, (4, 256)) if args.model == "llama1b" else \
      (llama.tiny_config(), (2, 64))
  model = nnx.eval_shape(lambda: llama.LlamaForCausalLM(
      cfg, param_dtype=jnp.bfloat16, dtype=jnp.bfloat16, rngs=nnx.Rngs(0)))
  graphdef, params, frozen = peft.split_trainable(model, "ft")
  param_bytes = sum(x.size * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(params))
  loss_fn = peft.make_loss_fn(graphdef, gpu.next_token_loss)
  ids = jax.ShapeDtypeStruct(shape, jnp.int32)
  fwd = analysis(jax.jit(loss_fn).lower(params, frozen, ids, ids).compile())
  out = dict(model=args.model, backend=jax.default_backend(), jax=jax.__version__,
             param_bytes=param_bytes, forward=fwd, rows=[])
  print(f"{jax.default_backend()}, jax {jax.__version__}: params {param_bytes / 2**30:.2f} "
        f"GiB (bfloat16); forward temporaries {fwd['temp'] / 2**30:.2f} GiB")
  print("| method | restore | step temporaries - forward's, in params-worths |")
  print("|---|---|---|")
  for name in args.methods:
    tx = getattr(hz, name)(1e-7)
    state = jax.eval_shape(tx.init, params)
    for restore in ("exact", "inplace"):
      step = hz.make_train_step(tx, loss_fn, restore=restore)
      row = dict(method=name, restore=restore,
                 **analysis(step.lower(params, state, frozen, ids, ids).compile()))
      row["extra_temp_params"] = (row["temp"] - fwd["temp"]) / param_bytes
      out["rows"].append(row)
      print(f"| {name} | {restore} | {row['extra_temp_params']:.3f} |", flush=True)
  if args.out:
    with open(args.out, "w") as fh:
      json.dump(out, fh, indent=1)
  return out


if __name__ == "__main__":
  main()
