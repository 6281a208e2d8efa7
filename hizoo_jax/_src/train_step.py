"""``make_train_step``: the zeroth-order step engine, as lean as an in-place PyTorch step.

The plain ``tx.update`` must keep the caller's params alive while it evaluates
``f(theta +- mu H^{-1/2} z)``, and XLA will not reuse an entry parameter's buffer for an
intermediate, so inside one plain update a perturbed copy of the params always exists
(plus, for HiZOO, the estimate). The engine instead perturbs the params themselves, like
the reference trainer's ``param.data`` updates::

    l0    = f(theta)                      (HiZOO, on Hessian steps)
    theta = theta + mu H^{-1/2} z         (in place; z regenerated from the state's key)
    l+    = f(theta)
    theta = theta - 2 mu H^{-1/2} z       (in place)
    l-    = f(theta)
    theta = theta + mu H^{-1/2} z         (in place: theta again, up to rounding)
    updates, state = tx.update(zeros, state, theta, zo_call=ZOCall(losses=(l0, l+, l-)))
    theta = theta + updates

The last call runs the whole optimizer's own ``update`` with the measured losses, so the
estimator, the Hessian EMA and any Optax chain or wrapper around the ZO transform are the
same code as the plain path; only the perturbed params differ (``restore``).

**The exact restore** (the default for 16-bit params) never moves theta: each measuring
pass evaluates ``f(theta + c mu H^{-1/2} z)`` with the sum formed inside the evaluation,
leaf by leaf, and no conditional around it (XLA materialises a conditional's operands
whole). XLA then forms each perturbed leaf where the forward pass reads it (fused into
the read where it can, e.g. the upcast of a bfloat16 weight for the CPU's dot), so no
perturbed copy of the params exists and the losses and the update are the plain
``tx.update``'s, bit for bit. What XLA holds beyond the forward pass is the perturbed
leaves it forms ahead of their reader: 0.001 params-worth on the 1.1B bfloat16 decoder
(benchmarks/RESULTS.md); on a forward pass that XLA:CPU fuses whole (YNNPACK's fusion of a
small MLP's dots) or schedules for concurrency, up to about a params-worth.

**Passes over the params.** Each move regenerates the noise of every parameter and reads
and writes all of them; with the small batches of zeroth-order fine-tuning these passes
cost as much as the forward passes. So the restoring move runs in the update's own pass
(XLA fuses ``theta - mu z + updates`` into one loop per leaf: MeZO makes 3 passes, not 4),
except for a method whose restore reads a state the update rewrites in place (HiZOO's
dense ``H``: one pass would keep a copy of the old ``H``; SubZero, ZO-Muon: one more
low-rank product). With one-sided probes (FZOO) each probe's restore joins the next
probe's move: ``N`` passes for ``N`` probes, not ``2N`` (:func:`_schedule`). The
trajectories are those of separate passes, bit for bit: every move is still rounded to
the params' dtype in the same order.

**Finding the ZO transform.** ``tx`` may be a bare ``scale_by_*``, an alias, a preset, a
chain, ``optax.inject_hyperparams``, ``optax.MultiSteps``, ``optax.masked`` or
``optax.multi_transform`` around one. The engine traces
``tx.update(..., zo_call=ZOCall(probe=p))``: the ZO transform records its static spec
(sampler, clip, the mask of the params it sees) in ``p`` and returns its state with the
hyperparameters in effect (``mu``, possibly injected or scheduled), which every wrapper
passes through. The engine picks that state out of the result by its type. XLA drops the
rest of the probe as dead code.

**One program.** At top level the step is one jitted executable with the params and the
optimizer state donated; called inside a user's ``jit``, ``lax.scan`` or ``nnx.jit`` the
same function traces into the caller's program. Either way the passes run in a
``lax.fori_loop`` with the params in the loop carry, which XLA rewrites in place: the step
allocates no params-sized temporary beyond what the forward pass itself needs (measured
for every composition above, at top level and inside a user's ``jit``:
benchmarks/RESULTS.md). ``lean=False``, several directions per step, or several ZO
transforms run the plain jitted ``tx.update`` instead.

**Compile time.** A step touches every leaf four times (l0 aside), so a model with
hundreds of tensors would compile hundreds of copies of the noise's ops. The noise is
drawn per group of leaves of one shape (:class:`hizoo_jax._src.sampling.DirectionWords`),
and the leaves' key words are run-time data, so the program holds the noise once per leaf
shape and XLA compiles one kernel per shape (200 tensors: from 11x to about 3x the first
call of a first-order Adam step, benchmarks/RESULTS.md).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.extend.core
import jax.numpy as jnp
import optax

from hizoo_jax._src import method as m
from hizoo_jax._src import numerics, sampling, transform
from hizoo_jax._src import sharding as shard_lib

RESTORE_MODES = ("auto", "inplace", "exact")
"""The values of :func:`hizoo_jax.make_train_step`'s ``restore`` option."""

# ----------------------------------------------------------------------------------------
# Finding the ZO transform inside any composition.


class _Probe:
  """Collects the methods of the ZO transforms an update call reaches."""

  def __init__(self):
    self.found: list[tuple[m.Method, Any, tuple[bool, ...]]] = []

  def record(self, method: m.Method, params_view: Any) -> None:
    leaves, view_def = jax.tree.flatten(params_view, is_leaf=transform.is_masked_node)
    mask = tuple(not transform.is_masked_node(x) for x in leaves)
    entry = (method, view_def, mask)
    if entry not in self.found:  # MultiSteps traces its inner update twice
      self.found.append(entry)


class NoZOTransformError(ValueError):
  """``make_train_step`` was given an optimizer without a zeroth-order transform."""


