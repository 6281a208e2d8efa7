"""LOZO and LOZO-M: two-sided SPSA along a low-rank perturbation ``U V^T`` per matrix.

One step (Chen et al., "Enhancing Zeroth-Order Fine-Tuning for Language Models with
Low-Rank Structures", ICLR 2025; the reference code optsuite/LOZO)::

    V     = fresh N(0, 1) [n, r] every nu-th step (stored between), else the stored V
    U     = fresh N(0, 1) [m, r] every step
    Z     = U V^T                 (matrices; vectors: a full Gaussian z)
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
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from hizoo_jax._src import method as m
from hizoo_jax._src.methods import lowrank as lr
from hizoo_jax._src.methods import spsa


class LOZOState(NamedTuple):
  """LOZO's state, one entry per params leaf.

  Attributes:
    v: the lazily resampled right factor ``V [..., n, r]`` of each matrix leaf (None for
      vectors).
    momentum: LOZO-M's momentum, ``[..., m, r]`` for matrices and leaf-shaped for vectors
      (an empty tuple without momentum).
  """

  v: tuple
  momentum: Any


@dataclasses.dataclass(frozen=True)
class LOZO(m.Method):
  """LOZO's method object (``momentum`` > 0: LOZO-M)."""

  name = "lozo"
  rank: int = 2
  momentum: float = 0.0

  @property
  def serial_products(self) -> bool:
    # Above the fused rank its products are matmuls, one leaf-sized buffer each.
    return self.rank > lr.FUSED_RANK

  def check(self, hyper):
    lr.check_options(self.rank, hyper)
    if not 0.0 <= self.momentum < 1.0:
      raise ValueError(f"momentum must lie in [0, 1), got {self.momentum!r}")

  def _v_shape(self, p):
    return jnp.shape(p)[:-2] + (jnp.shape(p)[-1], lr.rank_of(p, self.rank))

  def _u_shape(self, p):
    return jnp.shape(p)[:-1] + (lr.rank_of(p, self.rank),)

  def init(self, params, hyper):
    leaves = jax.tree.leaves(params)
    v = tuple(jnp.zeros(self._v_shape(p), lr.factor_dtype(p)) if lr.is_matrix(p) else None
              for p in leaves)
    if not self.momentum:
      return LOZOState(v=v, momentum=())
    mom = tuple(jnp.zeros(self._u_shape(p), lr.factor_dtype(p)) if lr.is_matrix(p)
                else jnp.zeros(jnp.shape(p), lr.factor_dtype(p)) for p in leaves)
    return LOZOState(v=v, momentum=mom)

  def in_effect(self, hyper, count, params, state):
    return {**spsa.mu_in_effect(hyper, params), "center": jnp.asarray(False),
            "resample": lr.every(hyper["resample_every"], count),
            "first": count == 0}

  def _factors(self, noise, state, hyper, words, i, p):
    """``(U, V)`` of matrix leaf ``i`` at this step."""
    fresh = lr.resampled(noise.noise_key, i, p, self._v_shape(p))
    v = jnp.where(hyper["resample"], fresh, state.v[i])
    return lr.leaf_factor(words, i, p, self._u_shape(p)), v

  def direction_leaf(self, noise, state, hyper, words, i, leaf):
    if not lr.is_matrix(leaf):
      return words.noise(noise.sampler, i, leaf)
    return lr.outer(*self._factors(noise, state, hyper, words, i, leaf))

  def estimate(self, noise, state, hyper, params, measured):
    dtype = measured.values.dtype
    lp, lm = m.probe_values(self, measured, dtype)
    c, finite = spsa.projections(hyper, lp[0], lm[0], dtype)
    c = jax.lax.optimization_barrier(c)
    beta = self.momentum
    words = noise.words(0)
    g, new_v, new_m = [], [], []
    for i, p in enumerate(params):
      cf = c.astype(lr.factor_dtype(p))
      if lr.is_matrix(p):
        u, v = self._factors(noise, state, hyper, words, i, p)
        new_v.append(v)
        if not self.momentum:
          g.append(cf * lr.outer(u, v))
          continue
        old_v = state.v[i]
        n = jnp.shape(p)[-1]
        carried = state.momentum[i] @ (jnp.swapaxes(old_v, -1, -2) @ v) / n
        mom = jnp.where(hyper["resample"], carried, state.momentum[i])
        mom = jnp.where(hyper["first"], cf * u, beta * mom + (1 - beta) * cf * u)
        mom = jnp.where(finite, mom, state.momentum[i])
        new_m.append(mom)
        g.append(jnp.where(finite, lr.outer(mom, v), 0))
      else:
        new_v.append(None)
        z = words.noise(noise.sampler, i, p)
        if not self.momentum:
          g.append(cf * z)
          continue
        mom = jnp.where(hyper["first"], cf * z, beta * state.momentum[i] + (1 - beta) * cf * z)
        mom = jnp.where(finite, mom, state.momentum[i])
        new_m.append(mom)
        g.append(jnp.where(finite, mom, 0).astype(z.dtype))
    new_state = LOZOState(v=tuple(new_v), momentum=tuple(new_m) if self.momentum else ())
    stats = dict(loss=(lp[0] + lm[0]) / 2, skipped=1 - finite.astype(jnp.int32),
                 projected=c.astype(dtype))
    return g, new_state, stats
