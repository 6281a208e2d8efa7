"""ZO-Muon: one-sided probes in a random subspace, the subspace estimate orthogonalised.

One step with ``q`` probes (arXiv 2602.17155, 2026; the reference code OPTML-Group/ZO-Muon)::

    P     = Haar-orthonormal [m, r] every nu-th step (QR of a Gaussian, sign-fixed), stored
    l0    = f(theta)
    l_i   = f(theta + mu P u_i),  u_i ~ N(0, 1) [r, n]      (vectors: a full Gaussian z_i)
    R     = 1/q sum_i (l_i - l0) / mu * u_i                  [r, n]
    g     = P NS5(R)                                        (vectors: s/q sum_i (l_i - l0)/mu z_i)

with ``m`` the rows of the reference's PyTorch weight ``[out, in]`` (its ``out``) and ``n``
its columns: on a Flax kernel ``[in, out]`` the leaf holds the transposes, ``u_i^T P^T``
and ``NS5(R)^T P^T`` (:func:`hizoo_jax._src.methods.lowrank.rows_last`, the ``layout``
option).

``NS5`` is Muon's quintic Newton-Schulz iteration (5 steps, coefficients (3.4445, -4.7750,
2.0315), on ``R / (|R|_F + 1e-7)``): an approximate orthogonalisation of the small
``r x n`` estimate, computed per matrix in float32 (it never touches a params-sized
array). ``q + 1`` forward passes a step.

Vectors (biases, norms): the reference code updates them with the one-sided estimate at a
hard-coded learning rate of 1e-7 while the matrices use the user's (1e-2 in its README):
here their estimate is multiplied by ``vector_scale`` (default ``1e-5``, that ratio), so the
learning rate applies to both (and the aliases decay selected vectors at ``vector_scale``
times the weight decay, as the reference's ``1e-7 * weight_decay``). Unlike the reference
code, one ``P`` serves every probe of a refresh step (the reference draws a new ``P`` for
each probe on those steps and updates with the last one).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from hizoo_jax._src import alias, numerics, sampling, transform
from hizoo_jax._src import config as cfg
from hizoo_jax._src import method as m
from hizoo_jax._src.methods import lowrank as lr
from hizoo_jax._src.methods import spsa

NS_COEFFS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5


def newton_schulz(r: jax.Array, steps: int = NS_STEPS, eps: float = 1e-7) -> jax.Array:
  """Muon's quintic Newton-Schulz orthogonalisation of ``r [..., a, b]`` (at least
  float32)."""
  a, b, c = NS_COEFFS
  x = r.astype(jnp.promote_types(r.dtype, jnp.float32))
  x = x / (jnp.linalg.norm(x, axis=(-2, -1), keepdims=True) + eps)
  wide = x.shape[-2] <= x.shape[-1]
  if not wide:
    x = jnp.swapaxes(x, -1, -2)
  for _ in range(steps):
    s = x @ jnp.swapaxes(x, -1, -2)
    x = a * x + (b * s + c * (s @ s)) @ x
  return x if wide else jnp.swapaxes(x, -1, -2)


class ZOMuonState(NamedTuple):
  """ZO-Muon's projector ``P [..., m, r]`` per matrix leaf (None for vectors)."""

  p: tuple
  refreshed_on_schedule = True  # also on a dropped step: the guard selects it


