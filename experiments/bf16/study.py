"""HiZOO in bfloat16 / float16: reproduce the stall, prototype fixes, measure them.

    python experiments/bf16/study.py            # ~2-4 min on 2 CPU cores; writes results.json
    python experiments/bf16/study.py --quick    # 1 seed
    python experiments/bf16/study.py --mu-sweep # one uniform mu, 1e-3 .. 3e-2 (~2 min)
    python experiments/bf16/study.py --table    # results.json as markdown

The problem (issue #12): HiZOO on 16-bit params at the default ``mu = 1e-3`` inflates ``H``
and stalls, because much of ``theta + mu H^{-1/2} z`` rounds back to ``theta`` (and the rest
jumps a whole ulp): the perturbation applied is not the one the estimator assumes.

Everything runs on a 1-hidden-layer MLP (4 -> 32 -> 2, tanh, cross-entropy on the side of a
random hyperplane, inputs of scale 3, weights ~ N(0, 1)-sized, full batch of 512), 100 steps,
lr 1e-2, alpha 1e-2, mu 1e-3, 3 seeds; params stored in the dtype studied. Both are
measured: the forward pass in that dtype (inputs cast to it; the loss reduced in float32), as
in 16-bit fine-tuning, and in float32 from the 16-bit params.

Runs:

* ``library``: the public API, ``hz.hizoo`` + ``tx.update(None, ..., value_fn=...)``.
* ``proto``: a standalone HiZOO step written here (paper estimator, the library's
  formulas: ``l+- = f(theta +- mu s z)``, ``s = H^{-1/2}``,
  ``c = (l+ + l- - 2 l0) / (2 mu^2)``, ``H <- clip((1 - alpha) H + alpha |c| H z^2)``,
  ``g = (l+ - l-) / (2 mu) s_new z``, ``theta <- round(theta - lr g)``), with the variants:

  - ``nearest``: round-to-nearest perturbed params (what the library does);
  - ``(a) effective``: the direction actually applied,
    ``z_eff = (round(theta + mu s z) - round(theta - mu s z)) / (2 mu s)``, in both the
    gradient and the Hessian estimate;
  - ``(b) stochastic``: stochastic rounding of ``theta +- mu s z`` (unbiased in expectation),
    independent draws for + and -; ``(b') antithetic``: the same uniforms for both, so the
    two points are mirror images around ``theta``;
  - ``(c) per-tensor mu``: ``mu_t = max(mu, k eps(dtype) rms(theta_t))``, k = 2, 4;
  - ``(e) per-element mu``: ``mu_i = max(mu, k ulp(theta_i) / s_i)`` (with (a));
  - ``(f) global mu``: one ``mu = max(mu, k eps(dtype) rms(all params))``, k = 1, 2, 4;
  - ``(g) 16-bit curvature floor``: the H update is skipped when
    ``|l+ + l- - 2 l0| <= 4 eps(compute dtype) max|l|`` (the library uses float32's eps, the
    loss dtype); with (f) as ``(f)+(g)``;
  - ``(d) f32 perturb``: ``theta +- mu s z`` formed and evaluated in float32 from the 16-bit
    storage (only the update is rounded to 16 bits).

  Each is run with the forward pass in the 16-bit dtype (``[16-bit compute]``) and in float32
  from the 16-bit params (``[f32 compute]``); (d) always evaluates in float32.

Measured per run: final full-batch loss, median H at the end, and the fraction of elements
whose intended perturbation ``mu s z`` rounds away (``round(theta + mu s z) == theta``),
averaged over the steps. Target: bf16 final loss <= 1.25x float32, median H within 3x.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

import hizoo_jax as hz

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS, LR, ALPHA, MU = 100, 1e-2, 1e-2, 1e-3
SIZES = (4, 32, 2)
CLIP = (1e-8, 1e8)


# ----------------------------------------------------------------------------------------
# The task.


# "small": the MLP above. "wide": an LLM-like mix of scales, 256 -> 32 -> 2 with a
# LayerNorm-like gain: w1 ~ 0.06 (8,192 params), a gain vector g1 = 1 (32), w2 ~ 0.35.
PROBLEM = "small"


def make_data(n=512, seed=1234):
  """The label is the side of a random hyperplane; inputs of scale 3 ("small") or 1."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((n, SIZES[0])).astype(np.float32)
  y = (x @ rng.standard_normal(SIZES[0]) > 0).astype(np.int32)
  return jnp.asarray(x if PROBLEM == "wide" else 3 * x), jnp.asarray(y)


