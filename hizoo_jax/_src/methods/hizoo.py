"""HiZOO, HiZOO-multi and HiZOO-L: the SPSA estimate preconditioned by a diagonal Hessian.

With ``H`` the running estimate of the diagonal Hessian (the paper's ``Sigma^{-1}``), one
step with ``n`` probes on the same batch (Algorithms 1 and 3 of Zhao et al., ICLR 2025)::

    l0 = f(theta)                                     # Hessian steps only, once per step
    for j in 1..n:
        l+-_j = f(theta +- mu H^{-1/2} z_j)            # H after the probes before j
        H     = clip(H + alpha (est(l+ + l- - 2 l0, H, z_j) - H))
        g_j   = (l+ - l-) / (2 mu) * H^{-1/2} z_j      # with the updated H
    g = mean of the g_j over the probes whose losses were finite

The per-leaf curvature strategies (dense ``H``, or HiZOO-L's rank-1 row and column
factors) live in :mod:`hizoo_jax._src.curvature`.

Probe ``j``'s direction depends on the Hessian updates of the probes before it. The
engine runs the probes as in-place passes over the params with the optimizer state left
as it was until the final update, so :meth:`HiZOO.displacement` replays those updates from
the stored ``H`` and the losses measured so far: elementwise for dense leaves (fused into
the pass, no params-sized temporary), one row-blocked reduction per replayed probe for
factored ones. A step with one probe replays nothing.
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

from hizoo_jax._src import alias, numerics, sampling, transform
from hizoo_jax._src import config as cfg
from hizoo_jax._src import curvature as curv
from hizoo_jax._src import method as m
from hizoo_jax._src.alias import ScalarOrSchedule
from hizoo_jax._src.methods import spsa


class HiZOOState(NamedTuple):
  """The state HiZOO keeps besides the transform's (:class:`hizoo_jax.ZOState`).

  Attributes:
    hessian: the diagonal-Hessian estimate ``H``, a tree shaped like the params whose
      leaves are dense arrays or :class:`hizoo_jax.FactoredHessian` (HiZOO-L).
    hessian_bounds: ``(lo, hi)`` clip bounds of ``H``, used to rebuild factored leaves.
    skipped_hessian_updates: Hessian updates skipped so far because the second difference
      ``|l+ + l- - 2 l0|`` was under the loss dtype's rounding floor.
  """

  hessian: Any
  hessian_bounds: jax.Array
  skipped_hessian_updates: jax.Array


@dataclasses.dataclass(frozen=True)
class HiZOO(m.Method):
  """HiZOO's method object: ``D_j = H^{-1/2} z_j`` with ``H`` as of probe ``j``."""

  name = "hizoo"
  # The restore reads the old H^{-1/2} while the update writes the new H in place; in
  # one pass XLA keeps a copy of H (1.0 param bytes, measured), so it stays a pass.
  restore_in_update = False
  estimator: str = "paper"
  factored: bool = False
  hessian_dtype: Any = None
  hessian_clip: tuple[float, float] = (1e-8, 1e8)
  # The estimate is read by one fused pass (hz.hizoo's learning rate and weight decay, with
  # nothing chained after the alias that reads it twice), so its H^{-1/2} need not be cheap
  # for XLA to recompute (curvature.inv_sqrt).
  estimate_read_once: bool = False

  @property
  def state_after_params(self) -> bool:
    # Several probes: the g pass replays the H_j chain from the stored H (dense leaves).
    return self.num_probes > 1 and not self.factored

  @property
  def independent_probes(self) -> bool:
    # Probe j's direction uses H after the Hessian updates of the probes before it.
    return self.num_probes == 1

  def check(self, hyper):
    spsa.check_mu(hyper)
    cfg.check_unit_interval("hessian_smoothing", hyper["hessian_smoothing"])
    cfg.check_positive("hessian_init", hyper["hessian_init"])
    cfg.check_int("hessian_update_every", hyper["hessian_update_every"], 1)
    if self.estimator not in curv.ESTIMATORS:
      raise ValueError(f"estimator must be one of {curv.ESTIMATORS}, got {self.estimator!r}")
    clip = self.hessian_clip
    if (not isinstance(clip, tuple | list) or len(clip) != 2
        or not all(isinstance(c, int | float) for c in clip)):
      raise TypeError(f"hessian_clip must be a (lo, hi) pair of floats, got {clip!r}")
    if not (0 < clip[0] <= clip[1] < np.inf):
      raise ValueError(f"hessian_clip must satisfy 0 < lo <= hi < inf, got {clip!r}")
    if self.hessian_dtype is not None:
      try:
        dt = jnp.dtype(self.hessian_dtype)
      except TypeError as e:
        raise TypeError(f"hessian_dtype must be a float dtype, got {self.hessian_dtype!r}") from e
      if not jnp.issubdtype(dt, jnp.floating):
        raise TypeError(f"hessian_dtype must be a float dtype, got {self.hessian_dtype!r}")
    cfg.check_int("min_dim_size_to_factor", hyper["min_dim_size_to_factor"], 1)
    cfg.check_nonnegative("curvature_floor", hyper["curvature_floor"])

  def _leaf_dtype(self, leaf):
    if self.hessian_dtype is not None:
      return jnp.dtype(self.hessian_dtype)
    return sampling.noise_dtype(jnp.result_type(leaf))

  def init(self, params, hyper):
    min_dim = cfg.concrete(hyper["min_dim_size_to_factor"])
    if min_dim is None:
      raise TypeError("min_dim_size_to_factor must be concrete at init; under "
                      "optax.inject_hyperparams list it in static_args")
    h = curv.init_tree(params, factored=self.factored, min_dim_size_to_factor=int(min_dim),
                       dtype_of=self._leaf_dtype, init_value=hyper["hessian_init"])
    bounds_dtype = jnp.result_type(jnp.float32, *[x.dtype for x in jax.tree.leaves(h)])
    return HiZOOState(hessian=h, hessian_bounds=jnp.asarray(self.hessian_clip, bounds_dtype),
                      skipped_hessian_updates=jnp.zeros([], jnp.int32))

  def in_effect(self, hyper, count, params, state):
    every = jnp.maximum(jnp.asarray(hyper["hessian_update_every"], jnp.int32), 1)
    s = hyper["hessian_smoothing"]
    alpha = numerics.sanitize_alpha(jnp.asarray(s(count) if callable(s) else s))
    dtype = numerics.loss_dtype(params)
    return {**spsa.mu_in_effect(hyper, params),
            "center": (count % every) == 0,
            "alpha": alpha.astype(jnp.promote_types(alpha.dtype, jnp.float32)),
            "curvature_floor": jnp.asarray(hyper["curvature_floor"], dtype)}

  # -- the per-probe scalars ---------------------------------------------------------------

  def _probe_scalars(self, hyper, measured, j, dtype, valid=True):
    """``(proj, c, do_h, finite, skipped_h)`` of probe ``j`` (static index)."""
    lp, lm = m.probe_values(self, measured, dtype)
    lp, lm = lp[j], lm[j]
    l0 = jnp.asarray(measured.center, dtype)
    center = hyper["center"]
    mu = hyper["mu"].astype(dtype)
    finite = (jnp.isfinite(lp) & jnp.isfinite(lm) & hyper["mu_ok"]
              & (jnp.isfinite(l0) | ~center) & valid)
    proj = jnp.where(finite, (lp - lm) / (2 * mu), 0)
    # The second difference, and whether it rises above the loss dtype's rounding floor.
    d2 = lp + lm - 2 * l0
    scale = jnp.maximum(jnp.maximum(jnp.abs(lp), jnp.abs(lm)), jnp.abs(l0))
    floor_mult = hyper["curvature_floor"].astype(dtype)
    resolved = (jnp.abs(d2) > floor_mult * jnp.finfo(dtype).eps * scale) | (floor_mult == 0)
    do_h = center & finite & resolved
    c = jnp.where(do_h, d2 / (2 * jnp.square(mu)), 0)
    skipped_h = (center & finite & ~resolved).astype(jnp.int32)
    proj, c, do_h = numerics.computed_once((proj, c, do_h))
    return proj, c, do_h, finite, skipped_h

  def _advance(self, noise, h_leaves, j, c, do_h, alpha, tie, dense_only=None, after=()):
    """``H`` after probe ``j``'s update (``do_h`` false: unchanged), leaf by leaf.

    A factored leaf needs reductions over its estimate; its noise is regenerated for each
    use, after the previous factored leaf is done (a cond whose predicate depends on it),
    so neither its estimate nor its noise is materialised and at most one leaf's
    temporaries are alive. ``tie``: draw the dense leaves' noise with a key XLA cannot
    merge with another pass's (see :meth:`estimate`). ``dense_only``: the factored leaves'
    states after this probe, already computed (they are small); only the dense leaves
    are updated here. ``after``: the whole probe's noise is ordered after these values
    (the engine's loop index, so that XLA does not hoist a replayed probe's noise out of
    the loop into a params-sized buffer).
    """
    words = noise.words(j, after)
    new, last = [], None
    for i, (p, h) in enumerate(zip(noise.leaves, h_leaves, strict=True)):
      zfn = (lambda after=(), i=i, p=p: words.noise(noise.sampler, i, p, after))
      strategy = curv.strategy_of(h)
      if strategy is curv.FACTORED:
        if dense_only is not None:
          new.append(dense_only[i])
          continue
        go = do_h if last is None else do_h & jnp.all(jnp.isfinite(last.row))
        rows = sampling.leaf_rows(noise.sampler, words.key(i), p)
        h = jax.lax.cond(
            go,
            lambda h, zfn=zfn, rows=rows: curv.FACTORED.update(
                h, zfn, c, alpha, estimator=self.estimator, clip=self.hessian_clip, rows=rows),
            lambda h: h,
            h,
        )
        last = h
      else:
        zh = zfn(after=tie) if tie else zfn()
        h_up = strategy.update(h, zh, c, alpha, estimator=self.estimator,
                               clip=self.hessian_clip)
        h = jnp.where(do_h, h_up, h)
      new.append(h)
    return new

  # -- the interface -----------------------------------------------------------------------

  def displacement(self, noise, state, hyper, j, measured, step, after=()):
    dtype = measured.values.dtype
    h_leaves = _leaves_of(state.hessian, noise.leaves)
    for i in range(self.num_probes - 1):  # replay the probes before j
      _, c, do_h, _, _ = self._probe_scalars(hyper, measured, i, dtype)
      h_leaves = self._advance(noise, h_leaves, i, c, do_h & (i < j), hyper["alpha"], (),
                               after=after)
    words = noise.words(j, after)
    out = []
    for i, (p, h) in enumerate(zip(noise.leaves, h_leaves, strict=True)):
      z = words.noise(noise.sampler, i, p)
      out.append(curv.over_sqrt(step.astype(z.dtype) * z, h, self.hessian_clip))
    return out

  def estimate(self, noise, state, hyper, params, measured):
    """The probes' Hessian updates and estimates, in order.

    In the engine's final pass (``noise.lean``) the new ``H`` (the state's pass) and
    ``g`` (the params' pass) are separate fusions: sharing one ``z`` between them would
    make XLA store it, so the state's updates draw their noise with keys tied to the
    probe's curvature scalar. With several probes the ``g`` pass also needs each
    intermediate ``H_j``; it recomputes their chain from the stored ``H`` with its own
    draws (several noise regenerations per element instead of a params-sized buffer per
    intermediate ``H_j``; the factored leaves' small states are shared).
    """
    dtype = measured.values.dtype
    h0 = _leaves_of(state.hessian, params)
    scalars = [self._probe_scalars(hyper, measured, j, dtype) for j in range(self.num_probes)]
    separate = noise.lean and self.num_probes > 1
    tie = (lambda c: (c,)) if noise.lean else (lambda c: ())
    h_state, chain = h0, []
    for j, (_, c, do_h, _, _) in enumerate(scalars):
      h_state = self._advance(noise, h_state, j, c, do_h, hyper["alpha"], tie(c))
      chain.append(h_state)
    g = m.noise_zeros(params)
    n_valid = jnp.zeros((), jnp.int32)
    n_skip_h = jnp.zeros((), jnp.int32)
    h_g = h0
    for j, (proj, c, do_h, finite, skipped_h) in enumerate(scalars):
      if separate:
        h_g = self._advance(noise, h_g, j, c, do_h, hyper["alpha"], (), dense_only=chain[j])
      else:
        h_g = chain[j]
      words = noise.words(j)
      g = [a + proj.astype(a.dtype) * m.scale_leaf(
               words.noise(noise.sampler, i, p),
               curv.inv_sqrt(h, self.hessian_clip, read_once=self.estimate_read_once))
           for i, (a, p, h) in enumerate(zip(g, params, h_g, strict=True))]
      n_valid = n_valid + finite.astype(jnp.int32)
      n_skip_h = n_skip_h + skipped_h
    h_leaves = h_state
    denom = jnp.maximum(n_valid, 1)
    g = [a / denom.astype(a.dtype) for a in g]
    treedef = jax.tree.structure(state.hessian, is_leaf=curv.is_factored)
    old = treedef.flatten_up_to(state.hessian)
    hessian = treedef.unflatten([jax.tree.map(lambda n, o: n.astype(o.dtype), new, o)
                                 for new, o in zip(h_leaves, old, strict=True)])
    lp, lm = m.probe_values(self, measured, dtype)
    loss = jnp.where(hyper["center"], jnp.asarray(measured.center, dtype),
                     jnp.mean((lp + lm) / 2))
    new_state = state._replace(
        hessian=hessian,
        skipped_hessian_updates=state.skipped_hessian_updates + n_skip_h)
    projected = sum(s[0] for s in scalars) / denom.astype(dtype)
    return g, new_state, dict(loss=loss, skipped=self.num_probes - n_valid, projected=projected)


