"""The zeroth-order estimate of one step, for MeZO (identity curvature) and HiZOO.

One step with ``n`` directions (HiZOO, Algorithms 1 and 3 of Zhao et al., ICLR 2025)::

    l0 = f(theta)                                     # Hessian steps only, once per step
    for j in 1..n:
        z   = sampler(key_j)                          # regenerated, never stored
        l+- = f(theta +- mu H^{-1/2} z)
        H   = clip(H + alpha (est(l+ + l- - 2 l0, H, z) - H))     # HiZOO only
        g_j = (l+ - l-) / (2 mu) * H^{-1/2} z         # with the updated H
    g = mean of the g_j over the directions whose losses were finite

MeZO is the same loop with ``H = 1`` (the identity curvature) and no ``l0``. The curvature
strategies of :mod:`hizoo_jax._src.curvature` hold everything that differs per leaf.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hizoo_jax._src import curvature as curv
from hizoo_jax._src import sampling
from hizoo_jax._src.config import ZOSpec


def loss_dtype(params: Any) -> np.dtype:
  """The dtype losses are compared and recorded in: at least float32."""
  dtypes = [jnp.result_type(x) for x in jax.tree.leaves(params)]
  return jnp.result_type(jnp.float32, *dtypes) if dtypes else np.dtype(jnp.float32)


def check_loss(loss: Any, what: str = "value_fn") -> jax.Array:
  """``loss`` as a scalar array, or a ValueError naming what returned it."""
  if isinstance(loss, tuple):
    raise ValueError(
        f"{what} must return a scalar loss, got a tuple; for a (loss, aux) function use "
        "make_train_step(..., has_aux=True), or wrap it as lambda p: f(p)[0]"
    )
  loss = jnp.asarray(loss)
  if loss.shape != ():
    raise ValueError(f"{what} must return a scalar loss, got shape {loss.shape}")
  if not jnp.issubdtype(loss.dtype, jnp.floating):
    raise ValueError(f"{what} must return a floating-point loss, got dtype {loss.dtype}")
  return loss


def sanitize_mu(mu: Any) -> tuple[jax.Array, jax.Array]:
  """``(mu, ok)``: a traced ``mu`` that is not finite and > 0 becomes 0 with ``ok = False``.

  Under ``jit`` a bad injected ``mu`` cannot raise; the step then perturbs by 0 and counts
  its directions as skipped, so params and state stay as they were.
  """
  mu = jnp.asarray(mu)
  ok = jnp.isfinite(mu) & (mu > 0)
  return jnp.where(ok, mu, jnp.zeros_like(mu)), ok


def effective_mu(mu: Any, params: Any, resolution: Any) -> jax.Array:
  """``mu``, raised for 16-bit params to ``resolution * eps(dtype) * rms(theta)``.

  In bfloat16 (8 mantissa bits) ``theta + mu z`` rounds back to ``theta`` for most elements
  at ``mu = 1e-3`` when ``|theta| ~ 0.05``: the perturbation applied is not the one the
  estimate assumes, the second difference is mostly rounding, and HiZOO's ``H`` inflates
  (measured on an MLP: 94% of the elements rounded away, median H 4000x float32's, final
  loss 3.3x). A perturbation of a few ulp of a typical param is applied for most elements:
  with ``resolution = 4`` about 7% still round away, and HiZOO in bfloat16 then trains like
  float32 (loss 1.00x, median H 1.00x; float16 1.17x / 1.55x; experiments/bf16). The rms is
  over all leaves of each 16-bit dtype (the largest of those values counts); float32 and
  wider leaves leave ``mu`` as given.
  """
  mu = jnp.asarray(mu)
  by_dtype: dict[Any, list] = {}
  for x in jax.tree.leaves(params):
    dt = jnp.result_type(x)
    if jnp.finfo(dt).bits < 32:
      by_dtype.setdefault(dt, []).append(x)
  res = np.asarray(resolution) if not isinstance(resolution, jax.core.Tracer) else None
  if not by_dtype or (res is not None and float(res) == 0):
    return mu
  floor = jnp.zeros((), jnp.float32)
  for dt, xs in by_dtype.items():
    total = sum(jnp.sum(jnp.square(jnp.asarray(x, jnp.float32))) for x in xs)
    count = sum(int(np.prod(jnp.shape(x))) for x in xs)
    rms = jnp.sqrt(total / max(count, 1))
    floor = jnp.maximum(floor, float(jnp.finfo(dt).eps) * rms)
  return jnp.maximum(mu, (jnp.asarray(resolution, jnp.float32) * floor).astype(mu.dtype))


def sanitize_alpha(alpha: Any) -> jax.Array:
  """``hessian_smoothing`` clamped into [0, 1] (NaN: 0, no update).

  An EMA factor above 1 extrapolates past the estimate (``alpha = 2`` gives ``2 est - H``)
  and one below 0 pushes ``H`` away from it; a schedule may return such values under
  ``jit``, where nothing can raise.
  """
  alpha = jnp.asarray(alpha)
  return jnp.where(jnp.isnan(alpha), 0, jnp.clip(alpha, 0, 1)).astype(alpha.dtype)


def perturb(spec: ZOSpec, params: Any, hessian: Any, dir_key: jax.Array, step: jax.Array):
  """``theta + step * H^{-1/2} z`` leaf by leaf (``step = coef * mu``), cast back.

  The noise of each leaf is regenerated from ``dir_key`` (the key schedule of
  :mod:`hizoo_jax._src.sampling`), combined in at least float32 and rounded once.
  """
  leaves, treedef = jax.tree.flatten(params)
  h_leaves = [None] * len(leaves) if hessian is None else treedef.flatten_up_to(hessian)
  words = sampling.DirectionWords(dir_key, len(leaves), leaves)
  out = []
  for i, (p, h) in enumerate(zip(leaves, h_leaves, strict=True)):
    z = words.noise(spec.sampler, i, p)
    delta = step.astype(z.dtype) * z
    s = curv.strategy_of(h).inv_sqrt(h, spec.hessian_clip)
    if s is not None:
      delta = delta * s.astype(z.dtype)
    out.append((jnp.asarray(p).astype(z.dtype) + delta).astype(jnp.result_type(p)))
  return treedef.unflatten(out)


def estimate(
    spec: ZOSpec,
    params: Any,
    value_fn: Callable[[Any], Any] | None,
    noise_key: jax.Array,
    num_directions: int,
    mu: jax.Array,
    hessian: Any,
    hessian_step: jax.Array | bool,
    alpha: jax.Array,
    *,
    curvature_floor: Any = 4.0,
    losses: tuple[jax.Array, jax.Array, jax.Array] | None = None,
) -> tuple[Any, Any, dict[str, jax.Array]]:
  """One zeroth-order step: ``(g, new_hessian, stats)``.

  ``hessian`` is None for MeZO. ``hessian_step`` says whether this step measures ``l0``
  and updates ``H`` (it may be traced). ``losses = (l0, l+[n], l-[n])``, when given, are
  losses measured elsewhere at exactly these perturbations (the lean train step measures
  them on in-place perturbed params); then ``value_fn`` is not called.
  """
  dtype = loss_dtype(params)
  mu, mu_ok = sanitize_mu(mu)
  alpha = sanitize_alpha(alpha)
  value = lambda p: check_loss(value_fn(p)).astype(dtype)
  hessian_step = jnp.asarray(hessian_step) if spec.hizoo else jnp.asarray(False)

  if not spec.hizoo:
    l0 = jnp.zeros((), dtype)
  elif losses is not None:
    l0 = jnp.asarray(losses[0], dtype)
  else:
    l0 = jax.lax.cond(hessian_step, lambda: value(params), lambda: jnp.zeros((), dtype))

  leaves, treedef = jax.tree.flatten(params)
  zero_i = jnp.zeros((), jnp.int32)

  def direction(carry, j):
    h_leaves, g_leaves, n_valid, n_skip_h = carry
    dkey = sampling.direction_key(noise_key, j)
    if losses is not None:
      lp = jnp.asarray(losses[1], dtype)[j]
      lm = jnp.asarray(losses[2], dtype)[j]
    else:
      h_tree = None if hessian is None else treedef.unflatten(h_leaves)
      lp = value(perturb(spec, params, h_tree, dkey, mu))
      lm = value(perturb(spec, params, h_tree, dkey, -mu))
    finite = jnp.isfinite(lp) & jnp.isfinite(lm) & mu_ok & (jnp.isfinite(l0) | ~hessian_step)
    proj = jnp.where(finite, (lp - lm) / (2 * mu.astype(dtype)), 0)

    # The second difference, and whether it rises above the loss dtype's rounding floor.
    d2 = lp + lm - 2 * l0
    scale = jnp.maximum(jnp.maximum(jnp.abs(lp), jnp.abs(lm)), jnp.abs(l0))
    floor_mult = jnp.asarray(curvature_floor, dtype)
    resolved = (jnp.abs(d2) > floor_mult * jnp.finfo(dtype).eps * scale) | (floor_mult == 0)
    do_h = hessian_step & finite & resolved
    c = jnp.where(do_h, d2 / (2 * jnp.square(mu.astype(dtype))), 0)
    n_skip_h = n_skip_h + (hessian_step & finite & ~resolved).astype(jnp.int32)
    # Materialised once: otherwise XLA copies this scalar logic into every leaf's fused
    # pass, which multiplies the compile time of models with many tensors.
    proj, c, do_h = jax.lax.optimization_barrier((proj, c, do_h))

    # The update pass, leaf by leaf. Dense leaves are one fused elementwise loop each. A
    # factored leaf needs reductions over its estimate; its noise is regenerated for each
    # use, after the previous factored leaf is done (a cond whose predicate depends on
    # it), so neither its estimate nor its noise is materialised and at most one leaf's
    # temporaries are alive.
    new_h, new_g, last = [], [], None
    words = sampling.DirectionWords(dkey, len(leaves), leaves)
    for i, (p, h, g) in enumerate(zip(leaves, h_leaves, g_leaves, strict=True)):

      def zfn(after=(), i=i, p=p):
        return words.noise(spec.sampler, i, p, after)

      strategy = curv.strategy_of(h)
      if strategy is curv.FACTORED:
        go = do_h if last is None else do_h & jnp.all(jnp.isfinite(last.row))
        rows = sampling.leaf_rows(spec.sampler, words.key(i), p)
        h = jax.lax.cond(
            go,
            lambda h, zfn=zfn, rows=rows: curv.FACTORED.update(
                h, zfn, c, alpha, estimator=spec.estimator, clip=spec.hessian_clip, rows=rows),
            lambda h: h,
            h,
        )
        last = h
      z = zfn()
      if strategy is curv.DENSE:
        # The lean train step (losses given) updates H and the params in one program:
        # sharing one z between the two passes would make XLA store it (a params-sized
        # buffer); an opaque key makes each pass draw it again (one more hash per element).
        zh = zfn(after=(c,)) if losses is not None else z
        h_up = strategy.update(h, zh, c, alpha, estimator=spec.estimator,
                               clip=spec.hessian_clip)
        h = jnp.where(do_h, h_up, h)
      s = strategy.inv_sqrt(h, spec.hessian_clip)
      direction_g = z if s is None else s.astype(z.dtype) * z
      new_h.append(h)
      new_g.append(g + proj.astype(z.dtype) * direction_g)
    n_valid = n_valid + finite.astype(jnp.int32)
    return (new_h, new_g, n_valid, n_skip_h), (lp, lm)

  h0 = [None] * len(leaves) if hessian is None else treedef.flatten_up_to(hessian)
  g0 = [jnp.zeros(jnp.shape(p), sampling.noise_dtype(jnp.result_type(p))) for p in leaves]
  carry = (h0, g0, zero_i, zero_i)
  if num_directions == 1:
    carry, (lp, lm) = direction(carry, 0)
    lp, lm = lp[None], lm[None]
  else:
    carry, (lp, lm) = jax.lax.scan(direction, carry, jnp.arange(num_directions))
  h_leaves, g_leaves, n_valid, n_skip_h = carry

  denom = jnp.maximum(n_valid, 1)
  g = treedef.unflatten([(a / denom.astype(a.dtype)).astype(jnp.result_type(p))
                         for a, p in zip(g_leaves, leaves, strict=True)])
  new_hessian = None if hessian is None else treedef.unflatten(h_leaves)
  loss = jnp.where(hessian_step, l0, jnp.mean((lp + lm) / 2))
  stats = dict(
      loss=loss,
      loss_plus=lp,
      loss_minus=lm,
      skipped_directions=num_directions - n_valid,
      skipped_hessian_updates=n_skip_h,
  )
  return g, new_hessian, stats