@dataclasses.dataclass(frozen=True)
class _Located:
  """The one ZO transform of ``tx``: its method, its state now, and its view of the params."""

  method: m.Method
  state: Any
  view_def: Any
  mask: tuple[bool, ...]
  index: int  # of the ZO state among the leaves of the optimizer state (is_zo_state)

  def rebind(self, opt_state) -> _Located:
    """The same transform, reading its key and method state from ``opt_state`` (a state
    of the same structure, e.g. the copy a loop carries) and keeping the options in
    effect that the probe found; no second probe trace."""
    zo = transform.zo_states(opt_state)[self.index]
    return dataclasses.replace(self, state=zo._replace(hyper=self.state.hyper))

  def view(self, params):
    """The params as the ZO transform sees them (``MaskedNode`` at frozen leaves)."""
    parts = self.view_def.flatten_up_to(params)
    return self.view_def.unflatten(
        [p if keep else optax.MaskedNode() for p, keep in zip(parts, self.mask, strict=True)])

  def merge(self, params, view):
    parts = self.view_def.flatten_up_to(params)
    new = self.view_def.flatten_up_to(view)
    return self.view_def.unflatten(
        [n if keep else p for p, n, keep in zip(parts, new, self.mask, strict=True)])

  def noise(self, leaves, prepared=None) -> m.StepNoise:
    key = jax.random.wrap_key_data(self.state.key, impl=self.method.key_impl)
    noise_key, _ = sampling.split_state_key(key)
    return m.StepNoise(self.method.sampler, noise_key, leaves, prepared=prepared)

  def leaf_positions(self, params) -> list[int]:
    """For each leaf of the view (in its order), its index in ``jax.tree.leaves(params)``."""
    parts = self.view_def.flatten_up_to(params)
    out, k = [], 0
    for part, keep in zip(parts, self.mask, strict=True):
      if keep:
        out.append(k)
      k += len(jax.tree.leaves(part))
    return out

  def prepare(self, params):
    """What the method needs from the unperturbed params (see Method.prepare)."""
    leaves = jax.tree.leaves(self.view(params))
    return self.method.prepare(leaves, self.state.method, self.state.hyper)

  def perturb(self, params, coefs, probes, measured, prepared=None, after=(), serial=True):
    """``params`` with the selected leaves moved by ``coefs[w] * mu * D_probes[w]``, one
    move after the other (each rounded to the params' dtype, as separate passes would be)
    but in one pass over the params: XLA fuses the moves of a leaf into one loop.

    ``after``: values the noise is ordered after (see :func:`sampling.tie`); inside a loop,
    the loop index, so that XLA regenerates the noise in each iteration's fused pass
    instead of hoisting the loop-invariant ``mu D`` out of the loop into a params-sized
    buffer.
    """
    st = self.state
    leaves, treedef = jax.tree.flatten(self.view(params))
    method_state = st.method
    if jax.tree.leaves(after):
      # The method's state (e.g. H^{-1/2}) is loop-invariant too, and so are the params of
      # an exact restore (whose float32 upcast XLA would hoist into a params-sized buffer).
      method_state, leaves, prepared, _ = jax.lax.optimization_barrier(
          (method_state, leaves, prepared, after))
    mu = st.hyper["mu"]
    if serial and self.method.serial_products:
      leaves = self._serial_moves(leaves, coefs, probes, method_state, prepared, after)
      return self.merge(params, treedef.unflatten(leaves))
    for coef, probe in zip(coefs, probes, strict=True):
      step = jnp.asarray(coef, mu.dtype) * mu
      d = self.method.displacement(self.noise(leaves, prepared), method_state, st.hyper,
                                   probe, measured, step, after=after)
      leaves = transform.moved(leaves, d)
    return self.merge(params, treedef.unflatten(leaves))

  def _serial_moves(self, leaves, coefs, probes, method_state, prepared, after):
    """The moves of :meth:`perturb` leaf after leaf (``Method.serial_products``): each
    leaf's directions read the method's state plus an exact zero computed from the previous
    leaf's moved value, so its products are formed after that leaf is written (and the
    previous products are freed). A data dependency: an optimization barrier in its place
    does not order them (measured: every product alive at once, as without it)."""
    st, method = self.state, self.method
    mu = st.hyper["mu"]
    noise = self.noise(leaves, prepared)
    words = [noise.words(probe, after) for probe in probes]
    steps = [jnp.asarray(coef, mu.dtype) * mu for coef in coefs]
    out, zero = [], None
    for i, leaf in enumerate(leaves):
      state_i = method_state
      if zero is not None:
        state_i = _tie_leaf_state(method_state, i, len(leaves), zero)
      for w, step in zip(words, steps, strict=True):
        d = method.direction_leaf(noise, state_i, st.hyper, w, i, leaf)
        leaf, = transform.moved([leaf], [step.astype(d.dtype) * d])
      out.append(leaf)
      # A running sum: a leaf whose direction does not read the state (a vector's noise)
      # passes the order on.
      zero = _after_whole([leaf]) + (0 if zero is None else zero)
    return out

  def tangents(self, params, probe, measured):
    """The tree ``D_probe`` (zeros at frozen leaves), the tangent of a ``"jvp"`` method."""
    st = self.state
    leaves, treedef = jax.tree.flatten(self.view(params))
    d = self.method.displacement(self.noise(leaves), st.method, st.hyper, probe, measured,
                                 jnp.ones((), st.hyper["mu"].dtype))
    d = [x.astype(jnp.result_type(p)) for x, p in zip(d, leaves, strict=True)]
    return self.merge(_zeros_like(params), treedef.unflatten(d))