@dataclasses.dataclass(frozen=True)
class ZOMuon(m.Method):
  """ZO-Muon's method object (``vector_scale`` is a numeric option; ``rank`` None: traced,
  recovered from the state; ``rows_last``: per leaf, set by :meth:`for_params`)."""

  name = "zo_muon"
  # Its moves are products P Z R formed per leaf; a restore fused into the update's pass
  # (or into the next probe's move) holds one more leaf-sized product (measured with the
  # fused rank-64 product: 1.8 param bytes over a forward pass instead of 0.99), so each
  # move stays a pass of its own.
  restore_in_update = False
  prepares_state = True
  rank: int | None = 64
  num_probes: int = 4
  layout: str = "flax"
  rows_last: tuple | None = None

  @property
  def passes(self):
    return m.one_sided(self.num_probes)

  @property
  def serial_products(self) -> bool:
    # Above the fused rank its products P u_i and P NS5(R) are matmuls, one leaf each.
    return self.rank > lr.FUSED_RANK

  def check(self, hyper):
    lr.check_options(self.rank, hyper, self.layout)
    cfg.check_nonnegative("vector_scale", hyper["vector_scale"])

  def for_params(self, params):
    return dataclasses.replace(self, rows_last=lr.rows_last(params, self.layout))

  def resolve(self, state):
    if self.rank is not None:
      return self
    return dataclasses.replace(self, rank=lr.rank_in_state(state.p))

  def _shapes(self, i, p):
    """``P [..., rows, r]`` and ``u_i^T [..., columns, r]`` in the reference's sense."""
    shape, r = jnp.shape(p), lr.rank_of(p, self.rank)
    rows, cols = (shape[-1], shape[-2]) if self.rows_last[i] else shape[-2:]
    return shape[:-2] + (rows, r), shape[:-2] + (cols, r)

  def _outer(self, i, rows, cols):
    return lr.leaf_outer(self.rows_last[i], rows, cols)

  def init(self, params, hyper):
    lr.check_concrete_rank(self.rank)
    return ZOMuonState(p=tuple(jnp.zeros(self._shapes(i, x)[0], lr.factor_dtype(x))
                               if lr.is_matrix(x) else None
                               for i, x in enumerate(jax.tree.leaves(params))))

  def in_effect(self, hyper, count, params, state):
    scale = cfg.concrete(hyper["vector_scale"])
    dtype = numerics.loss_dtype(params)
    return {**spsa.mu_in_effect(hyper, params), "center": jnp.asarray(True),
            "resample": lr.every(hyper["resample_every"], count),
            "vector_scale": jnp.asarray(hyper["vector_scale"] if scale is None
                                        else float(scale), dtype)}

  def prepare(self, noise, state, hyper):
    """The state with every matrix leaf's ``P`` of this step: redrawn on the steps that
    refresh it, before the passes that read it."""
    return ZOMuonState(p=lr.refreshed_subspaces(
        noise, hyper["resample"], state.p,
        lambda key, i, x: lr.orthonormal(
            lr.gaussian(key, self._shapes(i, x)[0], lr.factor_dtype(x)), sign_fix=True))), None

  def direction_leaf(self, noise, state, hyper, words, i, leaf):
    if not lr.is_matrix(leaf):
      return words.noise(noise.sampler, i, leaf)
    return self._outer(i, state.p[i], lr.leaf_factor(words, i, leaf, self._shapes(i, leaf)[1]))

  def estimate(self, noise, state, hyper, params, measured):
    return self.estimate_some(noise, state, hyper, params, measured, None)

  def estimate_some(self, noise, state, hyper, params, measured, only):
    dtype = measured.values.dtype
    l0 = jnp.asarray(measured.center, dtype)
    mu = hyper["mu"].astype(dtype)
    finite = jnp.isfinite(measured.values) & jnp.isfinite(l0) & hyper["mu_ok"]
    n = jnp.sum(finite.astype(jnp.int32), dtype=jnp.int32)
    coefs = jnp.where(finite, (measured.values - l0) / mu, 0) / jnp.maximum(n, 1)
    coefs = numerics.computed_once(coefs)
    g = []
    for i, x in enumerate(params):
      if only is not None and i not in only:  # the state stays complete; the estimate not
        g.append(m.noise_zeros([x])[0])
        continue
      if lr.is_matrix(x):
        proj = state.p[i]
        dt = lr.factor_dtype(x)
        r_t = sum(coefs[j].astype(dt)
                  * lr.leaf_factor(noise.words(j), i, x, self._shapes(i, x)[1])
                  for j in range(self.num_probes))  # R^T [..., columns, r]
        ortho = jnp.swapaxes(newton_schulz(jnp.swapaxes(r_t, -1, -2)), -1, -2)
        g.append(jnp.where(n > 0, self._outer(i, proj, ortho), 0))
      else:
        acc = m.noise_zeros([x])[0]
        scale = hyper["vector_scale"].astype(coefs.dtype)
        for j in range(self.num_probes):
          acc = acc + (scale * coefs[j]).astype(acc.dtype) * noise.words(j).noise(
              noise.sampler, i, x)
        g.append(acc)
    return g, state, dict(loss=l0, skipped=self.num_probes - n,
                          projected=jnp.sum(coefs).astype(dtype))


