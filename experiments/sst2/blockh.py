"""Prototype: a zeroth-order optimizer with a LEARNABLE curvature, one scalar per tensor.

Why: HiZOO's per-coordinate diagonal cannot be learned at d >= 1e4 within 1e4 steps
(notebooks/02): one two-point probe gives one number, ``delta = z^T A z``, so estimating d
diagonal entries needs O(d) probes, and HiZOO's H ends up acting as a scalar step-size
schedule (notebooks/03). With B blocks (B = number of parameter tensors, 26 for MiniLM LoRA)
the same probe identifies B numbers in O(B) steps.

The estimator (Gaussian z, block b holds n_b coordinates, S = diag(s_b) the preconditioner,
u = S^{1/2} z the probe)::

    l0 = f(theta),  l+- = f(theta +- mu u)
    g       = (l+ - l-) / (2 mu) * u                      (E[g] = S grad: preconditioned SPSA)
    delta   = (l+ + l- - 2 l0) / mu^2                     (= z^T S^1/2 A S^1/2 z + O(mu^2))
    r       = delta - rbar - sum_b c_b (||z_b||^2 - n_b)  (residual of the block model; rbar
                                                          is the running mean of delta)
    e_b     = c_b + r (||z_b||^2 - n_b) / (2 n_b)         E[e_b] = s_b mean diag(A_bb)
    c_b    <- (1 - beta) c_b + beta e_b                   (c starts at 0)

``E[z^T M z (||z_b||^2 - n_b)] = 2 tr(M_bb)`` for Gaussian z, so ``e_b`` is unbiased for the
mean diagonal curvature of block b in the preconditioned coordinates; ``h_b = c_b / s_b`` in
the parameters'. This is online least squares of ``delta`` on the B features ``||z_b||^2``.
Without the control variate ``sum_b c_b ||z_b||^2`` the other blocks' contributions to delta
are noise whose variance is ~ sum_b' c_b'^2 n_b', which buries a large flat block next to a
small stiff one; with it, only what the block model cannot explain (anisotropy inside a
block, off-diagonal curvature, float rounding) remains (``check_blockh.py``). The intercept is
a separate running mean of delta: tying it to ``sum_b c_b n_b`` (the first version) multiplies
the estimate by a random factor ``1 + beta sqrt(n_b / 2) eps`` each step, which blew up to
NaN on MiniLM LoRA (n_b = 3072). The scales are
refreshed only every ``refresh`` steps (by at most ``max_change`` x), and ``c`` is rescaled
with them, so the estimate does not chase its own feedback. The state keeps an EMA of
``e_b^2`` so the relative standard error of each estimate can be reported.

The preconditioner is SHAPE-ONLY: ``s_b = (mean_w(h) / h_b) ** power`` with ``mean_w`` the
coordinate-weighted mean, clipped to ``[1/kappa, kappa]`` (``power = 1``: Newton-like, the
preconditioned blocks all get the same curvature; ``power = 0.5``: halfway). With power 1 the
coordinate- weighted mean of ``1/s`` is therefore ~1, i.e. the variant has no scalar step-size
schedule of its own: its step-size control ("MeZO with lr / mean H(t)") is MeZO at the same
learning rate, and any difference from MeZO comes from how the step is distributed over
tensors. During ``warmup`` steps s = 1 (the variant is MeZO with an extra forward pass) while h
accumulates.

Forward passes: 3 per step (l0, l+, l-), like HiZOO; MeZO uses 2.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax


class BlockHState(NamedTuple):
  count: jax.Array          # steps taken
  key: jax.Array            # PRNG key data
  c: Any                    # curvature of each block in the CURRENT preconditioned coordinates
  c_sq: Any                 # EMA of the square of its per-step estimate (standard error)
  s: Any                    # the per-block step scales s_b (one scalar a leaf)
  r_mean: jax.Array         # EMA of the residual (centres it)
  l0: jax.Array             # loss at theta of the last step
  delta: jax.Array          # second difference of the last step


def scale_by_block_curvature(*, mu: float = 1e-3, beta: float = 0.01, warmup: int = 100,
                             refresh: int = 50, kappa: float = 30.0, max_change: float = 2.0,
                             center: float = 0.05, power: float = 1.0, seed: int = 0
                             ) -> optax.GradientTransformationExtraArgs:
  """Zeroth-order estimate preconditioned by a learned per-tensor curvature.

  ``update(updates, state, params, value_fn=f)``: ``updates`` is ignored; returns the
  preconditioned SPSA estimate ``g`` (chain with ``optax.scale(-lr)``).
  """

  def init_fn(params):
    scalars = lambda v: jax.tree.map(lambda p: jnp.full((), v, jnp.float32), params)
    return BlockHState(count=jnp.zeros((), jnp.int32),
                       key=jax.random.key_data(jax.random.key(seed)),
                       c=scalars(0.0), c_sq=scalars(0.0), s=scalars(1.0),
                       r_mean=jnp.zeros((), jnp.float32), l0=jnp.zeros((), jnp.float32),
                       delta=jnp.zeros((), jnp.float32))

  def update_fn(updates, state, params=None, *, value_fn=None, **_):
    del updates
    if params is None or value_fn is None:
      raise ValueError("scale_by_block_curvature needs params and value_fn")
    key, nkey = jax.random.split(jax.random.wrap_key_data(state.key))
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(key, len(leaves))
    z = treedef.unflatten([jax.random.normal(k, p.shape, jnp.float32)
                           for k, p in zip(keys, leaves, strict=True)])
    u = jax.tree.map(lambda zz, sb: zz * jnp.sqrt(sb), z, state.s)
    shift = lambda c: jax.tree.map(lambda p, uu: p + (c * mu * uu).astype(p.dtype), params, u)
    l0 = value_fn(params)
    lp = value_fn(shift(1.0))
    lm = value_fn(shift(-1.0))
    proj = (lp - lm) / (2 * mu)
    delta = (lp + lm - 2 * l0) / (mu * mu)
    g = jax.tree.map(lambda uu, p: (proj * uu).astype(p.dtype), u, params)
    # online least squares of delta on the features ||z_b||^2, with a control variate
    sq = jax.tree.map(lambda zz: jnp.sum(zz * zz), z)
    # centred features: the intercept E[delta] is its own running mean r_mean, NOT sum c_b n_b
    # (tying them made c_b n_b * feature a multiplicative noise on c_b that blew up to NaN)
    pred = sum(jax.tree.leaves(jax.tree.map(lambda c, q, zz: c * (q - zz.size), state.c, sq, z)))
    ok = jnp.isfinite(delta)
    r_mean = jnp.where(ok, (1 - center) * state.r_mean + center * delta, state.r_mean)
    resid = delta - r_mean - pred
    est = jax.tree.map(lambda c, q, zz: c + resid * (q - zz.size) / (2 * zz.size),
                       state.c, sq, z)
    c = jax.tree.map(lambda m, e: jnp.where(ok, (1 - beta) * m + beta * e, m), state.c, est)
    c_sq = jax.tree.map(lambda v, e: jnp.where(ok, (1 - beta) * v + beta * e * e, v),
                        state.c_sq, est)
    count = state.count + 1
    # every `refresh` steps after warmup: new scales from h_b = c_b / s_b; c rescaled to them
    new_s = _scales(c, state.s, params)
    do = (count >= warmup) & (count % refresh == 0)
    new_s = jax.tree.map(lambda n, o: jnp.where(do, n, o), new_s, state.s)
    c = jax.tree.map(lambda cc, n, o: cc * n / o, c, new_s, state.s)
    c_sq = jax.tree.map(lambda v, n, o: v * (n / o) ** 2, c_sq, new_s, state.s)
    return g, BlockHState(count=count, key=jax.random.key_data(nkey), c=c, c_sq=c_sq,
                          s=new_s, r_mean=r_mean, l0=l0, delta=delta)

  def _scales(c, s_old, params):
    cl, sl = jnp.stack(jax.tree.leaves(c)), jnp.stack(jax.tree.leaves(s_old))
    sizes = jnp.asarray([p.size for p in jax.tree.leaves(params)], jnp.float32)
    h = jnp.maximum(cl, 0.0) / sl                       # curvature in parameter coordinates
    wmean = jnp.sum(sizes * h) / jnp.sum(sizes)
    target = jnp.clip((wmean / jnp.maximum(h, 1e-30)) ** power, 1.0 / kappa, kappa)
    new = jnp.clip(target, sl / max_change, sl * max_change)
    new = jnp.where(wmean > 0, new, sl)
    return jax.tree.unflatten(jax.tree.structure(c), list(new))

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def block_curvature(lr: float, **kwargs) -> optax.GradientTransformationExtraArgs:
  """``theta <- theta - lr * g`` with :func:`scale_by_block_curvature`'s estimate."""
  return optax.chain(scale_by_block_curvature(**kwargs), optax.scale(-lr))


def curvature_report(state: BlockHState, beta: float = 0.01) -> dict[str, Any]:
  """Per-block curvature in parameter coordinates ``h_b = c_b / s_b``, the relative standard
  error of ``c_b`` (EMA of the per-step estimates), and the scales ``s_b``."""
  n = int(state.count)
  c = [float(x) for x in jax.tree.leaves(state.c)]
  v = [float(x) for x in jax.tree.leaves(state.c_sq)]
  s = [float(x) for x in jax.tree.leaves(state.s)]
  corr = 1.0 - (1.0 - beta) ** max(n, 1)
  neff = min(n, (2 - beta) / beta)  # effective number of samples an EMA averages
  rse = [float(np.sqrt(max(vv / corr - cc * cc, 0.0) / max(neff, 1.0))) / max(abs(cc), 1e-30)
         for cc, vv in zip(c, v, strict=True)]
  return {"h": [cc / ss for cc, ss in zip(c, s, strict=True)], "rel_se": rse, "scales": s,
          "steps": n}
