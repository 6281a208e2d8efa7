"""The learning rate and weight decay of the aliases: checked when built, guarded when traced.

``theta <- theta - lr * (g + weight_decay * theta)`` with a NaN or infinite ``lr`` (or
weight decay) turns every param into NaN in one step, and a negative one climbs the loss.
Neither is ever what a user meant, and the params are what a user cannot get back. So:

* a value that is concrete when the optimizer is built (a Python or NumPy number, a
  concrete array, also the hyperparameters ``optax.inject_hyperparams`` passes at ``init``)
  must be a finite number ``>= 0``, else ``ValueError`` naming the argument;
* a value only known under ``jit`` (an injected hyperparameter, a schedule's value at this
  step) is checked by :func:`guarded_chain` in the compiled step: when one is not finite
  or is negative, the step emits zero updates and returns the chain's previous states
  unchanged (the estimator's key, Hessian, counts and logged loss included), and counts
  the step in ``skipped_bad_hyperparams``. The next step is then the same step again: a
  schedule of the alias that is bad at step ``t`` stays bad (its count does not advance)
  and every step is skipped and counted until it is fixed; a value injected with
  ``optax.inject_hyperparams`` (whose schedules count every call) takes effect as soon as
  it is good again.

A value that was concrete when built costs nothing in the step. A traced or scheduled one
costs a scalar test, a select per array of the updates and of the small state, and NaN
losses handed to the zeroth-order transform, which then drops the step's direction and
keeps its Hessian itself: the lean step keeps no params-sized temporary
(``tests/test_guard.py`` checks the compiled memory).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from hizoo_jax._src import transform
from hizoo_jax._src.method import ZOCall


class GuardState(NamedTuple):
  """The last element of the state of :func:`guarded_chain`.

  Attributes:
    schedule_count: updates applied so far (int32), the step at which the guarded
      schedules are evaluated; the schedules inside the chain count the same updates,
      since a skipped update leaves their counts as they were.
    skipped_bad_hyperparams: updates skipped so far because a guarded value was not
      finite or was negative (int32).
  """

  schedule_count: jax.Array
  skipped_bad_hyperparams: jax.Array


def _concrete(x: Any) -> np.ndarray | None:
  if isinstance(x, jax.core.Tracer):
    return None
  try:
    return np.asarray(x)
  except Exception:  # noqa: BLE001 - not array-like: refused below by the caller
    return None


def check_nonnegative(name: str, value: Any) -> None:
  """Refuses a concrete ``value`` that is not a finite real number ``>= 0``.

  Schedules and traced values pass; :func:`guarded_chain` checks them in the step.

  Raises:
    TypeError: not a scalar number (nor a schedule).
    ValueError: NaN, infinite or negative.
  """
  if callable(value):
    return
  v = _concrete(value)
  if v is None and not isinstance(value, jax.core.Tracer):
    raise TypeError(f"{name} must be a number or a schedule, got {value!r}")
  if v is None:
    return
  # jnp.issubdtype, not np's: a bfloat16 value (what optax.inject_hyperparams makes of a
  # hyperparameter of bfloat16 params) is a float to JAX but not to NumPy.
  if v.ndim != 0 or not (jnp.issubdtype(v.dtype, jnp.integer)
                         or jnp.issubdtype(v.dtype, jnp.floating)) or v.dtype == np.bool_:
    raise TypeError(f"{name} must be a scalar number or a schedule, got {value!r}")
  if not np.isfinite(v) or v < 0:
    raise ValueError(f"{name} must be a finite number >= 0 (or a schedule), got {value!r}")


def _checked_when_built(value: Any) -> bool:
  """Whether ``value`` was concrete when the transformation was built (and so checked)."""
  return not callable(value) and _concrete(value) is not None


def guarded_chain(
    transforms: Sequence[optax.GradientTransformation],
    hyperparams: Mapping[str, Any],
) -> optax.GradientTransformationExtraArgs:
  """``optax.chain(*transforms)`` that skips the updates whose hyperparameters are bad.

  Concrete values are checked here (``ValueError``); traced values and schedules are
  checked at every update: if any is NaN, infinite or negative, the update is all zeros and
  the chain's states are returned unchanged, the event counted in the
  :class:`GuardState` that follows them. The state is the chain's tuple of states plus
  that one element, so ``state[0]`` is still the first transform's. Extra arguments of
  ``update`` (``value_fn``, ...) are passed on as ``optax.chain`` does; a probing
  ``zo_call`` (``hz.make_train_step`` locating the zeroth-order transform) passes through
  unguarded, since it updates nothing.

  Args:
    transforms: the transformations to chain, among them the ones using the values.
    hyperparams: ``{name: value}``; a value is a number, an array (possibly traced, e.g.
      by ``optax.inject_hyperparams``) or a schedule of the number of updates applied.

  Returns:
    An :class:`optax.GradientTransformationExtraArgs`.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> from hizoo_jax._src.guard import guarded_chain
    >>> lr = lambda count: jnp.where(count == 1, jnp.nan, 0.1)  # bad at the second step
    >>> tx = guarded_chain([optax.sgd(lr)], {"learning_rate": lr})
    >>> params = {"w": jnp.ones(2)}
    >>> state = tx.init(params)
    >>> u, state = tx.update({"w": jnp.ones(2)}, state, params)
    >>> u, state = tx.update({"w": jnp.ones(2)}, state, params)
    >>> u["w"].tolist(), int(state[-1].skipped_bad_hyperparams)
    ([0.0, 0.0], 1)
  """
  for name, value in hyperparams.items():
    check_nonnegative(name, value)
  guarded = {k: v for k, v in hyperparams.items() if not _checked_when_built(v)}
  inner = optax.chain(*transforms)

  def init_fn(params):
    return tuple(inner.init(params)) + (
        GuardState(schedule_count=jnp.zeros([], jnp.int32),
                   skipped_bad_hyperparams=jnp.zeros([], jnp.int32)),)

  def update_fn(updates, state, params=None, **extra_args):
    _check_own_state(state)
    old, guard_state = tuple(state[:-1]), state[-1]
    count = guard_state.schedule_count
    probing = _is_probe(extra_args)
    if probing or not guarded:
      new_updates, new = inner.update(updates, old, params, **extra_args)
      if not probing:
        guard_state = guard_state._replace(schedule_count=optax.safe_increment(count))
      return new_updates, tuple(new) + (guard_state,)
    ok = _all_good(guarded, count)
    new_updates, new = inner.update(updates, old, params, **_losses_unless(ok, extra_args))
    new_updates = jax.tree.map(lambda u: jnp.where(ok, u, jnp.zeros_like(u)), new_updates)
    new = _keep_unless(ok, tuple(new), old)
    return new_updates, new + (GuardState(
        schedule_count=jnp.where(ok, optax.safe_increment(count), count),
        skipped_bad_hyperparams=guard_state.skipped_bad_hyperparams
        + (~ok).astype(jnp.int32)),)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _check_own_state(state: Any) -> None:
  """Refuses a state this optimizer's ``init`` did not build (e.g. an ``optax.adam``
  state), by name, before it fails as an attribute error inside the chain."""
  if isinstance(state, tuple) and state and isinstance(state[-1], GuardState):
    return
  got = state[-1] if isinstance(state, tuple) and state else state
  raise TypeError(
      "tx.update got an optimizer state that this optimizer's init did not build (it ends "
      f"in {type(got).__name__}, not the GuardState of a hizoo_jax alias): build it with "
      "state = tx.init(params) from this very optimizer; the state of another optimizer "
      "(optax.adam, ...) cannot be reused")


def _is_probe(extra_args: dict[str, Any]) -> bool:
  return ZOCall.of(extra_args.get("zo_call")).is_probe


def _nan_unless(ok: jax.Array, loss: Any) -> Any:
  loss = jnp.asarray(loss)
  if not jnp.issubdtype(loss.dtype, jnp.inexact):
    return loss  # the transform refuses it with its own message
  return jnp.where(ok, loss, jnp.asarray(jnp.nan, loss.dtype))


def _losses_unless(ok: jax.Array, extra_args: dict[str, Any]) -> dict[str, Any]:
  """The extra arguments with the losses a zeroth-order transform sees made NaN unless
  ``ok``: it then drops the step's direction, as for a non-finite loss, which leaves its
  Hessian as it was and emits a zero estimate. That select happens inside the transform,
  before the estimate reads ``H``; a select of ``H`` after the chain would make XLA keep
  both the old and the new ``H`` (measured: +0.98 param bytes in the lean HiZOO step)."""
  extra_args = dict(extra_args)
  call = ZOCall.of(extra_args.get("zo_call"))
  if call.losses is not None:  # the measured values; what the method prepared stays
    l0, values, *rest = call.losses
    extra_args["zo_call"] = call.replace(
        losses=(_nan_unless(ok, l0), jax.tree.map(lambda x: _nan_unless(ok, x), values),
                *rest))
  value_fn = extra_args.get("value_fn")
  if callable(value_fn):
    extra_args["value_fn"] = lambda p: _nan_unless(ok, value_fn(p))
  return extra_args


# The fields of a zeroth-order state that the transform itself leaves as they were when its
# losses are not finite (a dropped direction changes no Hessian): the state of the method,
# unless it is redrawn on schedule whatever the losses (the low-rank methods' subspaces,
# marked ``refreshed_on_schedule``; small), which is selected like the rest.
_KEPT_BY_THE_TRANSFORM = ("hessian", "method")


def _keep_unless(ok: jax.Array, new: Any, old: Any) -> Any:
  """``new`` where ``ok``, else ``old``; a zeroth-order state's Hessian (its method state)
  is taken as the transform returned it, which is ``old``'s when it saw NaN losses
  (:func:`_losses_unless`); ``tests/test_guard.py`` compares the whole state bitwise."""
  def pick(n, o):
    if transform.is_zo_state(n):
      scheduled = getattr(n.method, "refreshed_on_schedule", False)
      kept = {f: jax.tree.map(lambda a, b: jnp.where(ok, a, b), getattr(n, f), getattr(o, f))
              for f in n._fields
              if f not in _KEPT_BY_THE_TRANSFORM or (f == "method" and scheduled)}
      return n._replace(**kept)
    return jax.tree.map(lambda a, b: jnp.where(ok, a, b), n, o)

  return jax.tree.map(pick, new, old, is_leaf=transform.is_zo_state)


def _all_good(values: Mapping[str, Any], count: jax.Array) -> jax.Array:
  """True when every value (schedules evaluated at ``count``) is finite and ``>= 0``."""
  ok = jnp.asarray(True)
  for value in values.values():
    v = jnp.asarray(value(count) if callable(value) else value)
    ok = ok & jnp.all(jnp.isfinite(v) & (v >= 0))
  return ok