def init_params(seed, dtype):
  k1, k2 = jax.random.split(jax.random.key(seed))
  w1_scale = 1.0 if PROBLEM == "wide" else 2.0
  p = {"w1": w1_scale * jax.random.normal(k1, SIZES[:2]) / np.sqrt(SIZES[0]),
       "b1": jnp.zeros(SIZES[1]),
       "w2": 2 * jax.random.normal(k2, SIZES[1:]) / np.sqrt(SIZES[1]),
       "b2": jnp.zeros(SIZES[2])}
  if PROBLEM == "wide":
    p["g1"] = jnp.ones(SIZES[1])
  return jax.tree.map(lambda a: a.astype(dtype), p)


def loss_fn(p, x, y, compute=None):
  """Cross-entropy; the forward pass in ``compute`` (None: the params' dtype, x cast to it),
  the loss reduced in float32."""
  dt = compute or p["w1"].dtype
  p = jax.tree.map(lambda a: a.astype(dt), p)
  pre = x.astype(dt) @ p["w1"]
  if "g1" in p:
    pre = pre * p["g1"]
  h = jnp.tanh(pre + p["b1"])
  logits = (h @ p["w2"] + p["b2"]).astype(jnp.float32)
  logp = jax.nn.log_softmax(logits)
  return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=-1))


def f32_loss(p, x, y):
  return loss_fn(p, x, y, jnp.float32)


# ----------------------------------------------------------------------------------------
# Rounding.


def round_to(x32, dtype):
  return x32.astype(dtype)


def stochastic_round(x32, dtype, key=None, u=None):
  """Round float32 ``x32`` to ``dtype`` up or down with probabilities that make it unbiased
  (uniforms ``u``, or drawn from ``key``). Given the same ``u``, ``theta + d`` and
  ``theta - d`` round to mirror images around a representable ``theta`` (antithetic)."""
  lo = x32.astype(dtype)
  lo32 = lo.astype(jnp.float32)
  # the neighbour on the other side of x32
  toward = jnp.where(x32 >= lo32, jnp.inf, -jnp.inf).astype(dtype)
  hi = jnp.nextafter(lo, toward)
  hi32 = hi.astype(jnp.float32)
  gap = hi32 - lo32
  p_hi = jnp.where(gap != 0, (x32 - lo32) / jnp.where(gap != 0, gap, 1), 0.0)
  u = jax.random.uniform(key, x32.shape) if u is None else u
  return jnp.where(u < p_hi, hi, lo)


def eps_of(dtype):
  return float(jnp.finfo(dtype).eps)


def ulp_of(p):
  """The spacing of ``p``'s dtype at ``p`` (away from zero), as float32."""
  up = jnp.nextafter(p, jnp.asarray(jnp.inf, p.dtype) * jnp.where(p >= 0, 1, -1).astype(p.dtype))
  return jnp.abs(up.astype(jnp.float32) - p.astype(jnp.float32))


# ----------------------------------------------------------------------------------------
# The public API (baseline).


def run_library(dtype, seed, x, y, compute=None):
  params = init_params(seed, dtype)
  tx = hz.hizoo(LR, mu=MU, hessian_smoothing=ALPHA, seed=seed)
  state = tx.init(params)

  @jax.jit
  def step(params, state):
    u, state = tx.update(None, state, params, value_fn=lambda p: loss_fn(p, x, y, compute))
    return jax.tree.map(lambda p, d: (p.astype(jnp.float32) + d).astype(p.dtype), params,
                        u), state

  for _ in range(STEPS):
    params, state = step(params, state)
  h = np.concatenate([np.ravel(np.asarray(v, np.float64))
                      for v in jax.tree.leaves(hz.get_hessian(state))])
  return dict(loss=float(f32_loss(params, x, y)), median_h=float(np.median(h)))


# ----------------------------------------------------------------------------------------
# The prototype step.


