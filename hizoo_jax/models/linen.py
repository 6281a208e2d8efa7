"""Flax Linen: zeroth-order steps on a ``flax.training.train_state.TrainState``.

``TrainState.apply_gradients(grads=...)`` calls ``tx.update(grads, opt_state, params)``: it
cannot pass the ``value_fn`` that a zeroth-order transform needs (the transform evaluates the
loss at perturbed params itself, there are no gradients to give). :func:`apply_zo` is the
zeroth-order counterpart: one step of :func:`hizoo_jax.make_train_step`'s engine on
``state.params`` and ``state.opt_state``, ``step + 1``. :class:`ZOTrainState` offers it as
a method.

Being the engine's step, it takes every optimizer ``make_train_step`` takes (``hz.hizoo``
and the other aliases, chains, ``optax.inject_hyperparams``, ``optax.masked``,
``optax.multi_transform``, ``optax.MultiSteps``, ``optax.apply_if_finite``) and keeps its
lean memory: inside the user's ``jax.jit`` it traces into that program (the loss function
is a static Python callable: close over it or mark it static).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flax.training import train_state

from hizoo_jax.models._adapter import engine_step

__all__ = ["ZOTrainState", "apply_zo"]


def apply_zo(state: train_state.TrainState, loss_fn: Callable[..., Any], *batch: Any,
             **step_options: Any) -> train_state.TrainState:
  """One zeroth-order step of a Linen ``TrainState``.

  Runs ``hz.make_train_step(state.tx, loss_fn, donate=False, **step_options)`` on
  ``(state.params, state.opt_state, *batch)`` and returns the new state with ``step + 1``,
  as ``apply_gradients`` does for gradients. Call it inside ``jax.jit``: outside, every
  call compiles the engine's step anew.

  Args:
    state: a ``flax.training.train_state.TrainState`` (or subclass) whose ``tx`` is a
      zeroth-order transform (``hz.mezo``, ``hz.hizoo``, ``hz.hizoo_l``, or a chain or
      Optax wrapper holding one).
    loss_fn: ``loss_fn(params, *batch) -> scalar``; for a Linen model typically
      ``lambda params, x, y: loss(model.apply({"params": params}, x), y)``.
    *batch: the arguments after ``params``, the same for every loss evaluation of the step.
    **step_options: options of :func:`hizoo_jax.make_train_step` (``restore``, ``lean``).

  Returns:
    The new ``TrainState``: updated ``params`` and ``opt_state``, ``step + 1``.

  Example:
    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> import hizoo_jax as hz
    >>> from flax.training import train_state
    >>> from hizoo_jax.models.linen import apply_zo
    >>> model = nn.Dense(1)
    >>> x, y = jnp.ones((8, 3)), jnp.zeros((8, 1))
    >>> params = model.init(jax.random.key(0), x)["params"]
    >>> state = train_state.TrainState.create(apply_fn=model.apply, params=params,
    ...                                       tx=hz.hizoo(1e-2, hessian_smoothing=1e-2))
    >>> def loss_fn(params, x, y):
    ...   return jnp.mean((model.apply({"params": params}, x) - y) ** 2)
    >>> step = jax.jit(lambda s, x, y: apply_zo(s, loss_fn, x, y))
    >>> for _ in range(3):
    ...   state = step(state, x, y)
    >>> int(state.step)
    3
  """
  # Nothing donated: the caller may still hold the old state (TrainState is functional).
  params, opt_state, _ = engine_step(state.tx, loss_fn, state.params, state.opt_state, *batch,
                                     donate=False, **step_options)
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state)


class ZOTrainState(train_state.TrainState):
  """A ``TrainState`` with :meth:`apply_zo`, the zeroth-order ``apply_gradients``.

  Example:
    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> import hizoo_jax as hz
    >>> from hizoo_jax.models.linen import ZOTrainState
    >>> model = nn.Dense(1)
    >>> x = jnp.ones((4, 2))
    >>> state = ZOTrainState.create(apply_fn=model.apply, tx=hz.mezo(1e-2),
    ...                             params=model.init(jax.random.key(0), x)["params"])
    >>> state = state.apply_zo(lambda p: jnp.sum(state.apply_fn({"params": p}, x) ** 2))
    >>> int(state.step)
    1
  """

  def apply_zo(self, loss_fn: Callable[..., Any], *batch: Any,
               **step_options: Any) -> ZOTrainState:
    """One zeroth-order step: :func:`apply_zo` ``(self, loss_fn, *batch, **step_options)``."""
    return apply_zo(self, loss_fn, *batch, **step_options)
