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
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hizoo_jax._src import config as cfg
from hizoo_jax._src import method as m
from hizoo_jax._src.methods import lowrank as lr
from hizoo_jax._src.methods import spsa


class SubZeroState(NamedTuple):
  """SubZero's orthonormal factors per matrix leaf (None for vectors)."""

  u: tuple
  v: tuple


@dataclasses.dataclass(frozen=True)
class SubZero(m.Method):
  """SubZero's method object."""

  name = "subzero"
  rank: int = 8

  def check(self, hyper):
    spsa.check_mu(hyper)
    cfg.check_int("rank", self.rank, 1)
    cfg.check_int("resample_every", hyper["resample_every"], 1)

  def _shapes(self, p):
    shape, r = jnp.shape(p), lr.rank_of(p, self.rank)
    return shape[:-1] + (r,), shape[:-2] + (shape[-1], r), shape[:-2] + (r, r)

  def init(self, params, hyper):
    leaves = jax.tree.leaves(params)
    shapes = [self._shapes(p) if lr.is_matrix(p) else None for p in leaves]
    return SubZeroState(
        u=tuple(None if s is None else jnp.zeros(s[0], jnp.float32) for s in shapes),
        v=tuple(None if s is None else jnp.zeros(s[1], jnp.float32) for s in shapes))

  def in_effect(self, hyper, count, params, state):
    return {**spsa.mu_in_effect(hyper, params), "center": jnp.asarray(False),
            "resample": lr.every(hyper["resample_every"], count)}

  def _subspace(self, noise, state, hyper, i, p):
    su, sv, _ = self._shapes(p)
    u = lr.orthonormal(lr.resampled(noise.noise_key, i, su, salt=0))
    v = lr.orthonormal(lr.resampled(noise.noise_key, i, sv, salt=1))
    return (jnp.where(hyper["resample"], u, state.u[i]),
            jnp.where(hyper["resample"], v, state.v[i]))

  def _direction(self, noise, state, hyper, words, i, p):
    if not lr.is_matrix(p):
      return words.noise(noise.sampler, i, p)
    u, v = self._subspace(noise, state, hyper, i, p)
    z0 = lr.leaf_factor(words, i, self._shapes(p)[2])
    m_, n_ = jnp.shape(p)[-2:]
    scale = np.float32(np.sqrt(m_ * n_) / u.shape[-1])
    return lr.outer((u @ z0) * scale, v)

  def displacement(self, noise, state, hyper, j, measured, step, after=()):
    words = noise.words(j, after)
    out = []
    for i, p in enumerate(noise.leaves):
      d = self._direction(noise, state, hyper, words, i, p)
      out.append(step.astype(d.dtype) * d)
    return out

  def estimate(self, noise, state, hyper, params, measured):
    dtype = measured.values.dtype
    lp, lm = m.probe_values(self, measured, dtype)
    g = m.noise_zeros(params)
    n_valid = jnp.zeros((), jnp.int32)
    total = jnp.zeros((), dtype)
    for j in range(self.num_probes):
      c, finite = spsa.projections(hyper, lp[j], lm[j], dtype)
      total = total + c
      c = jax.lax.optimization_barrier(c)
      words = noise.words(j)
      g = [a + c.astype(a.dtype) * self._direction(noise, state, hyper, words, i, p)
           for i, (a, p) in enumerate(zip(g, params, strict=True))]
      n_valid = n_valid + finite.astype(jnp.int32)
    denom = jnp.maximum(n_valid, 1)
    g = [a / denom.astype(a.dtype) for a in g]
    subspaces = [self._subspace(noise, state, hyper, i, p) if lr.is_matrix(p) else (None, None)
                 for i, p in enumerate(params)]
    new_state = SubZeroState(u=tuple(s[0] for s in subspaces),
                             v=tuple(s[1] for s in subspaces))
    stats = dict(loss=jnp.mean((lp + lm) / 2), skipped=self.num_probes - n_valid,
                 projected=total / denom.astype(dtype))
    return g, new_state, stats