def _leaves_of(hessian: Any, leaves: list) -> list:
  """The Hessian's per-leaf states, in the order of the params' leaves."""
  h = jax.tree.leaves(hessian, is_leaf=curv.is_factored)
  if len(h) != len(leaves):
    raise ValueError(f"the Hessian state has {len(h)} leaves but the params have "
                     f"{len(leaves)}: is the optimizer state from another model?")
  return h


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
  options = dict(
      mu=mu, hessian_smoothing=hessian_smoothing, estimator=estimator,
      num_directions=num_directions, factored=factored,
      min_dim_size_to_factor=min_dim_size_to_factor, hessian_update_every=hessian_update_every,
      hessian_clip=hessian_clip, hessian_init=hessian_init, hessian_dtype=hessian_dtype,
      curvature_floor=curvature_floor, mu_resolution=mu_resolution, sampler=sampler, seed=seed)
  return _scale_by_hizoo(options, estimate_read_once=False)


def _scale_by_hizoo(options: dict[str, Any], *, estimate_read_once: bool):
  """:func:`scale_by_hizoo` with all its ``options``; ``estimate_read_once``: only a fused
  pass reads the estimate (the aliases), see :func:`hizoo_jax._src.curvature.inv_sqrt`."""
  o = options
  clip = o["hessian_clip"]
  method = HiZOO(
      sampler=cfg.check_sampler(o["sampler"], needs_gaussian=True),
      key_impl=cfg.key_impl_of(o["seed"]),
      num_probes=cfg.probes(o["num_directions"]),
      estimator=o["estimator"],
      factored=bool(o["factored"]),
      hessian_dtype=o["hessian_dtype"],
      hessian_clip=tuple(clip) if isinstance(clip, list) else clip,
      estimate_read_once=estimate_read_once,
  )
  hyper = {k: o[k] for k in ("mu", "mu_resolution", "hessian_smoothing",
                             "hessian_update_every", "hessian_init", "min_dim_size_to_factor",
                             "curvature_floor")}
  return transform.zo_transform(method, hyper, o["seed"])


