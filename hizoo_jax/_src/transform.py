"""Zeroth-order gradient transformations: ``scale_by_zo`` (SPSA / MeZO) and ``scale_by_hizoo``.

Both emit the (preconditioned) zeroth-order estimate ``g`` as their updates, so any Optax
chain can follow them. They ignore the incoming ``updates`` and instead evaluate the loss
through ``value_fn(params)``, passed as an extra argument to ``update``.

One step with ``n`` directions (HiZOO, Algorithms 1 and 3 of Zhao et al., ICLR 2025)::

    l0 = f(theta)                                       # once per step, Hessian steps only
    for j in 1..n:
        z  = sampler(keys_j)                            # regenerated, never stored
        l+ = f(theta + mu H^{-1/2} z);  l- = f(theta - mu H^{-1/2} z)
        H  = clip(H + alpha (est(l+ + l- - 2 l0, H, z) - H))
        g_j = (l+ - l-) / (2 mu) * H^{-1/2} z           # the updated H
    g = mean_j g_j

MeZO (``scale_by_zo``) is the same loop with ``H = 1`` and no ``l0``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.tree_utils as otu
from optax._src import numerics

from hizoo_jax._src import hessian as hess
from hizoo_jax._src import sampling

ScalarOrSchedule = float | jax.Array | optax.Schedule


class ZOState(NamedTuple):
  """State of :func:`scale_by_zo`.

  Attributes:
    count: number of steps taken (int32).
    key: raw PRNG key data the next step draws its noise from (advanced every step).
    loss: the step's loss for logging: mean of ``(l+ + l-) / 2`` over directions.
    loss_plus: ``l+`` of each direction, shape ``[n]``.
    loss_minus: ``l-`` of each direction, shape ``[n]``.
    skipped_directions: directions dropped so far because a loss was not finite.
  """

  count: jax.Array
  key: jax.Array
  loss: jax.Array
  loss_plus: jax.Array
  loss_minus: jax.Array
  skipped_directions: jax.Array


class HiZOOState(NamedTuple):
  """State of :func:`scale_by_hizoo`.

  Attributes:
    count: number of steps taken (int32).
    key: raw PRNG key data the next step draws its noise from (advanced every step).
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
  hessian: Any
  hessian_bounds: jax.Array
  loss: jax.Array
  loss_plus: jax.Array
  loss_minus: jax.Array
  skipped_directions: jax.Array
  skipped_hessian_updates: jax.Array


# ----------------------------------------------------------------------------------------
# Configuration and its validation.


def _concrete(x: Any) -> np.ndarray | None:
  """``x`` as a NumPy value, or None when it is traced (e.g. under inject_hyperparams)."""
  if isinstance(x, jax.core.Tracer):
    return None
  try:
    return np.asarray(x)
  except Exception:  # noqa: BLE001 - anything that is not array-like
    return None


def _check_positive(name: str, value: Any) -> None:
  v = _concrete(value)
  if v is None:
    return
  if v.ndim != 0 or not np.issubdtype(v.dtype, np.number):
    raise TypeError(f"{name} must be a scalar number, got {value!r}")
  if not np.isfinite(v) or v <= 0:
    raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def _check_unit_interval(name: str, value: Any) -> None:
  if callable(value):
    return  # a schedule: checked where it is evaluated
  v = _concrete(value)
  if v is None:
    return
  if v.ndim != 0 or not np.issubdtype(v.dtype, np.number):
    raise TypeError(f"{name} must be a float in [0, 1] or a schedule, got {value!r}")
  if not 0.0 <= v <= 1.0:
    raise ValueError(f"{name} must lie in [0, 1], got {value!r}")


def _check_int(name: str, value: Any, minimum: int) -> int | None:
  """A concrete int >= minimum, or None when traced."""
  v = _concrete(value)
  if v is None:
    return None
  if v.ndim != 0 or not (np.issubdtype(v.dtype, np.integer) or v.dtype == np.bool_):
    if not (np.issubdtype(v.dtype, np.floating) and float(v).is_integer()):
      raise TypeError(f"{name} must be an integer, got {value!r}")
  if int(v) < minimum:
    raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
  return int(v)


