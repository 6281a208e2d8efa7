"""The method interface: what a zeroth-order method is, for the transform and the engine.

A zeroth-order step measures losses at perturbed params and turns them into an estimate
of the gradient. The data flows one way::

    sampler -> probes -> losses -> estimate -> method state -> Optax chain -> engine

A :class:`Method` is one small static (hashable) object that says everything that
differs between methods, and nothing else:

* :attr:`Method.passes`: the step's passes over the params, a static tuple of
  ``(probe j, coefficient c, measures)``. The engine moves the params in place by
  ``c * mu * D_j`` at each pass and measures the loss where ``measures`` is true; the
  coefficients of each probe sum to zero, so the params come back. Two-sided SPSA is
  ``(j, +1, True), (j, -2, True), (j, +1, False)``; a one-sided probe is
  ``(j, +1, True), (j, -1, False)``. Whether ``l0 = f(theta)`` is measured first is a
  (possibly traced) value of :meth:`Method.in_effect`, ``"center"``.
* :meth:`Method.displacement`: ``step * D_j`` for every leaf, with ``D_j`` the probe's
  perturbation direction, as elementwise expressions regenerated from keys (never
  stored).
* :meth:`Method.estimate`: the losses, the params and the method's state become the
  emitted estimate ``g`` (a tree shaped like the params), the new state and the step's
  statistics.
* :meth:`Method.init` and :meth:`Method.in_effect`: the method's own state, and the
  numeric options in effect at a step (schedules evaluated, traced values sanitised).
* :meth:`Method.prepare` (optional): the method's state as the step reads it (ZO-Muon's
  subspaces, redrawn at the start of the steps that refresh them) and what
  the step needs from the unperturbed params before the engine moves them in place
  (Sparse MeZO's masks), computed once per step and read by every pass and by the
  estimate.

The transform (:func:`hizoo_jax._src.transform.zo_transform`) runs any method through
``tx.update``: it measures the losses with ``value_fn`` on copies of the params. The
engine (:func:`hizoo_jax.make_train_step`) runs the same passes in place, in one program,
and hands the measured losses to the same ``tx.update``. Neither knows which method it
runs. A method that measures directional derivatives instead of losses
(:attr:`Method.measure` = ``"jvp"``) gets ``jax.jvp`` of the loss along ``D_j`` at each
measuring pass, with coefficient 0.

Key schedule (public and stable): the step's noise key is the first half of
``jax.random.split(state_key)``; probe ``j`` draws from
``sampling.direction_key(noise_key, j)``; leaf ``i`` of a probe from the words of
:class:`hizoo_jax._src.sampling.DirectionWords`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from hizoo_jax._src import sampling

Pass = tuple[int, float, bool]


def two_sided(num_probes: int) -> tuple[Pass, ...]:
  """``f(theta + mu D_j)`` and ``f(theta - mu D_j)`` for each probe, then back to theta."""
  out: list[Pass] = []
  for j in range(num_probes):
    out += [(j, 1.0, True), (j, -2.0, True), (j, 1.0, False)]
  return tuple(out)


def one_sided(num_probes: int) -> tuple[Pass, ...]:
  """``f(theta + mu D_j)`` for each probe, then back to theta."""
  out: list[Pass] = []
  for j in range(num_probes):
    out += [(j, 1.0, True), (j, -1.0, False)]
  return tuple(out)


def tangents(num_probes: int) -> tuple[Pass, ...]:
  """One directional derivative along ``D_j`` per probe (``measure = "jvp"``)."""
  return tuple((j, 0.0, True) for j in range(num_probes))


def measured_offsets(passes: tuple[Pass, ...]) -> tuple[tuple[int, float], ...]:
  """``(probe, offset)`` of each measuring pass: where the params stand, in units of
  ``mu D_probe``, when it measures (the running sum of the probe's coefficients)."""
  offset: dict[int, float] = {}
  out = []
  for j, c, measures in passes:
    offset[j] = offset.get(j, 0.0) + c
    if measures:
      out.append((j, offset[j]))
  return tuple(out)


class Measured(NamedTuple):
  """The losses of one step.

  Attributes:
    center: ``l0 = f(theta)`` (zero when the step does not measure it).
    values: one value per measuring pass of :attr:`Method.passes`, in order (a loss, or a
      directional derivative for ``measure = "jvp"``); passes not yet run are zero.
  """

  center: jax.Array
  values: jax.Array


@dataclasses.dataclass(frozen=True)
class ZOCall:
  """What a caller that runs the forward passes itself tells a zeroth-order transform:
  ``tx.update(updates, state, params, zo_call=ZOCall(...))``.

  It is the one keyword by which :func:`hizoo_jax.make_train_step` (and
  :func:`hizoo_jax.accumulate`) talk to the transform inside any composition. A wrapper
  forwards it with the other extra arguments, as ``optax.chain`` does; one that changes
  what it wraps sees (:func:`hizoo_jax.guarded`) reads :attr:`probe` and
  :attr:`losses` and rebuilds it with :meth:`replace`.

  Attributes:
    losses: ``(l0, values[, (state, prepared)])``: the loss at ``theta`` and one value
      per measuring pass, measured by the caller at exactly this step's passes, and what
      :meth:`Method.prepare` gave before the passes moved ``theta`` (the method's state
      as the passes read it, None where that is the stored one, and the rest);
      ``value_fn`` is then not called. ``None``: the transform measures through ``value_fn``.
    probe: the engine locating the transform: an object with ``record(method, params)``.
      The transform records its method and its view of the params and returns its state
      unchanged but for the options in effect (``hyper``); nothing is updated, so a
      wrapper passes the call through without guarding or counting it.
    leaves: flat indices of the leaves (of the transform's view of the params) whose
      estimate the caller uses; the others may come back as zeros
      (:meth:`Method.estimate_some`). The engine passes them when it orders the leaves of
      a method whose products are matmuls (:attr:`Method.serial_products`).
    outside: with ``leaves``, the values to emit for the other leaves (the engine's check
      that the rest of the chain treats each leaf alone).
  """

  losses: tuple | None = None
  probe: Any = None
  leaves: tuple[int, ...] | None = None
  outside: tuple | None = None

  @property
  def is_probe(self) -> bool:
    return self.probe is not None

  @classmethod
  def of(cls, call: Any) -> ZOCall:
    """``call`` checked (``None``: a call that measures through ``value_fn``)."""
    if call is None:
      return cls()
    if not isinstance(call, cls):
      raise TypeError(f"zo_call must be a hizoo_jax.method.ZOCall, got {type(call).__name__}")
    return call

  def replace(self, **changes: Any) -> ZOCall:
    return dataclasses.replace(self, **changes)


@dataclasses.dataclass
class StepNoise:
  """The noise of one step: probe ``j``'s perturbation of leaf ``i``, regenerated on demand.

  Attributes:
    sampler: the method's sampler.
    noise_key: the step's noise key (the probes' keys fold their index into it).
    leaves: the params' leaves (their shapes group the noise, see DirectionWords).
    lean: the estimate runs in the engine's final pass: draws that would otherwise be
      shared between two uses are drawn twice (``after``) so that XLA stores neither.
    prepared: what :meth:`Method.prepare` computed from the unperturbed params at the
      start of the step (e.g. Sparse MeZO's packed masks); None for most methods.
  """

  sampler: sampling.Sampler
  noise_key: jax.Array
  leaves: list
  lean: bool = False
  prepared: Any = None

  def __post_init__(self):
    self._words: dict[Any, sampling.DirectionWords] = {}

  def fresh(self) -> StepNoise:
    """The same noise with an empty cache of words (for use inside another trace, such as
    a loop body: cached words hold values of the trace that drew them)."""
    return StepNoise(self.sampler, self.noise_key, self.leaves, self.lean, self.prepared)

  def words(self, j: Any, after: Any = ()) -> sampling.DirectionWords:
    key = j if isinstance(j, int) and not jax.tree.leaves(after) else None
    if key is not None and key in self._words:
      return self._words[key]
    dkey = sampling.tie(sampling.direction_key(self.noise_key, j), after)
    words = sampling.DirectionWords(dkey, len(self.leaves), self.leaves)
    if key is not None:
      self._words[key] = words
    return words

  def noise(self, j: Any, i: int, after: Any = ()) -> jax.Array:
    """Leaf ``i``'s noise of probe ``j`` (in the leaf's noise dtype)."""
    return self.words(j).noise(self.sampler, i, self.leaves[i], after)

  def fn(self, j: Any, i: int):
    """``z(after=())``: leaf ``i``'s noise of probe ``j``, drawable again after ``after``."""
    return lambda after=(): self.noise(j, i, after)


@dataclasses.dataclass(frozen=True)
class Method:
  """Base of every zeroth-order method (a frozen dataclass: static and hashable).

  Subclasses set :attr:`name`, their static options as dataclass fields, and implement
  :meth:`init`, :meth:`in_effect`, :meth:`displacement` and :meth:`estimate`. The numeric
  options (which ``optax.inject_hyperparams`` may pass traced) are not fields: they reach
  :meth:`in_effect` as the ``hyper`` dict.
  """

  name: ClassVar[str] = "method"
  measure: ClassVar[str] = "loss"  # or "jvp"
  cost_per_measure: ClassVar[int] = 1  # forward passes a measuring pass counts as
  # The lean engine moves the params back to theta in the update's own pass over them (one
  # pass fewer). A method whose displacement reads a params-sized state that its update
  # rewrites (HiZOO's dense H) turns this off: XLA would keep a copy of the old state.
  restore_in_update: ClassVar[bool] = True
  # The update's pass over the params and its pass over the method's state both read a
  # params-sized state (HiZOO with several probes: the stored H, from which the estimate
  # replays the probes' H_j while the state's pass writes the new H over it). Two passes
  # with no data dependency between them: XLA keeps a copy of the state for the reader.
  # The lean engine then computes the state after the params (see engine.update.final_update).
  state_after_params: ClassVar[bool] = False
  # The method's matrix directions are matmul products (a leaf-sized buffer each, which XLA
  # does not fuse into the pass that adds it to the leaf). XLA:CPU's default scheduler runs
  # each operation for every leaf before the next, so it forms every leaf's product before
  # it adds any: all of them alive at once. The lean engine then orders the leaves, each
  # leaf's product formed after the previous leaf is written, in its passes and in its
  # update. It needs the default :meth:`displacement` (directions from
  # :meth:`direction_leaf`, each depending on the method's state) and a new state that no
  # product feeds; the engine checks the rest of the chain itself (engine.update._leafwise).
  serial_products: ClassVar[bool] = False
  # Whether :meth:`prepare` gives a state other than the stored one (ZO-Muon's subspaces,
  # redrawn on a refresh step). The engine then carries the prepared state
  # through its passes in place of the stored one, which nothing reads after, so XLA can
  # write one over the other (carried beside it: a second copy, 0.26 param bytes on
  # ZO-Muon's test model).
  prepares_state: ClassVar[bool] = False
  sampler: sampling.Sampler = sampling.DEFAULT_SAMPLER
  key_impl: str = "threefry2x32"
  num_probes: int = 1

  @property
  def passes(self) -> tuple[Pass, ...]:
    return two_sided(self.num_probes)

  @property
  def independent_probes(self) -> bool:
    """Whether probe ``j``'s direction is independent of the losses measured before it
    (then the engine may evaluate all probes at once, ``batch_probes``)."""
    return True

  @property
  def num_measured(self) -> int:
    return sum(1 for _, _, m in self.passes if m)

  def check(self, hyper: dict[str, Any]) -> None:
    """Refuses concrete bad numeric options (ValueError/TypeError naming the argument)."""

  def for_params(self, params: Any) -> Method:
    """The method for these params (a static property of their tree: e.g. which side of
    each matrix is which, from the leaves' paths); itself by default."""
    del params
    return self

  def resolve(self, state: Any) -> Method:
    """The method with the static options that arrived traced (``None``, e.g. a ``rank``
    under ``optax.inject_hyperparams``) recovered from ``state``, the method state that
    :meth:`init` built when they were concrete; itself by default."""
    del state
    return self

  def init(self, params: Any, hyper: dict[str, Any]) -> Any:
    """The method's own state (e.g. a Hessian estimate); ``()`` when it has none."""
    del params, hyper
    return ()

  def prepare(self, noise: StepNoise, state: Any, hyper: dict[str, jax.Array]
              ) -> tuple[Any, Any]:
    """``(state, prepared)`` of this step, computed once before any pass moves the params
    (``noise.leaves``): the method's state as the step's passes and estimate read it
    (``state`` itself unless :attr:`prepares_state`), and what else the step needs from
    the unperturbed params (small: it is carried through the engine's passes; None by
    default), read as ``noise.prepared``. The engine carries the prepared state in place
    of the stored one and hands the stored one back to the update, so a wrapper that
    skips the step keeps it.

    Work done here is traced once a step; done where a pass reads it, it is traced into
    every pass and into the update (ZO-Muon's redrawn subspaces: a third of its first
    call's compile time)."""
    del noise, hyper
    return state, None

  def in_effect(self, hyper: dict[str, Any], count: jax.Array, params: Any,
                state: Any) -> dict[str, jax.Array]:
    """The numeric options in effect at step ``count``: a dict of arrays with fixed
    shapes and dtypes, recorded in the transform's state. It must hold ``"mu"`` (the
    perturbation scale applied, 0 when not usable) and ``"center"`` (a bool: measure
    ``l0 = f(theta)`` first)."""
    raise NotImplementedError

  def direction_leaf(self, noise: StepNoise, state: Any, hyper: dict[str, jax.Array],
                     words: sampling.DirectionWords, i: int, leaf: Any) -> jax.Array:
    """Leaf ``i``'s direction ``D_j`` of the probe whose words are ``words`` (default: the
    sampler's noise ``z_j``). Methods with structured or masked directions override this
    and inherit :meth:`displacement` and :meth:`combine`."""
    del state, hyper
    return words.noise(noise.sampler, i, leaf)

  def displacement(self, noise: StepNoise, state: Any, hyper: dict[str, jax.Array], j: Any,
                   measured: Measured, step: jax.Array, after: Any = ()) -> list:
    """``step * D_j`` of every leaf (``step``: a scalar), in the leaves' noise dtype.

    ``j`` may be traced (the engine's loop); ``measured`` then holds the values of the
    passes run so far (a method whose directions depend on earlier probes, such as
    HiZOO-multi's Hessian, replays them). ``after``: values the noise is ordered after
    (see :func:`hizoo_jax._src.sampling.tie`).
    """
    del measured
    words = noise.words(j, after)
    out = []
    for i, p in enumerate(noise.leaves):
      d = self.direction_leaf(noise, state, hyper, words, i, p)
      out.append(step.astype(d.dtype) * d)
    return out

  def combine(self, noise: StepNoise, state: Any, hyper: dict[str, jax.Array], params: list,
              coefs: jax.Array) -> list:
    """``sum_j coefs[j] D_j`` of every leaf, each direction regenerated (never stored)."""
    g = noise_zeros(params)
    for j in range(self.num_probes):
      words = noise.words(j)
      g = [a + coefs[j].astype(a.dtype) * self.direction_leaf(noise, state, hyper, words, i, p)
           for i, (a, p) in enumerate(zip(g, params, strict=True))]
    return g

  def estimate(self, noise: StepNoise, state: Any, hyper: dict[str, jax.Array],
               params: list, measured: Measured) -> tuple[list, Any, dict[str, jax.Array]]:
    """``(g leaves, new state, stats)``: the estimate of each leaf (noise dtype), the
    method's new state, and ``stats`` with ``"loss"`` (the step's logged loss),
    ``"skipped"`` (probes dropped because a value was not finite) and ``"projected"``
    (the mean directional-derivative estimate of the valid probes)."""
    raise NotImplementedError

  def estimate_some(self, noise: StepNoise, state: Any, hyper: dict[str, jax.Array],
                    params: list, measured: Measured, only: frozenset
                    ) -> tuple[list, Any, dict[str, jax.Array]]:
    """:meth:`estimate` for a caller that uses the estimate of the leaves in ``only`` (flat
    indices) alone: the others may be anything of their shape and dtype (zeros), while the
    new state and the stats stay complete. The lean engine calls it once per group of
    leaves for a method with :attr:`serial_products`, so a method that skips the others
    saves their trace; the default computes everything."""
    del only
    return self.estimate(noise, state, hyper, params, measured)


def probe_values(method: Method, measured: Measured, dtype: Any) -> tuple[jax.Array, ...]:
  """The measured values grouped per probe: ``(v[probe, 0], v[probe, 1], ...)`` for a
  method whose probes all measure the same number of times (e.g. ``(l+, l-)``)."""
  per = method.num_measured // method.num_probes
  v = jnp.asarray(measured.values, dtype).reshape(method.num_probes, per)
  return tuple(v[:, k] for k in range(per))


def mean_over_valid(g: list, n_valid: jax.Array) -> list:
  """``g / max(n_valid, 1)`` leaf by leaf."""
  denom = jnp.maximum(n_valid, 1)
  return [a / denom.astype(a.dtype) for a in g]


def noise_zeros(leaves: list) -> list:
  """Zeros shaped like each leaf, in its noise dtype: the start of an estimate's sum."""
  return [jnp.zeros(jnp.shape(p), sampling.noise_dtype(jnp.result_type(p))) for p in leaves]


def scale_leaf(direction: jax.Array, scale: Any) -> jax.Array:
  """``scale * direction`` (``scale`` None: the direction itself), in the direction's dtype."""
  return direction if scale is None else scale.astype(direction.dtype) * direction
