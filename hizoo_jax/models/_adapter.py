"""The one path of the framework adapters (Linen ``apply_zo``, NNX ``nnx_zo_step``).

Each adapter only translates its framework's state into ``(params, opt_state)`` and back;
the step itself is always :func:`hizoo_jax.make_train_step`'s engine, so every optimizer
composition the engine handles (``optax.masked``, ``multi_transform``, ``MultiSteps``,
``apply_if_finite``, ``inject_hyperparams``, ...) works the same in every adapter, with
the same lean memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optax


def engine_step(tx: optax.GradientTransformationExtraArgs, loss_fn: Callable[..., Any],
                params: Any, opt_state: Any, *batch: Any, **step_options: Any) -> tuple:
  """``make_train_step(tx, loss_fn, **step_options)(params, opt_state, *batch)``.

  Meant to be called inside the user's ``jit`` (``jax.jit``, ``nnx.jit``), where the step
  traces into the caller's program. Outside ``jit`` the engine compiles its step at every
  call: the step is built per call because adapters build ``loss_fn`` per call (a closure
  over the batch or the frozen model), and a cache keyed on it would keep those alive.
  """
  import hizoo_jax  # noqa: PLC0415 (hizoo_jax.models is imported by the package's users)

  return hizoo_jax.make_train_step(tx, loss_fn, **step_options)(params, opt_state, *batch)