def _check_sampler(sampler: Any, *, needs_gaussian: bool) -> sampling.Sampler:
  if sampler is None:
    return sampling.DEFAULT_SAMPLER
  if not callable(sampler):
    raise TypeError(f"sampler must be callable as sampler(key, shape, dtype), got {sampler!r}")
  if needs_gaussian and not sampling.is_gaussian(sampler):
    raise ValueError(
        "sampler: the HiZOO curvature estimate needs Gaussian noise (E z^4 = 3); a "
        f"Rademacher/non-Gaussian sampler ({getattr(sampler, '__name__', sampler)!r}) makes "
        "the Hessian estimate wrong. Use hz.gaussian (the default), or scale_by_zo/mezo, "
        "which accept Rademacher noise."
    )
  return sampler


def _seed_to_key(seed: Any) -> tuple[jax.Array, str]:
  """``(raw key data, impl name)`` from an int seed, a typed key or raw key data."""
  if isinstance(seed, jax.Array) and jnp.issubdtype(seed.dtype, jax.dtypes.prng_key):
    return jax.random.key_data(seed), str(jax.random.key_impl(seed))
  impl = str(jax.config.jax_default_prng_impl)
  arr = jnp.asarray(seed)  # may be traced (e.g. an injected hyperparameter)
  if arr.ndim == 0:
    if not jnp.issubdtype(arr.dtype, jnp.integer):
      raise TypeError(f"seed must be an int or a PRNG key, got {seed!r}")
    return jax.random.key_data(jax.random.key(arr, impl=impl)), impl
  if arr.dtype != jnp.uint32:
    raise TypeError(f"seed must be an int or a PRNG key, got {seed!r}")
  return arr, impl


def _as_typed_key(key: Any, impl: str) -> jax.Array:
  if isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    return key
  key = jnp.asarray(key)
  if key.dtype != jnp.uint32:
    raise TypeError(f"key must be a PRNG key (jax.random.key or PRNGKey), got dtype {key.dtype}")
  return jax.random.wrap_key_data(key, impl=impl)


def _check_params(params: Any) -> None:
  if params is None:
    raise ValueError("params must be given to init/update of a zeroth-order transform")
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    dtype = jnp.result_type(leaf)
    if not jnp.issubdtype(dtype, jnp.floating):
      raise TypeError(
          f"params leaf {jax.tree_util.keystr(path)} has dtype {dtype}; zeroth-order "
          "transforms perturb floating-point params only. Pass the trainable params alone "
          "and close over the rest in value_fn."
      )


@dataclasses.dataclass(frozen=True)
class _Config:
  """The static part of a ZO transform's configuration."""

  hizoo: bool
  estimator: str = "paper"
  factored: bool = False
  min_dim_size_to_factor: int = 128
  hessian_dtype: Any = None
  hessian_clip: tuple[float, float] = (1e-8, 1e8)
  curvature_floor: float = 4.0


# ----------------------------------------------------------------------------------------
# The estimator.


def _loss_dtype(params: Any) -> np.dtype:
  dtypes = [jnp.result_type(x) for x in jax.tree.leaves(params)]
  return jnp.result_type(jnp.float32, *dtypes) if dtypes else np.dtype(jnp.float32)


def _evaluate(value_fn: Callable[[Any], Any], params: Any, dtype: Any) -> jax.Array:
  loss = value_fn(params)
  if isinstance(loss, tuple):
    raise ValueError(
        "value_fn must return a scalar loss, got a tuple; wrap a (loss, aux) function as "
        "lambda p: f(p)[0]"
    )
  loss = jnp.asarray(loss)
  if loss.shape != ():
    raise ValueError(f"value_fn must return a scalar loss, got shape {loss.shape}")
  return loss.astype(dtype)


def _perturb(params: Any, scales: Any, z: Any, coef: jax.Array) -> Any:
  """``theta + coef * s * z`` leaf by leaf, computed in the noise dtype, cast back."""

  def one(p, s, zl):
    step = coef.astype(zl.dtype) * zl
    if s is not None:
      step = step * s.astype(zl.dtype)
    return (p.astype(zl.dtype) + step).astype(p.dtype)

  if scales is None:
    return jax.tree.map(lambda p, zl: one(p, None, zl), params, z)
  return jax.tree.map(one, params, scales, z)


