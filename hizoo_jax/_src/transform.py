"""The zeroth-order gradient transformation: any method of :mod:`hizoo_jax._src.method`.

:func:`zo_transform` turns a method object into an ``optax.GradientTransformationExtraArgs``
that emits the method's estimate ``g`` as its updates, so any Optax chain can follow it. It
ignores the incoming ``updates`` and instead evaluates the loss through ``value_fn(params)``,
passed as an extra argument to ``update``. The constructors of this file (``scale_by_zo``,
``scale_by_hizoo``, ...) state each method's options once; the aliases forward them.

Extra arguments of ``update`` (all keyword-only):

* ``value_fn(params) -> scalar``: the loss of the current batch (required).
* ``key``: a PRNG key overriding the state's key for this call.
* ``value_params``: the full params ``value_fn`` takes, when the transform sees only some
  of them (``optax.masked`` and ``optax.multi_transform`` hand it the selected leaves;
  :func:`hizoo_jax.make_train_step` passes this itself).
* ``zo_losses = (l0, values[, prepared])``: the values measured by the caller at exactly
  this step's passes (the engine measures them on in-place perturbed params), and what
  the method prepared from the unperturbed params; ``value_fn`` is then not called.
* ``zo_probe``: used by :func:`hizoo_jax.make_train_step` to find the transform inside any
  composition; the call then records its method and view of the params and returns the
  state unchanged but for the options in effect (``hyper``), which every wrapper passes
  through.
* ``zo_leaves``: flat indices of the leaves (of this transform's view of the params) whose
  estimate the caller uses; the others may come back as zeros (``Method.estimate_some``).
  The lean engine passes it when it orders the leaves of a method whose products are
  matmuls (``Method.serial_products``), and, to check that the rest of the chain treats
  each leaf alone, ``zo_outside``: the values to use for the other leaves.
"""

from __future__ import annotations

import dataclasses
import inspect
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
from hizoo_jax._src.methods import forward_gradient as fg_method
from hizoo_jax._src.methods import fzoo as fzoo_method
from hizoo_jax._src.methods import hizoo as hizoo_method
from hizoo_jax._src.methods import lozo as lozo_method
from hizoo_jax._src.methods import sparse_mezo as sparse_method
from hizoo_jax._src.methods import spsa
from hizoo_jax._src.methods import subzero as subzero_method
from hizoo_jax._src.methods import zo_muon as zo_muon_method
from hizoo_jax._src.methods.hizoo import HiZOOState

ScalarOrSchedule = float | jax.Array | optax.Schedule