def proto_step(params, h, key, x, y, *, dtype, variant, mu_k, compute, mu_per="tensor"):
  """One HiZOO step (paper estimator) with the rounding ``variant``; returns diagnostics."""
  leaves, tdef = jax.tree.flatten(params)
  h_leaves = tdef.flatten_up_to(h)
  keys = jax.random.split(key, 3 * len(leaves))
  eval_f32 = variant == "f32_compute"
  f = partial(loss_fn, x=x, y=y, compute=jnp.float32 if eval_f32 else compute)

  plus, minus, zs, mus, rounded_away, intended = [], [], [], [], [], []
  if mu_k and mu_per == "global":  # (f): one mu for all params, at the resolution of their rms
    sq = sum(jnp.sum(jnp.square(p.astype(jnp.float32))) for p in leaves)
    mu_global = jnp.maximum(MU, mu_k * eps_of(dtype) * jnp.sqrt(sq / sum(p.size for p in leaves)))
  for i, (p, hl) in enumerate(zip(leaves, h_leaves, strict=True)):
    p32 = p.astype(jnp.float32)
    s = jax.lax.rsqrt(jnp.clip(hl, *CLIP))
    z = jax.random.normal(keys[3 * i], p.shape)
    mu_t = jnp.asarray(MU, jnp.float32)
    if mu_k and mu_per == "tensor":  # (c): per-tensor mu at the resolution of its scale
      rms = jnp.sqrt(jnp.mean(jnp.square(p32)))
      mu_t = jnp.maximum(mu_t, mu_k * eps_of(dtype) * rms)
    elif mu_k and mu_per == "global":
      mu_t = mu_global
    elif mu_k:  # (e): per-element mu, the perturbation >= mu_k ulp(theta) |z|
      mu_t = jnp.maximum(mu_t, mu_k * ulp_of(p) / s)
    d = mu_t * s * z
    if eval_f32:
      tp, tm = p32 + d, p32 - d
    elif variant == "stochastic":
      tp = stochastic_round(p32 + d, dtype, keys[3 * i + 1])
      tm = stochastic_round(p32 - d, dtype, keys[3 * i + 2])
    elif variant in ("antithetic", "antithetic_effective"):
      u = jax.random.uniform(keys[3 * i + 1], p.shape)
      tp, tm = stochastic_round(p32 + d, dtype, u=u), stochastic_round(p32 - d, dtype, u=u)
    else:
      tp, tm = round_to(p32 + d, dtype), round_to(p32 - d, dtype)
    rounded_away.append(jnp.sum(round_to(p32 + d, dtype) == p))
    intended.append(p.size)
    if variant in ("effective", "antithetic_effective"):  # (a): the direction applied
      z = (tp.astype(jnp.float32) - tm.astype(jnp.float32)) / (2 * mu_t * s)
    plus.append(tp)
    minus.append(tm)
    zs.append(z)
    mus.append(mu_t)

  l0 = f(params)
  lp, lm = f(tdef.unflatten(plus)), f(tdef.unflatten(minus))
  new_leaves, new_h = [], []
  for p, hl, z, mu_t in zip(leaves, h_leaves, zs, mus, strict=True):
    c = (lp + lm - 2 * l0) / (2 * mu_t**2)
    # (g): the curvature floor at the resolution of the forward pass (16-bit compute)
    floor_eps = eps_of(compute or dtype) if variant.endswith("floor16") else eps_of(jnp.float32)
    floor = 4 * floor_eps * jnp.maximum(jnp.maximum(jnp.abs(lp), jnp.abs(lm)),
                                                  jnp.abs(l0))
    do_h = jnp.abs(lp + lm - 2 * l0) > floor
    h_new = jnp.where(do_h, jnp.clip((1 - ALPHA) * hl + ALPHA * jnp.abs(c) * hl * z**2, *CLIP),
                      hl)
    s_new = jax.lax.rsqrt(h_new)
    g = (lp - lm) / (2 * mu_t) * s_new * z
    new_leaves.append((p.astype(jnp.float32) - LR * g).astype(dtype))
    new_h.append(h_new)
  frac = sum(rounded_away) / sum(intended)
  return tdef.unflatten(new_leaves), tdef.unflatten(new_h), frac, l0


