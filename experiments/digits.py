"""A small real task: a Flax MLP on scikit-learn's digits (1797 8x8 images, 10 classes).

Needs the ``examples`` extra (``flax``, ``scikit-learn``); the data ships with scikit-learn,
so nothing is downloaded. The default model, ``64 -> 128 -> 128 -> 10`` with ReLU, has
26 122 parameters; its ``128 x 128`` kernel is the leaf HiZOO-L factors (with the default
``min_dim_size_to_factor=128``), the others keep a dense Hessian.

    data = digits.load_data()
    graphdef, params = digits.init_model(seed=0)
    hist = digits.train(hz.hizoo(3e-3, hessian_smoothing=1e-6), data, steps=5000)
    hist.test_accuracy[-1]

:func:`train` runs zeroth-order optimizers through :func:`hizoo_jax.make_train_step` (one
jitted, donated step per mini-batch) and first-order ones (``first_order=True``) through
``jax.value_and_grad``; it evaluates the full train and test sets every ``eval_every`` steps.
:func:`time_steps` measures a step's wall-clock time as a ratio to one forward pass.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import hizoo_jax as hz

HIDDEN = (128, 128)
NUM_CLASSES = 10
BLOW_UP = 100.0  # train() stops a run whose train loss exceeds this times the initial one


class Data(NamedTuple):
  """Features in ``[0, 1]`` (``[n, 64]``, float32) and integer labels, split train/test."""

  x_train: jax.Array
  y_train: jax.Array
  x_test: jax.Array
  y_test: jax.Array


def load_data(test_fraction: float = 0.2, seed: int = 0) -> Data:
  """scikit-learn's digits, pixel values scaled to ``[0, 1]``, a stratified split.

  Args:
    test_fraction: share of the 1797 images held out (default: 360 test, 1437 train).
    seed: the split's seed.
  """
  from sklearn.datasets import load_digits
  from sklearn.model_selection import train_test_split

  ds = load_digits()
  x = (ds.data / 16.0).astype(np.float32)
  y = ds.target.astype(np.int32)
  xtr, xte, ytr, yte = train_test_split(x, y, test_size=test_fraction, random_state=seed,
                                        stratify=y)
  return Data(*(jnp.asarray(a) for a in (xtr, ytr, xte, yte)))


class MLP(nnx.Module):
  """``64 -> hidden... -> 10``, ReLU between layers."""

  def __init__(self, hidden: tuple[int, ...] = HIDDEN, *, rngs: nnx.Rngs):
    sizes = (64, *hidden, NUM_CLASSES)
    self.layers = nnx.List(
        [nnx.Linear(a, b, rngs=rngs) for a, b in zip(sizes[:-1], sizes[1:], strict=True)])

  def __call__(self, x: jax.Array) -> jax.Array:
    for layer in self.layers[:-1]:
      x = jax.nn.relu(layer(x))
    return self.layers[-1](x)


def init_model(seed: int = 0, hidden: tuple[int, ...] = HIDDEN) -> tuple[nnx.GraphDef, Any]:
  """``(graphdef, params)``: the model's structure and its ``nnx.Param`` state (a pytree)."""
  return nnx.split(MLP(hidden, rngs=nnx.Rngs(seed)), nnx.Param)


def make_loss(graphdef: nnx.GraphDef) -> Callable[[Any, jax.Array, jax.Array], jax.Array]:
  """``loss(params, x, y)``: mean softmax cross-entropy of the model on a batch."""

  def loss(params, x, y):
    logits = nnx.merge(graphdef, params)(x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  return loss


def make_accuracy(graphdef: nnx.GraphDef) -> Callable[[Any, jax.Array, jax.Array], jax.Array]:
  """``accuracy(params, x, y)``: share of correctly classified rows."""

  def accuracy(params, x, y):
    return jnp.mean(jnp.argmax(nnx.merge(graphdef, params)(x), -1) == y)

  return accuracy


def num_params(params: Any) -> int:
  """Number of scalars in a params pytree."""
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))


