"""MeZO / ZO-SGD: the two-sided SPSA estimate along Gaussian (or Rademacher) noise.

One step with ``n`` probes::

    l+-_j = f(theta +- mu z_j)
    g     = 1/n_valid * sum_j (l+_j - l-_j) / (2 mu) * z_j

Spall, 1992 (SPSA); Malladi et al., "Fine-Tuning Language Models with Just Forward
Passes", NeurIPS 2023 (MeZO).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from hizoo_jax._src import alias, numerics, sampling, transform
from hizoo_jax._src import config as cfg
from hizoo_jax._src import method as m
from hizoo_jax._src.alias import ScalarOrSchedule


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
  coefs = numerics.computed_once(coefs)
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


def scale_by_zo(
    mu: float = 1e-3,
    *,
    num_directions: int = 1,
    mu_resolution: float = 0.0,
    sampler: sampling.Sampler | Callable[..., jax.Array] | None = None,
    seed: int | jax.Array = 0,
) -> optax.GradientTransformationExtraArgs:
  r"""Zeroth-order (SPSA) gradient estimate, as used by MeZO.

  .. math::
    g = \frac{1}{n}\sum_{j=1}^n \frac{f(\theta + \mu z_j) - f(\theta - \mu z_j)}{2\mu} z_j,
    \qquad z_j \sim \mathcal{N}(0, I)

  The emitted updates are ``g`` (an estimate of the gradient), so chain it like a gradient:
  ``optax.chain(scale_by_zo(), optax.scale_by_adam(), optax.scale(-lr))`` is ZO-Adam.
  Call as ``tx.update(updates, state, params, value_fn=f)``; ``updates`` is ignored.

  Args:
    mu: perturbation scale (> 0).
    num_directions: directions ``n`` averaged per step (2n forward passes).
    mu_resolution: for 16-bit params, raise ``mu`` to at least ``mu_resolution * eps(dtype) *
      rms(theta)`` so that the perturbation survives rounding (see
      :func:`scale_by_hizoo`; off by default here: MeZO's estimate tolerates it).
    sampler: a :class:`hizoo_jax.Sampler` or a function ``sampler(key, shape, dtype)``;
      default :data:`hizoo_jax.fast_gaussian` (Gaussian moments through the fourth, fused
      into the passes that use it); :data:`hizoo_jax.gaussian` (exact normal, threefry) and
      :data:`hizoo_jax.rademacher` work too.
    seed: int seed or PRNG key; the state carries the key and advances it every step.

  Returns:
    An :class:`optax.GradientTransformationExtraArgs`.

  Example:
    >>> import jax.numpy as jnp, optax, hizoo_jax as hz
    >>> tx = optax.chain(hz.scale_by_zo(mu=1e-3), optax.sgd(0.1))
    >>> params = {"w": jnp.ones(3)}
    >>> state = tx.init(params)
    >>> loss = lambda p: jnp.sum(p["w"] ** 2)
    >>> updates, state = tx.update(None, state, params, value_fn=loss)
    >>> float(loss(optax.apply_updates(params, updates))) < 3.0
    True

  References:
    Spall, 1992 (SPSA); Malladi et al., "Fine-Tuning Language Models with Just Forward
    Passes", NeurIPS 2023 (MeZO).
  """
  sampler = cfg.check_sampler(sampler, needs_gaussian=False)
  n = cfg.probes(num_directions)
  method = SPSA(sampler=sampler, key_impl=cfg.key_impl_of(seed), num_probes=n)
  return transform.zo_transform(method, dict(mu=mu, mu_resolution=mu_resolution), seed)


@alias.shared_args_doc
def mezo(
    learning_rate: ScalarOrSchedule,
    *,
    weight_decay: float = 0.0,
    weight_decay_mask: Any = None,
    **options: Any,
) -> optax.GradientTransformationExtraArgs:
  """MeZO / ZO-SGD: ``theta <- theta - lr * (g_spsa + weight_decay * theta)``.

  Args:
    {shared_args}
    **options: ``mu``, ``num_directions``, ``sampler``, ``seed``: as in
      :func:`hizoo_jax.scale_by_zo`.

  Example:
    >>> import jax.numpy as jnp, hizoo_jax as hz
    >>> tx = hz.mezo(1e-2, mu=1e-3)
    >>> params = {"w": jnp.ones(4)}
    >>> step = hz.make_train_step(tx, lambda p, x: jnp.sum((p["w"] - x) ** 2))
    >>> params, state, loss = step(params, tx.init(params), jnp.zeros(4))
    >>> float(loss) > 0
    True

  References:
    Malladi et al., "Fine-Tuning Language Models with Just Forward Passes", NeurIPS 2023.
  """
  return alias.with_decay_and_lr(scale_by_zo(**options), learning_rate, weight_decay,
                                 weight_decay_mask)


_ZO_OPTIONS = tuple(
    p.replace(kind=alias.KEYWORD_ONLY) for p in inspect.signature(scale_by_zo).parameters.values())
mezo.__signature__ = alias.signature(_ZO_OPTIONS)  # type: ignore[attr-defined]