def run_proto(dtype, seed, x, y, variant, mu_k=0.0, compute=None, mu_per="tensor"):
  params = init_params(seed, dtype)
  h = jax.tree.map(lambda p: jnp.ones(p.shape, jnp.float32), params)

  @jax.jit
  def run(params, h):
    def body(carry, key):
      params, h = carry
      params, h, frac, l0 = proto_step(params, h, key, x, y, dtype=dtype, variant=variant,
                                       mu_k=mu_k, compute=compute, mu_per=mu_per)
      return (params, h), (frac, l0)

    keys = jax.random.split(jax.random.key(1000 + seed), STEPS)
    return jax.lax.scan(body, (params, h), keys)

  (params, h), (frac, _) = run(params, h)
  hs = np.concatenate([np.ravel(np.asarray(v, np.float64)) for v in jax.tree.leaves(h)])
  return dict(loss=float(f32_loss(params, x, y)), median_h=float(np.median(hs)),
              rounded_away=float(np.mean(np.asarray(frac))))


# ----------------------------------------------------------------------------------------


VARIANTS = [  # (name, variant, mu_k, mu_per)
    ("nearest", "nearest", 0.0, "tensor"),
    ("(a) effective", "effective", 0.0, "tensor"),
    ("(b) stochastic", "stochastic", 0.0, "tensor"),
    ("(b') antithetic SR", "antithetic", 0.0, "tensor"),
    ("(a)+(b') antithetic SR", "antithetic_effective", 0.0, "tensor"),
    ("(c) per-tensor mu k=2", "nearest", 2.0, "tensor"),
    ("(c) per-tensor mu k=4", "nearest", 4.0, "tensor"),
    ("(a)+(c) k=2", "effective", 2.0, "tensor"),
    ("(a)+(e) per-element mu k=2", "effective", 2.0, "element"),
    ("(f) global mu k=1", "nearest", 1.0, "global"),
    ("(f) global mu k=2", "nearest", 2.0, "global"),
    ("(f) global mu k=4", "nearest", 4.0, "global"),
    ("(a)+(f) k=1", "effective", 1.0, "global"),
    ("(a)+(f) k=2", "effective", 2.0, "global"),
    ("(a)+(f) k=4", "effective", 4.0, "global"),
    ("(d) f32 perturb", "f32_compute", 0.0, "tensor"),
    ("(g) 16-bit curvature floor", "nearest_floor16", 0.0, "tensor"),
    ("(f)+(g) k=4", "nearest_floor16", 4.0, "global"),
]


