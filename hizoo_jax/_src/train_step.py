"""``make_train_step``: a jit-compiled, donated zeroth-order training step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import optax
import optax.tree_utils as otu


def make_train_step(
    tx: optax.GradientTransformationExtraArgs,
    loss_fn: Callable[..., jax.Array],
    *,
    donate: bool = True,
) -> Callable[..., tuple[Any, Any, jax.Array]]:
  """Builds ``step(params, opt_state, *batch) -> (params, opt_state, loss)``.

  ``loss_fn(params, *batch)`` returns the scalar loss of a batch. The step is jit-compiled
  with ``params`` and ``opt_state`` donated (their buffers are reused for the outputs, so
  do not touch the arguments after the call). The returned ``loss`` is the one the
  optimizer recorded for the step (``l0`` on HiZOO Hessian steps, else the mean of
  ``(l+ + l-) / 2``), measured at the params before the update.

  Args:
    tx: a zeroth-order transformation or a chain containing one (e.g. ``hz.hizoo(1e-3)``).
    loss_fn: ``loss_fn(params, *batch) -> scalar``.
    donate: donate ``params`` and ``opt_state`` to the step.
  """

  def step(params, opt_state, *batch):
    value_fn = lambda p: loss_fn(p, *batch)
    updates, opt_state = tx.update(None, opt_state, params, value_fn=value_fn)
    params = optax.apply_updates(params, updates)
    return params, opt_state, otu.tree_get(opt_state, "loss")

  return jax.jit(step, donate_argnums=(0, 1) if donate else ())