__all__ = ["HiZOOState", "ZOState", "forward_passes", "get_hessian", "scale_by_forward_gradient",
           "scale_by_fzoo", "scale_by_hizoo", "scale_by_lozo", "scale_by_sparse_mezo",
           "scale_by_subzero", "scale_by_zo_muon", "scale_by_zo", "zo_transform"]


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

  def resolved(params, state=None) -> m.Method:
    """The method for these params, with its static options: from the options, or (traced
    under inject_hyperparams: the number of probes, a low-rank method's rank) from the
    shapes of the state that init built when they were concrete."""
    method_ = method.for_params(params)
    if state is not None:
      method_ = method_.resolve(state.method)
    if method_.num_probes is not None:
      return method_
    if state is None:
      raise TypeError(
          "num_directions must be a concrete int at init; under optax.inject_hyperparams "
          "pass static_args=('num_directions',)")
    per_probe = dataclasses.replace(method_, num_probes=1).num_measured
    return dataclasses.replace(method_, num_probes=state.losses.shape[0] // per_probe)

  def keys_of(state, key=None):
    """``(noise key of this step, key of the next state)``."""
    noise_key, next_key = sampling.split_state_key(
        jax.random.wrap_key_data(state.key, impl=method.key_impl))
    if key is not None:
      noise_key, _ = sampling.split_state_key(cfg.as_typed_key(key, method.key_impl))
    return noise_key, next_key

  def init_fn(params):
    cfg.check_params(params)
    method_ = resolved(params)
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
                           method_.in_effect(hyper, count, params, state)),
        method=state,
    )

  def update_fn(updates, state, params=None, *, value_fn=None, key=None, zo_losses=None,
                value_params=None, zo_probe=None, zo_leaves=None, zo_outside=None,
                **extra_args):
    del updates, extra_args  # ZO transforms measure the loss themselves.
    if not is_zo_state(state):
      raise TypeError(f"expected the ZOState of this transform's init, got {type(state)}: "
                      "build the optimizer state with state = tx.init(params) from this very "
                      "optimizer (another optimizer's state cannot be reused)")
    cfg.check_params(params)
    method = resolved(params, state)
    _check_state(method, hyper, state, params)
    num_measured = method.num_measured
    in_effect = method.in_effect(hyper, state.count, params, state.method)
    in_effect = jax.tree.map(lambda new, old: new.astype(old.dtype), in_effect, state.hyper)
    if zo_probe is not None:
      zo_probe.record(method, params)
      return jax.tree.map(jnp.zeros_like, params), state._replace(hyper=in_effect)

    dtype = state.losses.dtype
    leaves, treedef = jax.tree.flatten(params)
    noise_key, next_key = keys_of(state, key)
    if zo_losses is not None and len(zo_losses) > 2:
      prepared = zo_losses[2]  # the engine's, from theta before its passes moved it
    else:
      prepared = method.prepare(leaves, state.method, in_effect)
    noise = m.StepNoise(method.sampler, noise_key, leaves, lean=zo_losses is not None,
                        prepared=prepared)
    if zo_losses is None:
      value_fn = _resolve_value_fn(value_fn, params, value_params)
      measured = measure(method, noise, state.method, in_effect, treedef, leaves, value_fn,
                         dtype)
    else:
      measured = m.Measured(jnp.asarray(zo_losses[0], dtype),
                            jnp.asarray(zo_losses[1], dtype).reshape(num_measured))
    if zo_leaves is None:
      g, method_state, stats = method.estimate(noise, state.method, in_effect, leaves, measured)
    else:  # the lean engine's call for one group of leaves (Method.serial_products)
      g, method_state, stats = method.estimate_some(noise, state.method, in_effect, leaves,
                                                    measured, frozenset(zo_leaves))
      if zo_outside is not None:  # the engine's check that the chain is leafwise
        rest = iter(zo_outside)
        g = [a if i in zo_leaves else next(rest) for i, a in enumerate(g)]
    g = treedef.unflatten([a.astype(jnp.result_type(p))
                           for a, p in zip(g, leaves, strict=True)])
    passes_now = (num_measured * method.cost_per_measure
                  + in_effect["center"].astype(jnp.int32))
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

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


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


def scale_by_zo(
    mu: float = 1e-3,
    *,
    num_directions: int = 1,
    mu_resolution: float = 0.0,
    sampler: sampling.Sampler | Callable[..., jax.Array] | None = None,
    seed: int | jax.Array = 0,
) -> optax.GradientTransformationExtraArgs:
  r"""Zeroth-order (SPSA) gradient estimate, as used by MeZO.

  .. math::
    g = \frac{1}{n}\sum_{j=1}^n \frac{f(\theta + \mu z_j) - f(\theta - \mu z_j)}{2\mu} z_j,
    \qquad z_j \sim \mathcal{N}(0, I)

  The emitted updates are ``g`` (an estimate of the gradient), so chain it like a gradient:
  ``optax.chain(scale_by_zo(), optax.scale_by_adam(), optax.scale(-lr))`` is ZO-Adam.
  Call as ``tx.update(updates, state, params, value_fn=f)``; ``updates`` is ignored.

  Args:
    mu: perturbation scale (> 0).
    num_directions: directions ``n`` averaged per step (2n forward passes).
    mu_resolution: for 16-bit params, raise ``mu`` to at least ``mu_resolution * eps(dtype) *
      rms(theta)`` so that the perturbation survives rounding (see
      :func:`scale_by_hizoo`; off by default here: MeZO's estimate tolerates it).
    sampler: a :class:`hizoo_jax.Sampler` or a function ``sampler(key, shape, dtype)``;
      default :data:`hizoo_jax.fast_gaussian` (Gaussian moments through the fourth, fused
      into the passes that use it); :data:`hizoo_jax.gaussian` (exact normal, threefry) and
      :data:`hizoo_jax.rademacher` work too.
    seed: int seed or PRNG key; the state carries the key and advances it every step.

  Returns:
    An :class:`optax.GradientTransformationExtraArgs`.

  Example:
    >>> import jax.numpy as jnp, optax, hizoo_jax as hz
    >>> tx = optax.chain(hz.scale_by_zo(mu=1e-3), optax.sgd(0.1))
    >>> params = {"w": jnp.ones(3)}
    >>> state = tx.init(params)
    >>> loss = lambda p: jnp.sum(p["w"] ** 2)
    >>> updates, state = tx.update(None, state, params, value_fn=loss)
    >>> float(loss(optax.apply_updates(params, updates))) < 3.0
    True

  References:
    Spall, 1992 (SPSA); Malladi et al., "Fine-Tuning Language Models with Just Forward
    Passes", NeurIPS 2023 (MeZO).
  """
  sampler = cfg.check_sampler(sampler, needs_gaussian=False)
  n = _probes(num_directions)
  method = spsa.SPSA(sampler=sampler, key_impl=cfg.key_impl_of(seed), num_probes=n)
  return zo_transform(method, dict(mu=mu, mu_resolution=mu_resolution), seed)


