"""Keys to perturbations: the noise of every zeroth-order step, regenerated on demand.

Nothing here is ever stored in optimizer state. A step's noise is a pure function of
(the state's key at that step, the direction index, the leaf index), so any part of
the code (the estimator, the in-place train step, a debugging session) regenerates
exactly the same ``z`` from the same key.

Key schedule (public and stable since 0.2.0; tests and the lean train step rely on it)::

    noise_key, next_state_key = jax.random.split(state_key)
    direction_key_j           = jax.random.fold_in(noise_key, j)
    leaf_key_i                = direction_key_j with its last key word w replaced by
                                mix32(w ^ mix32(i * 0x9E3779B9 + 1))     (i: leaf index)
    z_j[leaf i]               = sampler.sample(leaf_key_i, leaf.shape, noise_dtype(leaf))

Leaves are indexed in ``jax.tree.leaves`` order. Deriving a leaf's key is a handful of
scalar integer operations, so a model with hundreds of tensors compiles its noise as fast
as its own elementwise ops (0.1.0 split the direction key with ``tree_split_key_like``,
whose per-leaf threefry calls dominated compile time at 200 tensors).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

SamplerFn = Callable[[jax.Array, tuple[int, ...], Any], jax.Array]


class Sampler:
  """A perturbation distribution: ``sample(key, shape, dtype) -> array``.

  Attributes:
    is_gaussian: whether the noise has the Gaussian fourth moment (``E z^4 = 3``) that
      HiZOO's curvature estimate relies on. Non-Gaussian samplers (Rademacher) are fine for
      SPSA/MeZO gradients and refused by :func:`hizoo_jax.scale_by_hizoo`.

  A sampler is also callable as ``sampler(key, shape, dtype)``. Subclasses may implement
  :meth:`rows`, a block of rows of the same noise, so that reductions over a leaf's noise
  (HiZOO-L's row and column sums) run block by block without a leaf-sized temporary.
  """

  is_gaussian: bool = True

  def sample(self, key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    raise NotImplementedError

  def rows(
      self, key: jax.Array, shape: tuple[int, ...], dtype: Any, start: Any, count: int
  ) -> jax.Array | None:
    """Rows ``[start, start + count)`` (axis -2) of ``sample(key, shape, dtype)``, or None
    if this sampler cannot draw a block without drawing the whole leaf."""
    del key, shape, dtype, start, count
    return None

  @property
  def has_rows(self) -> bool:
    return type(self).rows is not Sampler.rows

  def __call__(self, key: jax.Array, shape: tuple[int, ...], dtype: Any = jnp.float32):
    return self.sample(key, tuple(shape), dtype)


class Gaussian(Sampler):
  """Exact standard normal noise, ``z ~ N(0, I)``, from ``jax.random.normal``.

  On XLA:CPU the threefry generator materialises its bits and its normals for every leaf
  and costs about 0.8 forward passes of a 12.6M-parameter MLP at 1024 rows per draw
  (benchmarks/RESULTS.md); :data:`fast_gaussian`, the default, avoids both.
  """

  def sample(self, key, shape, dtype):
    return jax.random.normal(key, shape, dtype)

  def __repr__(self):
    return "hizoo_jax.gaussian"


class Rademacher(Sampler):
  """Random signs, ``z in {-1, +1}``. Valid for SPSA/MeZO gradients only.

  Its fourth moment is 1, not 3, so the HiZOO curvature estimate built on
  ``E[z^2 z^2]`` is wrong with it; :func:`hizoo_jax.scale_by_hizoo` refuses it.
  """

  is_gaussian = False

  def sample(self, key, shape, dtype):
    return jax.random.rademacher(key, shape, jnp.int8).astype(dtype)

  def __repr__(self):
    return "hizoo_jax.rademacher"


# FastGaussian: z = A s + B s^3 with s = SCALE (b0 + b1 + b2 + b3 - 510) / 256 the
# standardized sum of the four bytes of one 32-bit hash. A and B solve E z^2 = 1 and
# E z^4 = 3 exactly for that discrete distribution (tests/test_sampling.py recomputes them).
_FAST_A = 0.9490332780957843
_FAST_B = 0.018642382500609324
_FAST_SCALE = 1.7320640222190664
_GOLDEN = 0x9E3779B9  # odd: idx * _GOLDEN is a bijection of the 32-bit counter


def _six_bit_pieces(x: float, count: int = 3) -> tuple[float, ...]:
  """``x`` as a sum of ``count`` floats of at most 6 significant bits each."""
  pieces, rest = [], x
  for _ in range(count):
    if rest == 0:
      pieces.append(0.0)
      continue
    exp = math.floor(math.log2(abs(rest))) - 5
    piece = round(rest / 2.0**exp) * 2.0**exp
    pieces.append(piece)
    rest -= piece
  return tuple(pieces)


# The polynomial in the integer m = b0 + b1 + b2 + b3 - 510, |m| <= 510:
#   z = m (a + b m^2),  a = A SCALE / 256,  b = B (SCALE / 256)^3,
# evaluated in float32 so that it rounds the same way on every machine and in every XLA
# program: m and m^2 (< 2^18) are exact, b is split into three 6-bit pieces (b to 18 bits,
# 4e-6 relative: z moves by < 1e-6, E z^4 by < 1e-5, tested) so that each product b_k m^2
# is exact too, and a product that is exact rounds the same whether or not the compiler
# contracts it with the following add into an FMA. The sums run in a fixed order and the
# last product has no add to contract with. (A plain ``A s + B s^3`` differs in its last
# bit between programs, e.g. between a sharded and a one-device step, or eager and jit.)
_FAST_C = _FAST_SCALE / 256.0
_FAST_POLY_A = _FAST_A * _FAST_C
_FAST_POLY_B = _six_bit_pieces(_FAST_B * _FAST_C**3)


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


def _check_size(shape: tuple[int, ...]) -> None:
  if math.prod(shape) >= 2**32:
    raise ValueError(f"fast_gaussian: a leaf of shape {shape} has >= 2**32 elements")


class FastGaussian(Sampler):
  """Fast noise with the Gaussian moments HiZOO relies on (the default sampler).

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

  def _values(self, key, idx, dtype):
    words = jax.random.key_data(key).reshape(-1)
    return self._hash_values(words[0], words[-1], idx, dtype)

  def _hash_values(self, w0, w1, idx, dtype):
    h = _mix32((idx * jnp.uint32(_GOLDEN) + w0) ^ w1)
    byte_sum = (h & 0xFF) + ((h >> 8) & 0xFF) + ((h >> 16) & 0xFF) + (h >> 24)
    m = byte_sum.astype(jnp.int32) - 510
    mf = m.astype(jnp.float32)
    m2 = (m * m).astype(jnp.float32)
    poly = jnp.float32(_FAST_POLY_A)
    for piece in _FAST_POLY_B:
      poly = poly + jnp.float32(piece) * m2
    return (mf * poly).astype(dtype)

  def sample(self, key, shape, dtype):
    shape = tuple(shape)
    _check_size(shape)
    return self._values(key, _flat_index(shape), dtype)

  def rows(self, key, shape, dtype, start, count):
    shape = tuple(shape)
    _check_size(shape)
    return self._values(key, _flat_index(shape, start, count), dtype)

  def __repr__(self):
    return "hizoo_jax.fast_gaussian"


@dataclasses.dataclass(frozen=True)
class FunctionSampler(Sampler):
  """A user function ``fn(key, shape, dtype) -> array`` as a :class:`Sampler`."""

  fn: SamplerFn
  is_gaussian: bool = True

  def sample(self, key, shape, dtype):
    return self.fn(key, shape, dtype)


gaussian = Gaussian()
rademacher = Rademacher()
fast_gaussian = FastGaussian()
DEFAULT_SAMPLER: Sampler = fast_gaussian


def as_sampler(sampler: Any) -> Sampler:
  """``sampler`` as a :class:`Sampler`: the default for None, plain functions wrapped.

  A plain function counts as Gaussian unless it is ``jax.random.rademacher`` or carries
  ``gaussian = False``; its output must have the requested floating dtype.
  """
  if sampler is None:
    return DEFAULT_SAMPLER
  if isinstance(sampler, Sampler):
    return sampler
  if not callable(sampler):
    raise TypeError(f"sampler must be callable as sampler(key, shape, dtype), got {sampler!r}")
  gaussian_ = sampler is not jax.random.rademacher and bool(getattr(sampler, "gaussian", True))
  return FunctionSampler(sampler, is_gaussian=gaussian_)


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


def _leaf_salt(index: int) -> int:
  """``mix32(index * golden + 1)``, computed in Python (a constant of the program)."""
  x = (index * _GOLDEN + 1) % 2**32
  x ^= x >> 16
  x = (x * 0x7FEB352D) % 2**32
  x ^= x >> 15
  x = (x * 0x846CA68B) % 2**32
  return x ^ (x >> 16)


class DirectionWords:
  """The key words of every leaf of one direction, derived once for all leaves.

  ``first`` is the direction key's first word, ``last[i]`` leaf ``i``'s re-mixed last word
  (one small vector op for all leaves). A leaf's noise reads them as scalars inside its own
  elementwise pass: no per-leaf key array, no per-leaf kernel.
  """

  def __init__(self, dir_key: jax.Array, num_leaves: int):
    data = jax.random.key_data(dir_key).reshape(-1)
    salts = jnp.asarray([_leaf_salt(i) for i in range(num_leaves)], jnp.uint32)
    self.dir_key = dir_key
    # The barrier materialises the words once: without it XLA fuses the mixing into every
    # leaf's pass and recomputes it per element (slower to compile and to run).
    self.first, self.last = jax.lax.optimization_barrier((data[0], _mix32(data[-1] ^ salts)))

  def key(self, index: int) -> jax.Array:
    """Leaf ``index``'s key (as :func:`leaf_key`), for samplers that need a typed key."""
    data = jax.random.key_data(self.dir_key)
    last = self.last[index].reshape(data.shape[:-1] + (1,))
    data = jnp.concatenate([data[..., :-1], last], axis=-1)
    return jax.random.wrap_key_data(data, impl=jax.random.key_impl(self.dir_key))

  def noise(self, sampler: Sampler, index: int, leaf: Any) -> jax.Array:
    """Leaf ``index``'s noise, in :func:`noise_dtype` of the leaf."""
    if isinstance(sampler, FastGaussian):
      shape = tuple(jnp.shape(leaf))
      _check_size(shape)
      return sampler._hash_values(self.first, self.last[index], _flat_index(shape),
                                  noise_dtype(jnp.result_type(leaf)))
    return sample_leaf(sampler, self.key(index), leaf)


def leaf_key(dir_key: jax.Array, index: int) -> jax.Array:
  """The key of leaf ``index`` (in ``jax.tree.leaves`` order) within one direction."""
  return DirectionWords(dir_key, index + 1).key(index)


def leaf_keys(dir_key: jax.Array, params: Any) -> Any:
  """One key per leaf of ``params`` (a tree shaped like ``params``)."""
  leaves, treedef = jax.tree.flatten(params)
  return treedef.unflatten([leaf_key(dir_key, i) for i in range(len(leaves))])


def sample_leaf(sampler: Sampler, key: jax.Array, leaf: Any) -> jax.Array:
  """Draws the noise of one leaf, in :func:`noise_dtype` of the leaf."""
  dtype, shape = noise_dtype(jnp.result_type(leaf)), tuple(jnp.shape(leaf))
  z = jnp.asarray(sampler.sample(key, shape, dtype))
  if not jnp.issubdtype(z.dtype, jnp.floating) or z.shape != shape:
    raise TypeError(
        f"sampler {sampler!r} returned {z.dtype}{list(z.shape)} for a request of "
        f"{dtype}{list(shape)}: a sampler must return floating-point noise of the "
        "requested shape (an integer array would perturb bf16/fp32 params by whole units or "
        "round to 0)")
  return z.astype(dtype)


def leaf_rows(sampler: Sampler, key: jax.Array, leaf: Any):
  """``rows(start, count)`` drawing row blocks of the leaf's noise, or None if the sampler
  cannot."""
  if not sampler.has_rows:
    return None
  dtype = noise_dtype(jnp.result_type(leaf))
  return lambda start, count: sampler.rows(key, tuple(jnp.shape(leaf)), dtype, start, count)


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
    noise_key: jax.Array, direction: jax.typing.ArrayLike, params: Any,
    sampler: Any = DEFAULT_SAMPLER,
) -> Any:
  """The full noise tree ``z_j`` of one direction (materialises every leaf).

  The estimators never call this on a hot path that would keep the tree alive; it is the
  reference for tests and for users who want to look at the noise a step used.
  """
  return leaf_noise(direction_key(noise_key, direction), params, sampler)


def leaf_noise(dir_key: jax.Array, params: Any, sampler: Any = DEFAULT_SAMPLER) -> Any:
  """The noise tree of the direction whose key is ``dir_key``."""
  sampler = as_sampler(sampler)
  leaves, treedef = jax.tree.flatten(params)
  words = DirectionWords(dir_key, len(leaves))
  return treedef.unflatten([words.noise(sampler, i, p) for i, p in enumerate(leaves)])
