"""The curvature of a zeroth-order estimate, one small strategy per params leaf.

Two strategies, chosen per leaf at ``init`` and recognised afterwards by the type of the
leaf's state (:func:`strategy_of`):

* :data:`DENSE` (HiZOO): ``H`` is an array shaped like the leaf.
* :data:`FACTORED` (HiZOO-L): a :class:`FactoredHessian` ``(row, col)``.

Each strategy's ``update`` takes one EMA step of ``H`` from a direction's noise and
curvature probe; :func:`init_tree` builds either, and :func:`dense` reads either as the
dense ``H`` that :func:`inv_sqrt` and :func:`over_sqrt` (the update and perturbation scale
``Sigma^{1/2}``) take.

``H`` is the running estimate of the diagonal Hessian (the paper's ``Sigma^{-1}``). Each
params leaf of HiZOO gets either

* a dense array shaped like the leaf (HiZOO), or
* a :class:`FactoredHessian` ``(row, col)`` with ``row.shape == leaf.shape[:-1]`` and
  ``col.shape == leaf.shape[:-2] + leaf.shape[-1:]`` (HiZOO-L, Adafactor-style), standing
  for ``H_hat = row[..., :, None] * col[..., None, :] / sum(row, -1)[..., None, None]``.

All functions here work on one leaf; the transform maps them over the params tree. The
curvature estimate ``est`` itself is formed here too, so the formulas of section 1 of the
paper live in exactly one place:

    paper:     est = |c| * H * z^2                with c = (l+ + l- - 2 l0) / (2 mu^2)
    unbiased:  est = c * H * (z^2 - 1)            (signed; E[est] = diag(A) exactly)
    EMA:       H  <- clip(H + alpha * (est - H))  (== (1 - alpha) H + alpha est, rounded once)

The unbiased (MiNES) estimate enters the EMA with its sign. A signed estimate can drive
``(1 - alpha) H + alpha est`` below zero when ``H`` underestimates the curvature (then
``c`` is huge): one such draw would send ``H`` to the clip floor and the next perturbation,
``mu H^{-1/2} z``, to ``1e4 mu``. So on this path ``H`` may at most halve per update
(``H_new >= H / 2``, :data:`UNBIASED_MAX_DECREASE`). The floor binds only when
``alpha (c + 1) > 1/2``; in steady state (``alpha c << 1``) the update stays unbiased.
Taking ``|c H (z^2 - 1)|`` instead (a tempting way to keep it positive) brings the trace
back: ``E|z^2 - 1| = 0.968``, so its mean is ``~0.48 (tr A - A_ii) + ...`` (measured: 23.8
for a true 1.0 on diag(1, 2, 5, 10, 30)), almost as biased as the paper estimator (25.0).
    factored:  E = est with H_hat;  row <- EMA(row, sum(E, -1));  col <- EMA(col, sum(E, -2))
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

ESTIMATORS = ("paper", "unbiased")
UNBIASED_MAX_DECREASE = 0.5  # the unbiased path keeps H_new >= (1 - 0.5) H


class FactoredHessian(NamedTuple):
  """Rank-1 (Adafactor-style) diagonal Hessian of one matrix-shaped leaf.

  Attributes:
    row: row sums of ``H``, shape ``leaf.shape[:-1]`` (``[..., p]``).
    col: column sums of ``H``, shape ``leaf.shape[:-2] + (q,)`` (``[..., q]``).
  """

  row: jax.Array
  col: jax.Array


def is_factored(h: Any) -> bool:
  return isinstance(h, FactoredHessian)


def should_factor(shape: tuple[int, ...], min_dim_size_to_factor: int) -> bool:
  """HiZOO-L factors leaves with ndim >= 2 whose last two dims are both large enough."""
  return len(shape) >= 2 and min(shape[-2:]) >= min_dim_size_to_factor


def init_leaf(
    leaf: Any, *, factored: bool, min_dim_size_to_factor: int, dtype: Any, init_value: Any
) -> jax.Array | FactoredHessian:
  """The Hessian state of one leaf, starting from ``H = init_value`` (may be traced)."""
  shape = tuple(jnp.shape(leaf))  # a Python float leaf has shape ()
  v = jnp.asarray(init_value, dtype)
  if factored and should_factor(shape, min_dim_size_to_factor):
    p, q = shape[-2], shape[-1]
    # H = v everywhere  <=>  row = q v, col = p v  (then row col / sum(row) = v).
    row = jnp.full(shape[:-1], q * v, dtype)
    col = jnp.full(shape[:-2] + (q,), p * v, dtype)
    return FactoredHessian(row, col)
  return jnp.full(shape, v, dtype)


def dense(h: jax.Array | FactoredHessian, clip: tuple[float, float]) -> jax.Array:
  """The dense diagonal Hessian of one leaf (reconstructed and clipped if factored)."""
  if is_factored(h):
    total = jnp.sum(h.row, axis=-1)[..., None, None]
    full = h.row[..., :, None] * h.col[..., None, :] / total
    return jnp.clip(full, clip[0], clip[1])
  return h


def inv_sqrt(h: jax.Array | FactoredHessian, clip: tuple[float, float],
             read_once: bool = False) -> jax.Array:
  """``H^{-1/2}`` of one leaf, the update's scale ``Sigma^{1/2}``.

  By default from multiplies and adds (:func:`rsqrt`): an optimizer chained after HiZOO
  may read the estimate in several fusions, and each then recomputes it instead of
  storing it. ``read_once``: the estimate is read by one fused pass (a learning rate and
  weight decay, as in :func:`hizoo_jax.hizoo`), so the two correctly rounded ops of
  :func:`over_sqrt` do; they compile faster (HiZOO's first step on 200 tensors: 16% less
  XLA time than with :func:`rsqrt`'s twenty ops in every update pass).
  """
  d = dense(h, clip)
  return _sqrt_of_reciprocal(d) if read_once else rsqrt(d)


def _sqrt_of_reciprocal(d: jax.Array) -> jax.Array:
  return jax.lax.sqrt(jax.lax.div(jnp.ones_like(d), d))


def over_sqrt(direction: jax.Array, h: jax.Array | FactoredHessian,
              clip: tuple[float, float]) -> jax.Array:
  """``direction * H^{-1/2}`` of one leaf, in the direction's dtype: the perturbation
  ``c mu D``, which one fusion reads (the pass that moves the params, or the forward pass
  that reads ``theta + c mu D``), so :func:`rsqrt`'s reason does not apply.

  ``sqrt(1 / H)``: a divide and a square root, each correctly rounded, so every program
  computes the same bits (the plain update's and the lean step's, whatever their fusions).
  Not ``x / sqrt(H)``: XLA rewrites it into ``rsqrt``, and ``jax.lax.rsqrt`` here broke the
  bfloat16 exact step's bit-identity with the plain update (measured on an AMD EPYC). Two
  ops where :func:`rsqrt` has about twenty in each perturbation pass: on 200 tensors, 0.9 s
  less of a 6 s compile.
  """
  return direction * _sqrt_of_reciprocal(dense(h, clip)).astype(direction.dtype)


# x^{-1/2} of floats from multiplies and adds: a first guess from the bits, then Newton
# steps (per dtype: enough to reach its rounding from the guess's 3.4%).
_RSQRT_MAGIC = {jnp.dtype(jnp.float32): (jnp.int32, 0x5F375A86, 3),
                jnp.dtype(jnp.float64): (jnp.int64, 0x5FE6EB50C7B537A9, 4)}


def rsqrt(x: jax.Array) -> jax.Array:
  """``x ** -0.5`` for positive finite ``x``, from elementwise multiplies and adds only.

  Why not ``jax.lax.rsqrt``: XLA copies a cheap elementwise producer into each fusion
  that consumes it, but not a transcendental one. When the optimizer after HiZOO reads
  the estimate twice (Adam: its first and second moments are two fusions), XLA stores
  ``H^{-1/2}`` once per leaf rather than compute it twice: 0.98 param bytes over a
  forward pass with one probe, 3.99 with four (measured). Built from multiplies and adds,
  ``H^{-1/2}`` is recomputed inside each consumer, and nothing is stored (0.004 and 0.009).

  The first guess comes from the float's bits (halve the exponent, subtract from a
  constant): within 3.4% of the result. Each Newton step ``y <- y (3/2 - x y^2 / 2)``
  roughly squares the relative error (3.4% -> 2e-3 -> 5e-6 -> 3e-11 -> 1e-21), so three
  steps reach float32's rounding and four float64's. Measured over 3e5 values from
  1e-30 to 1e30 (float32) and 1e-300 to 1e300 (float64): within 2 ulp of the exact
  ``x ** -0.5`` (``jax.lax.rsqrt``: 1.6 ulp in float32, 1.2 in float64). Other float dtypes
  are computed in float32. NaN stays NaN.
  """
  # jax.lax ops rather than jnp's: the same arithmetic, but each jnp op is a nested jit
  # that costs its own trace, per leaf and per call.
  lax = jax.lax
  dtype = jnp.result_type(x)
  work = dtype if dtype in _RSQRT_MAGIC else jnp.dtype(jnp.float32)
  xw = lax.convert_element_type(x, work)
  itype, magic, steps = _RSQRT_MAGIC[work]
  bits = lax.bitcast_convert_type(xw, itype)
  guess = lax.sub(lax.full_like(bits, magic), lax.shift_right_arithmetic(
      bits, lax.full_like(bits, 1)))
  y = lax.bitcast_convert_type(guess, work)
  half = lax.mul(xw, lax.full_like(xw, 0.5))
  three_halves = lax.full_like(xw, 1.5)
  for _ in range(steps):
    y = lax.mul(y, lax.sub(three_halves, lax.mul(lax.mul(half, y), y)))
  return lax.convert_element_type(y, dtype)


def estimate(
    h_dense: jax.Array, z: jax.Array, curvature: jax.Array, estimator: str
) -> jax.Array:
  """The one-direction estimate ``est`` of one leaf.

  Args:
    h_dense: the (previous) dense Hessian of the leaf, the one the perturbation used.
    z: the leaf's noise.
    curvature: the scalar ``(l+ + l- - 2 l0) / (2 mu^2)``.
    estimator: ``"paper"`` (``|c| H z^2``, the paper's Algorithm 1, which drops the
      ``-Sigma^{-1}`` term of the MiNES identity) or ``"unbiased"`` (``c H (z^2 - 1)``,
      signed, the MiNES identity itself).
  """
  z2 = jnp.square(z).astype(h_dense.dtype)
  c = curvature.astype(h_dense.dtype)
  if estimator == "paper":
    return jnp.abs(c) * h_dense * z2
  if estimator == "unbiased":
    return c * h_dense * (z2 - 1)
  raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")


def update_leaf(
    h: jax.Array | FactoredHessian,
    z: jax.Array | Callable[..., jax.Array],
    curvature: jax.Array,
    alpha: jax.Array,
    *,
    estimator: str,
    clip: tuple[float, float],
    rows: Callable[[Any, int], jax.Array] | None = None,
) -> jax.Array | FactoredHessian:
  """One EMA step of the leaf's Hessian with the estimate from noise ``z``.

  ``z`` is the leaf's noise, or (factored leaves) a function ``z(after=())`` regenerating
  it, ordered after ``after``. ``rows(start, count)`` (factored leaves, optional) draws a
  block of rows of the same noise: then the row and column sums of the estimate are
  accumulated block by block and no leaf-sized temporary exists.

  The arithmetic runs in at least float32 and the result is clipped into the storage
  dtype's finite, normal range before the cast back, so a low-precision ``H`` (which the
  default never picks) is coarse but never inf, NaN or zero.
  """
  lo, hi = clip
  alpha = jnp.asarray(alpha)
  if is_factored(h):
    # z may be a function ``z(after=())`` that regenerates the noise: then the row and
    # the column sums each draw it inside their own reduction and E is never stored.
    work = _upcast(h)
    p, q = work.row.shape[-1], work.col.shape[-1]
    if rows is not None:
      row_sum, col_sum = _blocked_sums(work, rows, curvature, estimator, clip)
    else:
      zfn = z if callable(z) else (lambda after=(): z)
      full = dense(work, clip)
      row_sum = jnp.sum(estimate(full, zfn(), curvature, estimator), axis=-1)
      col_sum = jnp.sum(estimate(full, zfn(after=row_sum), curvature, estimator), axis=-2)
    a = alpha.astype(work.row.dtype)
    row = _floor(work.row + a * (row_sum - work.row), work.row, estimator)
    col = _floor(work.col + a * (col_sum - work.col), work.col, estimator)
    # Row sums of an H in [lo, hi] lie in [q lo, q hi]; column sums in [p lo, p hi].
    return FactoredHessian(
        _store(row, q * lo, q * hi, h.row.dtype), _store(col, p * lo, p * hi, h.col.dtype)
    )
  work = _upcast(h)
  e = estimate(work, z, curvature, estimator)
  new = _floor(work + alpha.astype(work.dtype) * (e - work), work, estimator)
  return _store(new, lo, hi, h.dtype)


BLOCK_ELEMENTS = 1 << 20  # elements of a factored leaf's estimate alive at a time


def _blocked_sums(work: FactoredHessian, rows, curvature, estimator, clip):
  """Row and column sums of a factored leaf's estimate, accumulated over row blocks."""
  lead, p, q = work.row.shape[:-1], work.row.shape[-1], work.col.shape[-1]
  block = max(1, min(p, BLOCK_ELEMENTS // max(1, q * math.prod(lead))))
  n_blocks = -(-p // block)
  # Under a mesh with Explicit axes, the block's values must carry one sharding: the row
  # and column factors (p + q floats) are gathered first, so each block is computed whole,
  # as its noise rows are, and the sums come out replicated.
  work = FactoredHessian(_replicated(work.row), _replicated(work.col))
  total = jnp.sum(work.row, axis=-1)[..., None, None]
  dtype = work.row.dtype

  def body(k, sums):
    row_sum, col_sum = sums
    start = jnp.minimum(k * block, p - block)  # the last block may overlap the previous
    own = start + jnp.arange(block) >= k * block
    r = jax.lax.dynamic_slice_in_dim(work.row, start, block, axis=-1)
    h = jnp.clip(r[..., :, None] * work.col[..., None, :] / total, clip[0], clip[1])
    e = estimate(h, rows(start, block).astype(dtype), curvature, estimator)
    e = jnp.where(own[:, None], e, 0)
    old = jax.lax.dynamic_slice_in_dim(row_sum, start, block, axis=-1)
    new = jnp.where(own, jnp.sum(e, axis=-1), old)
    row_sum = jax.lax.dynamic_update_slice_in_dim(row_sum, new, start, axis=-1)
    return row_sum, col_sum + jnp.sum(e, axis=-2)

  init = (jnp.zeros_like(work.row), jnp.zeros_like(work.col))  # on the factors' mesh
  return jax.lax.fori_loop(0, n_blocks, body, init)


def _replicated(x: jax.Array) -> jax.Array:
  """``x`` replicated when its type holds an explicit sharding (a mesh with Explicit axes);
  otherwise ``x`` (Auto axes or no mesh: XLA propagates the shardings itself)."""
  sharding = jax.typeof(x).sharding
  mesh = sharding.mesh
  if mesh.empty or all(s is None for s in sharding.spec):
    return x
  if not any(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types):
    return x
  return jax.sharding.reshard(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))


def _upcast(h: Any) -> Any:
  return jax.tree.map(lambda x: x.astype(jnp.promote_types(x.dtype, jnp.float32)), h)


def _store(x: jax.Array, lo: float, hi: float, dtype: Any) -> jax.Array:
  info = jnp.finfo(dtype)
  return jnp.clip(x, max(lo, float(info.tiny)), min(hi, float(info.max))).astype(dtype)


def _floor(new: jax.Array, old: jax.Array, estimator: str) -> jax.Array:
  """The unbiased path's guard against a sign flip: ``new >= old / 2``."""
  if estimator == "unbiased":
    return jnp.maximum(new, (1 - UNBIASED_MAX_DECREASE) * old)
  return new


# ----------------------------------------------------------------------------------------
# The strategies.


class _Dense:
  """HiZOO: a dense ``H`` shaped like the leaf."""

  name = "dense"

  def update(self, h, z, curvature, alpha, *, estimator, clip, rows=None):
    del rows
    return update_leaf(h, z() if callable(z) else z, curvature, alpha, estimator=estimator,
                       clip=clip)


class _Factored:
  """HiZOO-L: ``H`` stored as row and column sums (:class:`FactoredHessian`)."""

  name = "factored"

  def update(self, h, z, curvature, alpha, *, estimator, clip, rows=None):
    return update_leaf(h, z, curvature, alpha, estimator=estimator, clip=clip, rows=rows)


DENSE = _Dense()
FACTORED = _Factored()


def strategy_of(h: Any):
  """The strategy a leaf's curvature state belongs to."""
  if is_factored(h):
    return FACTORED
  return DENSE


def init_tree(params: Any, *, factored: bool, min_dim_size_to_factor: int, dtype_of, init_value):
  """The Hessian tree of ``params``: a factored leaf where HiZOO-L factors, else dense."""
  return jax.tree.map(
      lambda p: init_leaf(p, factored=factored, min_dim_size_to_factor=min_dim_size_to_factor,
                          dtype=dtype_of(p), init_value=init_value),
      params)
