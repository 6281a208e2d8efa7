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

As a library method (:class:`BlockCurvature`, a :class:`hizoo_jax.method.Method` run by
``zm.zo_transform``): the probe is ``u = S^{1/2} z`` with ``z`` the library's noise (default
:data:`hizoo_jax.fast_gaussian`, whose ``E z^2 = 1`` and ``E z^4 = 3`` are the only moments the
estimator uses), drawn from the transform's key schedule and regenerated wherever it is
needed, never stored: in the passes, in the estimate ``g`` and in the per-block sums
``||z_b||^2 - n_b``, which are reductions over the regenerated noise inside
:meth:`BlockCurvature.estimate`. The state (:class:`BlockHState`) holds B scalars per
quantity (``c``, ``c_sq``, ``s``) besides ``r_mean``, the last ``delta`` and the step count;
the transform's own state (``hz.ZOState``) holds the key, the forward passes and ``l0`` (as
``loss``). So the estimator runs in ``tx.update`` and in the lean engine
``hz.make_train_step`` alike, with no params-sized temporary
(experiments/tests/test_blockh.py). A step whose ``l+`` or ``l-`` is not finite emits
``g = 0`` (counted in ``skipped_directions``, as the library's methods do) and leaves
``c``, ``c_sq`` and ``r_mean`` unchanged when ``delta`` is not finite.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.tree_utils as otu

import hizoo_jax as hz
from hizoo_jax import method as zm


class BlockHState(NamedTuple):
  """The method's own state (``hz.ZOState.method``); one scalar per block (leaf) in ``c``,
  ``c_sq`` and ``s``, each a tree shaped like the params' leaves."""

  steps: jax.Array          # steps taken (int32)
  c: Any                    # curvature of each block in the CURRENT preconditioned coordinates
  c_sq: Any                 # EMA of the square of its per-step estimate (standard error)
  s: Any                    # the per-block step scales s_b (one scalar a leaf)
  r_mean: jax.Array         # running mean of delta (the intercept of the block model)
  delta: jax.Array          # second difference of the last step


def _state_dtype(params: Any) -> Any:
  """The dtype of the state's scalars: the loss dtype (at least float32)."""
  return jnp.result_type(jnp.float32, *[jnp.result_type(p) for p in jax.tree.leaves(params)])


def _concrete(x: Any) -> np.ndarray | None:
  if isinstance(x, jax.core.Tracer):
    return None
  try:
    return np.asarray(x, dtype=float)
  except (TypeError, ValueError):
    return None


def _check(name: str, value: Any, ok, what: str) -> None:
  v = _concrete(value)
  if v is not None and (v.ndim != 0 or not np.isfinite(v) or not ok(float(v))):
    raise ValueError(f"{name} must be {what}, got {value!r}")


def scales(c: jax.Array, s_old: jax.Array, sizes: jax.Array, kappa: jax.Array,
           max_change: jax.Array, power: jax.Array) -> jax.Array:
  """New scales from ``h_b = c_b / s_b`` (vectors over the blocks)."""
  h = jnp.maximum(c, 0.0) / s_old                     # curvature in parameter coordinates
  wmean = jnp.sum(sizes * h) / jnp.sum(sizes)
  target = jnp.clip((wmean / jnp.maximum(h, 1e-30)) ** power, 1.0 / kappa, kappa)
  new = jnp.clip(target, s_old / max_change, s_old * max_change)
  return jnp.where(wmean > 0, new, s_old)


BLOCK_ELEMENTS = 1 << 20  # elements of a leaf's noise alive at a time in its reduction


def feature(sampler: hz.Sampler, words: Any, i: int, leaf: Any, dtype: Any) -> jax.Array:
  """``||z_i||^2 - n_i`` of leaf ``i``'s noise, a reduction over the regenerated noise.

  XLA:CPU does not fuse the noise's hash into a reduction: reduced whole, a leaf's noise
  would be stored (0.97 param bytes for two 256 x 256 matrices and a bias, measured). A leaf of rank
  >= 2 is therefore reduced in blocks of rows (of its ``(-1, last axis)`` view, whose
  row-major noise is the leaf's) drawn by the sampler's :meth:`hizoo_jax.Sampler.rows`, at
  most :data:`BLOCK_ELEMENTS` at a time; vectors and scalars, and samplers that cannot draw
  rows, are reduced whole.
  """
  shape = tuple(jnp.shape(leaf))
  ndtype = jnp.promote_types(jnp.result_type(leaf), jnp.float32)  # the noise dtype
  if len(shape) < 2 or not sampler.has_rows:
    return jnp.sum(jnp.square(words.noise(sampler, i, leaf).astype(dtype)) - 1)
  cols = shape[-1]
  flat = (int(np.prod(shape[:-1])), cols)
  block = max(1, min(flat[0], BLOCK_ELEMENTS // max(cols, 1)))
  n_blocks = -(-flat[0] // block)
  key = words.key(i)

  def part(k, total):
    # run-time (a constant index would be folded into a block-sized constant per op)
    k = jax.lax.optimization_barrier(k)
    start = jnp.minimum(k * block, flat[0] - block)  # the last block may overlap
    own = start + jnp.arange(block) >= k * block
    z = sampler.rows(key, flat, ndtype, start, block).astype(dtype)
    return total + jnp.sum(jnp.where(own[:, None], jnp.square(z) - 1, 0))

  return jax.lax.fori_loop(0, n_blocks, part, jnp.zeros((), dtype))


@dataclasses.dataclass(frozen=True)
class BlockCurvature(zm.Method):
  """One two-sided probe ``u = S^{1/2} z`` with ``l0`` measured every step; the learned
  per-block curvature ``c`` and scales ``s`` in :class:`BlockHState`."""

  name = "block_curvature"
  sampler: hz.Sampler = hz.fast_gaussian

  def check(self, hyper):
    if self.num_probes != 1:
      raise ValueError(f"block curvature takes one probe a step, got {self.num_probes}")
    if not self.sampler.is_gaussian:
      raise ValueError(f"the block-curvature estimate needs Gaussian noise (E z^4 = 3), got "
                       f"{self.sampler!r}")
    _check("mu", hyper["mu"], lambda v: v > 0, "a finite number > 0")
    _check("beta", hyper["beta"], lambda v: 0 < v <= 1, "in (0, 1]")
    _check("center", hyper["center_rate"], lambda v: 0 <= v <= 1, "in [0, 1]")
    _check("warmup", hyper["warmup"], lambda v: v >= 0 and v.is_integer(), "an int >= 0")
    _check("refresh", hyper["refresh"], lambda v: v >= 1 and v.is_integer(), "an int >= 1")
    _check("kappa", hyper["kappa"], lambda v: v >= 1, "a finite number >= 1")
    _check("max_change", hyper["max_change"], lambda v: v >= 1, "a finite number >= 1")
    _check("power", hyper["power"], lambda v: v >= 0, "a finite number >= 0")

  def init(self, params, hyper):
    del hyper
    dtype = _state_dtype(params)
    # a new buffer each (one buffer twice in a state cannot be donated)
    scalar = lambda v: jnp.array(v, dtype, copy=True)
    scalars = lambda v: jax.tree.map(lambda p: scalar(v), params)
    return BlockHState(steps=jnp.zeros((), jnp.int32), c=scalars(0.0), c_sq=scalars(0.0),
                       s=scalars(1.0), r_mean=scalar(0.0), delta=scalar(0.0))

  def in_effect(self, hyper, count, params, state):
    del count, state
    dtype = _state_dtype(params)
    real = lambda k: jnp.asarray(hyper[k]).astype(dtype)
    whole = lambda k: jnp.asarray(hyper[k]).astype(jnp.int32)
    return {**zm.mu_in_effect(hyper, params), "center": jnp.asarray(True),
            "beta": real("beta"), "center_rate": real("center_rate"),
            "warmup": whole("warmup"), "refresh": jnp.maximum(whole("refresh"), 1),
            "kappa": real("kappa"), "max_change": real("max_change"), "power": real("power")}

  def direction_leaf(self, noise, state, hyper, words, i, leaf):
    z = words.noise(noise.sampler, i, leaf)
    return jnp.sqrt(jax.tree.leaves(state.s)[i]).astype(z.dtype) * z

  def estimate(self, noise, state, hyper, params, measured):
    dtype = measured.values.dtype
    sd = state.r_mean.dtype
    lp, lm = measured.values[0], measured.values[1]
    l0 = jnp.asarray(measured.center, dtype)
    mu = hyper["mu"].astype(dtype)
    finite = jnp.isfinite(lp) & jnp.isfinite(lm) & hyper["mu_ok"]
    proj = jnp.where(finite, (lp - lm) / (2 * mu), 0)
    delta = ((lp + lm - 2 * l0) / (mu * mu)).astype(sd)
    ok = jnp.isfinite(delta) & hyper["mu_ok"]
    # Computed once, not copied into every leaf's pass (compile time).
    proj = zm.computed_once(proj)
    s = jax.tree.leaves(state.s)
    g = [proj.astype(d.dtype) * d for d in (self.direction_leaf(noise, state, hyper,
                                                                noise.words(0), i, p)
                                            for i, p in enumerate(params))]
    # The features ||z_b||^2 - n_b: one reduction over each leaf's regenerated noise. In the
    # engine's final pass the draws are tied to delta, so that XLA neither shares them with
    # the estimate's pass (which would store the noise) nor hoists them.
    words = noise.words(0, (delta,) if noise.lean else ())
    q = [feature(noise.sampler, words, i, p, sd) for i, p in enumerate(params)]
    n = [jnp.asarray(float(np.prod(jnp.shape(p))), sd) for p in params]
    c, c_sq = jax.tree.leaves(state.c), jax.tree.leaves(state.c_sq)
    beta, rate = hyper["beta"].astype(sd), hyper["center_rate"].astype(sd)
    # centred features: the intercept E[delta] is its own running mean r_mean, NOT sum c_b n_b
    # (tying them made c_b n_b * feature a multiplicative noise on c_b that blew up to NaN)
    pred = sum((cb * qb for cb, qb in zip(c, q, strict=True)), jnp.zeros((), sd))
    r_mean = jnp.where(ok, (1 - rate) * state.r_mean + rate * delta, state.r_mean)
    resid = delta - r_mean - pred
    est = [cb + resid * qb / (2 * nb) for cb, qb, nb in zip(c, q, n, strict=True)]
    c = [jnp.where(ok, (1 - beta) * cb + beta * e, cb) for cb, e in zip(c, est, strict=True)]
    c_sq = [jnp.where(ok, (1 - beta) * v + beta * e * e, v)
            for v, e in zip(c_sq, est, strict=True)]
    steps = state.steps + 1
    # every `refresh` steps after warmup: new scales from h_b = c_b / s_b; c rescaled to them
    if s:
      old = jnp.stack(s)
      new = scales(jnp.stack(c), old, jnp.stack(n), hyper["kappa"].astype(sd),
                   hyper["max_change"].astype(sd), hyper["power"].astype(sd))
      do = (steps >= hyper["warmup"]) & (steps % hyper["refresh"] == 0)
      new = jnp.where(do, new, old)
      ratio = new / old
      c = [cb * ratio[b] for b, cb in enumerate(c)]
      c_sq = [v * ratio[b] ** 2 for b, v in enumerate(c_sq)]
      s = [new[b] for b in range(len(s))]
    treedef = jax.tree.structure(state.c)
    new_state = BlockHState(steps=steps, c=treedef.unflatten(c), c_sq=treedef.unflatten(c_sq),
                            s=treedef.unflatten(s), r_mean=r_mean, delta=delta)
    stats = dict(loss=l0, skipped=1 - finite.astype(jnp.int32), projected=proj)
    return g, new_state, stats


def scale_by_block_curvature(*, mu: float = 1e-3, beta: float = 0.01, warmup: int = 100,
                             refresh: int = 50, kappa: float = 30.0, max_change: float = 2.0,
                             center: float = 0.05, power: float = 1.0, seed: Any = 0,
                             sampler: hz.Sampler | None = None
                             ) -> optax.GradientTransformationExtraArgs:
  """Zeroth-order estimate preconditioned by a learned per-tensor curvature.

  ``update(updates, state, params, value_fn=f)`` like the library's transforms (the engine
  ``hz.make_train_step`` runs it too): ``updates`` is ignored; returns the preconditioned
  SPSA estimate ``g`` (chain with ``optax.scale(-lr)``). ``center`` is the rate of the
  running mean ``r_mean`` of delta; ``sampler`` a Gaussian :class:`hizoo_jax.Sampler`
  (default :data:`hizoo_jax.fast_gaussian`).
  """
  sampler = hz.fast_gaussian if sampler is None else sampler
  if not isinstance(sampler, hz.Sampler):
    raise TypeError(f"sampler must be a hizoo_jax.Sampler, got {sampler!r}")
  if isinstance(seed, jax.Array) and jnp.issubdtype(seed.dtype, jax.dtypes.prng_key):
    key_impl = str(jax.random.key_impl(seed))
  else:
    key_impl = str(jax.config.jax_default_prng_impl)
  method = BlockCurvature(sampler=sampler, key_impl=key_impl)
  hyper = dict(mu=mu, beta=beta, warmup=warmup, refresh=refresh, kappa=kappa,
               max_change=max_change, center_rate=center, power=power)
  return zm.zo_transform(method, hyper, seed)


def block_curvature(lr: float, *, mu: float = 1e-3, beta: float = 0.01, warmup: int = 100,
                    refresh: int = 50, kappa: float = 30.0, max_change: float = 2.0,
                    center: float = 0.05, power: float = 1.0, seed: Any = 0,
                    sampler: hz.Sampler | None = None) -> optax.GradientTransformationExtraArgs:
  """``theta <- theta - lr * g`` with :func:`scale_by_block_curvature`'s estimate (the
  options are spelled out so that ``optax.inject_hyperparams`` sees them)."""
  return optax.chain(
      scale_by_block_curvature(mu=mu, beta=beta, warmup=warmup, refresh=refresh, kappa=kappa,
                               max_change=max_change, center=center, power=power, seed=seed,
                               sampler=sampler),
      optax.scale(-lr))


def method_state(state: Any) -> BlockHState:
  """The :class:`BlockHState` inside a transform's state (a chain, a wrapper, ...)."""
  if isinstance(state, BlockHState):
    return state
  found = otu.tree_get(state, "BlockHState")
  if not isinstance(found, BlockHState):
    raise ValueError("no block-curvature state found (is it a scale_by_block_curvature "
                     "state?)")
  return found


def curvature_report(state: Any, beta: float = 0.01) -> dict[str, Any]:
  """Per-block curvature in parameter coordinates ``h_b = c_b / s_b``, the relative standard
  error of ``c_b`` (EMA of the per-step estimates), and the scales ``s_b``. ``state``: the
  state of :func:`scale_by_block_curvature`, of a chain or wrapper holding it, or its
  :class:`BlockHState`."""
  state = method_state(state)
  n = int(state.steps)
  c = [float(x) for x in jax.tree.leaves(state.c)]
  v = [float(x) for x in jax.tree.leaves(state.c_sq)]
  s = [float(x) for x in jax.tree.leaves(state.s)]
  corr = 1.0 - (1.0 - beta) ** max(n, 1)
  neff = min(n, (2 - beta) / beta)  # effective number of samples an EMA averages
  rse = [float(np.sqrt(max(vv / corr - cc * cc, 0.0) / max(neff, 1.0))) / max(abs(cc), 1e-30)
         for cc, vv in zip(c, v, strict=True)]
  return {"h": [cc / ss for cc, ss in zip(c, s, strict=True)], "rel_se": rse, "scales": s,
          "steps": n}
