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

import jax
import jax.numpy as jnp

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
    from hizoo_jax._src import numerics  # noqa: PLC0415

    dtype = numerics.loss_dtype(params)
    return {"mu": jnp.ones((), dtype), "center": jnp.asarray(False)}

  def estimate(self, noise, state, hyper, params, measured):
    d = measured.values
    finite = jnp.isfinite(d)
    coefs = jax.lax.optimization_barrier(jnp.where(finite, d, 0))
    n_valid = jnp.sum(finite.astype(jnp.int32), dtype=jnp.int32)
    g = m.mean_over_valid(self.combine(noise, state, hyper, params, coefs), n_valid)
    denom = jnp.maximum(n_valid, 1)
    return g, state, dict(loss=jnp.asarray(measured.center, d.dtype),
                          skipped=self.num_probes - n_valid,
                          projected=jnp.sum(coefs) / denom.astype(d.dtype))
