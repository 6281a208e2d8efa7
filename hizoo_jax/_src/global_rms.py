"""A global adaptive step size: one scalar second moment for the whole estimate.

Per-coordinate adaptivity (Adam's ``v`` per parameter) buys little for zeroth-order
estimates: every coordinate of ``g = c z`` shares one random scalar ``c``, so a
per-coordinate second moment mostly measures ``z^2``, noise that averages to 1, and costs
a params-sized state. What does vary is the scale of ``c`` over training. One scalar,
the running mean of ``mean(g^2)`` (for an SPSA estimate ``mean(g^2) = c^2 mean(z^2) ~
c^2``), recovers Adam-like step-size adaptation at SGD's memory (after the observation of
MEAZO, arXiv 2605.03869, that a global scalar matches per-coordinate adaptivity in
zeroth-order fine-tuning; its exact update rule and defaults were not available to us:
``decay`` and ``eps`` below are Adam's, stated as our choice).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from hizoo_jax._src import config as cfg


class GlobalRMSState(NamedTuple):
  """State of :func:`scale_by_global_rms`: the step count and the scalar second moment."""

  count: jax.Array
  nu: jax.Array


def scale_by_global_rms(decay: float = 0.999,
                        eps: float = 1e-8) -> optax.GradientTransformation:
  r"""Divides the updates by the running root mean square of their mean square.

  .. math::
    v_t = \beta v_{t-1} + (1 - \beta)\, \overline{g_t^2}, \qquad
    u_t = g_t / (\sqrt{v_t / (1 - \beta^t)} + \epsilon)

  with :math:`\overline{g^2}` the mean of ``g^2`` over every element of the update tree.
  Chain it after a zeroth-order estimate and before the learning rate:
  ``optax.chain(hz.scale_by_zo(), hz.scale_by_global_rms(), optax.scale(-lr))``. Its state
  is two scalars. A non-finite mean square leaves the state as it was and passes the
  update through unscaled (the ZO transform has already zeroed a step it skipped).

  Memory: the mean square is a reduction over the whole estimate before it is applied, so
  in :func:`hizoo_jax.make_train_step` the estimate is stored once (one params-worth in
  the params' dtype, measured 0.98 param bytes over a forward pass), as for any Optax
  transformation that reduces over the updates (``clip_by_global_norm``); the estimate
  alone is regenerated from keys and stores nothing.

  Args:
    decay: :math:`\beta`, in [0, 1).
    eps: added to the root mean square (> 0).
  """
  cfg.check_unit_interval("decay", decay)
  if cfg.concrete(decay) is not None and float(decay) >= 1:
    raise ValueError(f"decay must lie in [0, 1), got {decay!r}")
  cfg.check_positive("eps", eps)

  def init_fn(params):
    del params
    return GlobalRMSState(count=jnp.zeros([], jnp.int32), nu=jnp.zeros([], jnp.float32))

  def update_fn(updates, state, params=None):
    del params
    leaves = jax.tree.leaves(updates)
    size = sum(x.size for x in leaves)
    ms = sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves) / max(size, 1)
    ok = jnp.isfinite(ms)
    count = optax.safe_increment(state.count)
    nu = jnp.where(ok, decay * state.nu + (1 - decay) * ms, state.nu)
    count = jnp.where(ok, count, state.count)
    nu_hat = nu / (1 - jnp.asarray(decay, jnp.float32) ** jnp.maximum(count, 1))
    scale = jnp.where(ok & (count > 0), 1 / (jnp.sqrt(nu_hat) + eps), 1.0)
    updates = jax.tree.map(lambda g: (g * scale.astype(g.dtype)).astype(g.dtype), updates)
    return updates, GlobalRMSState(count=count, nu=nu)

  return optax.GradientTransformation(init_fn, update_fn)