def _zo_estimate(
    cfg: _Config,
    params: Any,
    value_fn: Callable[[Any], Any],
    noise_key: jax.Array,
    num_directions: int,
    mu: jax.Array,
    sampler: sampling.Sampler,
    hessian: Any,
    hessian_step: jax.Array | bool,
    alpha: jax.Array,
    losses: tuple[jax.Array, jax.Array, jax.Array] | None = None,
) -> tuple[Any, Any, dict[str, jax.Array]]:
  """One zeroth-order step: returns ``(g, new_hessian, stats)``.

  ``hessian`` is None for MeZO. ``hessian_step`` says whether this step measures ``l0``
  and updates ``H`` (it may be a traced bool). ``losses = (l0, l+[n], l-[n])``, when
  given, are the losses measured elsewhere at exactly these perturbations (the lean train
  step measures them on in-place perturbed params); then ``value_fn`` is not called.
  """
  loss_dtype = _loss_dtype(params)
  clip = cfg.hessian_clip
  mu = jnp.asarray(mu)
  value = lambda p: _evaluate(value_fn, p, loss_dtype)

  if losses is not None:
    l0 = jnp.asarray(losses[0], loss_dtype) if cfg.hizoo else None
  elif cfg.hizoo:
    if hessian_step is True:
      l0 = value(params)
    elif hessian_step is False:
      l0 = jnp.zeros((), loss_dtype)
    else:
      l0 = jax.lax.cond(
          hessian_step, lambda: value(params), lambda: jnp.zeros((), loss_dtype)
      )
  else:
    l0 = None

  def scales_of(h):
    if h is None:
      return None
    return jax.tree.map(lambda x: hess.inv_sqrt(x, clip), h, is_leaf=hess.is_factored)

  g_zero = jax.tree.map(lambda p: jnp.zeros(p.shape, sampling.noise_dtype(p.dtype)), params)
  zero_i = jnp.zeros((), jnp.int32)

  def direction(carry, j):
    h, g_sum, n_valid, n_skip_h = carry
    dkey = sampling.direction_key(noise_key, j)
    noise = lambda k: sampling.leaf_noise(k, params, sampler)
    if losses is not None:
      lp = jnp.asarray(losses[1], loss_dtype)[j]
      lm = jnp.asarray(losses[2], loss_dtype)[j]
      ukey = dkey
    else:
      s = scales_of(h)
      lp = value(_perturb(params, s, noise(dkey), mu))
      lm = value(_perturb(params, s, noise(dkey), -mu))
      ukey = dkey
    finite = jnp.isfinite(lp) & jnp.isfinite(lm)
    if cfg.hizoo:
      hstep = jnp.asarray(hessian_step)
      finite = finite & (jnp.isfinite(l0) | ~hstep)
      d2 = lp + lm - 2 * l0
      eps = jnp.finfo(loss_dtype).eps
      scale = jnp.maximum(jnp.maximum(jnp.abs(lp), jnp.abs(lm)), jnp.abs(l0))
      resolved = (jnp.abs(d2) > cfg.curvature_floor * eps * scale) | (cfg.curvature_floor == 0)
      do_h = hstep & finite & resolved
      curvature = d2 / (2 * mu.astype(loss_dtype) ** 2)
      n_skip_h = n_skip_h + (hstep & finite & ~resolved).astype(jnp.int32)
    proj = jnp.where(finite, (lp - lm) / (2 * mu.astype(loss_dtype)), 0)

    # The update pass, leaf by leaf. Dense leaves are one fused elementwise loop each.
    # A factored leaf needs reductions over its estimate; its noise is regenerated for
    # each use, after the previous factored leaf is done, so that neither its estimate
    # nor its noise is ever materialised and at most one leaf's temporaries are alive.
    flat_p, treedef = jax.tree.flatten(params)
    flat_k = treedef.flatten_up_to(sampling.leaf_keys(ukey, params))
    flat_g = treedef.flatten_up_to(g_sum)
    flat_h = treedef.flatten_up_to(h) if cfg.hizoo else [None] * len(flat_p)
    new_h, new_g, last = [], [], None
    for p_i, k_i, g_i, h_i in zip(flat_p, flat_k, flat_g, flat_h, strict=True):

      def zfn(after=(), k_i=k_i, p_i=p_i):
        return sampling.sample_leaf(sampler, sampling.tie(k_i, after), p_i)

      if cfg.hizoo:
        factored = hess.is_factored(h_i)
        if factored:
          # A conditional per factored leaf, its predicate depending on the previous
          # leaf: the leaves' reductions run one after another and their temporaries
          # (XLA stores this leaf's estimate for its row and column sums) never coexist.
          go = do_h if last is None else do_h & jnp.all(jnp.isfinite(last.row))
          rows = sampling.leaf_rows(sampler, k_i, p_i)
          h_i = jax.lax.cond(
              go,
              lambda h, zfn=zfn, rows=rows: hess.update_leaf(
                  h, zfn, curvature, alpha, estimator=cfg.estimator, clip=clip, rows=rows),
              lambda h: h,
              h_i,
          )
          last = h_i
        else:
          h_up = hess.update_leaf(h_i, zfn(), curvature, alpha, estimator=cfg.estimator, clip=clip)
          h_i = hess.select(do_h, h_up, h_i)
        z_i = zfn()
        scaled = hess.inv_sqrt(h_i, clip).astype(z_i.dtype) * z_i
      else:
        scaled = zfn()
      new_h.append(h_i)
      new_g.append(g_i + proj.astype(scaled.dtype) * scaled)
    if cfg.hizoo:
      h = treedef.unflatten(new_h)
    g_sum = treedef.unflatten(new_g)
    n_valid = n_valid + finite.astype(jnp.int32)
    return (h, g_sum, n_valid, n_skip_h), (lp, lm)

  carry = (hessian, g_zero, zero_i, zero_i)
  if num_directions == 1:
    carry, (lp, lm) = direction(carry, 0)
    lp, lm = lp[None], lm[None]
  else:
    carry, (lp, lm) = jax.lax.scan(direction, carry, jnp.arange(num_directions))
  hessian, g_sum, n_valid, n_skip_h = carry

  denom = jnp.maximum(n_valid, 1)
  g = jax.tree.map(lambda a, p: (a / denom.astype(a.dtype)).astype(p.dtype), g_sum, params)
  mean_loss = jnp.mean((lp + lm) / 2)
  if cfg.hizoo:
    loss = jnp.where(jnp.asarray(hessian_step), l0, mean_loss)
  else:
    loss = mean_loss
  stats = dict(
      loss=loss,
      loss_plus=lp,
      loss_minus=lm,
      skipped_directions=num_directions - n_valid,
      skipped_hessian_updates=n_skip_h,
  )
  return g, hessian, stats