HIZOO_OPTIONS: tuple[inspect.Parameter, ...] = tuple(
    p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
    for p in inspect.signature(scale_by_hizoo).parameters.values())
"""The options of :func:`scale_by_hizoo`, which the aliases take as keywords too."""


@alias.shared_args_doc
def hizoo(
    learning_rate: ScalarOrSchedule,
    *,
    weight_decay: float = 0.0,
    weight_decay_mask: Any = None,
    **options: Any,
) -> optax.GradientTransformationExtraArgs:
  """HiZOO: ``theta <- theta - lr * (g_hizoo + weight_decay * theta)``.

  The defaults are ``mu=1e-3`` (the paper's) and ``hessian_smoothing=1e-8`` (the paper
  states no value; the reference code's READMEs disagree: 1e-6 for full fine-tuning and
  1e-10 for LoRA in its 2024 RoBERTa README, the reverse in its 2024 OPT README, 1e-8 in
  its current one, and its scripts default to 0; see :mod:`hizoo_jax.presets`,
  :data:`~hizoo_jax.presets.REFERENCE_FT`, :data:`~hizoo_jax.presets.REFERENCE_LORA`). On
  small models that ``alpha`` barely moves the Hessian from 1, and HiZOO then behaves like
  MeZO with one more forward pass; :func:`hizoo_jax.presets.hizoo` sets
  ``alpha = 0.5 / d`` (d = number of params) and ``mu = 1e-2`` instead.

  Args:
    {shared_args}
    **options: every option of :func:`hizoo_jax.scale_by_hizoo` (``mu``,
      ``hessian_smoothing``, ``estimator``, ``num_directions``, ``factored``, ...).

  Example:
    >>> import jax.numpy as jnp, hizoo_jax as hz
    >>> tx = hz.hizoo(1e-2, mu=1e-2, hessian_smoothing=1e-3)
    >>> params = {"w": jnp.ones(4)}
    >>> step = hz.make_train_step(tx, lambda p, x: jnp.sum((p["w"] - x) ** 2))
    >>> params, state, loss = step(params, tx.init(params), jnp.zeros(4))
    >>> float(loss)  # l0 = f(theta) on a Hessian step
    4.0

  References:
    Zhao et al., "Second-Order Fine-Tuning without Pain for LLMs: A Hessian Informed
    Zeroth-Order Optimizer", ICLR 2025, Algorithms 1 and 3.
  """
  # The estimate goes to the weight decay and the learning rate, one fused pass.
  try:
    bound = inspect.signature(scale_by_hizoo).bind(**options)
  except TypeError as e:
    raise TypeError(f"hizoo() {e}") from None
  bound.apply_defaults()
  return alias.with_decay_and_lr(_scale_by_hizoo(bound.arguments, estimate_read_once=True),
                                 learning_rate, weight_decay, weight_decay_mask)


