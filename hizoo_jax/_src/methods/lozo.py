"""LOZO and LOZO-M: two-sided SPSA along a low-rank perturbation ``U V^T`` per matrix.

One step (Chen et al., "Enhancing Zeroth-Order Fine-Tuning for Language Models with
Low-Rank Structures", ICLR 2025; the reference code optsuite/LOZO)::

    V     = fresh N(0, 1) [n, r] every nu-th step (stored between), else the stored V
    U     = fresh N(0, 1) [m, r] every step
    Z     = U V^T                 (matrices; vectors: a full Gaussian z)

with ``m`` the rows of the reference's PyTorch weight ``[out, in]`` (its ``out``) and ``n``
its columns: on a Flax kernel ``[in, out]`` the leaf holds ``Z^T = V U^T``
(:func:`hizoo_jax._src.methods.lowrank.rows_last`, the ``layout`` option).
    c     = (f(theta + mu Z) - f(theta - mu Z)) / (2 mu)
    g     = c Z                                              (LOZO)
    M     = beta M + (1 - beta) c U,  g = M V^T              (LOZO-M, momentum in factor space)

LOZO-M's momentum lives in the ``[m, r]`` factor space; when ``V`` is redrawn it is carried
over as ``M V_old^T V_new / n`` (``n`` the matrix's columns), and the first step sets
``M = c U``; vectors keep a full momentum ``m = beta m + (1 - beta) c z``. As in the
reference code (and unlike a ``1 / r`` some write-ups of the paper carry), ``Z`` is not
scaled by the rank. Unlike the reference code, the ``U`` of the update is always the
``U`` of the perturbation (the reference redraws a different one on the steps that redraw
``V``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from hizoo_jax._src import alias, numerics, sampling, transform
from hizoo_jax._src import config as cfg
from hizoo_jax._src import method as m
from hizoo_jax._src.methods import lowrank as lr
from hizoo_jax._src.methods import spsa


class LOZOState(NamedTuple):
  """LOZO's state, one entry per params leaf.

  Attributes:
    v: the lazily resampled factor ``V [..., n, r]`` of each matrix leaf, over the
      reference's columns (None for vectors).
    momentum: LOZO-M's momentum, ``[..., m, r]`` over the reference's rows for matrices
      and leaf-shaped for vectors (an empty tuple without momentum).
  """

  v: tuple
  momentum: Any
  refreshed_on_schedule = True  # also on a dropped step: the guard selects it


@dataclasses.dataclass(frozen=True)
class LOZO(m.Method):
  """LOZO's method object (LOZO-M when ``with_momentum``; its ``beta`` is the numeric
  option ``momentum``). ``rank`` None: traced, recovered from the state; ``rows_last``:
  per leaf, set from the params by :meth:`for_params`."""

  name = "lozo"
  rank: int | None = 2
  with_momentum: bool | None = False
  layout: str = "flax"
  rows_last: tuple | None = None

  @property
  def serial_products(self) -> bool:
    # Above the fused rank its products are matmuls, one leaf-sized buffer each.
    return self.rank > lr.FUSED_RANK

  def check(self, hyper):
    lr.check_options(self.rank, hyper, self.layout)
    beta = cfg.concrete(hyper["momentum"])
    if beta is not None and (beta.ndim != 0 or not 0.0 <= float(beta) < 1.0):
      raise ValueError(f"momentum must lie in [0, 1), got {hyper['momentum']!r}")

  def for_params(self, params):
    return dataclasses.replace(self, rows_last=lr.rows_last(params, self.layout))

  def resolve(self, state):
    rank = lr.rank_in_state(state.v) if self.rank is None else self.rank
    on = state.momentum != () if self.with_momentum is None else self.with_momentum
    return dataclasses.replace(self, rank=rank, with_momentum=on)

  def _sides(self, i, p):
    """``(rows, columns)`` of matrix leaf ``i`` in the reference's sense."""
    a, b = jnp.shape(p)[-2:]
    return (b, a) if self.rows_last[i] else (a, b)

  def _v_shape(self, i, p):
    return jnp.shape(p)[:-2] + (self._sides(i, p)[1], lr.rank_of(p, self.rank))

  def _u_shape(self, i, p):
    return jnp.shape(p)[:-2] + (self._sides(i, p)[0], lr.rank_of(p, self.rank))

  def _outer(self, i, rows, cols):
    return lr.leaf_outer(self.rows_last[i], rows, cols)

  def init(self, params, hyper):
    lr.check_concrete_rank(self.rank)
    if self.with_momentum is None:
      raise TypeError("momentum must be a concrete number at init (0 or not decides whether "
                      "the state holds a momentum)")
    leaves = jax.tree.leaves(params)
    v = tuple(jnp.zeros(self._v_shape(i, p), lr.factor_dtype(p)) if lr.is_matrix(p) else None
              for i, p in enumerate(leaves))
    if not self.with_momentum:
      return LOZOState(v=v, momentum=())
    mom = tuple(jnp.zeros(self._u_shape(i, p), lr.factor_dtype(p)) if lr.is_matrix(p)
                else jnp.zeros(jnp.shape(p), lr.factor_dtype(p)) for i, p in enumerate(leaves))
    return LOZOState(v=v, momentum=mom)

  def in_effect(self, hyper, count, params, state):
    out = {**spsa.mu_in_effect(hyper, params), "center": jnp.asarray(False),
           "resample": lr.every(hyper["resample_every"], count),
           "first": count == 0}
    if self.with_momentum:
      # beta and 1 - beta, the latter computed in Python when beta is concrete (as a float
      # option always was), in the loss dtype when traced (optax.inject_hyperparams).
      dtype = numerics.loss_dtype(params)
      beta = cfg.concrete(hyper["momentum"])
      beta = jnp.asarray(hyper["momentum"], dtype) if beta is None else float(beta)
      out["momentum"] = jnp.asarray(beta, dtype)
      out["momentum_rest"] = jnp.asarray(1 - beta, dtype)
    return out

  def _factors(self, noise, state, hyper, words, i, p):
    """``(U, V)`` of matrix leaf ``i`` at this step."""
    fresh = lr.resampled(noise.noise_key, i, p, self._v_shape(i, p))
    v = jnp.where(hyper["resample"], fresh, state.v[i])
    return lr.leaf_factor(words, i, p, self._u_shape(i, p)), v

  def direction_leaf(self, noise, state, hyper, words, i, leaf):
    if not lr.is_matrix(leaf):
      return words.noise(noise.sampler, i, leaf)
    return self._outer(i, *self._factors(noise, state, hyper, words, i, leaf))

  def estimate(self, noise, state, hyper, params, measured):
    dtype = measured.values.dtype
    lp, lm = m.probe_values(self, measured, dtype)
    c, finite = spsa.projections(hyper, lp[0], lm[0], dtype)
    c = numerics.computed_once(c)
    words = noise.words(0)
    g, new_v, new_m = [], [], []
    for i, p in enumerate(params):
      cf = c.astype(lr.factor_dtype(p))
      if self.with_momentum:
        beta = hyper["momentum"].astype(lr.factor_dtype(p))
        rest = hyper["momentum_rest"].astype(lr.factor_dtype(p))
      if lr.is_matrix(p):
        u, v = self._factors(noise, state, hyper, words, i, p)
        new_v.append(v)
        if not self.with_momentum:
          g.append(cf * self._outer(i, u, v))
          continue
        old_v = state.v[i]
        n = self._sides(i, p)[1]
        carried = state.momentum[i] @ (jnp.swapaxes(old_v, -1, -2) @ v) / n
        mom = jnp.where(hyper["resample"], carried, state.momentum[i])
        mom = jnp.where(hyper["first"], cf * u, beta * mom + rest * cf * u)
        mom = jnp.where(finite, mom, state.momentum[i])
        new_m.append(mom)
        g.append(jnp.where(finite, self._outer(i, mom, v), 0))
      else:
        new_v.append(None)
        z = words.noise(noise.sampler, i, p)
        if not self.with_momentum:
          g.append(cf * z)
          continue
        mom = jnp.where(hyper["first"], cf * z, beta * state.momentum[i] + rest * cf * z)
        mom = jnp.where(finite, mom, state.momentum[i])
        new_m.append(mom)
        g.append(jnp.where(finite, mom, 0).astype(z.dtype))
    new_state = LOZOState(v=tuple(new_v),
                          momentum=tuple(new_m) if self.with_momentum else ())
    stats = dict(loss=(lp[0] + lm[0]) / 2, skipped=1 - finite.astype(jnp.int32),
                 projected=c.astype(dtype))
    return g, new_state, stats


