"""MeZO / ZO-SGD: the two-sided SPSA estimate along Gaussian (or Rademacher) noise.

One step with ``n`` probes::

    l+-_j = f(theta +- mu z_j)
    g     = 1/n_valid * sum_j (l+_j - l-_j) / (2 mu) * z_j

Spall, 1992 (SPSA); Malladi et al., "Fine-Tuning Language Models with Just Forward
Passes", NeurIPS 2023 (MeZO).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from hizoo_jax._src import config as cfg
from hizoo_jax._src import method as m
from hizoo_jax._src import numerics


def mu_in_effect(hyper: dict[str, Any], params: Any) -> dict[str, jax.Array]:
  """``mu`` as applied (raised for 16-bit params, 0 when not finite and > 0) and ``mu_ok``."""
  dtype = numerics.loss_dtype(params)
  mu = numerics.effective_mu(jnp.asarray(hyper["mu"], dtype), params,
                             hyper.get("mu_resolution", 0.0))
  mu, ok = numerics.sanitize_mu(mu)
  return {"mu": mu.astype(dtype), "mu_ok": ok}


def check_mu(hyper: dict[str, Any]) -> None:
  cfg.check_positive("mu", hyper["mu"])
  cfg.check_nonnegative("mu_resolution", hyper.get("mu_resolution", 0.0))


def projections(hyper, lp, lm, dtype, valid=True):
  """``(proj, finite)`` of each probe: ``(l+ - l-) / (2 mu)``, 0 where a value is not finite."""
  mu = hyper["mu"].astype(dtype)
  finite = jnp.isfinite(lp) & jnp.isfinite(lm) & hyper["mu_ok"] & valid
  return jnp.where(finite, (lp - lm) / (2 * mu), 0), finite


def two_sided_coefs(method: m.Method, hyper, measured: m.Measured):
  """``(coefs, n_valid, projected)`` of a two-sided method: each probe's ``(l+ - l-) /
  (2 mu)`` (0 where a value is not finite), how many probes were valid, their mean."""
  dtype = measured.values.dtype
  lp, lm = m.probe_values(method, measured, dtype)
  coefs, finite = projections(hyper, lp, lm, dtype)
  n_valid = jnp.sum(finite.astype(jnp.int32), dtype=jnp.int32)
  # Materialised once: otherwise XLA copies this scalar logic into every leaf's fused
  # pass, which multiplies the compile time of models with many tensors.
  coefs = jax.lax.optimization_barrier(coefs)
  return coefs, n_valid, jnp.sum(coefs) / jnp.maximum(n_valid, 1).astype(dtype)


@dataclasses.dataclass(frozen=True)
class SPSA(m.Method):
  """MeZO: ``D_j = z_j``, the two-sided difference along it. Methods that only change the
  direction (Sparse MeZO's mask, SubZero's subspace) derive from it."""

  name = "mezo"

  def check(self, hyper):
    check_mu(hyper)

  def in_effect(self, hyper, count, params, state):
    return {**mu_in_effect(hyper, params), "center": jnp.asarray(False)}

  def estimate(self, noise, state, hyper, params, measured):
    lp, lm = m.probe_values(self, measured, measured.values.dtype)
    coefs, n_valid, projected = two_sided_coefs(self, hyper, measured)
    g = m.mean_over_valid(self.combine(noise, state, hyper, params, coefs), n_valid)
    stats = dict(loss=jnp.mean((lp + lm) / 2), skipped=self.num_probes - n_valid,
                 projected=projected)
    return g, state, stats
