"""Gradient accumulation for zeroth-order steps: one step measured on several micro-batches.

A first-order run accumulates gradients over ``k`` micro-batches and takes one step with
their mean: the step the ``k`` micro-batches together would give (for a loss that is a mean
over examples, with micro-batches of one size). The zeroth-order counterpart keeps the
step's random direction fixed for ``k`` micro-batches, measures its losses (``l+``, ``l-``,
``l0``, every probe's) on each, and makes the one step from their means, since the loss of
the ``k`` micro-batches together is the mean of theirs. The estimate is linear in the
losses where that matters (HiZOO's curvature takes the absolute value of the averaged
second difference, as it would on the larger batch), so the step is the larger batch's.

``optax.MultiSteps`` around a zeroth-order transform cannot do this: it holds the whole
inner state until it emits, so the measurements of the micro-steps before are discarded.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from hizoo_jax._src import method, transform


class AccumulateState(NamedTuple):
  """State of :func:`accumulate`.

  Attributes:
    mini_step: micro-batches measured since the last step (int32, ``0 .. k - 1``).
    center: the sum of their unperturbed losses ``l0`` (zero where the method does not
      measure it).
    losses: the sum of their measuring passes' values, in the order of ``ZOState.losses``.
    inner: the wrapped optimizer's state; its zeroth-order state (the direction's key
      included) advances once every ``k`` micro-batches.
  """

  mini_step: jax.Array
  center: jax.Array
  losses: jax.Array
  inner: Any


def _the_zo_state(state: Any) -> transform.ZOState:
  found = transform.zo_states(state)
  if len(found) != 1:
    raise ValueError(f"accumulate needs an optimizer with exactly one zeroth-order transform; "
                     f"its state holds {len(found)}")
  return found[0]


def _with_zo_state(state: Any, new: transform.ZOState) -> Any:
  return jax.tree.map(lambda s: new if transform.is_zo_state(s) else s, state,
                      is_leaf=transform.is_zo_state)


def accumulate(tx: optax.GradientTransformation, every_k: int
               ) -> optax.GradientTransformationExtraArgs:
  """Zeroth-order gradient accumulation: one step of ``tx`` on ``every_k`` micro-batches.

  Each call measures the step's losses on one micro-batch along the step's direction (the
  same direction for all ``every_k`` calls); the ``every_k``-th call makes the step of
  ``tx`` from the means of the measurements, which is the step ``tx`` would make on the
  micro-batches together (for a loss that is a mean over examples and micro-batches of one
  size). The calls before it return zero updates and leave the rest of ``tx``'s state
  alone. Every micro-batch's forward passes are counted (:func:`hizoo_jax.forward_passes`).
  Use it as ``optax.MultiSteps`` would be used, with :func:`hizoo_jax.make_train_step` or
  ``tx.update(..., value_fn=...)``; a ``key=`` given to ``update`` must be the same for the
  micro-batches of a step.

  A direction measured as non-finite on any micro-batch is dropped for the whole step (its
  mean is not finite), as the method drops it on one batch. The calls cost what the step
  of ``tx`` costs, in the engine's memory too (MeZO, FZOO, HiZOO-L: measured the same),
  except for params-sized state that the step rewrites and then reads in its update
  (HiZOO's dense ``H``, a momentum or Adam after the estimate): while the held state may
  be kept, the new one gets a buffer of its own, one params-sized copy a leaf at most
  (measured: HiZOO and momentum 1.0 of the params' bytes, Adam 1.5).

  Args:
    tx: an optimizer with exactly one zeroth-order transform of the library (any method,
      alias, preset, chain or wrapper around one).
    every_k: micro-batches per step (an int >= 1).

  Returns:
    An Optax ``GradientTransformationExtraArgs``.
  """
  if isinstance(every_k, bool) or not isinstance(every_k, int) or every_k < 1:
    raise ValueError(f"every_k must be an int >= 1, got {every_k!r}")
  k = every_k

  def init_fn(params):
    inner = tx.init(params)
    zo = _the_zo_state(inner)
    return AccumulateState(mini_step=jnp.zeros([], jnp.int32),
                           center=jnp.zeros([], zo.losses.dtype),
                           losses=jnp.zeros_like(zo.losses), inner=inner)

  def update_fn(updates, state, params=None, **extra):
    if not isinstance(state, AccumulateState):
      raise TypeError(f"expected the AccumulateState of accumulate's init, got {type(state)}")
    call = method.ZOCall.of(extra.get("zo_call"))
    if call.is_probe:  # the engine looking for the ZO transform
      u, inner = tx.update(updates, state.inner, params, **extra)
      return u, state._replace(inner=inner)
    old = _the_zo_state(state.inner)
    # This micro-batch's step as tx would take it alone: its measurements (from the
    # engine's passes, or measured here with value_fn) and its forward passes. Only these
    # are read from it; XLA drops its estimate.
    _, alone = tx.update(updates, state.inner, params, **extra)
    now = _the_zo_state(alone)
    center_measured = now.hyper["center"].astype(bool)
    l0 = jnp.where(center_measured, now.loss, 0).astype(state.center.dtype)
    passes = now.forward_passes - old.forward_passes
    total_center = state.center + l0
    total_losses = state.losses + now.losses.astype(state.losses.dtype)
    # The step from the means, computed on every call and kept on the k-th: a select, not a
    # lax.cond, so that the engine's in-place passes still fuse the update into the restore
    # (a cond's updates are a params-sized buffer of their own). One cost remains for a
    # step whose update reads state it rewrites (HiZOO's dense H, a momentum or Adam after
    # the estimate): the new state is read by the params' pass and the held one may be
    # kept, so the new state gets a buffer of its own (measured in param bytes of
    # temporaries: HiZOO and momentum 1.0, Adam 1.5, MeZO and FZOO none; a lax.cond for
    # the state alone, the update still a select, measured no better: Adam 2.0).
    rest = {n: v for n, v in extra.items() if n not in ("value_fn", "zo_call")}
    prepared = tuple(call.losses[2:]) if call.losses is not None else ()
    means = (total_center / k, total_losses / k) + prepared
    u, stepped = tx.update(updates, state.inner, params,
                           zo_call=call.replace(losses=means), **rest)
    if k == 1:
      return u, state._replace(inner=stepped)
    emit = state.mini_step >= k - 1
    # held: the state as it was, but for this micro-batch's passes (tx counts the k-th's)
    # and its losses (what a training loop logs for the micro-step).
    held = _with_zo_state(state.inner, old._replace(
        forward_passes=transform.add_saturating(old.forward_passes, passes),
        loss=now.loss, losses=now.losses, projected=now.projected))
    u = jax.tree.map(lambda a: jnp.where(emit, a, jnp.zeros_like(a)), u)
    inner = jax.tree.map(lambda a, b: jnp.where(emit, a, b), stepped, held)
    keep = lambda total: jnp.where(emit, jnp.zeros_like(total), total)  # noqa: E731
    return u, AccumulateState(jnp.where(emit, 0, state.mini_step + 1).astype(jnp.int32),
                              keep(total_center), keep(total_losses), inner)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
