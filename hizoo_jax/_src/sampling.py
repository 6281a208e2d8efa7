"""Keys to perturbations: the noise of every zeroth-order step, regenerated on demand.

Nothing here is ever stored in optimizer state. A step's noise is a pure function of
(the state's key at that step, the direction index, the leaf index), so any part of
the code (the estimator, the in-place train step, a debugging session) regenerates
exactly the same ``z`` from the same key.

Key schedule (public and stable; tests and the lean train step rely on it)::

    noise_key, next_state_key = jax.random.split(state_key)
    direction_key_j           = jax.random.fold_in(noise_key, j)
    leaf keys                 = optax.tree_utils.tree_split_key_like(direction_key_j, params)
    z_j[leaf]                 = sampler(leaf_key, leaf.shape, noise_dtype(leaf))
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax.tree_utils as otu

Sampler = Callable[[jax.Array, tuple[int, ...], Any], jax.Array]


def gaussian(key: jax.Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
  """Exact standard normal noise, ``z ~ N(0, I)``, from ``jax.random.normal``.

  On XLA:CPU the threefry generator materialises its bits and its normals for every leaf
  and costs about 0.8 forward passes of a 12.6M-parameter MLP at 1024 rows per draw
  (benchmarks/RESULTS.md); :func:`fast_gaussian`, the default, avoids both.
  """
  return jax.random.normal(key, shape, dtype)


def rademacher(key: jax.Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
  """Random signs, ``z in {-1, +1}``. Valid for SPSA/MeZO gradients only.

  Its fourth moment is 1, not 3, so the HiZOO curvature estimate built on
  ``E[z^2 z^2]`` is wrong with it; :func:`hizoo_jax.scale_by_hizoo` refuses it.
  """
  return jax.random.rademacher(key, shape, jnp.int8).astype(dtype)


# Samplers whose fourth moment is not Gaussian. Users can mark their own sampler with
# ``sampler.gaussian = False`` to get the same protection.
rademacher.gaussian = False  # type: ignore[attr-defined]


# fast_gaussian: z = A s + B s^3 with s = SCALE (b0 + b1 + b2 + b3 - 510) / 256 the
# standardized sum of the four bytes of one 32-bit hash. A and B solve E z^2 = 1 and
# E z^4 = 3 exactly for that discrete distribution (tests/test_sampling.py recomputes them).
_FAST_A = 0.9490332780957843
_FAST_B = 0.018642382500609324
_FAST_SCALE = 1.7320640222190664
_GOLDEN = 0x9E3779B9  # odd: idx * _GOLDEN is a bijection of the 32-bit counter


def _mix32(x: jax.Array) -> jax.Array:
  """A 32-bit integer finalizer (xorshift-multiply, "lowbias32" constants)."""
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x7FEB352D)
  x = x ^ (x >> 15)
  x = x * jnp.uint32(0x846CA68B)
  return x ^ (x >> 16)


def _flat_index(shape: tuple[int, ...], row_offset: Any = 0, rows: int | None = None):
  """Row-major element index of ``shape`` as uint32, built from per-axis iotas.

  With ``rows``, only rows ``[row_offset, row_offset + rows)`` of axis -2 (all leading
  indices): the indices of that block within the full ``shape``.
  """
  out_shape = shape if rows is None else shape[:-2] + (rows,) + shape[-1:]
  idx = jnp.zeros(out_shape, jnp.uint32)
  stride = 1
  for axis in reversed(range(len(shape))):
    pos = jax.lax.broadcasted_iota(jnp.uint32, out_shape, axis)
    if rows is not None and axis == len(shape) - 2:
      pos = pos + jnp.asarray(row_offset).astype(jnp.uint32)
    idx = idx + pos * jnp.uint32(stride)
    stride *= shape[axis]
  return idx


def _fast_values(key: jax.Array, idx: jax.Array, dtype: Any) -> jax.Array:
  words = jax.random.key_data(key).reshape(-1)
  h = _mix32((idx * jnp.uint32(_GOLDEN) + words[0]) ^ words[-1])
  byte_sum = (h & 0xFF) + ((h >> 8) & 0xFF) + ((h >> 16) & 0xFF) + (h >> 24)
  s = (byte_sum.astype(jnp.float32) - 510.0) * jnp.float32(_FAST_SCALE / 256.0)
  return (s * (jnp.float32(_FAST_A) + jnp.float32(_FAST_B) * s * s)).astype(dtype)


def fast_gaussian(key: jax.Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
  """Fast noise with the Gaussian moments HiZOO relies on, for the lean train step.

  A counter-based generator: one 32-bit integer hash of (element index, key) per element,
  its four bytes summed (Irwin-Hall of 4) and mapped through ``A s + B s^3`` chosen so that
  ``z`` is symmetric with ``E z^2 = 1`` and ``E z^4 = 3`` exactly (``|z| <= 4.07``,
  ``E z^6 = 14.4`` vs 15). Those are the only moments in the SPSA gradient and in both
  curvature estimators (``E[(z'Bz)(z_i^2 - 1)] = (E z^4 - 1) B_ii``; odd moments vanish),
  so they stay exactly as unbiased as with ``N(0, I)``; the higher moments only enter the
  variance and the ``O(mu^2)`` Taylor terms. It has no transcendental function, no state
  and no intermediate array, so XLA fuses it into the elementwise pass that uses it, and
  each shard of a sharded leaf computes its own slice. Leaves must have < 2**32 elements.
  """
  shape = tuple(shape)
  if math.prod(shape) >= 2**32:
    raise ValueError(f"fast_gaussian: a leaf of shape {shape} has >= 2**32 elements")
  return _fast_values(key, _flat_index(shape), dtype)


def _fast_gaussian_rows(
    key: jax.Array, shape: tuple[int, ...], dtype: Any, start: Any, rows: int
) -> jax.Array:
  """Rows ``[start, start + rows)`` (axis -2) of ``fast_gaussian(key, shape, dtype)``."""
  shape = tuple(shape)
  if math.prod(shape) >= 2**32:
    raise ValueError(f"fast_gaussian: a leaf of shape {shape} has >= 2**32 elements")
  return _fast_values(key, _flat_index(shape, start, rows), dtype)


# Samplers may offer ``sampler.rows(key, shape, dtype, start, rows)``: a block of rows of
# the same noise, so that reductions over a leaf's noise can run block by block.
fast_gaussian.rows = _fast_gaussian_rows  # type: ignore[attr-defined]


DEFAULT_SAMPLER: Sampler = fast_gaussian


def is_gaussian(sampler: Sampler) -> bool:
  """Whether ``sampler`` may drive the Hessian estimate (Gaussian fourth moment)."""
  if sampler is jax.random.rademacher:
    return False
  return bool(getattr(sampler, "gaussian", True))


def noise_dtype(dtype: Any) -> np.dtype:
  """The dtype perturbations of a leaf are drawn and combined in.

  At least float32, so bf16/fp16 params are perturbed with well-resolved noise and the
  result is rounded once, when cast back to the leaf dtype.
  """
  return jnp.promote_types(dtype, jnp.float32)


def split_state_key(state_key: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Splits a state key into ``(noise_key_for_this_step, key_for_next_state)``."""
  noise_key, next_key = jax.random.split(state_key)
  return noise_key, next_key


def direction_key(noise_key: jax.Array, direction: jax.typing.ArrayLike) -> jax.Array:
  """The key of direction ``direction`` (0-based) within one step."""
  return jax.random.fold_in(noise_key, direction)


def leaf_keys(dir_key: jax.Array, params: Any) -> Any:
  """One key per leaf of ``params`` (a tree shaped like ``params``)."""
  return otu.tree_split_key_like(dir_key, params)


def sample_leaf(sampler: Sampler, key: jax.Array, leaf: Any) -> jax.Array:
  """Draws the noise of one leaf, in :func:`noise_dtype` of the leaf."""
  return sampler(key, tuple(leaf.shape), noise_dtype(leaf.dtype))


def leaf_rows(sampler: Sampler, key: jax.Array, leaf: Any):
  """``rows(start, count)`` drawing row blocks of the leaf's noise, or None if the sampler
  cannot (it has no ``rows`` method)."""
  rows = getattr(sampler, "rows", None)
  if rows is None:
    return None
  return lambda start, count: rows(key, tuple(leaf.shape), noise_dtype(leaf.dtype), start, count)


def tie(key: jax.Array, *after: Any) -> jax.Array:
  """``key``, made opaque to XLA and ordered after ``after`` (no-op if ``after`` is empty).

  Regenerating the noise of a leaf from the same key twice would be merged by XLA's
  common-subexpression elimination into one stored array; a key that went through an
  ``optimization_barrier`` with ``after`` is a different value to XLA, so its noise is
  drawn again, inside the fusion that uses it. The factored Hessian update uses this so
  that neither a leaf's noise nor its estimate is stored.
  """
  if not jax.tree.leaves(after):
    return key
  data = jax.random.key_data(key)
  data, _ = jax.lax.optimization_barrier((data, after))
  return jax.random.wrap_key_data(data, impl=jax.random.key_impl(key))


def direction_noise(
    noise_key: jax.Array, direction: jax.typing.ArrayLike, params: Any, sampler: Sampler = gaussian
) -> Any:
  """The full noise tree ``z_j`` of one direction (materialises every leaf).

  The estimators never call this on a hot path that would keep the tree alive; it is the
  reference for tests and for users who want to look at the noise a step used.
  """
  return leaf_noise(direction_key(noise_key, direction), params, sampler)


def leaf_noise(dir_key: jax.Array, params: Any, sampler: Sampler = gaussian) -> Any:
  """The noise tree of the direction whose key is ``dir_key``."""
  keys = leaf_keys(dir_key, params)
  return jax.tree.map(lambda k, p: sample_leaf(sampler, k, p), keys, params)
