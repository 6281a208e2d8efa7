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
scalar integer operations rather than a threefry call a leaf, so a model with hundreds of
tensors compiles its noise as fast as its own elementwise ops.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hizoo_jax._src import numerics

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
_GOLDEN_INV = pow(_GOLDEN, -1, 2**32)


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


def _flat_index(shape: tuple[int, ...], row_offset: Any = 0, rows: int | None = None,
                offset: Any = 0):
  """Row-major element index of ``shape``, plus ``offset``, as uint32 (wrapping).

  With ``rows``, only rows ``[row_offset, row_offset + rows)`` of axis -2 (all leading
  indices): the indices of that block within the full ``shape``. ``offset`` is added to the
  last axis's iota first: when it is run-time data, no params-sized part of the index is a
  compile-time constant, which XLA would hoist out of a loop into a params-sized buffer.
  """
  out_shape = shape if rows is None else shape[:-2] + (rows,) + shape[-1:]
  offset = jnp.asarray(offset).astype(jnp.uint32)
  if not shape:
    return offset
  idx = None
  stride = 1
  for axis in reversed(range(len(shape))):
    pos = jax.lax.broadcasted_iota(jnp.uint32, out_shape, axis)
    if rows is not None and axis == len(shape) - 2:
      pos = pos + jnp.asarray(row_offset).astype(jnp.uint32)
    idx = pos + offset if idx is None else idx + pos * jnp.uint32(stride)
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

  def _values(self, key, shape, dtype, start=0, count=None):
    words = jax.random.key_data(key).reshape(-1)
    return self._hash_values(words[0], words[-1], shape, dtype, start, count)

  def _hash_values(self, w0, w1, shape, dtype, start=0, count=None):
    # Element i hashes mix32((i * GOLDEN + w0) ^ w1), computed as
    # mix32(((i + w0 GOLDEN^-1) GOLDEN) ^ w1): the same uint32 (GOLDEN is odd, so it has an
    # inverse mod 2**32), with the key word entering the element index at its first op.
    offset = jnp.asarray(w0).astype(jnp.uint32) * jnp.uint32(_GOLDEN_INV)
    idx = _flat_index(shape, start, count, offset=offset)
    return self._from_hash(_mix32((idx * jnp.uint32(_GOLDEN)) ^ w1), dtype)

  def _from_hash(self, h, dtype):
    # The sum of the four bytes, two at a time: bytes 0 + 1 and 2 + 3 in two 16-bit lanes.
    pairs = (h & 0x00FF00FF) + ((h >> 8) & 0x00FF00FF)
    byte_sum = (pairs & 0xFFFF) + (pairs >> 16)
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
    words = jax.random.key_data(key).reshape(-1)
    return _fast_noise(words[0], words[-1], shape=shape, dtype=jnp.dtype(dtype), sampler=self)

  def rows(self, key, shape, dtype, start, count):
    shape = tuple(shape)
    _check_size(shape)
    return self._values(key, shape, dtype, start, count)

  def __repr__(self):
    return "hizoo_jax.fast_gaussian"


class FastRademacher(FastGaussian):
  """Random signs from the same counter-based hash as :class:`FastGaussian`: the top bit
  of each element's hash. Fused into the passes that use it like the default sampler
  (the threefry :data:`rademacher` materialises its bits). For SPSA-type estimates only:
  its fourth moment is 1, so HiZOO refuses it."""

  is_gaussian = False

  def _from_hash(self, h, dtype):
    return (1 - 2 * (h >> 31).astype(jnp.int32)).astype(jnp.float32).astype(dtype)

  def __repr__(self):
    return "hizoo_jax.fast_rademacher"


@functools.partial(jax.jit, static_argnames=("shape", "dtype", "sampler"))
def _fast_noise(w0: jax.Array, w1: jax.Array, *, shape: tuple[int, ...], dtype,
                sampler: FastGaussian) -> jax.Array:
  """Counter-based noise of one leaf from its two key words.

  Jitted so that a model with hundreds of leaves traces it once per leaf shape: each call
  is one cached ``jit`` call in the caller's program (XLA inlines it).
  """
  return sampler._hash_values(w0, w1, shape, dtype)


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
fast_rademacher = FastRademacher()
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