def _zeros_like(params):
  return jax.tree.map(jnp.zeros_like, params)


def _probe(tx, params, opt_state) -> tuple[list, list]:
  probe = _Probe()
  _, probed = tx.update(_zeros_like(params), opt_state, params,
                        zo_call=m.ZOCall(probe=probe))
  return probe.found, transform.zo_states(probed)


_MULTISTEPS_AROUND_ZO = (
    "optax.MultiSteps wraps a zeroth-order transform: it holds the transform's state, and "
    "so its random direction, until it emits, so every micro-step runs its forward passes "
    "along the same direction and all but the emitting one's measurements are discarded "
    "(and left out of hz.forward_passes). For gradient accumulation use hz.accumulate(tx, k): "
    "the step's direction measured on k micro-batches, the step the k together would give.")


def _warn_multisteps_around_zo(opt_state) -> None:
  is_multi = lambda x: isinstance(x, optax.MultiStepsState)  # noqa: E731
  for node in jax.tree.leaves(opt_state, is_leaf=is_multi):
    if is_multi(node) and transform.zo_states(node.inner_opt_state):
      warnings.warn(_MULTISTEPS_AROUND_ZO, UserWarning, stacklevel=2)
      return


def _locate(tx, params, opt_state) -> _Located | None:
  """The one ZO transform in ``tx``; None if there are several; raises if there is none."""
  found, states = _probe(tx, params, opt_state)
  if not found:
    raise NoZOTransformError(_NO_ZO)
  if len(found) != 1 or len(states) != 1:
    return None
  method, view_def, mask = found[0]
  return _Located(method, states[0], view_def, mask, index=0)


_NO_ZO = (
    "make_train_step needs an optimizer containing a zeroth-order transform (hz.hizoo, "
    "hz.hizoo_l, hz.mezo, hz.presets.*, hz.scale_by_hizoo/scale_by_zo, or a chain or "
    "wrapper around one); for first-order optimizers use jax.grad and tx.update")


def _static_info(tx, params, opt_state) -> dict[str, Any]:
  """What the probe finds, without running anything: ``found`` (the specs), ``states``
  (how many ZO states) and ``lean`` (whether the lean engine applies)."""
  info: dict[str, Any] = {}

  def trace(p, s):
    found, states = _probe(tx, p, s)
    info.update(found=found, states=len(states), lean=len(found) == 1 and len(states) == 1)

  jax.eval_shape(trace, params, opt_state)
  return info


def _check_buildable(tx) -> None:
  """Refuses an optimizer without a ZO transform when it can tell at build time.

  It traces ``init`` and a probe ``update`` on a one-leaf stand-in for the params. An
  optimizer that cannot run on that stand-in (e.g. a mask tree for specific params) is
  checked at its first step instead.
  """
  dummy = {"x": jax.ShapeDtypeStruct((2,), jnp.float32)}
  try:
    state = jax.eval_shape(tx.init, dummy)
    info = _static_info(tx, dummy, state)
  except Exception:  # noqa: BLE001 - the stand-in does not fit this optimizer
    return
  if not info["found"]:
    raise NoZOTransformError(_NO_ZO)


# ----------------------------------------------------------------------------------------
# The losses.


class _Loss:
  """``loss_fn`` evaluated with the checks of ``tx.update``, with or without aux."""

  def __init__(self, loss_fn, has_aux, dtype):
    self.loss_fn, self.has_aux, self.dtype = loss_fn, has_aux, dtype

  def __call__(self, params, *batch):
    out = self.loss_fn(params, *batch)
    if self.has_aux:
      if not (isinstance(out, tuple) and len(out) == 2):
        raise ValueError("has_aux=True: loss_fn must return a (loss, aux) pair")
      loss, aux = out
    else:
      loss, aux = out, None
    return numerics.check_loss(loss, "loss_fn").astype(self.dtype), aux

  def zeros(self, params, *batch):
    """A zero loss and aux of the right shapes (the not-taken branch of a cond)."""
    shapes = jax.eval_shape(self, params, *batch)
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def _mean_aux(stacked):
  """The mean of the measured evaluations' aux (slots 1..): floating leaves averaged,
  others taken from the first measured evaluation."""
  def one(x):
    if jnp.issubdtype(jnp.result_type(x), jnp.inexact):
      return (x[1] + x[2]) / 2 if x.shape[0] == 3 else jnp.mean(x[1:], axis=0)
    return x[1]
  return jax.tree.map(one, stacked)


def _final_update(tx, params, opt_state, losses, loc=None):
  """``theta + updates`` and the new state: the optimizer's own ``update`` with the losses
  the step measured, so everything chained after the estimate is the plain path's code.

  One call computes both. The ZO transform then draws the noise of its Hessian update
  with a key XLA cannot merge with the gradient's (``ZOCall.losses`` tells it so), so the
  params' pass and the state's pass each regenerate ``z`` rather than share a stored copy
  (an extra hash per element; measured: 1.0 param bytes of temporaries otherwise).

  Where both passes read the method's stored state (``method.state_after_params``: HiZOO
  with several probes), nothing orders the state's in-place write after the params' read,
  and XLA keeps a copy of the state (1.0 param bytes, measured; an optimization barrier
  does not order them for XLA's copy insertion, a data dependency does). So the method's
  state is taken from a second ``update`` whose losses depend on the new params by an
  exact zero (:func:`_after_written`): XLA drops the first call's state and the second's
  updates as unused, so each pass is still computed once.
  """
  method = None if loc is None else loc.method
  updates, new_state = tx.update(_zeros_like(params), opt_state, params,
                                 zo_call=m.ZOCall(losses=losses), value_params=params)
  params_new = optax.apply_updates(params, updates)
  if method is not None and method.serial_products:
    return _serial_update(tx, params, opt_state, losses, params_new, new_state, loc)
  if method is None or not method.state_after_params:
    return params_new, new_state
  zero = _after_written(params_new)
  l0, values, *rest = losses
  tied = (l0 + zero.astype(l0.dtype), values + zero.astype(values.dtype), *rest)
  _, later = tx.update(_zeros_like(params), opt_state, params,
                       zo_call=m.ZOCall(losses=tied), value_params=params)
  return params_new, _with_method_states(new_state, later)


