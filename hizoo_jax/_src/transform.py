"""Zeroth-order gradient transformations: ``scale_by_zo`` (SPSA / MeZO) and ``scale_by_hizoo``.

Both emit the (preconditioned) zeroth-order estimate ``g`` as their updates, so any Optax
chain can follow them. They ignore the incoming ``updates`` and instead evaluate the loss
through ``value_fn(params)``, passed as an extra argument to ``update``. The estimate
itself lives in :mod:`hizoo_jax._src.estimator`, the curvature strategies in
:mod:`hizoo_jax._src.curvature`, the argument checks in :mod:`hizoo_jax._src.config`.

Extra arguments of ``update`` (all keyword-only):

* ``value_fn(params) -> scalar``: the loss of the current batch (required).
* ``key``: a PRNG key overriding the state's key for this call.
* ``value_params``: the full params ``value_fn`` takes, when the transform sees only some
  of them (``optax.masked`` and ``optax.multi_transform`` hand it the selected leaves;
  :func:`hizoo_jax.make_train_step` passes this itself).
* ``zo_losses = (l0, l+[n], l-[n])``: losses measured by the caller at exactly this step's
  perturbations (the lean train step); ``value_fn`` is then not called.
* ``zo_probe``: used by :func:`hizoo_jax.make_train_step` to find the transform inside any
  composition; the call then records its static spec and returns the state unchanged but
  for the hyperparameters in effect (``mu``, ``hessian_every``).
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
from optax._src import numerics

from hizoo_jax._src import config as cfg
from hizoo_jax._src import curvature as curv
from hizoo_jax._src import estimator as est
from hizoo_jax._src import sampling

ScalarOrSchedule = float | jax.Array | optax.Schedule


class ZOState(NamedTuple):
  """State of :func:`scale_by_zo`.

  Attributes:
    count: number of steps taken (int32).
    key: raw PRNG key data the next step draws its noise from (advanced every step).
    mu: the perturbation scale of the last step (at init: the configured one).
    loss: the step's loss for logging: mean of ``(l+ + l-) / 2`` over directions.
    loss_plus: ``l+`` of each direction, shape ``[n]``.
    loss_minus: ``l-`` of each direction, shape ``[n]``.
    skipped_directions: directions dropped so far because a loss was not finite.
  """

  count: jax.Array
  key: jax.Array
  mu: jax.Array
  loss: jax.Array
  loss_plus: jax.Array
  loss_minus: jax.Array
  skipped_directions: jax.Array


class HiZOOState(NamedTuple):
  """State of :func:`scale_by_hizoo`.

  Attributes:
    count: number of steps taken (int32).
    key: raw PRNG key data the next step draws its noise from (advanced every step).
    mu: the perturbation scale of the last step (at init: the configured one).
    hessian_every: the ``hessian_update_every`` of the last step.
    hessian: the diagonal-Hessian estimate ``H``, a tree shaped like the params whose
      leaves are dense arrays or :class:`FactoredHessian` (HiZOO-L).
    hessian_bounds: ``(lo, hi)`` clip bounds of ``H``, used to rebuild factored leaves.
    loss: the step's loss for logging: ``l0`` on Hessian steps, else the mean of
      ``(l+ + l-) / 2`` over directions.
    loss_plus: ``l+`` of each direction, shape ``[n]``.
    loss_minus: ``l-`` of each direction, shape ``[n]``.
    skipped_directions: directions dropped so far because a loss was not finite.
    skipped_hessian_updates: Hessian updates skipped so far because the second difference
      ``|l+ + l- - 2 l0|`` was under the loss dtype's rounding floor.
  """

  count: jax.Array
  key: jax.Array
  mu: jax.Array
  hessian_every: jax.Array
  hessian: Any
  hessian_bounds: jax.Array
  loss: jax.Array
  loss_plus: jax.Array
  loss_minus: jax.Array
  skipped_directions: jax.Array
  skipped_hessian_updates: jax.Array


ZO_STATE_TYPES = (ZOState, HiZOOState)


def is_zo_state(x: Any) -> bool:
  return isinstance(x, ZO_STATE_TYPES)


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


@dataclasses.dataclass(frozen=True)
class _Hyper:
  """The numeric options, possibly traced (inject_hyperparams) or scheduled."""

  mu: Any
  hessian_smoothing: Any
  num_directions: Any
  hessian_update_every: Any
  hessian_init: Any
  seed: Any
  min_dim_size_to_factor: Any = 128
  curvature_floor: Any = 4.0
  mu_resolution: Any = 0.0


def _make(spec: cfg.ZOSpec, hp: _Hyper) -> optax.GradientTransformationExtraArgs:
  cfg.check_positive("mu", hp.mu)
  n_static = cfg.check_int("num_directions", hp.num_directions, 1)
  cfg.check_int("hessian_update_every", hp.hessian_update_every, 1)
  cfg.check_seed(hp.seed)
  res = cfg.concrete(hp.mu_resolution)
  if res is not None and (res.ndim != 0 or not np.isfinite(res) or res < 0):
    raise ValueError(f"mu_resolution must be a finite number >= 0, got {hp.mu_resolution!r}")
  if spec.hizoo:
    cfg.check_hizoo_options(spec, hp.hessian_smoothing, hp.hessian_init,
                            hp.min_dim_size_to_factor, hp.curvature_floor)

  def keys_of(state, key=None):
    """``(noise key of this step, key of the next state)``."""
    noise_key, next_key = sampling.split_state_key(
        jax.random.wrap_key_data(state.key, impl=spec.key_impl))
    if key is not None:
      noise_key, _ = sampling.split_state_key(cfg.as_typed_key(key, spec.key_impl))
    return noise_key, next_key

  def every_now():
    return jnp.maximum(jnp.asarray(hp.hessian_update_every, jnp.int32), 1)

  def init_fn(params):
    cfg.check_params(params)
    if n_static is None:
      raise TypeError(
          "num_directions must be a concrete int at init; under optax.inject_hyperparams pass "
          "static_args=('num_directions',)"
      )
    dtype = est.loss_dtype(params)
    mu = est.effective_mu(jnp.asarray(hp.mu, dtype), params, hp.mu_resolution)
    mu, _ = est.sanitize_mu(mu)
    common = dict(
        count=jnp.zeros([], jnp.int32),
        key=cfg.seed_to_key_data(hp.seed, spec.key_impl),
        mu=mu,
        loss=jnp.zeros([], dtype),
        loss_plus=jnp.zeros([n_static], dtype),
        loss_minus=jnp.zeros([n_static], dtype),
        skipped_directions=jnp.zeros([], jnp.int32),
    )
    if not spec.hizoo:
      return ZOState(**common)
    h = curv.init_tree(params, factored=spec.factored,
                       min_dim_size_to_factor=_concrete_int(hp.min_dim_size_to_factor),
                       dtype_of=spec.hessian_leaf_dtype, init_value=hp.hessian_init)
    bounds_dtype = jnp.result_type(jnp.float32, *[x.dtype for x in jax.tree.leaves(h)])
    return HiZOOState(
        hessian_every=every_now(),
        hessian=h,
        hessian_bounds=jnp.asarray(spec.hessian_clip, bounds_dtype),
        skipped_hessian_updates=jnp.zeros([], jnp.int32),
        **common,
    )

  def update_fn(updates, state, params=None, *, value_fn=None, key=None, zo_losses=None,
                value_params=None, zo_probe=None, **extra_args):
    del updates, extra_args  # ZO transforms measure the loss themselves.
    if not is_zo_state(state):
      raise TypeError(f"expected a {type(state).__name__} of this transform's init, got "
                      f"{type(state)}")
    cfg.check_params(params)
    mu_now = est.effective_mu(jnp.asarray(hp.mu, state.mu.dtype), params, hp.mu_resolution)
    mu, _ = est.sanitize_mu(mu_now)
    in_effect = dict(mu=mu.astype(state.mu.dtype))
    if spec.hizoo:
      in_effect["hessian_every"] = every_now()
    if zo_probe is not None:
      zo_probe.record(spec, params)
      return jax.tree.map(jnp.zeros_like, params), state._replace(**in_effect)

    if zo_losses is None:
      value_fn = _resolve_value_fn(value_fn, params, value_params)
    n = state.loss_plus.shape[0]
    noise_key, next_key = keys_of(state, key)
    if spec.hizoo:
      hessian_step = (state.count % in_effect["hessian_every"]) == 0
      s = hp.hessian_smoothing
      alpha = s(state.count) if callable(s) else s
      hessian = state.hessian
    else:
      hessian_step, alpha, hessian = False, 0.0, None

    g, hessian, stats = est.estimate(
        spec, params, value_fn, noise_key, n, mu_now, hessian, hessian_step, jnp.asarray(alpha),
        curvature_floor=hp.curvature_floor, losses=zo_losses)
    common = dict(
        count=numerics.safe_increment(state.count),
        key=jax.random.key_data(next_key).astype(state.key.dtype),
        loss=stats["loss"].astype(state.loss.dtype),
        loss_plus=stats["loss_plus"].astype(state.loss_plus.dtype),
        loss_minus=stats["loss_minus"].astype(state.loss_minus.dtype),
        skipped_directions=state.skipped_directions + stats["skipped_directions"],
        **in_effect,
    )
    if not spec.hizoo:
      return g, ZOState(**common)
    hessian = jax.tree.map(lambda new, old: new.astype(old.dtype), hessian, state.hessian)
    return g, HiZOOState(
        hessian=hessian,
        hessian_bounds=state.hessian_bounds,
        skipped_hessian_updates=state.skipped_hessian_updates + stats["skipped_hessian_updates"],
        **common,
    )

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _concrete_int(x: Any) -> int:
  v = cfg.concrete(x)
  if v is None:
    raise TypeError("min_dim_size_to_factor must be concrete at init; under "
                    "optax.inject_hyperparams list it in static_args")
  return int(v)


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
  spec = cfg.ZOSpec(hizoo=False, sampler=sampler, key_impl=cfg.key_impl_of(seed))
  return _make(spec, _Hyper(mu=mu, hessian_smoothing=0.0, num_directions=num_directions,
                            hessian_update_every=1, hessian_init=1.0, seed=seed,
                            mu_resolution=mu_resolution))


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
  spec = cfg.ZOSpec(
      hizoo=True,
      sampler=sampler,
      key_impl=cfg.key_impl_of(seed),
      estimator=estimator,
      factored=bool(factored),
      hessian_dtype=hessian_dtype,
      hessian_clip=tuple(hessian_clip) if isinstance(hessian_clip, list) else hessian_clip,
  )
  return _make(spec, _Hyper(mu=mu, hessian_smoothing=hessian_smoothing,
                            num_directions=num_directions,
                            hessian_update_every=hessian_update_every,
                            hessian_init=hessian_init, seed=seed,
                            min_dim_size_to_factor=min_dim_size_to_factor,
                            curvature_floor=curvature_floor, mu_resolution=mu_resolution))


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
