"""FZOO: one-sided Rademacher probes, the step normalised by the spread of the probe losses.

One step with ``N`` probes (Dang et al., "FZOO: Fast Zeroth-Order Optimizer for Fine-Tuning
Large Language Models towards Adam-Scale Speed", ICLR 2026)::

    l0    = f(theta)
    l_j   = f(theta + mu u_j),   u_j Rademacher (+-1),  j = 1..N
    sigma = std(l_1, ..., l_N)                            (population std, ddof 0)
    g     = 1 / (N sigma) * sum_j (l_j - l0) u_j

``N + 1`` forward passes a step. ``l_j - l0 ~ mu u_j . grad f`` and ``sigma ~ mu |grad f|``,
so ``g`` does not depend on ``mu`` and has the scale of a normalised gradient: the
learning rate is an actual step length, and FZOO's learning rates are much larger than
MeZO's (its reference scripts: 1e-5 to 5e-5 for OPT models, against MeZO's 1e-6 to 1e-7).

As in the reference code: ``sigma`` is over the perturbed losses only; there is no
division by ``mu``; the probes are one-sided. Unlike it: ``l0`` is measured before the
probes rather than after (the same batch and the same ``theta``, so the same value), and a
step whose probe losses have no spread (``sigma = 0``, which the reference divides by) or
has fewer than two finite probe losses is skipped (params unchanged, counted).

``normalize=False`` drops the division by ``sigma`` for the plain one-sided average
``g = 1 / (N mu) * sum_j (l_j - l0) u_j``: the ablation that separates FZOO's
normalisation from its batch of one-sided probes (MeZO's scale, so MeZO's learning rates).
It needs one finite probe loss rather than two.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from hizoo_jax._src import alias, numerics, sampling, transform
from hizoo_jax._src import config as cfg
from hizoo_jax._src import method as m
from hizoo_jax._src.methods import spsa


@dataclasses.dataclass(frozen=True)
class FZOO(m.Method):
  """FZOO's method object: one-sided probes ``D_j = u_j`` and a centre ``l0``."""

  name = "fzoo"
  sampler: sampling.Sampler = sampling.fast_rademacher
  num_probes: int = 8
  normalize: bool = True

  @property
  def passes(self):
    return m.one_sided(self.num_probes)

  def check(self, hyper):
    spsa.check_mu(hyper)
    if self.normalize and self.num_probes is not None and self.num_probes < 2:
      raise ValueError("num_directions must be >= 2 for FZOO (its step is normalised by "
                       f"the spread of the probe losses), got {self.num_probes}")
    cfg.check_nonnegative("mu_resolution", hyper.get("mu_resolution", 0.0))

  def in_effect(self, hyper, count, params, state):
    return {**spsa.mu_in_effect(hyper, params), "center": jnp.asarray(True)}

  def estimate(self, noise, state, hyper, params, measured):
    dtype = measured.values.dtype
    l0 = jnp.asarray(measured.center, dtype)
    values = measured.values
    finite = jnp.isfinite(values) & jnp.isfinite(l0) & hyper["mu_ok"]
    n = jnp.sum(finite.astype(jnp.int32), dtype=jnp.int32)
    nf = jnp.maximum(n, 1).astype(dtype)
    kept = jnp.where(finite, values, 0)
    mean = jnp.sum(kept) / nf
    sigma = jnp.sqrt(jnp.sum(jnp.where(finite, jnp.square(values - mean), 0)) / nf)
    if self.normalize:
      ok = (n >= 2) & (sigma > 0) & jnp.isfinite(sigma)
      scale = jnp.where(ok, sigma, 1)
    else:
      ok = n >= 1
      scale = hyper["mu"].astype(dtype)
    coefs = jnp.where(finite & ok, (values - l0) / (nf * scale), 0)
    coefs = numerics.computed_once(coefs)
    g = self.combine(noise, state, hyper, params, coefs)
    skipped = self.num_probes - jnp.where(ok, n, 0)
    projected = jnp.sum(jnp.where(finite, values - l0, 0)) / nf / hyper["mu"].astype(dtype)
    return g, state, dict(loss=l0, skipped=skipped, projected=projected)


def scale_by_fzoo(
    mu: float = 1e-3,
    *,
    num_directions: int = 8,
    normalize: bool = True,
    mu_resolution: float = 0.0,
    sampler: sampling.Sampler | Callable[..., jax.Array] | None = None,
    seed: int | jax.Array = 0,
) -> optax.GradientTransformationExtraArgs:
  r"""FZOO's normalised one-sided estimate.

  .. math::
    g = \frac{1}{N \sigma} \sum_{j=1}^N \big(f(\theta + \mu u_j) - f(\theta)\big) u_j,
    \qquad \sigma = \operatorname{std}_j f(\theta + \mu u_j)

  with Rademacher ``u_j``: ``N + 1`` forward passes a step. ``g`` has the scale of a
  normalised gradient (``mu`` cancels), so the learning rate is a step length.

  Args:
    mu: perturbation scale (> 0); defaults to the reference code's ``1e-3``.
    num_directions: probes ``N`` per step (>= 2); the reference code's default 8.
    normalize: divide by ``sigma`` (FZOO). ``False`` divides by ``mu`` instead, the plain
      one-sided average of ``N`` probes with MeZO's scale and learning rates: FZOO without
      its normalisation, to tell what the normalisation itself buys (``N >= 1``).
    mu_resolution: for 16-bit params, raise ``mu`` to at least ``mu_resolution *
      eps(dtype) * rms(theta)`` (see :func:`scale_by_hizoo`; off by default).
    sampler: default :data:`hizoo_jax.fast_rademacher` (the paper's noise, fused into the
      passes); any sampler works.
    seed: int seed or PRNG key; the state carries the key and advances it every step.

  References:
    Dang et al., "FZOO: Fast Zeroth-Order Optimizer for Fine-Tuning Large Language Models
    towards Adam-Scale Speed", ICLR 2026.
  """
  sampler = sampling.fast_rademacher if sampler is None else cfg.check_sampler(
      sampler, needs_gaussian=False)
  method = FZOO(sampler=sampler, key_impl=cfg.key_impl_of(seed),
                num_probes=cfg.probes(num_directions), normalize=bool(normalize))
  return transform.zo_transform(method, dict(mu=mu, mu_resolution=mu_resolution), seed)


fzoo = alias.make_alias(
    "fzoo", scale_by_fzoo,
    "FZOO: one-sided Rademacher probes, the step normalised by the spread of their losses "
    "(``N + 1`` forward passes, default ``N = 8``; learning rates far above MeZO's).",
    "Dang et al., ICLR 2026.")