# ----------------------------------------------------------------------------------------
# The transformations.


def _resolve_value_fn(value_fn: Any) -> Callable[[Any], Any]:
  if value_fn is None:
    raise TypeError(
        "value_fn is required: call tx.update(updates, state, params, value_fn=loss_of_params)"
        " where loss_of_params(params) returns the scalar loss on the current batch"
    )
  if not callable(value_fn):
    raise TypeError(f"value_fn must be callable as value_fn(params) -> scalar, got {value_fn!r}")
  return value_fn


def _make(
    cfg: _Config,
    *,
    mu: Any,
    hessian_smoothing: ScalarOrSchedule,
    num_directions: Any,
    hessian_update_every: Any,
    hessian_init: Any,
    sampler: Any,
    seed: Any,
) -> optax.GradientTransformationExtraArgs:
  _check_positive("mu", mu)
  n_static = _check_int("num_directions", num_directions, 1)
  k_static = _check_int("hessian_update_every", hessian_update_every, 1)
  sampler = _check_sampler(sampler, needs_gaussian=cfg.hizoo)
  if cfg.hizoo:
    _check_unit_interval("hessian_smoothing", hessian_smoothing)
    _check_positive("hessian_init", hessian_init)
    if cfg.estimator not in hess.ESTIMATORS:
      raise ValueError(f"estimator must be one of {hess.ESTIMATORS}, got {cfg.estimator!r}")
    clip = cfg.hessian_clip
    if (
        not isinstance(clip, tuple | list)
        or len(clip) != 2
        or not all(isinstance(c, int | float) for c in clip)
    ):
      raise TypeError(f"hessian_clip must be a (lo, hi) pair of floats, got {clip!r}")
    if not (0 < clip[0] <= clip[1] < np.inf):
      raise ValueError(f"hessian_clip must satisfy 0 < lo <= hi < inf, got {clip!r}")
    if cfg.hessian_dtype is not None:
      try:
        dt = jnp.dtype(cfg.hessian_dtype)
      except TypeError as e:
        raise TypeError(f"hessian_dtype must be a float dtype, got {cfg.hessian_dtype!r}") from e
      if not jnp.issubdtype(dt, jnp.floating):
        raise TypeError(f"hessian_dtype must be a float dtype, got {cfg.hessian_dtype!r}")
    _check_int("min_dim_size_to_factor", cfg.min_dim_size_to_factor, 1)
    floor = _concrete(cfg.curvature_floor)
    if floor is not None and (floor.ndim != 0 or not np.isfinite(floor) or floor < 0):
      raise ValueError(f"curvature_floor must be a finite number >= 0, got {cfg.curvature_floor!r}")
  if isinstance(seed, jax.Array) and jnp.issubdtype(seed.dtype, jax.dtypes.prng_key):
    impl = str(jax.random.key_impl(seed))
  else:
    impl = str(jax.config.jax_default_prng_impl)

  def keys_of(state, key=None):
    """``(noise key of this step, key of the next state)``."""
    noise_key, next_key = sampling.split_state_key(
        jax.random.wrap_key_data(state.key, impl=impl)
    )
    if key is not None:
      noise_key, _ = sampling.split_state_key(_as_typed_key(key, impl))
    return noise_key, next_key

  def hessian_step_of(state) -> jax.Array | bool:
    if not cfg.hizoo:
      return False
    if k_static == 1:
      return True
    return (state.count % jnp.asarray(hessian_update_every, jnp.int32)) == 0

  def perturb(params, state, coef, base=None):
    """``base + coef * mu * H^{-1/2} z`` with the z of this state's step, direction 0."""
    dkey = sampling.direction_key(keys_of(state)[0], 0)
    z = sampling.leaf_noise(dkey, params, sampler)
    scales = None
    if cfg.hizoo:
      scales = jax.tree.map(
          lambda h: hess.inv_sqrt(h, cfg.hessian_clip), state.hessian, is_leaf=hess.is_factored
      )
    return _perturb(params if base is None else base, scales, z, coef * jnp.asarray(mu))

  def init_fn(params):
    _check_params(params)
    if n_static is None:
      raise TypeError(
          "num_directions must be a concrete int at init; under optax.inject_hyperparams pass "
          "static_args=('num_directions',)"
      )
    key_data, _ = _seed_to_key(seed)
    loss_dtype = _loss_dtype(params)
    common = dict(
        count=jnp.zeros([], jnp.int32),
        key=key_data,
        loss=jnp.zeros([], loss_dtype),
        loss_plus=jnp.zeros([n_static], loss_dtype),
        loss_minus=jnp.zeros([n_static], loss_dtype),
        skipped_directions=jnp.zeros([], jnp.int32),
    )
    if not cfg.hizoo:
      return ZOState(**common)

    def leaf_dtype(p):
      if cfg.hessian_dtype is not None:
        return jnp.dtype(cfg.hessian_dtype)
      return sampling.noise_dtype(p.dtype)

    h = jax.tree.map(
        lambda p: hess.init_leaf(
            p,
            factored=cfg.factored,
            min_dim_size_to_factor=int(cfg.min_dim_size_to_factor),
            dtype=leaf_dtype(p),
            init_value=hessian_init,
        ),
        params,
    )
    h_dtypes = [x.dtype for x in jax.tree.leaves(h)]
    bounds_dtype = jnp.result_type(jnp.float32, *h_dtypes)
    return HiZOOState(
        hessian=h,
        hessian_bounds=jnp.asarray(cfg.hessian_clip, bounds_dtype),
        skipped_hessian_updates=jnp.zeros([], jnp.int32),
        **common,
    )

  def update_fn(
      updates, state, params=None, *, value_fn=None, key=None, zo_losses=None, **extra_args
  ):
    del updates, extra_args  # ZO transforms measure the loss themselves.
    if zo_losses is None:
      value_fn = _resolve_value_fn(value_fn)
    _check_params(params)
    n = state.loss_plus.shape[0]
    noise_key, next_key = keys_of(state, key)

    if cfg.hizoo:
      hessian_step = hessian_step_of(state)
      alpha = hessian_smoothing(state.count) if callable(hessian_smoothing) else hessian_smoothing
      hessian = state.hessian
    else:
      hessian_step, alpha, hessian = False, 0.0, None

    g, hessian, stats = _zo_estimate(
        cfg,
        params,
        value_fn,
        noise_key,
        n,
        mu,
        sampler,
        hessian,
        hessian_step,
        jnp.asarray(alpha),
        losses=zo_losses,
    )
    common = dict(
        count=numerics.safe_increment(state.count),
        key=jax.random.key_data(next_key).astype(state.key.dtype),
        loss=stats["loss"].astype(state.loss.dtype),
        loss_plus=stats["loss_plus"].astype(state.loss_plus.dtype),
        loss_minus=stats["loss_minus"].astype(state.loss_minus.dtype),
        skipped_directions=state.skipped_directions + stats["skipped_directions"],
    )
    if not cfg.hizoo:
      return g, ZOState(**common)
    hessian = jax.tree.map(lambda new, old: new.astype(old.dtype), hessian, state.hessian)
    return g, HiZOOState(
        hessian=hessian,
        hessian_bounds=state.hessian_bounds,
        skipped_hessian_updates=state.skipped_hessian_updates + stats["skipped_hessian_updates"],
        **common,
    )

  update_fn.zo_hooks = ZOHooks(
      hizoo=cfg.hizoo,
      locate=lambda opt_state: opt_state,
      perturb=perturb,
      hessian_step=hessian_step_of,
      loss_dtype=_loss_dtype,
  )
  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