def _run_time_scalars(word: jax.Array, salts: tuple[int, ...], positions: tuple[int, ...],
                      group_salts: tuple[tuple[int, ...], ...] = ()):
  """``mix32(word ^ salt)`` for each salt, and the ``positions``, as separate scalars of
  run-time data; and ``mix32(word ^ salts)`` of each of ``group_salts`` as a vector.

  Why not ``_mix32(word ^ salts)[i]`` and a constant position: XLA compiles one
  machine-code kernel per distinct fused computation and reuses it for identical ones. A
  leaf's constant index or salt inside its fused pass makes every leaf's pass distinct, so
  a model with hundreds of tensors compiled hundreds of noise kernels (20-40 ms each on a
  CPU: 22 s of the first step of a 200-tensor MeZO model). Here the values enter as the
  initial values of a loop that runs once at run time (its trip count is data the
  compiler cannot see through, so it is neither unrolled nor folded) and come out as
  separate scalar buffers: the passes of all leaves of one shape and dtype are then one
  computation, compiled once.

  The groups' word vectors come out of the loop as buffers for the same reason a fused
  pass cannot see through it: computed in the open, XLA fuses their mixing (a dozen ops)
  into every pass of every leaf of the group, and a step's passes are most of its
  instructions (HiZOO on 200 tensors of one shape: 92,000 instructions, 82,400 with the
  vectors stored).
  """
  init = (tuple(jnp.uint32(s) for s in salts), tuple(jnp.uint32(j) for j in positions),
          tuple(jnp.asarray(g, jnp.uint32) for g in group_salts))

  def body(carry):
    k, (salts, pos, groups) = carry
    # keeps the positions run-time data
    zero = (numerics.runtime_one(word) - 1).astype(jnp.uint32)
    return k + 1, (tuple(_mix_words(word, s) for s in salts), tuple(j + zero for j in pos),
                   tuple(_mix_words(word, g) for g in groups))

  one = numerics.runtime_one(word)
  _, (words, pos, groups) = jax.lax.while_loop(lambda c: c[0] < one, body,
                                               (jnp.zeros((), jnp.int32), init))
  return words, pos, groups


@jax.jit
def _mix_words(word: jax.Array, salts: jax.Array) -> jax.Array:
  return _mix32(word ^ salts)


@functools.partial(jax.jit, static_argnames=("shape", "dtype", "sampler"))
def _fast_noise_group(w0: jax.Array, w1s: jax.Array, *, shape: tuple[int, ...], dtype,
                      sampler: FastGaussian):
  """The :class:`FastGaussian` noise of ``k`` leaves of one shape, stacked: ``[k, *shape]``.

  Row ``j`` is bit for bit ``_fast_noise(w0, w1s[j])``. A leaf reads its row with a
  dynamic slice at a run-time position, and XLA fuses this computation into the leaf's
  pass (nothing of shape ``[k, *shape]`` is stored): the program then holds the noise's
  ops once per shape instead of once per leaf, which is most of a zeroth-order step's
  compile time on models with hundreds of tensors.
  """
  w1 = w1s.reshape(w1s.shape + (1,) * len(shape))
  return sampler._hash_values(w0, w1, shape, dtype)