# A group of leaves whose update products may be alive at once (Method.serial_products):
# up to this fraction of the params' bytes, or one leaf where a leaf is larger.
SERIAL_GROUP_FRACTION = 0.05


def _serial_groups(leaves) -> list[list[int]]:
  """Consecutive leaves in groups of at most ``SERIAL_GROUP_FRACTION`` of the params'
  bytes (a larger leaf alone)."""
  sizes = [int(jnp.size(x)) * jnp.dtype(jnp.result_type(x)).itemsize for x in leaves]
  budget = SERIAL_GROUP_FRACTION * sum(sizes)
  groups, total = [[]], 0
  for i, size in enumerate(sizes):
    if groups[-1] and total + size > budget:
      groups.append([])
      total = 0
    groups[-1].append(i)
    total += size
  return groups


def _serial_update(tx, params, opt_state, losses, params_new, new_state, loc):
  """``(params, state)`` computed group of leaves after group (``Method.serial_products``).

  The products of a leaf's update are formed inside the ZO transform, before the rest of
  the chain, so ordering them after the previous leaves' writes takes one ``update`` per
  group: each call's losses and method state depend on those writes by an exact zero
  (:func:`_after_whole`), and each call estimates its own group's leaves alone
  (``ZOCall.leaves``, ``Method.estimate_some``); XLA drops what a call computes for the other
  leaves. The first call is the full ``update`` (its first group, and every leaf outside
  the ZO transform). The new state comes from the last call: its reads of the method's
  state (e.g. ZO-Muon's projectors) come after every other call's, so the state is written
  in place, with no copy kept for the readers. This holds where the rest of the chain
  treats each leaf alone and keeps no state of the updates (:func:`_leafwise`, read from
  the jaxpr); elsewhere (Adam's moments, a global-norm clip) the single ``update`` is
  kept, with every product formed before any is applied."""
  leaves, treedef = jax.tree.flatten(params_new)
  position = loc.leaf_positions(params)  # ZO leaf i is leaves[position[i]]
  groups = _serial_groups([leaves[k] for k in position])
  if len(groups) < 2 or not _leafwise(tx, params, opt_state, losses, position, groups[1]):
    return params_new, new_state
  out = list(leaves)
  l0, values, *rest = losses
  state = new_state
  for prev, group in zip(groups[:-1], groups[1:], strict=True):
    zero = _after_whole([out[position[i]] for i in prev])
    tied = (l0 + zero.astype(l0.dtype), values + zero.astype(values.dtype), *rest)
    updates, state = tx.update(_zeros_like(params), _tied_method_states(opt_state, zero),
                               params, value_params=params,
                               zo_call=m.ZOCall(losses=tied, leaves=tuple(group)))
    later = jax.tree.leaves(optax.apply_updates(params, updates))
    for i in group:
      out[position[i]] = later[position[i]]
  return treedef.unflatten(out), state


def _leafwise(tx, params, opt_state, losses, position, group) -> bool:
  """Whether the updates of ``group``'s leaves depend on the ZO estimate of those leaves
  alone, and the new state on no estimate, read from the jaxpr of ``tx.update`` with the
  other leaves' estimates as inputs. A transform after the estimate that reduces over
  every leaf (``clip_by_global_norm``, ``apply_if_finite``) or keeps a state of the updates
  (Adam's moments) fails it, as does anything the walk cannot see into (a nested call
  counts as depending on all of its inputs)."""
  group = set(group)
  full = jax.tree.leaves(params)
  outside = [jnp.zeros(jnp.shape(full[k]), sampling.noise_dtype(jnp.result_type(full[k])))
             for i, k in enumerate(position) if i not in group]

  def updates_of_group(outside):
    call = m.ZOCall(losses=losses, leaves=tuple(sorted(group)), outside=outside)
    updates, state = tx.update(_zeros_like(params), opt_state, params, zo_call=call,
                               value_params=params)
    ups = jax.tree.leaves(updates)
    return [ups[position[i]] for i in sorted(group)], jax.tree.leaves(state)

  jaxpr = jax.make_jaxpr(updates_of_group)(outside).jaxpr
  tainted = set(jaxpr.invars)
  for eqn in jaxpr.eqns:
    if any(not isinstance(v, jax.extend.core.Literal) and v in tainted for v in eqn.invars):
      tainted.update(eqn.outvars)
  return not any(not isinstance(v, jax.extend.core.Literal) and v in tainted
                 for v in jaxpr.outvars)


def _plus(tree, zero):
  """``tree`` plus the exact zero ``zero``: the same values, computed after it."""
  return jax.tree.map(lambda a: a + zero.astype(a.dtype), tree)


def _tie_leaf_state(state, i, n, zero):
  """``state`` plus ``zero`` where leaf ``i``'s directions read it: of a NamedTuple state
  whose fields are tuples with one entry per leaf (the low-rank methods'), entry ``i`` of
  each such field and the other fields whole; of any other state, all of it. (Tying every
  entry for every leaf would trace n² additions.)"""
  tie = lambda tree: _plus(tree, zero)
  if not (isinstance(state, tuple) and hasattr(state, "_fields")):
    return tie(state)
  return state._replace(**{
      f: (tuple(tie(x) if k == i else x for k, x in enumerate(v))
          if isinstance(v, tuple) and len(v) == n else tie(v))
      for f, v in zip(state._fields, state, strict=True)})


