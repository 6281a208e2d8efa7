"""First-call time against the number of leaves, for a chain model: trace + lower (Python:
the library's and JAX's) and XLA's compile, measured apart.

A model of ``L`` layers ``h = tanh(h @ w + b)`` with 16 x 16 weights has ``2 L`` leaves
(the many-small-leaves case: per-head LoRA, MoE experts). Each row is a fresh process
(``benchmarks.common.run_child``), so nothing is cached between rows. First-order Adam
(``jax.value_and_grad`` + ``optax.adam`` in one ``jax.jit``) is the reference: a
zeroth-order step should cost a constant multiple of it at every size, i.e. grow as XLA's
own compile time grows.

    python benchmarks/compile_leaves.py [--layers 250 500 1000] [--methods adam mezo hizoo]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def child(layers: int, method: str) -> dict:
  import jax
  import jax.numpy as jnp
  import optax

  import hizoo_jax as hz

  params = {f"l{i:04d}": {"w": jnp.eye(16) * 0.9, "b": jnp.zeros(16)} for i in range(layers)}

  def loss(p, x, y):
    h = x
    for k in sorted(p):
      h = jnp.tanh(h @ p[k]["w"] + p[k]["b"])
    return jnp.mean((h - y) ** 2)

  x, y = jnp.ones((8, 16)), jnp.zeros((8, 16))
  t = time.perf_counter()
  if method == "adam":
    opt = optax.adam(1e-3)

    @jax.jit
    def step(p, s, x, y):
      value, g = jax.value_and_grad(loss)(p, x, y)
      u, s = opt.update(g, s, p)
      return optax.apply_updates(p, u), s, value

    args = (params, opt.init(params), x, y)
  else:
    tx = getattr(hz, method)(1e-3)
    step = hz.make_train_step(tx, loss)
    args = (params, tx.init(params), x, y)
  lowered = step.lower(*args)  # trace + lower: the library's Python and JAX's
  t_lower = time.perf_counter()
  compiled = lowered.compile()  # XLA
  t_compile = time.perf_counter()
  jax.block_until_ready(compiled(*args))
  t_run = time.perf_counter()
  return dict(layers=layers, leaves=2 * layers, method=method,
              seconds=t_run - t, lower=t_lower - t, compile=t_compile - t_lower,
              run=t_run - t_compile)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--layers", type=int, nargs="+", default=[250, 500, 1000])
  ap.add_argument("--methods", nargs="+", default=["adam", "mezo", "hizoo"])
  ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                "compile_leaves.json"))
  ap.add_argument("--child", nargs=2, metavar=("LAYERS", "METHOD"), help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.child:
    print(json.dumps(child(int(args.child[0]), args.child[1])))
    return
  from common import machine, run_child, write_json

  rows = []
  zo = [m for m in args.methods if m != "adam"]
  print("| leaves | " + " | ".join(f"{m}: lower / compile s" for m in args.methods) + " | " +
        " | ".join(f"{m} / adam: compile" for m in zo) + " |")
  for n in args.layers:
    r = {m: run_child(__file__, "--child", str(n), m) for m in args.methods}
    rows.append(dict(leaves=2 * n, seconds={m: v["seconds"] for m, v in r.items()},
                     lower={m: v["lower"] for m, v in r.items()},
                     compile={m: v["compile"] for m, v in r.items()}))
    ratios = [f"{r[m]['compile'] / r['adam']['compile']:.2f}" for m in zo if "adam" in r]
    print(f"| {2 * n} | " + " | ".join(f"{r[m]['lower']:.1f} / {r[m]['compile']:.1f}"
                                      for m in args.methods) + " | " +
          " | ".join(ratios) + " |", flush=True)
  write_json(args.out, dict(machine=machine(), rows=rows))
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