hizoo.__signature__ = alias.signature(HIZOO_OPTIONS)  # type: ignore[attr-defined]


def hizoo_l(
    learning_rate: ScalarOrSchedule,
    *,
    weight_decay: float = 0.0,
    weight_decay_mask: Any = None,
    **options: Any,
) -> optax.GradientTransformationExtraArgs:
  """HiZOO-L: HiZOO with a rank-1 (Adafactor-style) Hessian for large matrices.

  A ``p x q`` matrix leaf keeps ``p + q`` Hessian floats instead of ``p q``; leaves whose
  last two dims are not both ``>= min_dim_size_to_factor`` (and vectors) keep a dense
  Hessian. Arguments as in :func:`hizoo` (``factored`` is implied).

  References:
    Zhao et al., ICLR 2025, Appendix D.1, Algorithm 2; Shazeer & Stern, 2018 (Adafactor).
  """
  if "factored" in options:
    raise TypeError("hizoo_l() is hizoo(factored=True); it takes no 'factored' argument")
  return hizoo(learning_rate, weight_decay=weight_decay, weight_decay_mask=weight_decay_mask,
               factored=True, **options)


hizoo_l.__signature__ = alias.signature(  # type: ignore[attr-defined]
    HIZOO_OPTIONS, drop=("factored",))
