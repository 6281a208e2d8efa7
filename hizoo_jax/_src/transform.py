"""The zeroth-order gradient transformation: any method of :mod:`hizoo_jax._src.method`.

:func:`zo_transform` turns a method object into an ``optax.GradientTransformationExtraArgs``
that emits the method's estimate ``g`` as its updates, so any Optax chain can follow it. It
ignores the incoming ``updates`` and instead evaluates the loss through ``value_fn(params)``,
passed as an extra argument to ``update``. Each method's file in ``_src/methods/`` builds
its ``scale_by_*`` on it (the options stated once) and its optimizer alias.

Extra arguments of ``update`` (all keyword-only):

* ``value_fn(params) -> scalar``: the loss of the current batch (required).
* ``key``: a PRNG key overriding the state's key for this call.
* ``value_params``: the full params ``value_fn`` takes, when the transform sees only some
  of them (``optax.masked`` and ``optax.multi_transform`` hand it the selected leaves;
  :func:`hizoo_jax.make_train_step` passes this itself).
* ``zo_call``: a :class:`hizoo_jax.method.ZOCall` from a caller that runs the forward
  passes itself (:func:`hizoo_jax.make_train_step`, :func:`hizoo_jax.accumulate`): the
  losses it measured, or the engine's search for the transform.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.tree_utils as otu

from hizoo_jax._src import config as cfg
from hizoo_jax._src import curvature as curv
from hizoo_jax._src import method as m
from hizoo_jax._src import numerics, sampling

__all__ = ["ZOState", "forward_passes", "get_hessian", "zo_states", "zo_transform"]


class ZOState(NamedTuple):
  """State of every zeroth-order transform.

  Attributes:
    count: number of steps taken (int32).
    key: raw PRNG key data the next step draws its noise from (advanced every step).
    forward_passes: forward passes executed so far (int32): ``l0`` where measured and
      one per measuring pass (a directional derivative counts as one). Compare methods
      by this, not by steps.
    loss: the step's loss for logging (``l0`` where the method measures it, else the
      mean of the perturbed losses).
    losses: the values of the step's measuring passes, in order (two-sided methods:
      ``l+_1, l-_1, l+_2, ...``). For a method that measures directional derivatives
      (:func:`scale_by_forward_gradient`) these are not losses but the derivatives
      ``grad f . z_j``, one per direction; its ``loss`` is ``f(theta)``.
    skipped_directions: probes dropped so far because a value was not finite.
    projected: the step's directional-derivative estimate, averaged over its probes (MeZO:
      ``(l+ - l-) / (2 mu)``; for a zeroth-order run it stands where a first-order run
      logs a gradient norm: ``E[projected^2] = |grad f|^2`` for Gaussian SPSA).
    hyper: the numeric options in effect at the last step (``mu`` as applied, ...).
    method: the method's own state (e.g. :class:`HiZOOState`; ``()`` for MeZO).
  """

  count: jax.Array
  key: jax.Array
  forward_passes: jax.Array
  loss: jax.Array
  losses: jax.Array
  skipped_directions: jax.Array
  projected: jax.Array
  hyper: dict
  method: Any


def is_zo_state(x: Any) -> bool:
  return isinstance(x, ZOState)


def zo_states(state: Any) -> list[ZOState]:
  """The zeroth-order transforms' states in ``state``, in tree order.

  Args:
    state: any optimizer state (chains, wrappers, ``optax.MultiStepsState``, the pure
      state of an ``nnx.Optimizer``).

  Returns:
    The :class:`ZOState` of each zeroth-order transform; empty for a first-order state.
  """
  return [x for x in jax.tree.leaves(state, is_leaf=is_zo_state) if is_zo_state(x)]


# ----------------------------------------------------------------------------------------
# Masked views: optax.masked hands the transform only the selected leaves.


def is_masked_node(x: Any) -> bool:
  return isinstance(x, optax.MaskedNode)


def has_masked_nodes(params: Any) -> bool:
  return any(is_masked_node(x) for x in jax.tree.leaves(params, is_leaf=is_masked_node))


def merge_view(full: Any, view: Any) -> Any:
  """``full`` with the selected (non-``MaskedNode``) leaves of ``view`` put in."""
  return jax.tree.map(lambda v, f: f if is_masked_node(v) else v, view, full,
                      is_leaf=is_masked_node)


def mask_like(full: Any, view: Any) -> Any:
  """``full`` seen through the mask of ``view``: ``MaskedNode`` where ``view`` has one."""
  return jax.tree.map(lambda v, f: v if is_masked_node(v) else f, view, full,
                      is_leaf=is_masked_node)


# ----------------------------------------------------------------------------------------
# The transformation.


@functools.lru_cache(maxsize=256)
def _compiled_in_effect(method: m.Method, hyper_items: tuple) -> Callable:
  hyper = {k: v for k, _, v in hyper_items}
  return jax.jit(lambda count, params, state: method.in_effect(hyper, count, params, state))


def _initial_in_effect(method: m.Method, hyper: dict[str, Any], count: jax.Array,
                       params: Any, state: Any) -> dict[str, jax.Array]:
  """The options in effect before the first step, as one compiled program.

  Run op by op, their two dozen scalar ops each compile on first use: 0.3 s of the first
  step of a 200-tensor model. The program is cached per method and options (hashable ones:
  numbers, strings, schedules). Op by op instead: options that are arrays, and a schedule
  that needs a concrete step count (Python control flow on it).
  """
  items = tuple((k, type(v), v) for k, v in sorted(hyper.items()))
  try:
    return _compiled_in_effect(method, items)(count, params, state)
  except (TypeError, jax.errors.ConcretizationTypeError):
    return method.in_effect(hyper, count, params, state)


def zo_transform(method: m.Method, hyper: dict[str, Any],
                 seed: Any = 0) -> optax.GradientTransformationExtraArgs:
  """The transformation that runs ``method`` (a :class:`hizoo_jax._src.method.Method`).

  Args:
    method: the method object (static: sampler, key implementation, probes, options).
    hyper: its numeric options, possibly traced (``optax.inject_hyperparams``) or
      schedules; checked here where they are concrete.
    seed: int seed or PRNG key; the state carries the key and advances it every step.
  """
  method.check(hyper)
  cfg.check_seed(seed)

  def init_fn(params):
    cfg.check_params(params)
    method_ = _resolved(method, params)
    dtype = numerics.loss_dtype(params)
    count = jnp.zeros([], jnp.int32)
    state = method_.init(params, hyper)
    return ZOState(
        count=count,
        key=cfg.seed_to_key_data(seed, method.key_impl),
        forward_passes=jnp.zeros([], jnp.int32),
        loss=jnp.zeros([], dtype),
        losses=jnp.zeros([method_.num_measured], dtype),
        skipped_directions=jnp.zeros([], jnp.int32),
        projected=jnp.zeros([], dtype),
        # copies: an injected hyperparameter may come back as the very array the wrapper
        # holds, and one buffer twice in a state cannot be donated.
        hyper=jax.tree.map(lambda x: jnp.array(x, copy=True),
                           _initial_in_effect(method_, hyper, count, params, state)),
        method=state,
    )

  def update_fn(updates, state, params=None, *, value_fn=None, key=None, value_params=None,
                zo_call=None, **extra_args):
    del updates, extra_args  # ZO transforms measure the loss themselves.
    call = m.ZOCall.of(zo_call)
    if not is_zo_state(state):
      raise TypeError(f"expected the ZOState of this transform's init, got {type(state)}: "
                      "build the optimizer state with state = tx.init(params) from this very "
                      "optimizer (another optimizer's state cannot be reused)")
    cfg.check_params(params)
    method_ = _resolved(method, params, state)
    _check_state(method_, hyper, state, params)
    in_effect = method_.in_effect(hyper, state.count, params, state.method)
    in_effect = jax.tree.map(lambda new, old: new.astype(old.dtype), in_effect, state.hyper)
    if call.is_probe:
      call.probe.record(method_, params)
      return jax.tree.map(jnp.zeros_like, params), state._replace(hyper=in_effect)
    if call.losses is None:
      value_fn = _resolve_value_fn(value_fn, params, value_params)
    return _step(method_, state, in_effect, params, call, key, value_fn)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _resolved(method: m.Method, params: Any, state: ZOState | None = None) -> m.Method:
  """The method for these params, with its static options: from the options, or (traced
  under inject_hyperparams: the number of probes, a low-rank method's rank) from the shapes
  of the state that init built when they were concrete."""
  method = method.for_params(params)
  if state is not None:
    method = method.resolve(state.method)
  if method.num_probes is not None:
    return method
  if state is None:
    raise TypeError(
        "num_directions must be a concrete int at init; under optax.inject_hyperparams "
        "pass static_args=('num_directions',)")
  per_probe = dataclasses.replace(method, num_probes=1).num_measured
  return dataclasses.replace(method, num_probes=state.losses.shape[0] // per_probe)


def _keys(method: m.Method, state: ZOState, key: Any = None):
  """``(noise key of this step, key of the next state)``; ``key`` overrides the former."""
  noise_key, next_key = sampling.split_state_key(
      jax.random.wrap_key_data(state.key, impl=method.key_impl))
  if key is not None:
    noise_key, _ = sampling.split_state_key(cfg.as_typed_key(key, method.key_impl))
  return noise_key, next_key


def _step(method: m.Method, state: ZOState, in_effect: dict, params: Any, call: m.ZOCall,
          key: Any, value_fn: Callable[[Any], Any] | None) -> tuple[Any, ZOState]:
  """``(g, new state)``: the losses measured here through ``value_fn``, or the caller's
  (``call.losses``), turned into the method's estimate."""
  dtype = state.losses.dtype
  num_measured = method.num_measured
  leaves, treedef = jax.tree.flatten(params)
  noise_key, next_key = _keys(method, state, key)
  given = call.losses
  noise = m.StepNoise(method.sampler, noise_key, leaves, lean=given is not None)
  if given is not None and len(given) > 2:
    # The caller prepared the step, from theta before its passes moved it.
    method_state, noise.prepared = given[2]
    if method_state is None:  # the stored state, as the method prepares it
      method_state = state.method
  else:
    method_state, noise.prepared = method.prepare(noise, state.method, in_effect)
  if given is None:
    measured = measure(method, noise, method_state, in_effect, treedef, leaves, value_fn,
                       dtype)
  else:
    measured = m.Measured(jnp.asarray(given[0], dtype),
                          jnp.asarray(given[1], dtype).reshape(num_measured))
  if call.leaves is None:
    g, method_state, stats = method.estimate(noise, method_state, in_effect, leaves, measured)
  else:  # the lean engine's call for one group of leaves (Method.serial_products)
    g, method_state, stats = method.estimate_some(noise, method_state, in_effect, leaves,
                                                  measured, frozenset(call.leaves))
    if call.outside is not None:  # the engine's check that the chain is leafwise
      rest = iter(call.outside)
      g = [a if i in call.leaves else next(rest) for i, a in enumerate(g)]
  g = treedef.unflatten([a.astype(jnp.result_type(p)) for a, p in zip(g, leaves, strict=True)])
  passes_now = num_measured * method.cost_per_measure + in_effect["center"].astype(jnp.int32)
  return g, ZOState(
      count=optax.safe_increment(state.count),
      key=jax.random.key_data(next_key).astype(state.key.dtype),
      forward_passes=add_saturating(state.forward_passes, passes_now),
      loss=stats["loss"].astype(dtype),
      losses=measured.values.astype(dtype),
      skipped_directions=state.skipped_directions
      + jnp.asarray(stats["skipped"]).astype(state.skipped_directions.dtype),
      projected=stats["projected"].astype(dtype),
      hyper=in_effect,
      method=method_state,
  )


def _check_state(method: m.Method, hyper: dict, state: ZOState, params: Any) -> None:
  """A state built for other params (another model, another method) is refused by name,
  before it fails as a shape error deep in the step. Skipped where the state's layout
  depends on an option that is traced here (``optax.inject_hyperparams`` without
  ``static_args``): init saw it concrete, the step cannot recompute it."""
  try:
    expected = jax.eval_shape(
        lambda p: (jnp.zeros([method.num_measured]), method.init(p, hyper)), params)
  except (TypeError, jax.errors.ConcretizationTypeError):
    return
  cfg.check_state_matches((state.losses, state.method), expected, "zeroth-order part")


def add_saturating(total: jax.Array, n: jax.Array) -> jax.Array:
  """``total + n`` for int32 counters, stopping at the largest int32 instead of wrapping."""
  top = jnp.iinfo(total.dtype).max
  return jnp.where(total > top - n, top, total + n).astype(total.dtype)


def measure(method: m.Method, noise: m.StepNoise, state: Any, hyper: dict, treedef,
            leaves: list, value_fn: Callable[[Any], Any], dtype: Any) -> m.Measured:
  """The plain path's measurements: ``l0`` (where the method wants it) and every measuring
  pass, each on a perturbed copy of the params (``value_fn`` traced once per kind)."""
  value = lambda p: numerics.check_loss(value_fn(p)).astype(dtype)
  zero = jnp.zeros((), dtype)
  center = jax.lax.cond(hyper["center"], lambda: value(treedef.unflatten(leaves)),
                        lambda: zero)
  offsets = m.measured_offsets(method.passes)
  values = jnp.zeros([len(offsets)], dtype)
  mu = hyper["mu"]

  def one(carry, k, probe, offset):
    center, values = carry
    noise_k = noise.fresh()
    measured = m.Measured(center, values)
    if method.measure == "jvp":
      d = method.displacement(noise_k, state, hyper, probe, measured, jnp.ones((), mu.dtype))
      primal, v = jax.jvp(lambda *xs: value(treedef.unflatten(list(xs))), tuple(leaves),
                          tuple(x.astype(jnp.result_type(p))
                                for x, p in zip(d, leaves, strict=True)))
      center = jnp.where(k == 0, primal, center)  # the loss at theta, from the first jvp
    else:
      step = jnp.asarray(offset, mu.dtype) * mu
      d = method.displacement(noise_k, state, hyper, probe, measured, step)
      v = value(treedef.unflatten(moved(leaves, d)))
    return center, values.at[k].set(v.astype(dtype))

  carry = (center, values)
  if len(offsets) <= 2:
    for k, (probe, offset) in enumerate(offsets):
      carry = one(carry, k, probe, offset)
  else:
    probes = jnp.asarray([j for j, _ in offsets], jnp.int32)
    offs = jnp.asarray([o for _, o in offsets], np.float32)
    carry = jax.lax.fori_loop(0, len(offsets),
                              lambda k, c: one(c, k, probes[k], offs[k]), carry)
  center, values = carry
  return m.Measured(center, values)


def moved(leaves: list, displacements: list) -> list:
  """``theta + delta`` leaf by leaf, combined in the noise dtype and rounded once."""
  return [(jnp.asarray(p).astype(d.dtype) + d).astype(jnp.result_type(p))
          for p, d in zip(leaves, displacements, strict=True)]


def _resolve_value_fn(value_fn: Any, params: Any, value_params: Any) -> Callable[[Any], Any]:
  if value_fn is None:
    raise TypeError(
        "value_fn is required: call tx.update(updates, state, params, value_fn=loss_of_params)"
        " where loss_of_params(params) returns the scalar loss on the current batch"
    )
  if not callable(value_fn):
    raise TypeError(f"value_fn must be callable as value_fn(params) -> scalar, got {value_fn!r}")
  if not has_masked_nodes(params):
    return value_fn
  if value_params is None:
    raise ValueError(
        "this zeroth-order transform sees masked params (optax.masked/multi_transform hand "
        "it the selected leaves only), but value_fn needs all of them: pass "
        "value_params=params to tx.update (hz.make_train_step does this itself)")
  return lambda view: value_fn(merge_view(value_params, view))


# ----------------------------------------------------------------------------------------
# Constructors. The options of HiZOO are stated once, here; the aliases forward them.


def get_hessian(state: Any) -> Any:
  """The current diagonal-Hessian estimate as a dense tree shaped like the params.

  Works on the state of :func:`scale_by_hizoo` or of any chain/wrapper containing it.
  Factored (HiZOO-L) leaves are rebuilt as ``row col^T / sum(row)``, clipped like the
  estimator clips them.
  """
  h = otu.tree_get(state, "hessian")
  bounds = otu.tree_get(state, "hessian_bounds")
  if h is None or bounds is None:
    raise ValueError("get_hessian: state holds no HiZOO Hessian (is it a scale_by_hizoo state?)")
  clip = (bounds[0], bounds[1])
  return jax.tree.map(lambda x: curv.dense(x, clip), h, is_leaf=curv.is_factored)


def forward_passes(state: Any) -> jax.Array | None:
  """Forward passes the zeroth-order transforms in ``state`` have executed so far.

  The count every comparison between methods should use, since a step costs a different
  number of passes per method (MeZO 2, HiZOO 3, FZOO with ``n`` probes ``n + 1``, ...).
  Works on the state of any zeroth-order transform of the library or of any chain or
  wrapper holding one (``optax.chain``, ``optax.inject_hyperparams``, ...), also inside
  ``jax.jit``. Several zeroth-order transforms in one state are added up. A state that was
  ``jax.vmap``-ed (over seeds, say) gives one count per member. The count is what the
  states took in: under ``optax.MultiSteps`` wrapped around the transform, a micro-step
  that does not emit runs its passes and discards them, uncounted (:func:`accumulate`
  measures and counts every micro-batch).

  Args:
    state: an optimizer state.

  Returns:
    An int32 array (``int(...)`` it for logging), or None when ``state`` holds no
    zeroth-order transform (a first-order optimizer's state). Counts stop at the largest
    int32 instead of wrapping.
  """
  counters = [s.forward_passes for s in zo_states(state)]
  if not counters:
    return None
  total = jnp.asarray(counters[0])
  for c in counters[1:]:
    total = add_saturating(total, jnp.asarray(c))
  return total