def scale_by_hizoo(
    mu: float = 1e-3,
    hessian_smoothing: ScalarOrSchedule = 1e-8,
    *,
    estimator: str = "paper",
    num_directions: int = 1,
    factored: bool = False,
    min_dim_size_to_factor: int = 128,
    hessian_update_every: int = 1,
    hessian_clip: tuple[float, float] = (1e-8, 1e8),
    hessian_init: float = 1.0,
    hessian_dtype: Any = None,
    curvature_floor: float = 4.0,
    mu_resolution: float = 4.0,
    sampler: sampling.Sampler | Callable[..., jax.Array] | None = None,
    seed: int | jax.Array = 0,
) -> optax.GradientTransformationExtraArgs:
  r"""Hessian-informed zeroth-order estimate (HiZOO, HiZOO-multi, HiZOO-L).

  With ``H`` the running diagonal-Hessian estimate (``Sigma^{-1}`` in the paper)::

    l0 = f(theta);  l+- = f(theta +- mu H^{-1/2} z)
    est = |l+ + l- - 2 l0| / (2 mu^2) * H z^2              ("paper")
        = (l+ + l- - 2 l0) / (2 mu^2) * H (z^2 - 1)        ("unbiased", MiNES; signed)
    H  <- clip((1 - alpha) H + alpha est)
    g  = (l+ - l-) / (2 mu) * H^{-1/2} z                   (with the updated H)

  With ``num_directions = n`` the loop runs ``n`` times on the same batch (``l0`` once),
  updating ``H`` after each direction, and emits the mean of the ``g_j``: ``1 + 2n``
  forward passes. The emitted updates are ``g``, ready for ``optax.scale_by_learning_rate``
  or any other Optax transformation.

  A direction whose ``l0``/``l+``/``l-`` is not finite is dropped (no update, no Hessian
  change, counted in ``skipped_directions``). A Hessian update whose second difference is
  below ``curvature_floor * eps * max|l|`` of the loss dtype is skipped (counted in
  ``skipped_hessian_updates``): it would feed rounding noise into the EMA. Values that
  arrive traced cannot raise under ``jit``: a ``hessian_smoothing`` (or schedule value)
  outside [0, 1] is clamped into it, and a ``mu`` that is not finite and > 0 skips the
  step (params unchanged, directions counted as skipped).

  Args:
    mu: perturbation scale (> 0).
    hessian_smoothing: EMA factor ``alpha`` in [0, 1], or a schedule of the step count.
    estimator: ``"paper"`` (Algorithm 1) or ``"unbiased"`` (keeps the MiNES ``-Sigma^{-1}``
      term and its sign, so ``E[est] = diag(A)``; the paper estimator's mean is
      ``(tr A + 2 A_ii) / 2`` for ``H = I``). The clip keeps ``H > 0`` either way.
    num_directions: directions per step (HiZOO-multi when > 1).
    factored: store a rank-1 (row, column) Hessian for large matrices (HiZOO-L).
    min_dim_size_to_factor: factor a leaf only if its last two dims are both at least this.
    hessian_update_every: measure ``l0`` and update ``H`` every k-th step only (other steps
      cost 2n forward passes instead of 1 + 2n).
    hessian_clip: ``(lo, hi)`` bounds applied to ``H`` after every update (``0 < lo``).
    hessian_init: initial value of ``H`` (> 0).
    hessian_dtype: dtype of ``H``; default: at least float32 whatever the params' dtype
      (a bf16/fp16 EMA with ``alpha = 1e-8`` never moves). Pass a string (``"float32"``)
      under ``optax.inject_hyperparams``.
    curvature_floor: multiple of ``eps * max|l|`` under which a second difference is
      treated as rounding noise.
    mu_resolution: for 16-bit params (bfloat16, float16), ``mu`` is raised to at least
      ``mu_resolution * eps(dtype) * rms(theta)`` (rms over the leaves of that dtype), in
      the perturbation, the gradient and the curvature alike: below a few ulp of a typical
      param, ``theta + mu z`` rounds back to ``theta`` and ``H`` inflates on rounding
      noise. ``0`` keeps ``mu`` as given; float32 params are never affected. The ``mu`` in
      use is recorded in the state.
    sampler: a :class:`hizoo_jax.Sampler` with Gaussian moments (or a function
      ``sampler(key, shape, dtype)``): default :data:`hizoo_jax.fast_gaussian` (E z^2 = 1,
      E z^4 = 3 exactly, fused into the passes that use it), or :data:`hizoo_jax.gaussian`
      (exact normal, threefry; slower and it materialises the noise). Rademacher noise is
      refused.
    seed: int seed or PRNG key; the state carries the key and advances it every step.

  Returns:
    An :class:`optax.GradientTransformationExtraArgs`; call its update as
    ``tx.update(updates, state, params, value_fn=f, key=None)``.

  Example:
    >>> import jax.numpy as jnp, optax, hizoo_jax as hz
    >>> tx = optax.chain(hz.scale_by_hizoo(mu=1e-2, hessian_smoothing=0.1), optax.sgd(0.1))
    >>> params = {"w": jnp.ones(3)}
    >>> state = tx.init(params)
    >>> updates, state = tx.update(None, state, params, value_fn=lambda p: jnp.sum(p["w"] ** 2))
    >>> hz.get_hessian(state)["w"].shape
    (3,)

  References:
    Zhao et al., "Second-Order Fine-Tuning without Pain for LLMs: A Hessian Informed
    Zeroth-Order Optimizer", ICLR 2025.
  """
  sampler = cfg.check_sampler(sampler, needs_gaussian=True)
  method = hizoo_method.HiZOO(
      sampler=sampler,
      key_impl=cfg.key_impl_of(seed),
      num_probes=_probes(num_directions),
      estimator=estimator,
      factored=bool(factored),
      hessian_dtype=hessian_dtype,
      hessian_clip=tuple(hessian_clip) if isinstance(hessian_clip, list) else hessian_clip,
  )
  hyper = dict(mu=mu, mu_resolution=mu_resolution, hessian_smoothing=hessian_smoothing,
               hessian_update_every=hessian_update_every, hessian_init=hessian_init,
               min_dim_size_to_factor=min_dim_size_to_factor, curvature_floor=curvature_floor)
  return zo_transform(method, hyper, seed)