class DirectionWords:
  """The key words of every leaf of one direction, derived once for all leaves.

  Leaf ``i``'s key is the direction key with its last word ``w`` replaced by
  ``mix32(w ^ salt_i)`` (:func:`last`). Given the ``leaves``, those of one shape and dtype
  form a group: :data:`fast_gaussian` draws the group's noise as one stacked computation
  (:func:`_fast_noise_group`) from the vector of its leaves' words, and each leaf reads its
  row at a run-time position, inside its own elementwise pass. The program then holds the
  noise's ops once per leaf shape, and XLA compiles one kernel per shape: a model with
  hundreds of tensors but few shapes (a transformer's repeated layers) compiles as fast as
  a small one. A leaf alone in its shape (or with no ``leaves`` given) gets its word as a
  run-time scalar (:func:`_run_time_scalars`).
  """

  def __init__(self, dir_key: jax.Array, num_leaves: int, leaves: Any = None):
    data = jax.random.key_data(dir_key).reshape(-1)
    self.dir_key = dir_key
    self.first, self.word = data[0], data[-1]
    self.group_of: dict[int, tuple] = {}  # leaf index -> group signature (groups of >= 2)
    groups: dict[tuple, list[int]] = {}
    for i, leaf in enumerate(leaves if leaves is not None else ()):
      groups.setdefault((tuple(jnp.shape(leaf)), noise_dtype(jnp.result_type(leaf))), []).append(i)
    self.groups = {sig: members for sig, members in groups.items() if len(members) > 1}
    positions: dict[int, int] = {}
    for sig, members in self.groups.items():
      for j, i in enumerate(members):
        self.group_of[i], positions[i] = sig, j
    singles = [i for i in range(num_leaves) if i not in self.group_of]
    words, pos, group_words = _run_time_scalars(
        self.word, tuple(_leaf_salt(i) for i in singles),
        tuple(positions[i] for i in sorted(positions)),
        tuple(tuple(_leaf_salt(i) for i in members) for members in self.groups.values()))
    self._single_word = dict(zip(singles, words, strict=True))
    self.position = dict(zip(sorted(positions), pos, strict=True))
    self._group_words = dict(zip(self.groups, group_words, strict=True))
    self._group_noise: dict[tuple, jax.Array] = {}

  def group_words(self, sig: tuple) -> jax.Array:
    """The last words of a group's leaves, as a vector in the group's order."""
    return self._group_words[sig]

  def last(self, index: int) -> jax.Array:
    """Leaf ``index``'s last key word, ``mix32(w ^ salt_index)``, a run-time scalar."""
    if index in self._single_word:
      return self._single_word[index]
    sig = self.group_of[index]
    return jax.lax.dynamic_index_in_dim(self.group_words(sig), self.position[index], 0,
                                        keepdims=False)

  def key(self, index: int) -> jax.Array:
    """Leaf ``index``'s key (as :func:`leaf_key`), for samplers that need a typed key."""
    data = jax.random.key_data(self.dir_key)
    last = self.last(index).reshape(data.shape[:-1] + (1,))
    data = jnp.concatenate([data[..., :-1], last], axis=-1)
    return jax.random.wrap_key_data(data, impl=jax.random.key_impl(self.dir_key))

  def noise(self, sampler: Sampler, index: int, leaf: Any, after: Any = ()) -> jax.Array:
    """Leaf ``index``'s noise, in :func:`noise_dtype` of the leaf.

    ``after``: values this draw is ordered after, through an optimization barrier (see
    :func:`tie`); XLA then draws the noise again instead of sharing (and storing) one draw
    between the passes that use it.
    """
    if not isinstance(sampler, FastGaussian):
      return sample_leaf(sampler, tie(self.key(index), after), leaf)
    shape, dtype = tuple(jnp.shape(leaf)), noise_dtype(jnp.result_type(leaf))
    _check_size(shape)
    sig = self.group_of.get(index)
    if sig is None or sig != (shape, dtype):
      first, last = self.first, self.last(index)
      if jax.tree.leaves(after):
        first, last, _ = jax.lax.optimization_barrier((first, last, after))
      return _fast_noise(first, last, shape=shape, dtype=dtype, sampler=sampler)
    tied = tuple(jax.tree.leaves(after))
    cache_key = (sig, sampler, tuple(id(x) for x in tied))
    if cache_key not in self._group_noise:
      first, lasts = self.first, self.group_words(sig)
      if tied:
        first, lasts, _ = jax.lax.optimization_barrier((first, lasts, after))
      # ``tied`` is kept with the draw so that its ids stay those of live objects
      self._group_noise[cache_key] = (tied, _fast_noise_group(first, lasts, shape=shape,
                                                              dtype=dtype, sampler=sampler))
    group = self._group_noise[cache_key][1]
    start = (self.position[index],) + (jnp.uint32(0),) * len(shape)
    return jax.lax.dynamic_slice(group, start, (1,) + shape).reshape(shape)


def leaf_key(dir_key: jax.Array, index: int) -> jax.Array:
  """The key of leaf ``index`` (in ``jax.tree.leaves`` order) within one direction."""
  return DirectionWords(dir_key, index + 1).key(index)


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
  words = DirectionWords(dir_key, len(leaves), leaves)
  return treedef.unflatten([words.noise(sampler, i, p) for i, p in enumerate(leaves)])