class ZOHooks(NamedTuple):
  """What :func:`hizoo_jax.make_train_step` needs to run a ZO step's passes itself.

  Attached as ``tx.update.zo_hooks`` by :func:`scale_by_zo`, :func:`scale_by_hizoo` and
  the aliases. The lean step perturbs the params in place with :attr:`perturb`, measures
  the losses, and hands them to ``tx.update(..., zo_losses=(l0, l+, l-))``, which then
  runs the same estimator code as a plain update without calling ``value_fn``.

  Attributes:
    hizoo: whether the transform measures ``l0`` and keeps a Hessian.
    locate: the ZO transform's state within the optimizer state.
    perturb: ``perturb(params, zo_state, coef, base=None) -> base + coef mu H^{-1/2} z``.
    hessian_step: ``hessian_step(zo_state)``: whether this step measures ``l0``.
    loss_dtype: ``loss_dtype(params)``: the dtype losses are recorded in.
  """

  hizoo: bool
  locate: Callable[[Any], Any]
  perturb: Callable[..., Any]
  hessian_step: Callable[[Any], Any]
  loss_dtype: Callable[[Any], Any]


def zo_hooks(tx: optax.GradientTransformation) -> ZOHooks | None:
  """The :class:`ZOHooks` of ``tx`` (None if ``tx`` exposes none, e.g. a custom chain)."""
  return getattr(tx.update, "zo_hooks", None)


