"""The paper's 2-D test functions (Zhao et al., ICLR 2025, Appendix C), runners and probes.

* ``f_a(x, y) = 8 (x - 1)^2 (1.3 x^2 + 2 x + 1) + 0.5 (y - 4)^2``  (from Sophia; min 0 at (1, 4))
* ``f_b(x, y) = |x| + |y|``                                        (non-smooth; min 0 at 0)
* ``f_c(x, y) = 10000 x^2 + y^2``                                  (condition number 1e4)

The paper does not give its starting points; ours are in :data:`START`. Params are a
single ``(2,)`` vector ``[x, y]``; :func:`optimize` runs any Optax transformation on them
under one ``jax.lax.scan`` and returns the trajectory, :func:`sweep` runs a learning-rate
by seed grid as one program and :func:`compare` picks each method's best setting.

For the curvature study, :func:`diagonal_quadratic` builds ``f(x) = x^T diag(a) x / 2``
with a known diagonal and :func:`estimate_diagonal` runs a HiZOO Hessian estimate on it
(the params held fixed), scored by :func:`rank_correlation` and :func:`relative_error`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.tree_utils as otu

import hizoo_jax as hz


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
COUNTERS = ("skipped_directions", "skipped_hessian_updates", "forward_passes")


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
  """Losses ``[n_lr, n_seed, steps + 1]`` and points ``[n_lr, n_seed, steps + 1, 2]``.

  ``counters`` holds the final state's counters (``"skipped_directions"``,
  ``"skipped_hessian_updates"``, ``"forward_passes"``, each ``[n_lr, n_seed]``) where the
  state has them (a first-order run has none).
  """

  learning_rates: np.ndarray
  losses: np.ndarray
  xs: np.ndarray
  counters: dict | None = None

  def steps_to(self, threshold: float = 0.1) -> np.ndarray:
    """``[n_lr, n_seed]`` first step below ``threshold`` (``inf`` if never)."""
    below = self.losses < threshold
    first = np.argmax(below, axis=-1).astype(float)
    first[~below.any(axis=-1)] = np.inf
    return first

  def reached(self, threshold: float = 0.1) -> np.ndarray:
    """``[n_lr]`` number of seeds that got below ``threshold`` at some step."""
    return np.isfinite(self.steps_to(threshold)).sum(axis=1)

  def stayed(self, threshold: float = 0.1) -> np.ndarray:
    """``[n_lr]`` number of seeds below ``threshold`` at the last step."""
    return (self.losses[:, :, -1] < threshold).sum(axis=1)

  def best(self, threshold: float = 0.1, *, robust: bool = False) -> tuple[float, float, int]:
    """``(best lr, median steps over seeds at it, lr index)``; ties go to the smaller lr.

    With ``robust``, only learning rates at which every seed reached ``threshold`` and
    was still below it at the last step qualify (``inf`` steps if none does): the fastest
    median alone picks edge-of-stability settings where some seeds later diverge.
    """
    med = np.median(self.steps_to(threshold), axis=1)
    if robust:
      n = self.losses.shape[1]
      ok = (self.reached(threshold) == n) & (self.stayed(threshold) == n)
      med = np.where(ok, med, np.inf)
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
    dtype=None,
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
    dtype: params dtype (default: float64 when x64 is enabled, else float32); the loss
      is computed in it. The trajectory's losses are re-evaluated in float64 if x64 is on.
    **options: further arguments of ``factory``; integers and strings are kept static.
  """
  static = tuple(k for k, v in options.items() if isinstance(v, int | str | bool | tuple))
  tx = optax.inject_hyperparams(factory, static_args=static)(learning_rate=1.0, **options)
  dtype = dtype or jnp.result_type(float)
  lrs = jnp.asarray(learning_rates, dtype)
  n_seeds = 1 if first_order else seeds
  shape = (1, 2) if matrix else (2,)
  loss = (lambda p: f(p.reshape(2))) if matrix else f
  p0 = jnp.asarray(x0, dtype).reshape(shape)

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

    (_, state), ps = jax.lax.scan(body, (p0, state), None, length=steps)
    counters = {k: otu.tree_get(state, k) for k in COUNTERS}
    return jnp.concatenate([p0.reshape(1, 2), ps]), {
        k: v for k, v in counters.items() if v is not None}

  run = jax.jit(jax.vmap(jax.vmap(one, in_axes=(None, 0)), in_axes=(0, None)))
  xs, counters = run(lrs, jnp.arange(n_seeds))
  xs_wide = xs.astype(jnp.result_type(float))
  losses = jax.vmap(f)(xs_wide.reshape(-1, 2)).reshape(xs.shape[:-1])
  return Sweep(np.asarray(learning_rates), np.asarray(losses), np.asarray(xs),
               {k: np.asarray(v) for k, v in counters.items()} or None)


