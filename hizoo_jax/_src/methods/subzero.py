"""SubZero: two-sided SPSA in a random orthonormal subspace of each matrix.

One step (Yu et al., "Zeroth-Order Fine-Tuning of LLMs in Random Subspaces", ICCV 2025;
the reference code zimingyy/SubZero)::

    U, V  = Q of QR(N(0, 1) [m, r]), Q of QR(N(0, 1) [n, r])   every T-th step, stored
    Z     = sqrt(m n) / r * U Z0 V^T,  Z0 ~ N(0, 1) [r, r] every step
                                       (vectors: a full Gaussian z)
    c     = (f(theta + mu Z) - f(theta - mu Z)) / (2 mu)
    g     = c Z

``sqrt(m n) / r`` makes ``E |Z|_F^2 = m n``, the energy of a full Gaussian perturbation
of the same matrix. The reference runs this estimate through SGD (momentum optional):
here it is an Optax transformation, so ``optax.sgd(lr, momentum=...)`` or anything else
can follow it. The reference's ``--weight_decay`` is silently ignored (its optimizer is
built without it); ``hz.subzero(..., weight_decay=...)`` applies it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from hizoo_jax._src import alias, sampling, transform
from hizoo_jax._src import config as cfg
from hizoo_jax._src.methods import lowrank as lr
from hizoo_jax._src.methods import spsa


class SubZeroState(NamedTuple):
  """SubZero's orthonormal factors per matrix leaf (None for vectors)."""

  u: tuple
  v: tuple
  refreshed_on_schedule = True  # also on a dropped step: the guard selects it


@dataclasses.dataclass(frozen=True)
class SubZero(spsa.SPSA):
  """SubZero's method object."""

  name = "subzero"
  # Its moves are products U Z V^T formed per leaf; fused into the update's pass the
  # restore holds one more (0.23 param bytes over a forward pass instead of 0.16, measured
  # on four 256 x 256 matrices at rank 8), so it stays a pass of its own.
  restore_in_update = False
  rank: int | None = 8  # None: traced (optax.inject_hyperparams), recovered from the state

  @property
  def serial_products(self) -> bool:
    # Above the fused rank its products are matmuls, one leaf-sized buffer each.
    return self.rank > lr.FUSED_RANK

  def check(self, hyper):
    lr.check_options(self.rank, hyper)

  def resolve(self, state):
    if self.rank is not None:
      return self
    return dataclasses.replace(self, rank=lr.rank_in_state(state.u))

  def _shapes(self, p):
    shape, r = jnp.shape(p), lr.rank_of(p, self.rank)
    return shape[:-1] + (r,), shape[:-2] + (shape[-1], r), shape[:-2] + (r, r)

  def init(self, params, hyper):
    if self.rank is None:
      raise TypeError("rank must be a concrete int at init (it shapes the state); under "
                      "optax.inject_hyperparams pass it as a number, not a traced value")
    leaves = jax.tree.leaves(params)
    shapes = [self._shapes(p) if lr.is_matrix(p) else None for p in leaves]
    return SubZeroState(
        u=tuple(None if s is None else jnp.zeros(s[0], lr.factor_dtype(p))
                for s, p in zip(shapes, leaves, strict=True)),
        v=tuple(None if s is None else jnp.zeros(s[1], lr.factor_dtype(p))
                for s, p in zip(shapes, leaves, strict=True)))

  def in_effect(self, hyper, count, params, state):
    return {**super().in_effect(hyper, count, params, state),
            "resample": lr.every(hyper["resample_every"], count)}

  def _subspace(self, noise, state, hyper, i, p):
    # Drawn where each pass reads it, unlike ZO-Muon's (Method.prepare): prepared once a
    # step, SubZero's first call on MiniLM-L6 took 2.2x a jitted Adam step's instead of
    # 6.2x, but its step ran 0.31 s instead of 0.25 (cause not isolated).
    su, sv, _ = self._shapes(p)
    return lr.refreshed(
        hyper["resample"],
        lambda: (lr.orthonormal(lr.resampled(noise.noise_key, i, p, su, salt=0)),
                 lr.orthonormal(lr.resampled(noise.noise_key, i, p, sv, salt=1))),
        (state.u[i], state.v[i]))

  def direction_leaf(self, noise, state, hyper, words, i, leaf):
    if not lr.is_matrix(leaf):
      return words.noise(noise.sampler, i, leaf)
    u, v = self._subspace(noise, state, hyper, i, leaf)
    z0 = lr.leaf_factor(words, i, leaf, self._shapes(leaf)[2])
    m_, n_ = jnp.shape(leaf)[-2:]
    scale = np.sqrt(m_ * n_) / u.shape[-1]
    return lr.outer((u @ z0) * jnp.asarray(scale, u.dtype), v)

  def estimate(self, noise, state, hyper, params, measured):
    g, _, stats = super().estimate(noise, state, hyper, params, measured)
    subspaces = [self._subspace(noise, state, hyper, i, p) if lr.is_matrix(p) else (None, None)
                 for i, p in enumerate(params)]
    new_state = SubZeroState(u=tuple(s[0] for s in subspaces),
                             v=tuple(s[1] for s in subspaces))
    return g, new_state, stats


def scale_by_subzero(
    mu: float = 1e-3,
    *,
    rank: int = 8,
    resample_every: int = 2000,
    num_directions: int = 1,
    mu_resolution: float = 0.0,
    sampler: sampling.Sampler | Callable[..., jax.Array] | None = None,
    seed: int | jax.Array = 0,
) -> optax.GradientTransformationExtraArgs:
  r"""SubZero's SPSA estimate in random orthonormal subspaces.

  Each matrix leaf is perturbed along ``Z = sqrt(m n) / r * U Z0 V^T`` with orthonormal
  ``U [m, r]``, ``V [n, r]`` (QR of Gaussians, redrawn every ``resample_every`` steps) and
  a fresh ``Z0 [r, r]`` every step; vectors along a full Gaussian ``z``. ``g = c Z``, two
  forward passes a probe.

  Args:
    mu: perturbation scale (> 0); the reference code's ``1e-3``.
    rank: ``r`` (clipped to each matrix's smaller dimension); the reference code's 8.
    resample_every: steps between redraws of ``U`` and ``V``; the reference code's 2000.
    num_directions: probes averaged per step.
    mu_resolution: as in :func:`scale_by_zo`.
    sampler: noise of the vector leaves (default :data:`hizoo_jax.fast_gaussian`).
    seed: int seed or PRNG key; the state carries the key and advances it every step.

  References:
    Yu et al., "Zeroth-Order Fine-Tuning of LLMs in Random Subspaces", ICCV 2025.
  """
  sampler = cfg.check_sampler(sampler, needs_gaussian=False)
  method = SubZero(sampler=sampler, key_impl=cfg.key_impl_of(seed),
                                  num_probes=cfg.probes(num_directions),
                                  rank=cfg.static_int("rank", rank))
  return transform.zo_transform(method, dict(mu=mu, mu_resolution=mu_resolution,
                                   resample_every=resample_every), seed)


subzero = alias.make_alias(
    "subzero", scale_by_subzero,
    "SubZero: SPSA in random orthonormal subspaces of each matrix.",
    "Yu et al., ICCV 2025.")