def scale_by_zo(
    mu: float = 1e-3,
    *,
    num_directions: int = 1,
    sampler: sampling.Sampler | None = None,
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
    sampler: ``sampler(key, shape, dtype) -> array``; default
      :func:`hizoo_jax.fast_gaussian` (Gaussian moments through the fourth, fused into
      the passes that use it); :func:`hizoo_jax.gaussian` (exact normal, threefry) and
      :func:`hizoo_jax.rademacher` work too.
    seed: int seed or PRNG key; the state carries the key and advances it every step.

  Returns:
    An :class:`optax.GradientTransformationExtraArgs`.

  References:
    Spall, 1992 (SPSA); Malladi et al., "Fine-Tuning Language Models with Just Forward
    Passes", NeurIPS 2023 (MeZO).
  """
  return _make(
      _Config(hizoo=False),
      mu=mu,
      hessian_smoothing=0.0,
      num_directions=num_directions,
      hessian_update_every=1,
      hessian_init=1.0,
      sampler=sampler,
      seed=seed,
  )


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
    sampler: sampling.Sampler | None = None,
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
  ``skipped_hessian_updates``): it would feed rounding noise into the EMA.

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
    sampler: ``sampler(key, shape, dtype) -> array`` with Gaussian moments: default
      :func:`hizoo_jax.fast_gaussian` (E z^2 = 1, E z^4 = 3 exactly, fused into the
      passes that use it), or :func:`hizoo_jax.gaussian` (exact normal, threefry; slower
      and it materialises the noise). Rademacher noise is refused.
    seed: int seed or PRNG key; the state carries the key and advances it every step.

  Returns:
    An :class:`optax.GradientTransformationExtraArgs`; call its update as
    ``tx.update(updates, state, params, value_fn=f, key=None)``.

  References:
    Zhao et al., "Second-Order Fine-Tuning without Pain for LLMs: A Hessian Informed
    Zeroth-Order Optimizer", ICLR 2025.
  """
  cfg = _Config(
      hizoo=True,
      estimator=estimator,
      factored=bool(factored),
      min_dim_size_to_factor=min_dim_size_to_factor,
      hessian_dtype=hessian_dtype,
      hessian_clip=tuple(hessian_clip) if isinstance(hessian_clip, list) else hessian_clip,
      curvature_floor=curvature_floor,
  )
  return _make(
      cfg,
      mu=mu,
      hessian_smoothing=hessian_smoothing,
      num_directions=num_directions,
      hessian_update_every=hessian_update_every,
      hessian_init=hessian_init,
      sampler=sampler,
      seed=seed,
  )


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
  return jax.tree.map(lambda x: hess.dense(x, clip), h, is_leaf=hess.is_factored)