def _probes(num_directions: Any) -> int | None:
  """``num_directions`` as the static number of probes, or None when it is traced
  (``optax.inject_hyperparams``): then the state's shape tells (:func:`zo_transform`)."""
  return cfg.check_int("num_directions", num_directions, 1)


def scale_by_fzoo(
    mu: float = 1e-3,
    *,
    num_directions: int = 8,
    mu_resolution: float = 0.0,
    sampler: sampling.Sampler | Callable[..., jax.Array] | None = None,
    seed: int | jax.Array = 0,
) -> optax.GradientTransformationExtraArgs:
  r"""FZOO's normalised one-sided estimate.

  .. math::
    g = \frac{1}{N \sigma} \sum_{j=1}^N \big(f(\theta + \mu u_j) - f(\theta)\big) u_j,
    \qquad \sigma = \operatorname{std}_j f(\theta + \mu u_j)

  with Rademacher ``u_j``: ``N + 1`` forward passes a step. ``g`` has the scale of a
  normalised gradient (``mu`` cancels), so the learning rate is a step length.

  Args:
    mu: perturbation scale (> 0); defaults to the reference code's ``1e-3``.
    num_directions: probes ``N`` per step (>= 2); the reference code's default 8.
    mu_resolution: for 16-bit params, raise ``mu`` to at least ``mu_resolution *
      eps(dtype) * rms(theta)`` (see :func:`scale_by_hizoo`; off by default).
    sampler: default :data:`hizoo_jax.fast_rademacher` (the paper's noise, fused into the
      passes); any sampler works.
    seed: int seed or PRNG key; the state carries the key and advances it every step.

  References:
    Dang et al., "FZOO: Fast Zeroth-Order Optimizer for Fine-Tuning Large Language Models
    towards Adam-Scale Speed", ICLR 2026.
  """
  sampler = sampling.fast_rademacher if sampler is None else cfg.check_sampler(
      sampler, needs_gaussian=False)
  method = fzoo_method.FZOO(sampler=sampler, key_impl=cfg.key_impl_of(seed),
                            num_probes=_probes(num_directions))
  return zo_transform(method, dict(mu=mu, mu_resolution=mu_resolution), seed)


