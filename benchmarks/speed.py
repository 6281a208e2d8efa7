"""Step time of the zeroth-order optimizers in forward passes, and the PyTorch reference.

Model: MLP 1024 -> 2048 -> 2048 -> 2048 -> 1024 (12.6M float32 params). Everything is
timed in one process, as medians of >= 5 calls after warm-up, and reported as ratios to a
jitted forward pass (``fwd``) on the same batch. Each step is timed alternately with forward
passes (fwd, step, fwd, step, ...) and its ratio is the median of the per-pair ratios, so a
machine whose speed drifts between rows (a shared VM) does not skew the ratios:

* the default step (``hz.make_train_step``) of MeZO, HiZOO, HiZOO-L, HiZOO with
  ``hessian_update_every=10`` (whole cycles of 10 steps), at 1024 rows, with the default
  fused sampler; and, for comparison, the plain step and the threefry sampler;
* one draw of 12.6M normals by each generator;
* at 64 rows, the HiZOO and MeZO steps against the reference PyTorch step
  (benchmarks/torch_reference.py), side by side, and their ratio again from alternate calls
  (needs ``torch``; skipped otherwise).

    python benchmarks/speed.py [--quick] [--out benchmarks/results/speed.json]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from common import (  # noqa: E402
  SPEED_SIZES,
  batch,
  machine,
  mlp_loss,
  mlp_params,
  quartiles,
  time_calls,
  time_paired,
  write_json,
)

import hizoo_jax as hz  # noqa: E402

N_NOISE = sum(a * b + b for a, b in zip(SPEED_SIZES[:-1], SPEED_SIZES[1:], strict=True))


def box_muller(key, shape, dtype=jnp.float32):
  """Hash + Box-Muller using both outputs (for comparison; not the library's sampler)."""
  n = int(np.prod(shape))
  words = jax.random.key_data(key).reshape(-1)
  k = jax.lax.iota(jnp.uint32, (n + 1) // 2)

  def mix(x):
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)

  a = mix(k * jnp.uint32(0x9E3779B9) + words[0])
  b = mix(a ^ words[-1])
  u1 = ((a >> 8).astype(jnp.float32) + 1.0) / 16777216.0
  u2 = (b >> 8).astype(jnp.float32) / 16777216.0
  r = jnp.sqrt(-2.0 * jnp.log(u1))
  t = 2.0 * jnp.pi * u2
  return jnp.stack([r * jnp.cos(t), r * jnp.sin(t)], -1).reshape(-1)[:n].reshape(shape)


def block(tree):
  jax.block_until_ready(tree)
  return tree


def step_caller(tx, params, x, y, *, lean=True, steps_per_call=1):
  """A blocking call that runs ``steps_per_call`` steps of ``tx`` on its own copy of params."""
  state = tx.init(params)
  step = hz.make_train_step(tx, mlp_loss, lean=lean)
  box = {"p": jax.tree.map(jnp.copy, params), "s": state}

  def call():
    for _ in range(steps_per_call):
      box["p"], box["s"], loss = step(box["p"], box["s"], x, y)
    block((box["p"], loss))

  return call


def time_step(tx, params, x, y, *, fwd, lean=True, steps_per_call=1, repeats=7):
  """Seconds per step, seconds per forward pass and the quartiles of their paired ratio."""
  call = step_caller(tx, params, x, y, lean=lean, steps_per_call=steps_per_call)
  t, t_fwd, ratios = time_paired(call, lambda: block(fwd(params, x, y)), repeats=repeats)
  return t / steps_per_call, t_fwd, quartiles([r / steps_per_call for r in ratios])


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--quick", action="store_true", help="5 repeats")
  ap.add_argument("--repeats", type=int, default=15, help="timed calls per row (default 15)")
  ap.add_argument("--out", default="benchmarks/results/speed.json")
  args = ap.parse_args()
  rep = 5 if args.quick else args.repeats
  params = mlp_params(SPEED_SIZES)
  fwd = jax.jit(mlp_loss)
  res = dict(machine=machine(), params=N_NOISE)

  # Forward passes, then the steps at 1024 rows.
  x, y = batch(SPEED_SIZES, 1024)
  t_fwd, _ = time_calls(lambda: block(fwd(params, x, y)), repeats=rep)
  configs = {
      "MeZO": (lambda: hz.mezo(1e-6), {}),
      "HiZOO": (lambda: hz.hizoo(1e-6), {}),
      "HiZOO-L": (lambda: hz.hizoo_l(1e-6), {}),
      "HiZOO, hessian_update_every=10": (lambda: hz.hizoo(1e-6, hessian_update_every=10),
                                         dict(steps_per_call=10)),
      "MeZO, plain step": (lambda: hz.mezo(1e-6), dict(lean=False)),
      "HiZOO, plain step": (lambda: hz.hizoo(1e-6), dict(lean=False)),
      "MeZO, threefry sampler": (lambda: hz.mezo(1e-6, sampler=hz.gaussian), {}),
      "HiZOO, threefry sampler": (lambda: hz.hizoo(1e-6, sampler=hz.gaussian), {}),
  }
  steps = {}
  for name, (make, kw) in configs.items():
    t, t_f, (q25, ratio, q75) = time_step(make(), params, x, y, fwd=fwd, repeats=rep, **kw)
    steps[name] = dict(seconds=t, fwd=ratio, fwd_q25=q25, fwd_q75=q75, fwd_seconds=t_f)
  res["rows1024"] = dict(fwd_seconds=t_fwd, steps=steps)

  # One draw of N_NOISE normals by each generator, in forward passes at 64 and 1024 rows.
  x64, y64 = batch(SPEED_SIZES, 64)
  t_fwd64, _ = time_calls(lambda: block(fwd(params, x64, y64)), repeats=rep)
  gens = {
      "threefry (jax.random.normal)": lambda k: jax.random.normal(k, (N_NOISE,)),
      "rbg (jax.random.normal)": lambda k: jax.random.normal(k, (N_NOISE,)),
      "hash + Box-Muller (both outputs)": lambda k: box_muller(k, (N_NOISE,)),
      "hz.fast_gaussian": lambda k: hz.fast_gaussian(k, (N_NOISE,)),
  }
  noise = {}
  for name, g in gens.items():
    key = jax.random.key(0, impl="rbg") if name.startswith("rbg") else jax.random.key(0)
    f = jax.jit(g)
    t, _ = time_calls(lambda f=f, key=key: block(f(key)), repeats=rep)
    noise[name] = dict(seconds=t, fwd64=t / t_fwd64, fwd1024=t / t_fwd)
  # the same draw fused into a perturbation (what a pass costs beyond reading/writing)
  for name, g in (("w + mu z, hz.fast_gaussian", hz.fast_gaussian),
                  ("w + mu z, threefry", jax.random.normal)):
    f = jax.jit(lambda w, k, g=g: w + 1e-3 * g(k, (N_NOISE,)), donate_argnums=(0,))
    box = {"w": jnp.ones((N_NOISE,), jnp.float32)}  # donated: a fresh buffer per generator

    def call(f=f, box=box):
      box["w"] = block(f(box["w"], jax.random.key(0)))

    t, _ = time_calls(call, repeats=rep)
    noise[name] = dict(seconds=t, fwd64=t / t_fwd64, fwd1024=t / t_fwd)
  res["noise"] = noise

  # 64 rows: against the PyTorch reference, side by side.
  rows64 = dict(fwd_seconds=t_fwd64)
  ours = {"HiZOO": step_caller(hz.hizoo(1e-6), params, x64, y64),
          "MeZO": step_caller(hz.mezo(1e-6), params, x64, y64)}
  paired64 = {}
  try:
    import torch
    from torch_reference import MLP, ReferenceHiZOO, ReferenceMeZO
  except ImportError:
    torch = None
  if torch is None:
    for name, call in ours.items():
      rows64[name], _ = time_calls(call, repeats=rep)
  else:
    torch.manual_seed(0)
    model = MLP(SPEED_SIZES).eval()
    tx64, ty64 = torch.tensor(np.asarray(x64)), torch.tensor(np.asarray(y64))
    ref, mref = ReferenceHiZOO(model), ReferenceMeZO(model)
    rows64["torch forward"], _ = time_calls(lambda: ref.loss(tx64, ty64), repeats=rep)
    rows64["torch threads"] = torch.get_num_threads()
    # Each hizoo-jax step timed alternately with its reference step: the medians of both
    # (a hizoo-jax step's from its first pairing) and the quartiles of the per-pair ratios.
    for mine, theirs, name in (
        ("HiZOO", lambda: ref.step(tx64, ty64, True), "torch HiZOO (as written: 4 forward passes)"),
        ("HiZOO", lambda: ref.step(tx64, ty64, False), "torch HiZOO (3 forward passes)"),
        ("MeZO", lambda: mref.step(tx64, ty64), "torch MeZO")):
      t_mine, rows64[name], ratios = time_paired(ours[mine], theirs, repeats=rep)
      rows64.setdefault(mine, t_mine)
      q25, med, q75 = quartiles(ratios)
      paired64[name] = dict(ratio=med, q25=q25, q75=q75)
  rows64["paired ratios"] = paired64
  res["rows64"] = rows64
  write_json(args.out, res)

  m = res["machine"]
  print(f"{m['cpu']} ({m['cores']} cores), jax {m['jax']} on {m['backend']}; "
        f"{N_NOISE / 1e6:.1f}M params; medians of {rep} after warm-up\n")
  print(f"1024 rows: fwd = {t_fwd * 1e3:.1f} ms (before the steps); each step is timed "
        "alternately with forward passes and its ratio is the median of the pairs\n")
  print("| step | ms | forward ms (paired) | forward passes | quartiles | target |")
  print("|---|---|---|---|---|---|")
  targets = {"MeZO": "<= 2.15", "HiZOO": "<= 3.2", "HiZOO, hessian_update_every=10": "<= 2.3"}
  for name, r in steps.items():
    print(f"| {name} | {r['seconds'] * 1e3:.1f} | {r['fwd_seconds'] * 1e3:.1f} | {r['fwd']:.2f} "
          f"| {r['fwd_q25']:.2f}-{r['fwd_q75']:.2f} | {targets.get(name, '')} |")
  print(f"\nOne draw of {N_NOISE / 1e6:.1f}M normals:\n")
  print("| generator | ms | fwd at 64 rows | fwd at 1024 rows |")
  print("|---|---|---|---|")
  for name, r in noise.items():
    print(f"| {name} | {r['seconds'] * 1e3:.1f} | {r['fwd64']:.2f} | {r['fwd1024']:.3f} |")
  print(f"\n64 rows: fwd = {t_fwd64 * 1e3:.1f} ms\n")
  print("| step | ms | forward passes |")
  print("|---|---|---|")
  for name, v in rows64.items():
    if name in ("fwd_seconds", "torch threads", "paired ratios"):
      continue
    print(f"| {name} | {v * 1e3:.1f} | {v / t_fwd64:.2f} |")
  if torch is not None:
    print("\nStep time of hizoo-jax / the reference, timed alternately (median of the pairs):\n")
    for ref_name, r in paired64.items():
      label = "MeZO" if "MeZO" in ref_name else "HiZOO"
      target = "" if label == "MeZO" else " (target <= 0.3)"
      print(f"{label} (hizoo-jax) / {ref_name}: {r['ratio']:.3f} "
            f"(quartiles {r['q25']:.3f}-{r['q75']:.3f}){target}")
  print(f"\nwrote {args.out}")


if __name__ == "__main__":
  main()
