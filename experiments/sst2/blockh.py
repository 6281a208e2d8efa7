"""Prototype: a zeroth-order optimizer with a LEARNABLE curvature, one scalar per tensor.

Why: HiZOO's per-coordinate diagonal cannot be learned at d >= 1e4 within 1e4 steps
(notebooks/02): one two-point probe gives one number, ``delta = z^T A z``, so estimating d
diagonal entries needs O(d) probes, and HiZOO's H ends up acting as a scalar step-size
schedule (notebooks/03). With B blocks (B = number of parameter tensors, 26 for MiniLM LoRA)
the same probe identifies B numbers in O(B) steps.

The estimator (Gaussian z, block b holds n_b coordinates, u = S^{1/2} z the probe direction
with S the current preconditioner, constant on each block)::

    l0 = f(theta),  l+- = f(theta +- mu u)
    g       = (l+ - l-) / (2 mu) * u                      (preconditioned SPSA step, E = S grad)
    delta   = (l+ + l- - 2 l0) / mu^2                     (= u^T A u + O(mu^2))
    c_b     = delta * (||z_b||^2 - n_b) / (2 n_b)         E[c_b] = s_b * mean diag(A_bb)
    h_b    <- EMA_beta(c_b / s_b)                         (bias-corrected, like Adam's m)

``E[z^T M z (||z_b||^2 - n_b)] = 2 tr(M_bb)`` for Gaussian z, so ``c_b / s_b`` is unbiased for
the mean diagonal curvature of block b. Its variance is about ``(2 sum_b' s_b'^2 ||A_b'||^2_F)
/ n_b ...``; in practice the signal-to-noise ratio per step is ~1/B when the blocks contribute
equally, so ~B / beta steps average it down. The state also keeps an EMA of ``(c_b/s_b)^2`` so
the relative standard error of each ``h_b`` can be reported.

The preconditioner is SHAPE-ONLY: ``s_b = mean_w(h) / h_b`` with ``mean_w`` the coordinate-
weighted mean, clipped to ``[1/kappa, kappa]``. The coordinate-weighted mean of ``1/s`` is
therefore ~1, i.e. the variant has no scalar step-size schedule of its own: its step-size
control ("MeZO with lr / mean H(t)") is MeZO at the same learning rate, and any difference from
MeZO comes from how the step is distributed over tensors. During ``warmup`` steps s = 1
(the variant is MeZO with an extra forward pass) while h accumulates.

Forward passes: 3 per step (l0, l+, l-), like HiZOO; MeZO uses 2.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax


class BlockHState(NamedTuple):
  count: jax.Array          # steps taken
  key: jax.Array            # PRNG key data
  h_m: Any                  # EMA of the per-block curvature estimate (one scalar a leaf)
  h_v: Any                  # EMA of its square (for the standard error)
  l0: jax.Array             # loss at theta of the last step
  delta: jax.Array          # second difference of the last step


def scale_by_block_curvature(*, mu: float = 1e-3, beta: float = 0.01, warmup: int = 100,
                             kappa: float = 30.0, seed: int = 0
                             ) -> optax.GradientTransformationExtraArgs:
  """Zeroth-order estimate preconditioned by a learned per-tensor curvature.

  ``update(updates, state, params, value_fn=f)``: ``updates`` is ignored; returns the
  preconditioned SPSA estimate ``g`` (chain with ``optax.scale(-lr)``).
  """

  def init_fn(params):
    zeros = lambda: jax.tree.map(lambda p: jnp.zeros((), jnp.float32), params)
    return BlockHState(count=jnp.zeros((), jnp.int32),
                       key=jax.random.key_data(jax.random.key(seed)),
                       h_m=zeros(), h_v=zeros(), l0=jnp.zeros((), jnp.float32),
                       delta=jnp.zeros((), jnp.float32))

  def update_fn(updates, state, params=None, *, value_fn=None, **_):
    del updates
    if params is None or value_fn is None:
      raise ValueError("scale_by_block_curvature needs params and value_fn")
    s = scales(state, params)
    key, nkey = jax.random.split(jax.random.wrap_key_data(state.key))
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(key, len(leaves))
    z = treedef.unflatten([jax.random.normal(k, p.shape, jnp.float32)
                           for k, p in zip(keys, leaves, strict=True)])
    u = jax.tree.map(lambda zz, sb: zz * jnp.sqrt(sb), z, s)
    shift = lambda c: jax.tree.map(lambda p, uu: p + (c * mu * uu).astype(p.dtype), params, u)
    l0 = value_fn(params)
    lp = value_fn(shift(1.0))
    lm = value_fn(shift(-1.0))
    proj = (lp - lm) / (2 * mu)
    delta = (lp + lm - 2 * l0) / (mu * mu)
    g = jax.tree.map(lambda uu: (proj * uu).astype(jnp.float32), u)
    # per-block curvature estimate, back in parameter coordinates (divide by s_b)
    est = jax.tree.map(
        lambda zz, sb: delta * (jnp.sum(zz * zz) - zz.size) / (2 * zz.size) / sb, z, s)
    ok = jnp.isfinite(delta)
    h_m = jax.tree.map(lambda m, e: jnp.where(ok, (1 - beta) * m + beta * e, m), state.h_m, est)
    h_v = jax.tree.map(lambda v, e: jnp.where(ok, (1 - beta) * v + beta * e * e, v),
                       state.h_v, est)
    g = jax.tree.map(lambda gg, p: gg.astype(p.dtype), g, params)
    return g, BlockHState(count=state.count + 1, key=jax.random.key_data(nkey), h_m=h_m,
                          h_v=h_v, l0=l0, delta=delta)

  def scales(state, params):
    """Per-leaf step scales s_b (1 during warmup)."""
    corr = 1.0 - (1.0 - beta) ** jnp.maximum(state.count, 1).astype(jnp.float32)
    h = jax.tree.map(lambda m: m / corr, state.h_m)
    hl, sizes = jax.tree.leaves(h), [p.size for p in jax.tree.leaves(params)]
    hv = jnp.stack(hl)
    pos = jnp.maximum(hv, 1e-12)
    wmean = jnp.sum(jnp.asarray(sizes, jnp.float32) * jnp.maximum(hv, 0)) / sum(sizes)
    sv = jnp.clip(wmean / pos, 1.0 / kappa, kappa)
    sv = jnp.where((state.count < warmup) | ~(wmean > 0), jnp.ones_like(sv), sv)
    return jax.tree.unflatten(jax.tree.structure(h), list(sv))

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def block_curvature(lr: float, **kwargs) -> optax.GradientTransformationExtraArgs:
  """``theta <- theta - lr * g`` with :func:`scale_by_block_curvature`'s estimate."""
  return optax.chain(scale_by_block_curvature(**kwargs), optax.scale(-lr))


def curvature_report(state: BlockHState, beta: float = 0.01) -> dict[str, Any]:
  """Per-block bias-corrected curvature, its relative standard error, and the scales."""
  n = int(state.count)
  corr = 1.0 - (1.0 - beta) ** max(n, 1)
  m = [float(x) / corr for x in jax.tree.leaves(state.h_m)]
  v = [float(x) / corr for x in jax.tree.leaves(state.h_v)]
  # effective number of averaged samples of an EMA: (2 - beta) / beta
  neff = min(n, (2 - beta) / beta)
  rse = [float(jnp.sqrt(max(vv - mm * mm, 0.0) / max(neff, 1.0))) / max(abs(mm), 1e-30)
         for mm, vv in zip(m, v, strict=True)]
  return {"h": m, "rel_se": rse, "steps": n}