def scale_by_forward_gradient(
    *,
    num_directions: int = 1,
    sampler: sampling.Sampler | Callable[..., jax.Array] | None = None,
    seed: int | jax.Array = 0,
) -> optax.GradientTransformationExtraArgs:
  r"""The forward-gradient estimate ``g = 1/n sum_j <grad f, z_j> z_j`` by ``jax.jvp``.

  The directional derivative is exact (no perturbation scale, no finite difference), so
  it behaves like SPSA at ``mu -> 0`` and does not lose ``l+ - l-`` to rounding in bf16.
  Each direction is one forward pass carrying tangents (counted as two forward passes);
  the tangent tree is params-sized and exists during the step (the zeroth-order methods
  perturb in place and hold none).

  The state's ``losses`` field holds the step's directional derivatives ``grad f . z_j``
  (not losses), and ``loss`` the loss ``f(theta)`` from the first ``jax.jvp``.

  Args:
    num_directions: directions ``n`` averaged per step.
    sampler: default :data:`hizoo_jax.fast_gaussian`; any sampler works.
    seed: int seed or PRNG key; the state carries the key and advances it every step.

  References:
    Baydin et al., "Gradients without Backpropagation", 2022; Zhang et al., "Revisiting
    Zeroth-Order Optimization for Memory-Efficient LLM Fine-Tuning: A Benchmark", ICML
    2024 (Forward-Grad).
  """
  sampler = cfg.check_sampler(sampler, needs_gaussian=False)
  method = fg_method.ForwardGradient(sampler=sampler, key_impl=cfg.key_impl_of(seed),
                                     num_probes=_probes(num_directions))
  return zo_transform(method, {}, seed)


def scale_by_sparse_mezo(
    mu: float = 1e-3,
    *,
    sparsity: float = 0.8,
    num_directions: int = 1,
    mu_resolution: float = 0.0,
    sampler: sampling.Sampler | Callable[..., jax.Array] | None = None,
    seed: int | jax.Array = 0,
) -> optax.GradientTransformationExtraArgs:
  r"""Sparse MeZO's masked SPSA estimate.

  .. math::
    g = \frac{f(\theta + \mu\, m \odot z) - f(\theta - \mu\, m \odot z)}{2\mu}\,
        m \odot z, \qquad m = |\theta| \le h

  per weight matrix, with ``h`` the ``(1 - sparsity)`` quantile of ``|theta|`` at ``init``
  (``sparsity = 0.8``: the 20% smallest weights of each matrix are perturbed and
  updated); the mask is recomputed from the params at every step. Leaves with fewer than
  two dimensions are perturbed whole, and so are matrices whose quantile is 0 at ``init``
  (no spread: LoRA's ``B``, a zero-initialised head), which a zero threshold would mask out
  after their first move.

  Args:
    mu: perturbation scale (> 0), MeZO's default ``1e-3``.
    sparsity: fraction of each matrix left out, in [0, 1); 0.8, the paper's best on
      most tasks.
    num_directions: directions averaged per step (2 forward passes each).
    mu_resolution: as in :func:`scale_by_zo`.
    sampler: default :data:`hizoo_jax.fast_gaussian`; any sampler works.
    seed: int seed or PRNG key; the state carries the key and advances it every step.

  References:
    Liu et al., "Sparse MeZO: Less Parameters for Better Performance in Zeroth-Order LLM
    Fine-Tuning", NeurIPS 2025.
  """
  sampler = cfg.check_sampler(sampler, needs_gaussian=False)
  method = sparse_method.SparseMeZO(sampler=sampler, key_impl=cfg.key_impl_of(seed),
                                    num_probes=_probes(num_directions))
  return zo_transform(method, dict(mu=mu, mu_resolution=mu_resolution, sparsity=sparsity),
                      seed)


