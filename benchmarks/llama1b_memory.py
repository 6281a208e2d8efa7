"""Compiled memory of a step on a bfloat16 Llama (1.1B, SmolLM2-135M), on any machine.

The params are abstract (``nnx.eval_shape``): nothing is allocated or run, so a 2-core CPU
compiles the step of a model it could not comfortably hold and reads ``memory_analysis()``
of the executable (arguments, outputs, aliased, temporaries) against the jitted forward
pass of the same batch (4 x 256 tokens, ``benchmarks/gpu.py``'s ``llama1b``):

    python benchmarks/llama1b_memory.py [--methods mezo hizoo] [--out FILE]
    python benchmarks/llama1b_memory.py --model smollm2 --methods mezo fzoo zo_muon hizoo
    python benchmarks/llama1b_memory.py --mode lora        # LoRA (rank 8, q and v) params
    python benchmarks/llama1b_memory.py --model tiny     # llama.tiny_config(), for tests

Each method is compiled with ``restore="exact"`` (the default for 16-bit params: theta is
never written until the update; each measuring pass forms ``theta + c mu D`` where the
forward pass reads it) and ``restore="inplace"`` (moves theta and adds the perturbation
back; in bfloat16 theta drifts by rounding, see "Floating-point drift of the in-place
reconstruction" in benchmarks/RESULTS.md). The temporaries beyond the forward pass's are
what the step adds, in params-worths of the trainable params (``largest_leaf``: the
largest trainable leaf in the same unit; ``state_bytes``: the optimizer state, e.g.
HiZOO's float32 H).
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

# SmolLM2-135M's architecture (its config.json): no weights are needed to compile.
SMOLLM2_135M = llama.LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                 num_hidden_layers=30, num_attention_heads=9,
                                 num_key_value_heads=3, max_position_embeddings=8192,
                                 rms_norm_eps=1e-5, rope_theta=100000.0,
                                 tie_word_embeddings=True)
MODELS = {
    "llama1b": lambda: (gpu.LLAMA_1B, (4, 256)),
    "smollm2": lambda: (SMOLLM2_135M, (4, 256)),
    "tiny": lambda: (llama.tiny_config(), (2, 64)),
}


def analysis(compiled) -> dict:
  mem = compiled.memory_analysis()
  return dict(argument=mem.argument_size_in_bytes, output=mem.output_size_in_bytes,
              alias=mem.alias_size_in_bytes, temp=mem.temp_size_in_bytes)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--methods", nargs="+", default=["mezo", "hizoo"])
  ap.add_argument("--model", choices=tuple(MODELS), default="llama1b")
  ap.add_argument("--mode", choices=("ft", "lora"), default="ft",
                  help="train every param (ft) or LoRA rank 8 on q and v (lora)")
  ap.add_argument("--restores", nargs="+", default=["exact", "inplace"])
  ap.add_argument("--out", default=None)
  args = ap.parse_args(argv)
  cfg, shape = MODELS[args.model]()

  def make():
    model = llama.LlamaForCausalLM(cfg, param_dtype=jnp.bfloat16, dtype=jnp.bfloat16,
                                   rngs=nnx.Rngs(0))
    if args.mode == "lora":
      peft.apply_lora(model, rank=8, rngs=nnx.Rngs(1))
    return model

  model = nnx.eval_shape(make)
  graphdef, params, frozen = peft.split_trainable(model, args.mode)
  sizes = [x.size * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(params)]
  param_bytes = sum(sizes)
  loss_fn = peft.make_loss_fn(graphdef, gpu.next_token_loss)
  ids = jax.ShapeDtypeStruct(shape, jnp.int32)
  fwd = analysis(jax.jit(loss_fn).lower(params, frozen, ids, ids).compile())
  out = dict(model=args.model, mode=args.mode, backend=jax.default_backend(),
             jax=jax.__version__, param_bytes=param_bytes,
             largest_leaf=max(sizes) / param_bytes, forward=fwd, rows=[])
  print(f"{jax.default_backend()}, jax {jax.__version__}, {args.model} ({args.mode}): "
        f"trainable params {param_bytes / 2**20:.1f} MiB (bfloat16), largest leaf "
        f"{out['largest_leaf']:.3f} of them; forward temporaries {fwd['temp'] / 2**20:.1f} MiB")
  print("| method | restore | step temporaries - forward's, in params-worths | state MiB |")
  print("|---|---|---|---|")
  for name in args.methods:
    tx = getattr(hz, name)(1e-7)
    state = jax.eval_shape(tx.init, params)
    state_bytes = sum(x.size * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(state))
    for restore in args.restores:
      step = hz.make_train_step(tx, loss_fn, restore=restore)
      row = dict(method=name, restore=restore, state_bytes=state_bytes,
                 **analysis(step.lower(params, state, frozen, ids, ids).compile()))
      row["extra_temp_params"] = (row["temp"] - fwd["temp"]) / param_bytes
      out["rows"].append(row)
      print(f"| {name} | {restore} | {row['extra_temp_params']:.3f} | "
            f"{state_bytes / 2**20:.1f} |", flush=True)
  if args.out:
    with open(args.out, "w") as fh:
      json.dump(out, fh, indent=1)
  return out


if __name__ == "__main__":
  main()