def _tied_method_states(opt_state, zero):
  """``opt_state`` with each ZO state's method state plus ``zero`` (the same values,
  computed after whatever ``zero`` depends on)."""
  return jax.tree.map(
      lambda a: a._replace(method=_plus(a.method, zero)) if transform.is_zo_state(a) else a,
      opt_state, is_leaf=transform.is_zo_state)


def _after_written(tree) -> jax.Array:
  """An int32 0 that depends on every non-empty leaf of ``tree`` (one element of each,
  compared with +inf: false for every value, NaN included, and not folded by XLA), so
  whatever uses it is computed after those leaves are."""
  flags = [jnp.ravel(x)[0] > jnp.inf for x in jax.tree.leaves(tree) if jnp.size(x)]
  return sum((f.astype(jnp.int32) for f in flags), jnp.zeros((), jnp.int32))


def _after_whole(leaves) -> jax.Array:
  """An int32 0 that depends on every element of ``leaves`` (the largest element above
  +inf: false for every value, NaN included): unlike :func:`_after_written`, XLA cannot
  compute it from a slice of the producer's inputs, so the producer's whole pass comes
  first. (``any(x > inf)`` would store the comparison's boolean array.)"""
  flags = [jnp.max(x) > jnp.inf for x in leaves if jnp.size(x)]
  return sum((f.astype(jnp.int32) for f in flags), jnp.zeros((), jnp.int32))


def _with_method_states(opt_state, source):
  """``opt_state`` with each ZO state's method state taken from ``source`` (same
  structure)."""
  return jax.tree.map(
      lambda a, b: a._replace(method=b.method) if transform.is_zo_state(a) else a,
      opt_state, source, is_leaf=transform.is_zo_state)


def _logged_loss(opt_state):
  """The loss the (first) ZO state recorded for the step."""
  return transform.zo_states(opt_state)[0].loss


def _outputs(params, opt_state, aux, has_aux, loss=None):
  # A copy: the state's own field is donated with the state at the next step.
  loss = jnp.copy(_logged_loss(opt_state)) if loss is None else loss
  return (params, opt_state, loss, aux) if has_aux else (params, opt_state, loss)


# ----------------------------------------------------------------------------------------
# The steps.


def _one_pass_step(tx, loss_fn, has_aux, restore, fused_noise_only=False,
                   batch_probes=False):
  """The lean step as one traceable function (one executable when jitted); the plain step
  where it does not apply, or, with ``fused_noise_only``, where it does not pay."""

  def step(params, opt_state, *batch):
    loc = _locate(tx, params, opt_state)
    if batch_probes:
      if loc is None:
        raise ValueError("batch_probes=True needs one zeroth-order transform in tx")
      return _batched_step(tx, loc, _Loss(loss_fn, has_aux, numerics.loss_dtype(params)),
                           has_aux, params, opt_state, batch)
    if loc is None or (fused_noise_only and not isinstance(loc.method.sampler,
                                                           sampling.FastGaussian)):
      # A sampler that does not fuse into the elementwise passes (threefry) materialises
      # the noise in each of them, and in one program XLA keeps those buffers apart: the
      # lean step would hold more than the plain one (MeZO 4.0 vs 2.5, HiZOO 5.5 vs 4.5
      # param bytes over a forward pass, benchmarks/RESULTS.md).
      return _plain_fn(tx, loss_fn, has_aux)(params, opt_state, *batch)
    f = _Loss(loss_fn, has_aux, numerics.loss_dtype(params))
    if loc.method.measure == "jvp":
      return _jvp_step(tx, loc, f, has_aux, params, opt_state, batch)
    zero = f.zeros(params, *batch)
    inplace = _inplace_restore(restore, params)
    # The passes of the method: the params move by coef * mu * D_probe at each and the
    # loss is measured where slot > 0 (slot 0 holds l0, measured first at theta where the
    # method asks for it). In place, the coefficients of each probe sum to 0 and the last
    # pass restores theta with no evaluation; with an exact restore, each measuring pass
    # evaluates the loss at theta + offset mu D formed inside the evaluation (theta stays
    # in the carry, unwritten, until the update). What makes XLA
    # keep no params-sized temporary (each measured on the 403 MB benchmark model,
    # benchmarks/RESULTS.md):
    # - the losses, l0 included, ride in the carry and pass the barrier with the params,
    #   so the loop's in-place writes come after l0's read of theta (else: a copy);
    # - every evaluation in the loop reads the pass's output, not the carried params;
    # - the optimizer state rides in the carry and the noise and the method's state are
    #   tied to the loop index (else XLA hoists the loop-invariant mu D out of the loop
    #   into a params-sized buffer: 1.0 and 2.2 param bytes for MeZO and HiZOO);
    # - the final update comes after a second barrier, not interleaved with the loop.
    rows, tail = _schedule(loc.method, inplace)
    probes = jnp.asarray([[j for j, _ in moves] for moves, _ in rows], jnp.int32)
    coefs = jnp.asarray([[c for _, c in moves] for moves, _ in rows], jnp.float32)
    slots = jnp.asarray([k for _, k in rows], jnp.int32)
    n_slots = 1 + loc.method.num_measured

    def body(i, carry):
      p, work, s, outs, prepared = carry
      here = loc.rebind(s)
      measured = m.Measured(outs[0][0], outs[0][1:])
      k = slots[i]
      if not inplace:
        # Every pass measures, at theta + offset mu D: the perturbed leaves are
        # temporaries of the evaluation, no buffer of the carry, and no conditional
        # (whose operands XLA would materialise whole before it runs). The batch is tied
        # to the loop index: else XLA hoists what the forward pass computes from the batch
        # alone (LoRA's frozen projections) out of the loop and keeps it alive across the
        # passes (measured: 22.5 LoRA-params-worth on the tiny Llama). Leaves are not
        # ordered one after the other (serial_products): that order is the params', not
        # the forward pass's, so every perturbed leaf would wait for its reader. ZO-Muon
        # on the tiny Llama, params-worth beyond the forward pass's: 0.14 unordered under
        # XLA:CPU's memory-minimising scheduler; under its default (concurrency) one,
        # which forms every leaf's product before the forward pass reads any, 1.64
        # unordered and 0.94 ordered.
        here_batch, _ = jax.lax.optimization_barrier((batch, i))
        out = f(here.perturb(p, list(coefs[i]), list(probes[i]), measured, prepared,
                             after=i, serial=False), *here_batch)
        outs = jax.tree.map(lambda a, o: a.at[k].set(o), outs, out)
        return p, work, s, outs, prepared
      work = here.perturb(work, list(coefs[i]), list(probes[i]), measured,
                          prepared, after=i)
      out = jax.lax.cond(k > 0, lambda: f(work, *batch), lambda: zero)
      outs = jax.tree.map(lambda a, o: a.at[k].set(jnp.where(k > 0, o, a[k])), outs, out)
      return p, work, s, outs, prepared

    l0 = jax.lax.cond(loc.state.hyper["center"], lambda: f(params, *batch), lambda: zero)
    outs = jax.tree.map(lambda z: jnp.zeros((n_slots,) + z.shape, z.dtype).at[0].set(z), l0)
    prepared = loc.prepare(params)
    params, opt_state, outs, prepared = jax.lax.optimization_barrier(
        (params, opt_state, outs, prepared))
    if inplace:
      _, params, opt_state, outs, prepared = jax.lax.fori_loop(
          0, len(rows), body, ((), params, opt_state, outs, prepared))
    else:
      params, _, opt_state, outs, prepared = jax.lax.fori_loop(
          0, len(rows), body, (params, (), opt_state, outs, prepared))
    losses = outs[0]
    params, opt_state, prepared = jax.lax.optimization_barrier((params, opt_state, prepared))
    if tail:
      # The restoring moves, outside the loop: XLA fuses them into the update's pass over
      # the params (one noise regeneration and one read-write of the params fewer).
      params = loc.rebind(opt_state).perturb(
          params, [c for _, c in tail], [j for j, _ in tail],
          m.Measured(losses[0], losses[1:]), prepared)
    params, opt_state = _final_update(tx, params, opt_state,
                                      (losses[0], losses[1:], prepared), loc)
    aux = _mean_aux(outs[1]) if has_aux else None
    return _outputs(params, opt_state, aux, has_aux)

  return step