def mu_sweep(seeds, x, y, out):
  """A uniform mu (one for all params) from 1e-3 to 3e-2: float32, bf16 and f16, round to
  nearest, both computes. Writes ``out`` (json) and prints a markdown table."""
  global MU
  default, rows = MU, []
  try:
    for mu in (1e-3, 3e-3, 1e-2, 3e-2):
      MU = mu
      for dtype, compute in (("float32", None), ("bfloat16", None), ("bfloat16", jnp.float32),
                             ("float16", None), ("float16", jnp.float32)):
        runs = [run_proto(jnp.dtype(dtype), s, x, y, "nearest", 0.0, compute) for s in seeds]
        rows.append(dict(mu=mu, dtype=dtype, compute="f32" if compute else "16-bit",
                         **{k: float(np.mean([r[k] for r in runs])) for k in runs[0]}))
  finally:
    MU = default
  lines = ["| mu | dtype | compute | final loss | median H | rounded away | loss / f32 | H / f32 |",
           "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    ref = next(q for q in rows if q["mu"] == r["mu"] and q["dtype"] == "float32")
    lines.append(f"| {r['mu']:g} | {r['dtype']} | {r['compute']} | {r['loss']:.3f} | "
                 f"{r['median_h']:.4g} | {r['rounded_away']:.2f} | "
                 f"{r['loss'] / ref['loss']:.2f} | {r['median_h'] / ref['median_h']:.3g} |")
  with open(out, "w") as fh:
    json.dump(rows, fh, indent=1)
  print("\n".join(lines))


def markdown(res) -> str:
  """The results as a markdown table (mean over seeds; ratios against float32)."""
  lines = ["| run | final loss | median H | rounded away | loss / f32 | H / f32 | target |",
           "|---|---|---|---|---|---|---|"]
  for key, r in res["runs"].items():
    ra = f"{r['rounded_away']:.2f}" if "rounded_away" in r else "–"
    lines.append(f"| {key} | {r['loss']:.3f} | {r['median_h']:.4g} | {ra} | "
                 f"{r['loss_ratio']:.2f} | {r['h_ratio']:.3g} | "
                 f"{'**yes**' if r['meets_target'] else 'no'} |")
  return "\n".join(lines)


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--quick", action="store_true", help="one seed")
  ap.add_argument("--out", default=None, help="default: results.json (results_wide.json)")
  ap.add_argument("--only", default=None, help="run the rows whose name contains this")
  ap.add_argument("--problem", choices=("small", "wide"), default="small",
                  help="wide: 256 -> 32 -> 2 with a gain vector (LLM-like scales); "
                       "writes results_wide.json unless --out is given")
  ap.add_argument("--table", action="store_true", help="print --out as markdown, run nothing")
  ap.add_argument("--mu-sweep", action="store_true",
                  help="only the uniform-mu sweep (writes mu_sweep.json next to --out)")
  args = ap.parse_args()
  global PROBLEM, SIZES
  PROBLEM = args.problem
  if PROBLEM == "wide":
    SIZES = (256, 32, 2)
  args.out = args.out or os.path.join(
      HERE, "results_wide.json" if PROBLEM == "wide" else "results.json")
  if args.mu_sweep:
    x, y = make_data()
    mu_sweep([0] if args.quick else [0, 1, 2], x, y,
             os.path.join(HERE, f"mu_sweep{'_wide' if PROBLEM == 'wide' else ''}.json"))
    return
  if args.table:
    with open(args.out) as fh:
      print(markdown(json.load(fh)))
    return
  seeds = [0] if args.quick else [0, 1, 2]
  x, y = make_data()
  t0 = time.time()
  res = {"settings": dict(problem=PROBLEM, steps=STEPS, lr=LR, alpha=ALPHA, mu=MU, sizes=SIZES,
                          seeds=seeds),
         "runs": {}}

  def record(key, fn):
    if args.only and args.only not in key and "float32" not in key.split()[1]:
      return
    runs = [fn(s) for s in seeds]
    out = {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}
    out["per_seed"] = runs
    res["runs"][key] = out
    ra = f"  rounded away {out['rounded_away']:.3f}" if "rounded_away" in out else ""
    print(f"{key:52s} loss {out['loss']:.3f}  median H {out['median_h']:10.1f}{ra}"
          f"   [{time.time() - t0:.0f} s]", flush=True)

  computes = {"16-bit compute": None, "f32 compute": jnp.float32}
  for dtype in ("float32", "bfloat16", "float16"):
    for cname, compute in computes.items():
      if dtype == "float32" and compute is not None:
        continue
      tag = "" if dtype == "float32" else f" [{cname}]"
      record(f"library {dtype}{tag}",
             lambda s, dt=dtype, c=compute: run_library(jnp.dtype(dt), s, x, y, c))
  for dtype in ("float32", "bfloat16", "float16"):
    for cname, compute in computes.items():
      if dtype == "float32" and compute is not None:
        continue
      for name, variant, mu_k, mu_per in VARIANTS:
        if (dtype == "float32" and name != "nearest") or (
            variant == "f32_compute" and compute is not None):
          continue
        tag = "" if dtype == "float32" else f" [{cname}]"
        record(f"proto {dtype} {name}{tag}",
               lambda s, dt=dtype, v=variant, k=mu_k, c=compute, m=mu_per: run_proto(
                   jnp.dtype(dt), s, x, y, v, k, c, m))

  ref = res["runs"]["proto float32 nearest"]
  lib_ref = res["runs"]["library float32"]
  print("\nratios vs float32 (loss ratio, median-H ratio); target <= 1.25 and within 3x")
  for key, r in res["runs"].items():
    base = lib_ref if key.startswith("library") else ref
    r["loss_ratio"] = r["loss"] / base["loss"]
    r["h_ratio"] = r["median_h"] / base["median_h"]
    r["meets_target"] = bool(r["loss_ratio"] <= 1.25 and 1 / 3 <= r["h_ratio"] <= 3)
    print(f"{key:52s} {r['loss_ratio']:6.2f}  {r['h_ratio']:9.2f}  "
          f"{'ok' if r['meets_target'] else '--'}")
  with open(args.out, "w") as fh:
    json.dump(res, fh, indent=1)
  print(f"wrote {args.out} in {time.time() - t0:.0f} s")


if __name__ == "__main__":
  main()