def scale_by_lozo(
    mu: float = 1e-3,
    *,
    rank: int = 2,
    resample_every: int = 50,
    momentum: float = 0.0,
    mu_resolution: float = 0.0,
    layout: str = "flax",
    sampler: sampling.Sampler | Callable[..., jax.Array] | None = None,
    seed: int | jax.Array = 0,
) -> optax.GradientTransformationExtraArgs:
  r"""LOZO's low-rank SPSA estimate (LOZO-M with ``momentum > 0``).

  Each matrix leaf is perturbed along ``Z = U V^T`` (``U [m, r]`` fresh every step, ``V
  [n, r]`` redrawn every ``resample_every`` steps), vectors along a full Gaussian ``z``;
  ``g = c Z`` with ``c = (l+ - l-) / (2 mu)``. With ``momentum = beta`` the estimate is
  ``M V^T`` for a momentum ``M = beta M + (1 - beta) c U`` kept in the ``[m, r]`` factor
  space (vectors: a leaf-sized momentum), carried over to a redrawn ``V`` as
  ``M V_old^T V / n``. Two forward passes a step; the perturbation is formed inside the
  passes, never stored at params size. ``m`` and ``n`` are the rows and columns of the
  reference's PyTorch weight ``[out, in]``: on a Flax kernel ``[in, out]`` the fresh ``U``
  lies along ``out`` (the last axis) and the lazy ``V`` along ``in`` (``layout``).

  Args:
    mu: perturbation scale (> 0); the reference code's ``1e-3``.
    rank: ``r`` (clipped to each matrix's smaller dimension); the reference code's 2.
    resample_every: steps between redraws of ``V`` (``nu``); the reference code's 50.
    momentum: LOZO-M's ``beta`` in [0, 1); 0 is LOZO. The reference scripts use 0.9.
      Whether it is 0 is fixed at ``init`` (it decides the state); its value may be
      injected or scheduled.
    mu_resolution: as in :func:`scale_by_zo`.
    layout: where a matrix leaf holds the reference's rows (PyTorch's ``out``): ``"flax"``
      (default) on the last axis of every matrix leaf but embedding tables (a leaf whose
      path ends in a key ``embedding``: ``[num_embeddings, features]``, PyTorch's layout);
      ``"torch"``: on axis -2 of every matrix leaf (weights kept as ``[out, in]``).
    sampler: noise of the vector leaves (default :data:`hizoo_jax.fast_gaussian`); the
      factors are Gaussian.
    seed: int seed or PRNG key; the state carries the key and advances it every step.

  References:
    Chen et al., "Enhancing Zeroth-Order Fine-Tuning for Language Models with Low-Rank
    Structures", ICLR 2025.
  """
  sampler = cfg.check_sampler(sampler, needs_gaussian=False)
  beta = cfg.concrete(momentum)
  method = LOZO(sampler=sampler, key_impl=cfg.key_impl_of(seed), num_probes=1,
                            rank=cfg.static_int("rank", rank), layout=layout,
                            with_momentum=None if beta is None else bool(beta != 0))
  return transform.zo_transform(method, dict(mu=mu, mu_resolution=mu_resolution, momentum=momentum,
                                   resample_every=resample_every), seed)


lozo = alias.make_alias(
    "lozo", scale_by_lozo,
    "LOZO / LOZO-M: low-rank ``U V^T`` perturbations per matrix (``momentum > 0``: LOZO-M).",
    "Chen et al., ICLR 2025.")