Move = tuple[int, float]  # (probe, coefficient): params += coefficient * mu * D_probe


def _schedule(method: m.Method, inplace: bool
              ) -> tuple[list[tuple[tuple[Move, ...], int]], tuple[Move, ...]]:
  """``(rows, tail)``: each row of the engine's loop is one pass over the params, making
  its moves and then measuring into its slot (0: no evaluation); ``tail`` is the moves that
  restore theta after the last measurement, which the step folds into the update's pass
  (unless the method says otherwise: :attr:`Method.restore_in_update`).

  In place, a non-measuring pass (a probe's restore) joins the next measuring pass when
  that leaves at most one row with fewer moves than the widest (one-sided probes: ``N``
  passes instead of ``2N``). Rows are padded to one width with zero moves, which cost a
  noise draw and no pass over memory; the two-sided probes' restores stay passes of their
  own, since merging them would pad ``N + 1`` rows of ``2N``. With an exact restore, only
  the measuring passes run, each evaluating the loss at its offset from theta (formed
  from theta where the forward pass reads each leaf), and there is no tail."""
  if not inplace:
    return [(((j, o),), k + 1) for k, (j, o) in enumerate(m.measured_offsets(method.passes))], ()
  merged, pending, k = [], [], 0
  for j, c, measures in method.passes:
    pending.append((j, c))
    if measures:
      k += 1
      merged.append((tuple(pending), k))
      pending = []
  tail = tuple(pending)
  if tail and not method.restore_in_update:
    merged.append((tail, 0))
    tail = ()
  width = max(len(moves) for moves, _ in merged)
  if sum(len(moves) < width for moves, _ in merged) > 1:
    # Unmerged: every pass its own row, the restores measuring nothing.
    merged = [(((mv,), 0) if i < len(moves) - 1 else ((mv,), k))
              for moves, k in merged for i, mv in enumerate(moves)]
    width = 1
  return [(moves + ((0, 0.0),) * (width - len(moves)), k) for moves, k in merged], tail


def _jvp_step(tx, loc, f, has_aux, params, opt_state, batch):
  """The engine for a method that measures directional derivatives (``jax.jvp``): the
  params are not moved; each probe's tangent tree ``D_j`` is built for its jvp (the
  tangent is an input of the forward pass, so it exists as a buffer: one params-worth,
  in the params' dtype, besides what the forward pass itself needs)."""
  n = loc.method.num_measured
  dtype = f.dtype
  values = jnp.zeros([n], dtype)
  center, aux = jnp.zeros((), dtype), None
  for k, (probe, _) in enumerate(m.measured_offsets(loc.method.passes)):
    d = loc.tangents(params, probe, m.Measured(center, values))
    (loss, a), (dloss, _) = jax.jvp(lambda p: f(p, *batch), (params,), (d,))
    values = values.at[k].set(dloss.astype(dtype))
    if k == 0:
      center, aux = loss, a
  params, opt_state = _final_update(tx, params, opt_state, (center, values), loc)
  return _outputs(params, opt_state, aux, has_aux)