class Result(NamedTuple):
  """The best setting of one method on one function."""

  method: str
  function: str
  steps: float  # median over seeds of the first step with f < threshold (inf: never)
  learning_rate: float
  options: dict
  sweep: Sweep
  lr_index: int
  robust: bool = False  # every seed reached the threshold and stayed below it at the end

  @property
  def passes_per_step(self) -> float | None:
    """Forward passes a step executed at the chosen setting, from the state's counter
    (mean over seeds and steps; None for a first-order method, which has no count)."""
    if not self.sweep.counters or "forward_passes" not in self.sweep.counters:
      return None
    steps = self.sweep.losses.shape[-1] - 1
    return float(np.mean(self.sweep.counters["forward_passes"][self.lr_index])) / steps

  @property
  def passes(self) -> float | None:
    """Median forward passes to ``f < threshold`` (``steps`` times :attr:`passes_per_step`;
    ``inf``: never; None for a first-order method)."""
    cost = self.passes_per_step
    return None if cost is None else self.steps * cost

  def counts(self, threshold: float = 0.1) -> tuple[int, int, int]:
    """``(seeds that reached threshold, seeds below it at the last step, seeds)``."""
    i = self.lr_index
    return (int(self.sweep.reached(threshold)[i]), int(self.sweep.stayed(threshold)[i]),
            self.sweep.losses.shape[1])