def scale_by_lozo(
    mu: float = 1e-3,
    *,
    rank: int = 2,
    resample_every: int = 50,
    momentum: float = 0.0,
    mu_resolution: float = 0.0,
    layout: str = "flax",
    sampler: sampling.Sampler | Callable[..., jax.Array] | None = None,
    seed: int | jax.Array = 0,
) -> optax.GradientTransformationExtraArgs:
  r"""LOZO's low-rank SPSA estimate (LOZO-M with ``momentum > 0``).

  Each matrix leaf is perturbed along ``Z = U V^T`` (``U [m, r]`` fresh every step, ``V
  [n, r]`` redrawn every ``resample_every`` steps), vectors along a full Gaussian ``z``;
  ``g = c Z`` with ``c = (l+ - l-) / (2 mu)``. With ``momentum = beta`` the estimate is
  ``M V^T`` for a momentum ``M = beta M + (1 - beta) c U`` kept in the ``[m, r]`` factor
  space (vectors: a leaf-sized momentum), carried over to a redrawn ``V`` as
  ``M V_old^T V / n``. Two forward passes a step; the perturbation is formed inside the
  passes, never stored at params size. ``m`` and ``n`` are the rows and columns of the
  reference's PyTorch weight ``[out, in]``: on a Flax kernel ``[in, out]`` the fresh ``U``
  lies along ``out`` (the last axis) and the lazy ``V`` along ``in`` (``layout``).

  Args:
    mu: perturbation scale (> 0); the reference code's ``1e-3``.
    rank: ``r`` (clipped to each matrix's smaller dimension); the reference code's 2.
    resample_every: steps between redraws of ``V`` (``nu``); the reference code's 50.
    momentum: LOZO-M's ``beta`` in [0, 1); 0 is LOZO. The reference scripts use 0.9.
      Whether it is 0 is fixed at ``init`` (it decides the state); its value may be
      injected or scheduled.
    mu_resolution: as in :func:`scale_by_zo`.
    layout: where a matrix leaf holds the reference's rows (PyTorch's ``out``): ``"flax"``
      (default) on the last axis of every matrix leaf but embedding tables (a leaf whose
      path ends in a key ``embedding``: ``[num_embeddings, features]``, PyTorch's layout);
      ``"torch"``: on axis -2 of every matrix leaf (weights kept as ``[out, in]``).
    sampler: noise of the vector leaves (default :data:`hizoo_jax.fast_gaussian`); the
      factors are Gaussian.
    seed: int seed or PRNG key; the state carries the key and advances it every step.

  References:
    Chen et al., "Enhancing Zeroth-Order Fine-Tuning for Language Models with Low-Rank
    Structures", ICLR 2025.
  """
  sampler = cfg.check_sampler(sampler, needs_gaussian=False)
  beta = cfg.concrete(momentum)
  method = lozo_method.LOZO(sampler=sampler, key_impl=cfg.key_impl_of(seed), num_probes=1,
                            rank=_static_int("rank", rank), layout=layout,
                            with_momentum=None if beta is None else bool(beta != 0))
  return zo_transform(method, dict(mu=mu, mu_resolution=mu_resolution, momentum=momentum,
                                   resample_every=resample_every), seed)