def _batched_step(tx, loc, f, has_aux, params, opt_state, batch):
  """Every measured point of the step in one batched forward pass (``jax.vmap`` over the
  probes): the perturbed params ``theta + offset mu D_j`` of all ``N`` measuring passes
  are built side by side (``N`` params-sized copies of the perturbed leaves) and the loss
  is evaluated on all of them at once. On an accelerator, where one small-batch forward
  pass leaves the device mostly idle, ``N`` of them cost little more than one. Only for
  methods whose probes do not depend on each other's losses (not HiZOO with several
  probes, whose later probes use the Hessian updated by the earlier ones)."""
  method = loc.method
  if method.measure != "loss":
    raise ValueError(f"batch_probes=True: {method.name} measures {method.measure!r}, not "
                     "losses at perturbed params")
  if not method.independent_probes:
    raise ValueError(f"batch_probes=True: the probes of {method.name} depend on each "
                     "other's losses (its later probes use the state the earlier ones "
                     "updated); use the sequential step")
  offsets = m.measured_offsets(method.passes)
  probes = jnp.asarray([j for j, _ in offsets], jnp.int32)
  coefs = jnp.asarray([o for _, o in offsets], jnp.float32)
  prepared = loc.prepare(params)
  dtype = f.dtype
  nothing = m.Measured(jnp.zeros((), dtype), jnp.zeros([method.num_measured], dtype))
  perturbed = jax.vmap(lambda j, c: loc.perturb(params, [c], [j], nothing, prepared))(
      probes, coefs)
  values, aux = jax.vmap(lambda p: f(p, *batch))(perturbed)
  zero = f.zeros(params, *batch)
  l0, aux0 = jax.lax.cond(loc.state.hyper["center"], lambda: f(params, *batch), lambda: zero)
  params, opt_state = _final_update(tx, params, opt_state, (l0, values, prepared), loc)
  if has_aux:
    aux = _mean_aux(jax.tree.map(lambda a, s: jnp.concatenate([a[None], s]), aux0, aux))
  return _outputs(params, opt_state, aux, has_aux)


def _plain_fn(tx, loss_fn, has_aux):
  def step(params, opt_state, *batch):
    if has_aux:
      raise ValueError(
          "has_aux=True needs the lean step (one direction per step and one zeroth-order "
          "transform); this optimizer runs the plain tx.update, which cannot return aux")
    value_fn = lambda p: loss_fn(p, *batch)
    updates, opt_state = tx.update(_zeros_like(params), opt_state, params, value_fn=value_fn,
                                   value_params=params)
    params = optax.apply_updates(params, updates)
    return _outputs(params, opt_state, None, False)

  return step


def _inplace_restore(restore: str, params: Any) -> bool:
  if restore != "auto":
    return restore == "inplace"
  # Only floating leaves are perturbed (a frozen integer leaf under optax.masked is not).
  return all(jnp.finfo(jnp.result_type(x)).bits >= 32 for x in jax.tree.leaves(params)
             if jnp.issubdtype(jnp.result_type(x), jnp.inexact))


def _is_traced(tree) -> bool:
  return any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(tree))