def scale_by_zo_muon(
    mu: float = 1e-3,
    *,
    rank: int = 64,
    num_directions: int = 4,
    resample_every: int = 100,
    vector_scale: float = 1e-5,
    mu_resolution: float = 0.0,
    layout: str = "flax",
    sampler: sampling.Sampler | Callable[..., jax.Array] | None = None,
    seed: int | jax.Array = 0,
) -> optax.GradientTransformationExtraArgs:
  r"""ZO-Muon's orthogonalised subspace estimate.

  Per matrix leaf, with a Haar-orthonormal ``P [m, r]`` (redrawn every ``resample_every``
  steps) and ``q`` one-sided probes ``l_i = f(theta + mu P u_i)``, ``u_i [r, n]``:
  ``g = P NS5(R)``, ``R = 1/q sum_i (l_i - l0) / mu u_i``, with Muon's Newton-Schulz
  orthogonalisation ``NS5`` of the small ``r x n`` estimate. Vectors get ``vector_scale``
  times the one-sided estimate. ``q + 1`` forward passes a step. ``m`` and ``n`` are the
  rows and columns of the reference's PyTorch weight ``[out, in]``: on a Flax kernel ``[in,
  out]`` the subspace ``P`` lies along ``out`` (the last axis; ``layout``).

  Args:
    mu: perturbation scale (> 0); the reference code's ``1e-3``.
    rank: ``r`` (clipped to each matrix's smaller dimension); the reference README's 64.
    num_directions: probes ``q``; the reference's 4.
    resample_every: steps between redraws of ``P``; the reference README's 100.
    vector_scale: the vectors' estimate relative to the matrices' (the reference's
      vector learning rate 1e-7 over its matrix learning rate 1e-2).
    mu_resolution: as in :func:`scale_by_zo`.
    layout: where a matrix leaf holds the reference's rows, as in :func:`scale_by_lozo`.
    sampler: noise of the vector leaves (default :data:`hizoo_jax.fast_gaussian`).
    seed: int seed or PRNG key; the state carries the key and advances it every step.

  References:
    ZO-Muon, arXiv 2602.17155, 2026; Jordan et al., Muon (2024), for Newton-Schulz.
  """
  sampler = cfg.check_sampler(sampler, needs_gaussian=False)
  method = ZOMuon(sampler=sampler, key_impl=cfg.key_impl_of(seed),
                                 num_probes=cfg.probes(num_directions),
                                 rank=cfg.static_int("rank", rank), layout=layout)
  return transform.zo_transform(method, dict(mu=mu, mu_resolution=mu_resolution,
                                   resample_every=resample_every, vector_scale=vector_scale),
                      seed)


zo_muon = alias.make_alias(
    "zo_muon", scale_by_zo_muon,
    "ZO-Muon: subspace probes and a Newton-Schulz-orthogonalised step per matrix (the "
    "learning rate is a step length: 1e-2 in the reference README).",
    "arXiv 2602.17155, 2026.",
    extra="""

  Vectors step at ``vector_scale`` times the learning rate, and so does their weight decay
  when ``weight_decay_mask`` selects them: ``lr * vector_scale * weight_decay * theta``
  (the reference trainer's ``1e-7 * weight_decay`` at its ``lr = 1e-2``). The default
  mask decays no vector, as the reference does on OPT (whose vectors are all biases and
  layer norms).""",
    scaled_vectors=True)