def compare(
    methods: dict[str, tuple[Callable[..., optax.GradientTransformation], list[dict]]],
    functions: tuple[str, ...] = ("f_a", "f_b", "f_c"),
    *,
    steps: int = 3000,
    learning_rates: np.ndarray | None = None,
    seeds: int = 5,
    threshold: float = 0.1,
    robust: bool = False,
    dtype=None,
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
    robust: prefer settings at which every seed reached ``threshold`` and stayed below it
      at the last step (:meth:`Sweep.best`); where no setting is robust, fall back to the
      fastest median (the result's ``robust`` field says which it is).
    dtype: params dtype of the zeroth-order runs (see :func:`sweep`).
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
        sw = sweep(factory, FUNCTIONS[fname], START[fname], steps, learning_rates, seeds,
                   dtype=dtype, **opts)
        lr, med, i = sw.best(threshold, robust=robust)
        if not np.isfinite(med):
          lr, med, i = sw.best(threshold)
        n = sw.losses.shape[1]
        ok = bool(sw.reached(threshold)[i] == n and sw.stayed(threshold)[i] == n)
        cand = Result(mname, fname, med, lr, opts, sw, i, ok)
        # with `robust`, a robust candidate beats any other; then the fewer steps win
        if best is None or (robust and cand.robust, -cand.steps) > (
            robust and best.robust, -best.steps):
          best = cand
      out.append(best)
  return out


# ----------------------------------------------------------------------------------------
# Curvature probes: how well does a HiZOO Hessian estimate recover a known diagonal?


def diagonal_quadratic(
    d: int, condition: float, seed: int = 0
) -> tuple[np.ndarray, Callable[[jax.Array], jax.Array]]:
  """``(a, f)`` with ``f(x) = sum(a x^2) / 2``: a known diagonal Hessian ``a``.

  ``a`` is log-uniform on ``[1, condition]`` (both ends included when ``d >= 2``), in a
  random order.
  """
  rng = np.random.default_rng(seed)
  a = condition ** rng.uniform(0.0, 1.0, d)
  if d >= 2:
    a[rng.choice(d, 2, replace=False)] = (1.0, float(condition))
  a_j = jnp.asarray(a)
  return a, lambda x: 0.5 * jnp.sum(a_j * jnp.square(x))


def estimate_diagonal(
    f: Callable[[jax.Array], jax.Array],
    d: int,
    steps: int,
    smoothing: np.ndarray,
    *,
    seeds: int = 1,
    x: jax.Array | None = None,
    dtype=None,
    **options,
) -> np.ndarray:
  """The HiZOO Hessian estimate after ``steps`` updates at a fixed point, for each ``alpha``.

  Runs ``hz.scale_by_hizoo(hessian_smoothing=alpha, **options)`` on ``f`` with the params
  held at ``x`` (default zeros; the emitted updates are discarded), for every smoothing
  factor and seed, as one ``vmap`` of a ``scan``.

  Args:
    f: the loss of a ``(d,)`` vector.
    d: dimension.
    steps: Hessian updates (with ``num_directions = n`` in ``options``, each step makes
      ``n`` of them).
    smoothing: the ``alpha`` values.
    seeds: seeds per ``alpha``.
    x: the fixed point.
    dtype: params dtype (default: float64 when x64 is enabled).
    **options: further arguments of :func:`hizoo_jax.scale_by_hizoo` (``estimator``,
      ``num_directions``, ``mu``, ...).

  Returns:
    ``H`` as ``[len(smoothing), seeds, d]``.
  """

  dtype = dtype or jnp.result_type(float)
  x = jnp.zeros(d, dtype) if x is None else jnp.asarray(x, dtype)
  static = tuple(k for k, v in options.items() if isinstance(v, int | str | bool | tuple))
  tx = optax.inject_hyperparams(hz.scale_by_hizoo, static_args=static)(
      hessian_smoothing=1.0, **options)
  state0 = tx.init(x)

  def one(alpha, seed):
    state = state0._replace(hyperparams={**state0.hyperparams, "hessian_smoothing": alpha})
    state = otu.tree_set(state, key=jax.random.key_data(jax.random.key(seed)))

    def body(s, _):
      _, s = tx.update(None, s, x, value_fn=f)
      return s, None

    state, _ = jax.lax.scan(body, state, None, length=steps)
    return hz.get_hessian(state.inner_state)

  run = jax.jit(jax.vmap(jax.vmap(one, in_axes=(None, 0)), in_axes=(0, None)))
  return np.asarray(run(jnp.asarray(smoothing, dtype), jnp.arange(seeds)))


def rank_correlation(h: np.ndarray, a: np.ndarray) -> np.ndarray:
  """Spearman rank correlation of ``h`` and ``a`` along the last axis (no tie handling)."""
  h, a = np.broadcast_arrays(np.asarray(h), np.asarray(a))

  def ranks(v):
    return np.argsort(np.argsort(v, axis=-1), axis=-1).astype(float)

  rh, ra = ranks(h), ranks(a)
  rh -= rh.mean(-1, keepdims=True)
  ra -= ra.mean(-1, keepdims=True)
  return (rh * ra).sum(-1) / np.sqrt((rh**2).sum(-1) * (ra**2).sum(-1))


def relative_error(h: np.ndarray, a: np.ndarray, *, rescale: bool = False) -> np.ndarray:
  """Median over coordinates of ``|h_i / (s a_i) - 1|`` along the last axis.

  ``s = 1``, or with ``rescale`` the best common scale ``exp(median(log(h / a)))``: the
  error of the estimate's shape, which is what a preconditioner needs (a common scale is
  absorbed by the learning rate).
  """
  ratio = np.asarray(h) / np.asarray(a)
  if rescale:
    ratio = ratio / np.exp(np.median(np.log(ratio), axis=-1, keepdims=True))
  return np.median(np.abs(ratio - 1.0), axis=-1)