def make_train_step(
    tx: optax.GradientTransformationExtraArgs,
    loss_fn: Callable[..., Any],
    *,
    has_aux: bool = False,
    lean: bool | None = None,
    restore: str = "auto",
    donate: bool = True,
    param_shardings: Any = None,
    batch_sharding: Any = None,
    batch_probes: bool = False,
) -> Callable[..., tuple]:
  """Builds ``step(params, opt_state, *batch) -> (params, opt_state, loss)``.

  ``loss_fn(params, *batch)`` returns the scalar loss of a batch. At top level the step is
  jit-compiled with ``params`` and ``opt_state`` donated (their buffers are reused for the
  outputs: do not touch the arguments after the call). Called inside a user's ``jax.jit``,
  ``lax.scan`` or ``nnx.jit`` it traces into the caller's program as one lean pass. The
  returned ``loss`` is the one the optimizer recorded for the step (``l0`` on HiZOO
  Hessian steps, else the mean of ``(l+ + l-) / 2``).

  Args:
    tx: any optimizer containing one zeroth-order transform: ``hz.hizoo``, ``hz.hizoo_l``,
      ``hz.mezo``, ``hz.presets.*``, a bare ``hz.scale_by_*``, or a chain,
      ``optax.inject_hyperparams``, ``optax.MultiSteps``, ``optax.masked``,
      ``optax.multi_transform`` or ``optax.apply_if_finite`` around one. An optimizer
      without one raises ValueError (at build time when a one-leaf stand-in can tell).
    loss_fn: ``loss_fn(params, *batch) -> scalar`` (``-> (scalar, aux)`` with ``has_aux``).
    has_aux: ``loss_fn`` returns ``(loss, aux)``; the step then returns ``(params,
      opt_state, loss, aux)`` with ``aux`` the mean of the two perturbed evaluations'
      ``aux`` (floating leaves; other leaves from ``theta + mu z``), like the logged loss of
      MeZO. Needs the lean step (one direction per step).
    lean: None (default): the lean engine whenever it applies (one direction per step, one
      ZO transform) and pays, else the plain step. It does not pay with a sampler that
      does not fuse into the elementwise passes (anything but ``hz.fast_gaussian``, e.g.
      ``hz.gaussian``): that sampler's noise is materialised in every pass, and the plain
      step holds less (unless ``has_aux``, which needs the lean engine). ``False``: always
      the plain step, one jitted ``tx.update`` (keeps a perturbed copy of the params and the
      estimate alive).
      ``True``: the lean engine, or an error where it does not apply.
    restore: ``"exact"`` never writes a perturbed value into ``theta``: each measuring
      pass forms ``theta + c mu D`` leaf by leaf where the forward pass reads it, so the
      step is the plain update bit for bit and holds no perturbed copy of the params (a
      perturbed leaf at a time, or the few leaves XLA forms ahead of their reader; on
      the 1.1B bfloat16 decoder 0.001 params-worth beyond the forward pass's, compiled).
      ``"inplace"`` moves ``theta`` itself and adds the perturbation back, like the
      reference code: nothing leaf-sized beyond the forward pass's, but ``theta`` drifts
      by about one ulp (RMS) per step, as a random walk. ``"auto"`` (default): exact if
      any params leaf is 16-bit, else in place. Measured (benchmarks/RESULTS.md): after
      300 steps the in-place drift is 1e-6 of RMS(theta) in float32 but 7% in bfloat16.
    donate: donate ``params`` and ``opt_state`` to the top-level step.
    param_shardings: a ``NamedSharding`` for all params, or a tree of them shaped like the
      params. The step returns params (and optimizer state, sharded like the params)
      with these shardings. None: whatever the inputs have.
    batch_sharding: a sharding (or a tuple, one per batch argument) the batch is put on
      before the step (e.g. ``NamedSharding(mesh, P("data"))`` for data parallelism).
    batch_probes: evaluate every perturbed point of the step in one batched forward pass
      (``jax.vmap`` over the probes) instead of one after the other. For methods with
      several independent probes (FZOO, ZO-Muon, MeZO with ``num_directions``) on an
      accelerator, where a small-batch forward pass leaves the device mostly idle. It
      holds ``N`` perturbed copies of the trainable params (``N``: the measuring passes
      of a step; cheap for LoRA, ``N`` params-worth for full fine-tuning), and the
      losses are those of ``restore="exact"`` (each point is built from ``theta``).
  """
  if restore not in RESTORE_MODES:
    raise ValueError(f"restore must be one of {RESTORE_MODES}, got {restore!r}")
  _check_buildable(tx)
  layout = _Layout(param_shardings, batch_sharding)
  donated = (0, 1) if donate else ()
  plain = _plain_fn(tx, loss_fn, has_aux)
  if batch_probes and lean is False:
    raise ValueError("batch_probes=True runs the lean engine; it cannot be combined with "
                     "lean=False")
  fused = _one_pass_step(tx, loss_fn, has_aux, restore,
                         fused_noise_only=lean is None and not has_aux and not batch_probes,
                         batch_probes=batch_probes)

  def traced_step(params, opt_state, *batch):
    _warn_multisteps_around_zo(opt_state)  # at trace time: once per compiled step
    if lean is False:
      return plain(params, opt_state, *batch)
    if lean is True:
      if _locate(tx, params, opt_state) is None:
        raise ValueError(_NOT_LEAN)
    return fused(params, opt_state, *batch)

  def build(params, opt_state):
    p_sh, s_sh, rep = layout.of(params, opt_state)
    outs = None if p_sh is None else (p_sh, s_sh, rep) + ((None,) if has_aux else ())
    jit_kw = {} if outs is None else dict(out_shardings=outs)
    info = _static_info(tx, params, opt_state)
    if not info["found"]:
      raise NoZOTransformError(_NO_ZO)
    if lean is True and not info["lean"]:
      raise ValueError(_NOT_LEAN)
    return jax.jit(traced_step, donate_argnums=donated, **jit_kw)

  get = _cached(build)

  def step(params, opt_state, *batch):
    if _is_traced((params, opt_state, batch)):
      return traced_step(params, opt_state, *batch)
    return get(params, opt_state)(params, opt_state, *layout.put_batch(batch))

  def lower(params, opt_state, *batch):
    """The top-level step lowered for these arguments (``.compile().memory_analysis()``,
    ``.as_text()``), as ``jax.jit(...).lower``."""
    return get(params, opt_state).lower(params, opt_state, *layout.put_batch(batch))

  step.lower = lower
  return step


_NOT_LEAN = ("lean=True needs one zeroth-order transform with one direction per step; use "
             "lean=None (falls back to the plain step) or lean=False")


class _Layout:
  """Shardings of params, optimizer state and batch (all None without a mesh)."""

  def __init__(self, param_shardings, batch_sharding):
    self.param_shardings = param_shardings
    self.batch_sharding = batch_sharding

  def of(self, params, opt_state):
    """``(param shardings tree, state shardings tree, replicated)`` or Nones."""
    if self.param_shardings is None:
      return None, None, None
    p = shard_lib.as_tree(self.param_shardings, params)
    mesh = shard_lib.mesh_of(p)
    return p, shard_lib.state_shardings(opt_state, params, p), \
        jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

  def put_batch(self, batch):
    if self.batch_sharding is None:
      return batch
    s = self.batch_sharding
    shardings = s if isinstance(s, tuple | list) else (s,) * len(batch)
    return tuple(jax.device_put(b, sh) for b, sh in zip(batch, shardings, strict=True))


def _cached(build):
  """Builds the step once per (params, state) structure."""
  cache = {}

  def get(params, opt_state):
    key = (jax.tree.structure(params), jax.tree.structure(opt_state),
           tuple((jnp.shape(x), jnp.result_type(x)) for x in jax.tree.leaves(params)))
    if key not in cache:
      cache[key] = build(params, opt_state)
    return cache[key]

  return get
