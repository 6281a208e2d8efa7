"""The paper's 2-D test functions (Zhao et al., ICLR 2025, Appendix C) and a runner.

* ``f_a(x, y) = 8 (x - 1)^2 (1.3 x^2 + 2 x + 1) + 0.5 (y - 4)^2``  (from Sophia; min 0 at (1, 4))
* ``f_b(x, y) = |x| + |y|``                                        (non-smooth; min 0 at 0)
* ``f_c(x, y) = 10000 x^2 + y^2``                                  (condition number 1e4)

The paper does not give its starting points; ours are in :data:`START`. Params are a
single ``(2,)`` vector ``[x, y]``; :func:`optimize` runs any Optax transformation on them
under one ``jax.lax.scan`` and returns the trajectory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax


def f_a(p: jax.Array) -> jax.Array:
  x, y = p[..., 0], p[..., 1]
  return 8 * (x - 1) ** 2 * (1.3 * x**2 + 2 * x + 1) + 0.5 * (y - 4) ** 2


def f_b(p: jax.Array) -> jax.Array:
  return jnp.abs(p[..., 0]) + jnp.abs(p[..., 1])


def f_c(p: jax.Array) -> jax.Array:
  return 10000 * p[..., 0] ** 2 + p[..., 1] ** 2


FUNCTIONS: dict[str, Callable[[jax.Array], jax.Array]] = {"f_a": f_a, "f_b": f_b, "f_c": f_c}
START: dict[str, tuple[float, float]] = {"f_a": (0.25, 1.0), "f_b": (1.5, -1.0), "f_c": (0.3, 3.0)}
MINIMUM: dict[str, tuple[float, float]] = {"f_a": (1.0, 4.0), "f_b": (0.0, 0.0), "f_c": (0.0, 0.0)}


class Trajectory(NamedTuple):
  """Points ``xs`` ``[steps + 1, 2]`` and losses ``[steps + 1]`` (index 0: the start)."""

  xs: np.ndarray
  losses: np.ndarray

  def steps_to(self, threshold: float = 0.1) -> int | None:
    """First step at which the loss is below ``threshold`` (None if never)."""
    hit = np.nonzero(self.losses < threshold)[0]
    return int(hit[0]) if hit.size else None


def optimize(
    tx: optax.GradientTransformation,
    f: Callable[[jax.Array], jax.Array],
    x0: tuple[float, float] | jax.Array,
    steps: int,
    *,
    first_order: bool = False,
    dtype=None,
) -> Trajectory:
  """Runs ``steps`` updates of ``tx`` on ``f`` from ``x0`` (zeroth-order unless told).

  Args:
    tx: an Optax transformation; zeroth-order ones get ``value_fn=f``.
    f: the loss of a ``(2,)`` vector.
    x0: the starting point.
    steps: number of updates.
    first_order: feed ``jax.grad(f)`` to ``tx`` (for Adam and friends) instead of
      ``value_fn``.
    dtype: params dtype (default: float64 when x64 is enabled, else float32).
  """
  dtype = dtype or jnp.result_type(float)
  p0 = jnp.asarray(x0, dtype)

  @jax.jit
  def run(p0):
    def body(carry, _):
      p, s = carry
      if first_order:
        u, s = tx.update(jax.grad(f)(p), s, p)
      else:
        u, s = tx.update(None, s, p, value_fn=f)
      p = optax.apply_updates(p, u)
      return (p, s), p

    _, ps = jax.lax.scan(body, (p0, tx.init(p0)), None, length=steps)
    xs = jnp.concatenate([p0[None], ps])
    return xs, jax.vmap(f)(xs)

  xs, losses = run(p0)
  return Trajectory(np.asarray(xs), np.asarray(losses))


class Sweep(NamedTuple):
  """Losses ``[n_lr, n_seed, steps + 1]`` and points ``[n_lr, n_seed, steps + 1, 2]``."""

  learning_rates: np.ndarray
  losses: np.ndarray
  xs: np.ndarray

  def steps_to(self, threshold: float = 0.1) -> np.ndarray:
    """``[n_lr, n_seed]`` first step below ``threshold`` (``inf`` if never)."""
    below = self.losses < threshold
    first = np.argmax(below, axis=-1).astype(float)
    first[~below.any(axis=-1)] = np.inf
    return first

  def best(self, threshold: float = 0.1) -> tuple[float, float, int]:
    """``(best lr, median steps over seeds at it, lr index)``; ties go to the smaller lr."""
    med = np.median(self.steps_to(threshold), axis=1)
    i = int(np.argmin(med))
    return float(self.learning_rates[i]), float(med[i]), i


def sweep(
    factory: Callable[..., optax.GradientTransformation],
    f: Callable[[jax.Array], jax.Array],
    x0: tuple[float, float],
    steps: int,
    learning_rates: np.ndarray,
    seeds: int = 5,
    *,
    first_order: bool = False,
    matrix: bool = False,
    **options,
) -> Sweep:
  """Runs ``factory(learning_rate=lr, **options)`` for every lr and seed, in one program.

  The learning rate is injected with ``optax.inject_hyperparams`` and the seeds enter as
  the state's key, so a whole grid is a single ``vmap`` of a ``scan``.

  Args:
    factory: e.g. ``hz.hizoo`` or ``optax.adam``.
    f: the loss of a ``(2,)`` vector.
    x0: start point.
    steps: updates per run.
    learning_rates: the lr grid.
    seeds: number of seeds (0..seeds-1); first-order methods are deterministic and run once.
    first_order: feed ``jax.grad(f)`` instead of ``value_fn``.
    matrix: hold the point as a ``(1, 2)`` matrix, so HiZOO-L factors it (pass
      ``min_dim_size_to_factor=1``).
    **options: further arguments of ``factory``; integers and strings are kept static.
  """
  static = tuple(k for k, v in options.items() if isinstance(v, int | str | bool | tuple))
  tx = optax.inject_hyperparams(factory, static_args=static)(learning_rate=1.0, **options)
  lrs = jnp.asarray(learning_rates, jnp.result_type(float))
  n_seeds = 1 if first_order else seeds
  shape = (1, 2) if matrix else (2,)
  loss = (lambda p: f(p.reshape(2))) if matrix else f
  p0 = jnp.asarray(x0, jnp.result_type(float)).reshape(shape)

  state0 = tx.init(p0)  # eagerly: structural options (num_directions, ...) stay concrete

  def one(lr, seed):
    state = state0._replace(hyperparams={**state0.hyperparams, "learning_rate": lr})
    if not first_order:
      key = jax.random.key_data(jax.random.key(seed))
      state = optax.tree_utils.tree_set(state, key=key)

    def body(carry, _):
      p, s = carry
      if first_order:
        u, s = tx.update(jax.grad(loss)(p), s, p)
      else:
        u, s = tx.update(None, s, p, value_fn=loss)
      p = optax.apply_updates(p, u)
      return (p, s), p.reshape(2)

    _, ps = jax.lax.scan(body, (p0, state), None, length=steps)
    return jnp.concatenate([p0.reshape(1, 2), ps])

  run = jax.jit(jax.vmap(jax.vmap(one, in_axes=(None, 0)), in_axes=(0, None)))
  xs = run(lrs, jnp.arange(n_seeds))
  losses = jax.vmap(f)(xs.reshape(-1, 2)).reshape(xs.shape[:-1])
  return Sweep(np.asarray(learning_rates), np.asarray(losses), np.asarray(xs))


class Result(NamedTuple):
  """The best setting of one method on one function."""

  method: str
  function: str
  steps: float  # median over seeds of the first step with f < threshold (inf: never)
  learning_rate: float
  options: dict
  sweep: Sweep
  lr_index: int


def compare(
    methods: dict[str, tuple[Callable[..., optax.GradientTransformation], list[dict]]],
    functions: tuple[str, ...] = ("f_a", "f_b", "f_c"),
    *,
    steps: int = 3000,
    learning_rates: np.ndarray | None = None,
    seeds: int = 5,
    threshold: float = 0.1,
    progress: Callable[[str], None] | None = None,
) -> list[Result]:
  """Steps to ``f < threshold`` of each method on each function, at its best setting.

  Args:
    methods: ``name -> (factory, [options, ...])``; every options dict is a candidate
      setting (e.g. one per ``hessian_smoothing``) and the learning rate is swept on top.
    functions: names in :data:`FUNCTIONS`.
    steps: updates per run.
    learning_rates: the lr grid (default: 1e-5 .. 1 in half decades).
    seeds: seeds per setting; the median decides.
    threshold: the loss to reach.
    progress: called with a label before each sweep (e.g. a progress bar's update).
  """
  if learning_rates is None:
    learning_rates = 10.0 ** np.arange(-5, 0.01, 0.5)
  out = []
  for fname in functions:
    for mname, (factory, candidates) in methods.items():
      best = None
      for opts in candidates:
        if progress is not None:
          progress(f"{fname} {mname} {opts}")
        sw = sweep(factory, FUNCTIONS[fname], START[fname], steps, learning_rates, seeds, **opts)
        lr, med, i = sw.best(threshold)
        if best is None or med < best.steps:
          best = Result(mname, fname, med, lr, opts, sw, i)
      out.append(best)
  return out
