"""Finding the one zeroth-order transform inside any composition of optimizers.

The engine traces ``tx.update(..., zo_call=ZOCall(probe=p))``: the ZO transform records
its method and its view of the params in ``p`` and returns its state with the options in
effect, which every wrapper passes through; :class:`Located` is what the engine then knows
of it (its method, state, view of the params) and how it moves the params.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import jax
import jax.extend.core
import jax.numpy as jnp
import optax

from hizoo_jax._src import method as m
from hizoo_jax._src import sampling, transform
from hizoo_jax._src.engine import order


class Probe:
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
class Located:
  """The one ZO transform of ``tx``: its method, its state now, and its view of the params."""

  method: m.Method
  state: Any
  view_def: Any
  mask: tuple[bool, ...]
  index: int  # of the ZO state among the leaves of the optimizer state (is_zo_state)

  def rebind(self, opt_state) -> Located:
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

  def prepare(self, params, opt_state):
    """``(opt_state, prepared)`` for the step's passes: the optimizer state with the
    method's state as this step reads it (see Method.prepare) in place of the stored one,
    which the passes never read (so XLA may write the one over the other), and what else
    the method needs from the unperturbed params."""
    noise = self.noise(jax.tree.leaves(self.view(params)))
    method_state, prepared = self.method.prepare(noise, self.state.method, self.state.hyper)
    if not self.method.prepares_state:
      return opt_state, prepared
    return self._with_method_state(opt_state, method_state), prepared

  def for_update(self, opt_state, stored, prepared):
    """``(opt_state, prepared)`` for the final update: the optimizer state with the stored
    method state ``stored`` back in place, so that a wrapper that keeps the state it was
    given when it skips a step keeps the user's, and ``(the method state the passes read,
    prepared)``, which the ZO transform takes as :attr:`ZOCall.losses` ``[2]``. Where no
    wrapper keeps it, nothing reads ``stored`` after :meth:`prepare`. (A method whose
    state the preparation leaves as it is hands ``None`` for it.)"""
    if not self.method.prepares_state:
      return opt_state, (None, prepared)
    step_state = transform.zo_states(opt_state)[self.index].method
    return self._with_method_state(opt_state, stored), (step_state, prepared)

  def _with_method_state(self, opt_state, method_state):
    found = iter(range(len(transform.zo_states(opt_state))))
    return jax.tree.map(
        lambda a: (a._replace(method=method_state) if next(found) == self.index else a)
        if transform.is_zo_state(a) else a, opt_state, is_leaf=transform.is_zo_state)

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
        state_i = order.tie_leaf_state(method_state, i, len(leaves), zero)
      for w, step in zip(words, steps, strict=True):
        d = method.direction_leaf(noise, state_i, st.hyper, w, i, leaf)
        leaf, = transform.moved([leaf], [step.astype(d.dtype) * d])
      out.append(leaf)
      # A running sum: a leaf whose direction does not read the state (a vector's noise)
      # passes the order on.
      zero = order.after_whole([leaf]) + (0 if zero is None else zero)
    return out

  def tangents(self, params, probe, measured):
    """The tree ``D_probe`` (zeros at frozen leaves), the tangent of a ``"jvp"`` method."""
    st = self.state
    leaves, treedef = jax.tree.flatten(self.view(params))
    d = self.method.displacement(self.noise(leaves), st.method, st.hyper, probe, measured,
                                 jnp.ones((), st.hyper["mu"].dtype))
    d = [x.astype(jnp.result_type(p)) for x, p in zip(d, leaves, strict=True)]
    return self.merge(zeros_like(params), treedef.unflatten(d))


def zeros_like(params):
  return jax.tree.map(jnp.zeros_like, params)


def find_transforms(tx, params, opt_state) -> tuple[list, list]:
  probe = Probe()
  _, probed = tx.update(zeros_like(params), opt_state, params,
                        zo_call=m.ZOCall(probe=probe))
  return probe.found, transform.zo_states(probed)


_MULTISTEPS_AROUND_ZO = (
    "optax.MultiSteps wraps a zeroth-order transform: it holds the transform's state, and "
    "so its random direction, until it emits, so every micro-step runs its forward passes "
    "along the same direction and all but the emitting one's measurements are discarded "
    "(and left out of hz.forward_passes). For gradient accumulation use hz.accumulate(tx, k): "
    "the step's direction measured on k micro-batches, the step the k together would give.")


def warn_multisteps_around_zo(opt_state) -> None:
  is_multi = lambda x: isinstance(x, optax.MultiStepsState)  # noqa: E731
  for node in jax.tree.leaves(opt_state, is_leaf=is_multi):
    if is_multi(node) and transform.zo_states(node.inner_opt_state):
      warnings.warn(_MULTISTEPS_AROUND_ZO, UserWarning, stacklevel=2)
      return


def locate(tx, params, opt_state) -> Located | None:
  """The one ZO transform in ``tx``; None if there are several; raises if there is none."""
  found, states = find_transforms(tx, params, opt_state)
  if not found:
    raise NoZOTransformError(NO_ZO)
  if len(found) != 1 or len(states) != 1:
    return None
  method, view_def, mask = found[0]
  return Located(method, states[0], view_def, mask, index=0)


NO_ZO = (
    "make_train_step needs an optimizer containing a zeroth-order transform (hz.hizoo, "
    "hz.hizoo_l, hz.mezo, hz.presets.*, hz.scale_by_hizoo/scale_by_zo, or a chain or "
    "wrapper around one); for first-order optimizers use jax.grad and tx.update")


def static_info(tx, params, opt_state) -> dict[str, Any]:
  """What the probe finds, without running anything: ``found`` (the specs), ``states``
  (how many ZO states) and ``lean`` (whether the lean engine applies)."""
  info: dict[str, Any] = {}

  def trace(p, s):
    found, states = find_transforms(tx, p, s)
    info.update(found=found, states=len(states), lean=len(found) == 1 and len(states) == 1)

  jax.eval_shape(trace, params, opt_state)
  return info


def check_buildable(tx) -> None:
  """Refuses an optimizer without a ZO transform when it can tell at build time.

  It traces ``init`` and a probe ``update`` on a one-leaf stand-in for the params. An
  optimizer that cannot run on that stand-in (e.g. a mask tree for specific params) is
  checked at its first step instead.
  """
  dummy = {"x": jax.ShapeDtypeStruct((2,), jnp.float32)}
  try:
    state = jax.eval_shape(tx.init, dummy)
    info = static_info(tx, dummy, state)
  except Exception:  # noqa: BLE001 - the stand-in does not fit this optimizer
    return
  if not info["found"]:
    raise NoZOTransformError(NO_ZO)
