"""Forward gradients: the exact directional derivative along random directions, by jvp.

One step with ``n`` directions (Baydin et al., "Gradients without Backpropagation", 2022;
the "Forward-Grad" baseline of ZO-Bench, Zhang et al., ICML 2024)::

    d_j = grad f(theta) . z_j          (one jax.jvp: the loss and its derivative along z_j)
    g   = 1/n * sum_j d_j z_j

An unbiased estimate of the gradient with the variance of SPSA at ``mu -> 0``, but no
finite difference: no perturbation scale to tune, no rounding of ``l+ - l-`` in bf16.
Its cost is a forward pass carrying tangents, roughly two forward passes of work, and it
is counted as two in the state's ``forward_passes``. Its memory is not a zeroth-order
method's: the tangent ``z_j`` enters the forward pass as an input, so one params-sized
tangent tree exists during the step (plus the forward's activations' tangents, the size
of its activations); the zeroth-order steps perturb in place and hold none.
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


@dataclasses.dataclass(frozen=True)
class ForwardGradient(m.Method):
  """The forward-gradient method object (``measure = "jvp"``)."""

  name = "forward_gradient"
  measure = "jvp"
  cost_per_measure = 2

  @property
  def passes(self):
    return m.tangents(self.num_probes)

  def in_effect(self, hyper, count, params, state):
    del hyper, count, state
    dtype = numerics.loss_dtype(params)
    return {"mu": jnp.ones((), dtype), "center": jnp.asarray(False)}

  def estimate(self, noise, state, hyper, params, measured):
    d = measured.values
    finite = jnp.isfinite(d)
    coefs = numerics.computed_once(jnp.where(finite, d, 0))
    n_valid = jnp.sum(finite.astype(jnp.int32), dtype=jnp.int32)
    g = m.mean_over_valid(self.combine(noise, state, hyper, params, coefs), n_valid)
    denom = jnp.maximum(n_valid, 1)
    return g, state, dict(loss=jnp.asarray(measured.center, d.dtype),
                          skipped=self.num_probes - n_valid,
                          projected=jnp.sum(coefs) / denom.astype(d.dtype))


def scale_by_forward_gradient(
    *,
    num_directions: int = 1,
    sampler: sampling.Sampler | Callable[..., jax.Array] | None = None,
    seed: int | jax.Array = 0,
) -> optax.GradientTransformationExtraArgs:
  r"""The forward-gradient estimate ``g = 1/n sum_j <grad f, z_j> z_j`` by ``jax.jvp``.

  The directional derivative is exact (no perturbation scale, no finite difference), so
  it behaves like SPSA at ``mu -> 0`` and does not lose ``l+ - l-`` to rounding in bf16.
  Each direction is one forward pass carrying tangents (counted as two forward passes);
  the tangent tree is params-sized and exists during the step (the zeroth-order methods
  perturb in place and hold none).

  The state's ``losses`` field holds the step's directional derivatives ``grad f . z_j``
  (not losses), and ``loss`` the loss ``f(theta)`` from the first ``jax.jvp``.

  Args:
    num_directions: directions ``n`` averaged per step.
    sampler: default :data:`hizoo_jax.fast_gaussian`; any sampler works.
    seed: int seed or PRNG key; the state carries the key and advances it every step.

  References:
    Baydin et al., "Gradients without Backpropagation", 2022; Zhang et al., "Revisiting
    Zeroth-Order Optimization for Memory-Efficient LLM Fine-Tuning: A Benchmark", ICML
    2024 (Forward-Grad).
  """
  sampler = cfg.check_sampler(sampler, needs_gaussian=False)
  method = ForwardGradient(sampler=sampler, key_impl=cfg.key_impl_of(seed),
                                     num_probes=cfg.probes(num_directions))
  return transform.zo_transform(method, {}, seed)


forward_gradient = alias.make_alias(
    "forward_gradient", scale_by_forward_gradient,
    "Forward-gradient descent: the exact directional derivative by ``jax.jvp``.",
    "Baydin et al., 2022; Zhang et al., ICML 2024 (ZO-Bench's Forward-Grad).")