def scale_by_subzero(
    mu: float = 1e-3,
    *,
    rank: int = 8,
    resample_every: int = 2000,
    num_directions: int = 1,
    mu_resolution: float = 0.0,
    sampler: sampling.Sampler | Callable[..., jax.Array] | None = None,
    seed: int | jax.Array = 0,
) -> optax.GradientTransformationExtraArgs:
  r"""SubZero's SPSA estimate in random orthonormal subspaces.

  Each matrix leaf is perturbed along ``Z = sqrt(m n) / r * U Z0 V^T`` with orthonormal
  ``U [m, r]``, ``V [n, r]`` (QR of Gaussians, redrawn every ``resample_every`` steps) and
  a fresh ``Z0 [r, r]`` every step; vectors along a full Gaussian ``z``. ``g = c Z``, two
  forward passes a probe.

  Args:
    mu: perturbation scale (> 0); the reference code's ``1e-3``.
    rank: ``r`` (clipped to each matrix's smaller dimension); the reference code's 8.
    resample_every: steps between redraws of ``U`` and ``V``; the reference code's 2000.
    num_directions: probes averaged per step.
    mu_resolution: as in :func:`scale_by_zo`.
    sampler: noise of the vector leaves (default :data:`hizoo_jax.fast_gaussian`).
    seed: int seed or PRNG key; the state carries the key and advances it every step.

  References:
    Yu et al., "Zeroth-Order Fine-Tuning of LLMs in Random Subspaces", ICCV 2025.
  """
  sampler = cfg.check_sampler(sampler, needs_gaussian=False)
  method = subzero_method.SubZero(sampler=sampler, key_impl=cfg.key_impl_of(seed),
                                  num_probes=_probes(num_directions),
                                  rank=_static_int("rank", rank))
  return zo_transform(method, dict(mu=mu, mu_resolution=mu_resolution,
                                   resample_every=resample_every), seed)


def scale_by_zo_muon(
    mu: float = 1e-3,
    *,
    rank: int = 64,
    num_directions: int = 4,
    resample_every: int = 100,
    vector_scale: float = 1e-5,
    mu_resolution: float = 0.0,
    layout: str = "flax",
    sampler: sampling.Sampler | Callable[..., jax.Array] | None = None,
    seed: int | jax.Array = 0,
) -> optax.GradientTransformationExtraArgs:
  r"""ZO-Muon's orthogonalised subspace estimate.

  Per matrix leaf, with a Haar-orthonormal ``P [m, r]`` (redrawn every ``resample_every``
  steps) and ``q`` one-sided probes ``l_i = f(theta + mu P u_i)``, ``u_i [r, n]``:
  ``g = P NS5(R)``, ``R = 1/q sum_i (l_i - l0) / mu u_i``, with Muon's Newton-Schulz
  orthogonalisation ``NS5`` of the small ``r x n`` estimate. Vectors get ``vector_scale``
  times the one-sided estimate. ``q + 1`` forward passes a step. ``m`` and ``n`` are the
  rows and columns of the reference's PyTorch weight ``[out, in]``: on a Flax kernel ``[in,
  out]`` the subspace ``P`` lies along ``out`` (the last axis; ``layout``).

  Args:
    mu: perturbation scale (> 0); the reference code's ``1e-3``.
    rank: ``r`` (clipped to each matrix's smaller dimension); the reference README's 64.
    num_directions: probes ``q``; the reference's 4.
    resample_every: steps between redraws of ``P``; the reference README's 100.
    vector_scale: the vectors' estimate relative to the matrices' (the reference's
      vector learning rate 1e-7 over its matrix learning rate 1e-2).
    mu_resolution: as in :func:`scale_by_zo`.
    layout: where a matrix leaf holds the reference's rows, as in :func:`scale_by_lozo`.
    sampler: noise of the vector leaves (default :data:`hizoo_jax.fast_gaussian`).
    seed: int seed or PRNG key; the state carries the key and advances it every step.

  References:
    ZO-Muon, arXiv 2602.17155, 2026; Jordan et al., Muon (2024), for Newton-Schulz.
  """
  sampler = cfg.check_sampler(sampler, needs_gaussian=False)
  method = zo_muon_method.ZOMuon(sampler=sampler, key_impl=cfg.key_impl_of(seed),
                                 num_probes=_probes(num_directions),
                                 rank=_static_int("rank", rank), layout=layout)
  return zo_transform(method, dict(mu=mu, mu_resolution=mu_resolution,
                                   resample_every=resample_every, vector_scale=vector_scale),
                      seed)


def _static_int(name: str, value: Any) -> int | None:
  """A static int option (it shapes the state), or None when it arrives traced (under
  ``optax.inject_hyperparams``): the method then recovers it from the state's shapes."""
  return cfg.check_int(name, value, 1)


HIZOO_OPTIONS: tuple[inspect.Parameter, ...] = tuple(
    p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
    for p in inspect.signature(scale_by_hizoo).parameters.values())
"""The options of :func:`scale_by_hizoo`, which the aliases take as keywords too."""


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
