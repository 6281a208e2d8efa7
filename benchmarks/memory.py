"""Peak memory of a zeroth-order train step over a forward pass, in units of param bytes.

Model: 4 layers of 4096 x 4096 float32 (256 MiB of params), 64 rows. Two measures:

* compiled: ``memory_analysis()`` of the step's executable (arguments + outputs - aliased
  + temporaries), the plain and the lean step alike.
* process peak RSS: every configuration runs in a fresh process that builds the params,
  compiles and runs the forward pass, resets the peak RSS (``/proc/self/clear_refs``,
  after ``malloc_trim``), runs 3 forward passes and reads the peak; then it creates the
  optimizer state, compiles the step, resets again, runs 3 steps and reads the peak. The
  difference is the step's extra memory, its optimizer state included, with compilation
  excluded.

    python benchmarks/memory.py [--out benchmarks/results/memory.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
from common import (  # noqa: E402
  MEMORY_SIZES,
  batch,
  compiled_peak,
  machine,
  mlp_loss,
  mlp_params,
  nbytes,
  peak_rss_bytes,
  reset_peak_rss,
  run_child,
  write_json,
)

import hizoo_jax as hz  # noqa: E402

ROWS = 64
OPTIMIZERS = {
    "MeZO": lambda s: hz.mezo(1e-6, sampler=s),
    "HiZOO": lambda s: hz.hizoo(1e-6, sampler=s),
    "HiZOO-L": lambda s: hz.hizoo_l(1e-6, sampler=s),
}
SAMPLERS = {"fast": hz.fast_gaussian, "threefry": hz.gaussian}
PATHS = ("plain", "lean")


def compiled_table():
  params = mlp_params(MEMORY_SIZES)
  x, y = batch(MEMORY_SIZES, ROWS)
  pbytes = nbytes(params)
  fwd = compiled_peak(jax.jit(mlp_loss).lower(params, x, y).compile())
  rows = []
  for name, make in OPTIMIZERS.items():
    for sname, sampler in SAMPLERS.items():
      tx = make(sampler)
      state = tx.init(params)
      # the step's peak holds the optimizer state (HiZOO's H: 1.0 param bytes)
      peaks = {path: compiled_peak(hz.make_train_step(tx, mlp_loss, lean=path == "lean")
                                   .lower(params, state, x, y).compile()) for path in PATHS}
      rows.append(dict(optimizer=name, sampler=sname,
                       plain_extra=(peaks["plain"] - fwd) / pbytes,
                       lean_extra=(peaks["lean"] - fwd) / pbytes))
  return dict(param_bytes=pbytes, forward_peak_bytes=fwd, rows=rows)


def child(config):
  """One fresh process: forward peak, then step peak (JSON on the last line)."""
  params = mlp_params(MEMORY_SIZES)
  x, y = batch(MEMORY_SIZES, ROWS)
  f = jax.jit(mlp_loss)
  jax.block_until_ready(f(params, x, y))  # compile
  reset_peak_rss()
  for _ in range(3):
    jax.block_until_ready(f(params, x, y))
  fwd_peak = peak_rss_bytes()
  name, sname, path = config.split(":")
  tx = OPTIMIZERS[name](SAMPLERS[sname])
  state = tx.init(params)
  step = hz.make_train_step(tx, mlp_loss, lean=path == "lean")
  params, state, loss = step(params, state, x, y)  # compile
  jax.block_until_ready((params, state))
  reset_peak_rss()
  for _ in range(3):
    params, state, loss = step(params, state, x, y)
    jax.block_until_ready((params, loss))
  print(json.dumps(dict(config=config, forward_peak=fwd_peak, step_peak=peak_rss_bytes(),
                        param_bytes=nbytes(params))))


def rss_table():
  rows = []
  for name in OPTIMIZERS:
    for sname in SAMPLERS:
      for path in PATHS:
        r = run_child(__file__, "--child", f"{name}:{sname}:{path}")
        rows.append(dict(optimizer=name, sampler=sname, path=path,
                         extra=(r["step_peak"] - r["forward_peak"]) / r["param_bytes"],
                         forward_peak_mib=r["forward_peak"] / 2**20,
                         step_peak_mib=r["step_peak"] / 2**20))
  return dict(rows=rows)


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--out", default="benchmarks/results/memory.json")
  ap.add_argument("--child", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.child:
    child(args.child)
    return
  comp = compiled_table()
  rss = rss_table()
  print(f"params: {comp['param_bytes'] / 2**20:.0f} MiB float32, {ROWS} rows; extra peak "
        "memory over a forward pass, in param bytes (targets: MeZO <= 0.4, HiZOO <= 1.4, "
        "HiZOO-L <= 0.45)\n")
  print("| optimizer | sampler | compiled: plain step | compiled: lean step | "
        "RSS: plain step | RSS: lean step |")
  print("|---|---|---|---|---|---|")
  by = {(r["optimizer"], r["sampler"], r["path"]): r["extra"] for r in rss["rows"]}
  for r in comp["rows"]:
    k = (r["optimizer"], r["sampler"])
    print(f"| {k[0]} | {k[1]} | {r['plain_extra']:.2f} | {r['lean_extra']:.2f} | "
          f"{by[k + ('plain',)]:.2f} | {by[k + ('lean',)]:.2f} |")
  write_json(args.out, dict(machine=machine(), compiled=comp, rss=rss))
  print(f"\nwrote {args.out}")


if __name__ == "__main__":
  main()