class History(NamedTuple):
  """A training run, evaluated at ``steps`` (index 0: before training).

  Attributes:
    steps: the step counts of the evaluations.
    train_loss: full-train-set loss at each evaluation (NaN once diverged).
    test_loss: test-set loss at each evaluation.
    test_accuracy: test-set accuracy at each evaluation.
    seconds: wall-clock time of the training steps alone (evaluations excluded), including
      the first step's compilation.
    monitored: ``monitor(opt_state)`` at each evaluation, if a monitor was given.
  """

  steps: np.ndarray
  train_loss: np.ndarray
  test_loss: np.ndarray
  test_accuracy: np.ndarray
  seconds: float
  monitored: list | None = None

  @property
  def diverged(self) -> bool:
    """Whether the run blew up: its final train loss is NaN (see :func:`train`) or above
    the initial one."""
    return not self.train_loss[-1] <= self.train_loss[0]


def first_order_step(tx: optax.GradientTransformation, loss_fn: Callable[..., jax.Array]):
  """``step(params, opt_state, x, y) -> (params, opt_state, loss)`` with exact gradients."""

  def step(params, opt_state, *batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return jax.jit(step, donate_argnums=(0, 1))


def batches(n: int, batch_size: int, steps: int, seed: int) -> np.ndarray:
  """``[steps, batch_size]`` row indices: shuffled epochs, drawn without replacement."""
  rng = np.random.default_rng(seed)
  per_epoch = n // batch_size
  epochs = -(-steps // per_epoch)
  idx = np.concatenate([rng.permutation(n)[: per_epoch * batch_size] for _ in range(epochs)])
  return idx.reshape(-1, batch_size)[:steps]


@functools.lru_cache(maxsize=8)
def _evaluator(hidden: tuple[int, ...]):
  """``evaluate(params, data) -> (train loss, test loss, test accuracy)``, jitted once."""
  graphdef, _ = init_model(0, hidden)
  loss_fn, acc_fn = make_loss(graphdef), make_accuracy(graphdef)
  return jax.jit(lambda p, d: (loss_fn(p, d.x_train, d.y_train), loss_fn(p, d.x_test, d.y_test),
                               acc_fn(p, d.x_test, d.y_test)))


@functools.lru_cache(maxsize=64)
def _compiled_step(tx: optax.GradientTransformation, first_order: bool, hidden: tuple[int, ...]):
  """The jitted step of :func:`train` for ``tx``, built once per transformation.

  Runs that reuse the same ``tx`` object (e.g. several seeds: the seed enters through the
  state's key) reuse its compilation, which costs more than a few thousand steps of this
  small model. The step gathers its batch from the device-resident train set: one small
  index array crosses to the device per step.
  """
  graphdef, _ = init_model(0, hidden)
  loss_fn = make_loss(graphdef)
  batch_loss = lambda p, x, y, i: loss_fn(p, x[i], y[i])
  if first_order:
    return first_order_step(tx, batch_loss)
  return hz.make_train_step(tx, batch_loss)


def train(
    tx: optax.GradientTransformation,
    data: Data,
    *,
    steps: int,
    batch_size: int = 64,
    seed: int = 0,
    model_seed: int | None = None,
    hidden: tuple[int, ...] = HIDDEN,
    first_order: bool = False,
    eval_every: int = 100,
    monitor: Callable[[Any], Any] | None = None,
    progress: Callable[[int], None] | None = None,
) -> History:
  """Trains the MLP with ``tx`` on mini-batches and evaluates it along the way.

  Args:
    tx: an Optax transformation: zeroth-order (``hz.hizoo(...)``, a chain with
      ``hz.scale_by_zo``, ...) unless ``first_order``. Runs given the same ``tx`` object
      share one compiled step (pass one ``tx`` to all seeds of a setting).
    data: from :func:`load_data`.
    steps: optimizer steps.
    batch_size: rows per step (the same batch for all of a step's forward passes).
    seed: seeds the batch order and, for ZO transforms, the perturbations (the state's key
      is set from it, whatever ``tx``'s own seed).
    model_seed: the model's initialization (default: ``seed``).
    hidden: hidden widths.
    first_order: feed exact gradients (``jax.value_and_grad``) instead of ``value_fn``.
    eval_every: evaluate the full train/test sets every this many steps.
    monitor: called with the optimizer state at each evaluation (e.g. to follow the
      Hessian estimate); its results, which should be host values (the state's buffers
      are donated to the next step), are kept in ``History.monitored`` (None after a
      divergence).
    progress: called with the number of steps done after each evaluation.

  Returns:
    A :class:`History`. A run whose loss stops being finite, or whose train loss exceeds
    ``BLOW_UP`` times the initial one, is stopped there; its remaining evaluations are NaN.
  """
  graphdef, params = init_model(seed if model_seed is None else model_seed, hidden)
  evaluate = _evaluator(hidden)
  state = tx.init(params)
  if not first_order:
    key = jax.random.key_data(jax.random.key(seed))
    state = optax.tree_utils.tree_set(state, key=key)
  step = _compiled_step(tx, first_order, hidden)
  idx = batches(data.x_train.shape[0], batch_size, steps, seed).astype(np.int32)

  evals = [0, *range(eval_every, steps, eval_every), steps]
  rows = [tuple(float(v) for v in evaluate(params, data))]
  monitored = None if monitor is None else [monitor(state)]
  seconds = 0.0
  for a, b in zip(evals[:-1], evals[1:], strict=True):
    t0 = time.perf_counter()
    for i in range(a, b):
      params, state, loss = step(params, state, data.x_train, data.y_train, idx[i])
    loss = float(loss)  # waits for the last step
    seconds += time.perf_counter() - t0
    row = tuple(float(v) for v in evaluate(params, data))
    if not (np.isfinite(loss) and row[0] <= BLOW_UP * rows[0][0]):
      rows += [(np.nan, np.nan, np.nan)] * (len(evals) - len(rows))
      if monitored is not None:
        monitored += [None] * (len(evals) - len(monitored))
      break
    rows.append(row)
    if monitor is not None:
      monitored.append(monitor(state))
    if progress is not None:
      progress(b)
  r = np.asarray(rows, dtype=float)
  return History(np.asarray(evals), r[:, 0], r[:, 1], r[:, 2], seconds, monitored)


def time_steps(
    steps: dict[str, tuple[Callable[..., Any], Any]],
    loss_fn: Callable[..., jax.Array],
    params: Any,
    batch: tuple[jax.Array, ...],
    *,
    repeats: int = 7,
    inner: int = 20,
) -> dict[str, float]:
  """Median wall-clock time of each step, in forward passes of ``loss_fn`` on ``batch``.

  Args:
    steps: ``name -> (step, opt_state)`` with ``step(params, opt_state, *batch) ->
      (params, opt_state, loss)`` (donating steps are fed fresh copies).
    loss_fn: ``loss_fn(params, *batch)``; its jitted call is the unit.
    params: the params every step starts from.
    batch: the batch.
    repeats: timed repetitions after one warm-up; the median is reported.
    inner: calls per repetition (the mean over them is one sample).

  Returns:
    ``name -> median seconds of a step / median seconds of a forward pass``, plus the key
    ``"forward_seconds"`` (the unit).
  """
  fwd = jax.jit(loss_fn)

  def clock(fn):
    fn()  # warm-up (compilation)
    samples = []
    for _ in range(repeats):
      t0 = time.perf_counter()
      for _ in range(inner):
        out = fn()
      jax.block_until_ready(out)
      samples.append((time.perf_counter() - t0) / inner)
    return float(np.median(samples))

  unit = clock(lambda: fwd(params, *batch))
  out = {"forward_seconds": unit}
  for name, (step, opt_state) in steps.items():
    carry = [jax.tree.map(jnp.copy, params), jax.tree.map(jnp.copy, opt_state)]

    def call(step=step, carry=carry):
      carry[0], carry[1], loss = step(carry[0], carry[1], *batch)
      return loss

    out[name] = clock(call) / unit
  return out
