"""The step engine: memory of every composition, small-model overhead, compile time.

Three measurements (each a section of the JSON and of ``benchmarks/RESULTS.md``):

* ``memory``: for each optimizer composition users build, the transient memory of
  ``hz.make_train_step`` over a forward pass, in param bytes (6 x 4096^2 float32 leaves, 64
  rows), from compiled ``memory_analysis()``: what the program allocates beyond its
  arguments (temporaries + outputs not aliased to donated arguments), minus the forward
  pass's temporaries; params and optimizer state themselves are not counted. At top level
  (``step.lower``) and traced into a user's ``jax.jit`` that donates params and state.
  The plain step (``lean=False``) for reference.
* ``small``: the default (lean) step against the plain step (one jitted ``tx.update``) on
  the digits-size MLP (64-128-128-10, batch 64): medians of paired timings (>= 7 after
  warm-up).
* ``compile``: the first call (trace + compile + run) of ``make_train_step`` on 200-tensor
  models against a jitted first-order Adam step on the same model, each in a fresh
  process: a chain of 200 64 x 64 layers (one shape, like a transformer's repeated
  layers), and a chain of 200 layers of 200 different shapes (every leaf its own kernel).

    python benchmarks/engine.py [--only memory|small|compile] [--out benchmarks/results/engine.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from common import (  # noqa: E402
  batch,
  machine,
  mlp_loss,
  mlp_params,
  nbytes,
  quartiles,
  time_paired,
  write_json,
)

import hizoo_jax as hz  # noqa: E402

MEMORY_SIZES = [4096] * 7  # 6 x 4096^2 float32 (403 MB)
ROWS = 64
LR = 1e-6
COMPOSITIONS = {
    "hz.mezo": lambda: hz.mezo(LR),
    "hz.hizoo": lambda: hz.hizoo(LR),
    "hz.presets.hizoo(lr)": lambda: hz.presets.hizoo(LR),
    "inject_hyperparams(hz.hizoo)(lr=cosine)": lambda: optax.inject_hyperparams(hz.hizoo)(
        learning_rate=optax.cosine_decay_schedule(LR, 1000)),
    "chain(scale_by_hizoo, sgd(momentum=0.9))": lambda: optax.chain(
        hz.scale_by_hizoo(), optax.sgd(LR, momentum=0.9)),
    "chain(scale_by_zo, scale_by_adam, scale(-lr))": lambda: optax.chain(
        hz.scale_by_zo(), optax.scale_by_adam(), optax.scale(-LR)),
    "masked(hz.mezo, biases frozen)": lambda: optax.masked(
        hz.mezo(LR), lambda p: jax.tree.map(lambda x: x.ndim == 2, p)),
    "MultiSteps(hz.mezo, 4)": lambda: optax.MultiSteps(hz.mezo(LR), 4),
    # several probes per step and the methods of the method core (0.4.0)
    "hz.mezo(num_directions=4)": lambda: hz.mezo(LR, num_directions=4),
    "hz.hizoo(num_directions=4)": lambda: hz.hizoo(LR, num_directions=4),
    "hz.fzoo (8 probes)": lambda: hz.fzoo(LR),
    "hz.sparse_mezo": lambda: hz.sparse_mezo(LR),
    "hz.lozo(momentum=0.9)": lambda: hz.lozo(LR, momentum=0.9),
    "hz.subzero": lambda: hz.subzero(LR),
    "hz.zo_muon": lambda: hz.zo_muon(LR),
    "hz.forward_gradient": lambda: hz.forward_gradient(LR),
}


def transient(compiled):
  """Bytes an executable allocates beyond its arguments: temporaries + new outputs."""
  m = compiled.memory_analysis()
  return m.temp_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes


def memory():
  params = mlp_params(MEMORY_SIZES)
  x, y = batch(MEMORY_SIZES, ROWS)
  pbytes = nbytes(params)
  fwd = transient(jax.jit(mlp_loss).lower(params, x, y).compile())
  rows = []
  for name, make in COMPOSITIONS.items():
    tx = make()
    state = tx.init(params)
    plain = transient(hz.make_train_step(tx, mlp_loss, lean=False)
                      .lower(params, state, x, y).compile())
    step = hz.make_train_step(tx, mlp_loss)
    top = transient(step.lower(params, state, x, y).compile())
    user = jax.jit(lambda p, s, step=step: step(p, s, x, y), donate_argnums=(0, 1))
    traced = transient(user.lower(params, state).compile())
    row = dict(composition=name, plain=(plain - fwd) / pbytes, top_level=(top - fwd) / pbytes,
               in_user_jit=(traced - fwd) / pbytes)
    rows.append(row)
    print(f"{name}: plain {row['plain']:.2f}  top level {row['top_level']:.2f}  "
          f"in jit {row['in_user_jit']:.2f}", flush=True)
  return dict(param_bytes=pbytes, forward_transient_bytes=fwd, rows=rows)


def small(repeats=15):
  sizes = [64, 128, 128, 10]
  x, y = batch(sizes, 64)
  out = []
  for name, make in (("MeZO", lambda: hz.mezo(1e-3)), ("HiZOO", lambda: hz.hizoo(1e-3))):
    calls = {}
    for path in ("lean", "plain"):
      tx = make()
      box = [mlp_params(sizes), None]
      box[1] = tx.init(box[0])
      step = hz.make_train_step(tx, mlp_loss, lean=path == "lean")

      def call(step=step, box=box):
        box[0], box[1], loss = step(box[0], box[1], x, y)
        loss.block_until_ready()

      calls[path] = call
    t_lean, t_plain, ratios = time_paired(calls["lean"], calls["plain"], repeats=repeats,
                                          warmup=3)
    row = dict(optimizer=name, default_over_plain=quartiles(ratios),
               default_ms=t_lean * 1e3, plain_ms=t_plain * 1e3)
    out.append(row)
    print(f"small {name}: default/plain {row['default_over_plain'][1]:.2f} "
          f"({t_lean * 1e3:.2f} ms vs {t_plain * 1e3:.2f} ms)", flush=True)
  return out


def _chain_model(kind):
  """200 tanh layers: 64 x 64 each ("same"), or 200 different shapes ("distinct")."""
  n = 200
  if kind == "same":
    widths = [64] * (n + 1)
  else:
    widths = [48 + i for i in range(n + 1)]
  params = {f"w{i:03d}": jnp.eye(widths[i], widths[i + 1], dtype=jnp.float32) * 0.9
            for i in range(n)}
  x = jnp.ones((16, widths[0]), jnp.float32)

  def loss(p, x):
    h = x
    for k in sorted(p):
      h = jnp.tanh(h @ p[k])
    return jnp.mean(h ** 2)

  return params, x, loss


def _compile_child(kind):
  """One fresh process: the first call of one step on a 200-tensor model, in seconds."""
  model, step_kind = kind.split(":", 1)
  params, x, loss = _chain_model(model)
  t = time.perf_counter()
  if step_kind == "adam":
    tx = optax.adam(1e-3)
    state = tx.init(params)

    @jax.jit
    def step(p, s, x):
      g = jax.grad(loss)(p, x)
      u, s = tx.update(g, s, p)
      return optax.apply_updates(p, u), s

    jax.block_until_ready(step(params, state, x))
  else:
    opt, path = step_kind.split(":")
    tx = hz.mezo(1e-3) if opt == "mezo" else hz.hizoo(1e-3)
    state = tx.init(params)
    jax.block_until_ready(hz.make_train_step(tx, loss, lean=path == "lean")(params, state, x))
  return time.perf_counter() - t


STEPS = ["adam", "mezo:lean", "hizoo:lean", "mezo:plain", "hizoo:plain"]


def compile_times(repeats=(("same", 3), ("distinct", 1))):
  """First-call seconds; the "distinct" model takes minutes a run, hence one run of it."""
  rows = []
  for model, n in repeats:
    kinds = [f"{model}:{k}" for k in STEPS]
    times = {k: [] for k in kinds}
    for _ in range(n):  # interleaved, so that all kinds see the same machine
      for k in kinds:
        out = subprocess.run([sys.executable, __file__, "--compile-child", k],
                             capture_output=True, text=True, check=True)
        times[k].append(float(out.stdout.strip().splitlines()[-1]))
    adam = float(np.median(times[f"{model}:adam"]))
    for k, v in times.items():
      rows.append(dict(model=model, step=k.split(":", 1)[1], seconds=float(np.median(v)),
                       over_adam=float(np.median(v)) / adam, runs=v))
      print(f"compile {k}: {rows[-1]['seconds']:.2f} s = {rows[-1]['over_adam']:.1f} x Adam",
            flush=True)
  return rows


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--only", choices=("memory", "small", "compile"))
  ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                "engine.json"))
  ap.add_argument("--compile-child")
  args = ap.parse_args()
  if args.compile_child:
    print(_compile_child(args.compile_child))
    return
  result = {}
  if os.path.exists(args.out):
    with open(args.out) as fh:
      result = json.load(fh)
  result["machine"] = machine()
  if args.only in (None, "memory"):
    result["memory"] = memory()
  if args.only in (None, "small"):
    result["small"] = small()
  if args.only in (None, "compile"):
    result["compile"] = compile_times()
  write_json(args.out, result)


if __name__ == "__main__":
  main()
