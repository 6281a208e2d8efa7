"""What the low-rank methods (LOZO, SubZero, ZO-Muon) share: which leaves are matrices,
their factors' noise, and ``A B^T`` formed inside the elementwise pass that uses it.

A leaf with ``ndim >= 2`` is a stack of matrices over its last two axes (a transformer's
stacked layers; a conv kernel ``[kh, kw, cin, cout]`` is ``kh kw`` matrices ``cin x
cout``), each with its own factors; smaller leaves (biases, norms) get the method's rule
for vectors. The rank is clipped to ``min(m, n)`` per leaf.

Which side of a matrix is which. The reference codes hold PyTorch weights ``[out, in]``
and draw LOZO's fresh factor and ZO-Muon's subspace over the rows, ``out``. A Flax kernel
(``nnx.Linear``, ``linen.Dense``, this library's models) is ``[in, out]``: its ``out`` is
the last axis. The ``layout`` option of those methods says where the reference's rows are:
``"flax"`` (default) on the last axis of every matrix leaf but embedding tables (leaves
whose path ends in a key ``embedding``: ``[num_embeddings, features]`` as in PyTorch), on
axis -2 for those; ``"torch"`` on axis -2 of every matrix leaf. :func:`rows_last` gives the
answer per leaf.

``outer(A, B) = A B^T`` is written as a broadcast product summed over the rank, not as a
matmul: XLA fuses it into the pass that adds it to the params (measured: 0 bytes of
temporaries for a 1024 x 1024 leaf at rank 4 and 64, where ``A @ B.T`` materialises the
whole product), so a step never holds a params-sized perturbation. It costs ``m n r``
multiply-adds per pass, like the product itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from hizoo_jax._src import config as cfg
from hizoo_jax._src import sampling

# Tags folded into the step's noise key for the lazily resampled factors, so that they
# never share a stream with the probes' noise (which folds in the probe index 0, 1, ...).
FACTOR_TAG = 0x4C524B31  # "LRK1"


LAYOUTS = ("flax", "torch")


def check_options(rank, hyper, layout: str = "flax") -> None:
  """The options every low-rank method takes: ``mu``, ``rank`` (None: traced, recovered
  from the state), ``resample_every`` and ``layout``."""
  cfg.check_positive("mu", hyper["mu"])
  cfg.check_nonnegative("mu_resolution", hyper.get("mu_resolution", 0.0))
  if rank is not None:
    cfg.check_int("rank", rank, 1)
  cfg.check_int("resample_every", hyper["resample_every"], 1)
  if layout not in LAYOUTS:
    raise ValueError(f"layout must be one of {LAYOUTS} (where a matrix leaf holds the "
                     f"reference's rows, PyTorch's out axis), got {layout!r}")


def _is_embedding(path) -> bool:
  """Whether a leaf's path ends in a key ``embedding`` (``nnx.Embed``, ``linen.Embed``),
  an NNX variable's trailing ``.value`` aside."""
  names = [getattr(k, "key", getattr(k, "name", None)) for k in path]
  if names and names[-1] == "value" and isinstance(path[-1], jax.tree_util.GetAttrKey):
    names = names[:-1]
  return bool(names) and names[-1] == "embedding"


def rows_last(params: Any, layout: str) -> tuple[bool, ...]:
  """Per flat leaf of ``params``: whether the reference's rows (PyTorch's ``out`` axis, over
  which LOZO draws its fresh factor and ZO-Muon its subspace) are the leaf's last axis.
  ``"torch"``: never; ``"flax"``: for every leaf but embedding tables."""
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  return tuple(layout == "flax" and not _is_embedding(path) for path, _ in flat)


def leaf_outer(rows_last: bool, rows: jax.Array, cols: jax.Array) -> jax.Array:
  """The leaf-shaped ``rows cols^T`` (the reference's ``[out, in]``), transposed when the
  leaf holds the reference's rows last."""
  return outer(cols, rows) if rows_last else outer(rows, cols)


def check_concrete_rank(rank: int | None) -> None:
  """A state's shapes need the rank: at init it must be a number."""
  if rank is None:
    raise TypeError("rank must be a concrete int at init (it shapes the state); under "
                    "optax.inject_hyperparams pass it as a number, not a traced value")


def rank_in_state(factors: tuple) -> int:
  """The ``rank`` option that built the factors ``[..., k, r]`` of a state (their largest
  ``r``): it gives every leaf the same clipped rank as the option did."""
  ranks = [int(jnp.shape(f)[-1]) for f in factors if f is not None]
  return max(ranks, default=1)


def is_matrix(leaf) -> bool:
  return jnp.ndim(leaf) >= 2


def rank_of(leaf, rank: int) -> int:
  m, n = jnp.shape(leaf)[-2:]
  return max(1, min(int(rank), int(m), int(n)))


# Up to this rank the product is a fused sum of broadcast products (no stored product, r
# multiply-adds per element in every pass, which XLA:CPU runs as scalar code); above it a
# matmul, which stores the leaf's product but runs at matmul speed. Measured on MiniLM-L6
# full fine-tuning (2 CPU cores): ZO-Muon at rank 64 took 56 forward passes a step fused,
# 8.6 with the matmul (its floor is 5), for 0.73 param bytes more compiled memory.
FUSED_RANK = 16


def outer(a: jax.Array, b: jax.Array) -> jax.Array:
  """``a @ swapaxes(b)`` for ``a [..., m, r]`` and ``b [..., n, r]``. Up to rank
  :data:`FUSED_RANK`, a sum of ``r`` broadcast products: purely elementwise, so XLA fuses it
  into the pass that uses it (a reduction over a broadcast ``[m, n, r]`` is fused alone
  but, inside the engine's loop, stored). Above it, a matmul (stored, fast)."""
  if a.shape[-1] > FUSED_RANK:
    return jnp.matmul(a, jnp.swapaxes(b, -1, -2), precision=jax.lax.Precision.HIGHEST)
  out = a[..., :, None, 0] * b[..., None, :, 0]
  for k in range(1, a.shape[-1]):
    out = out + a[..., :, None, k] * b[..., None, :, k]
  return out


def factor_dtype(leaf) -> jnp.dtype:
  """The factors' dtype: the leaf's noise dtype (at least float32: bf16 params get float32
  factors, float64 params float64 ones)."""
  return sampling.noise_dtype(jnp.result_type(leaf))


def gaussian(key: jax.Array, shape: tuple[int, ...], dtype=jnp.float32) -> jax.Array:
  """Gaussian factors (the default sampler's moments, drawn from ``key``)."""
  return sampling.fast_gaussian.sample(key, tuple(shape), dtype)


def leaf_factor(words: sampling.DirectionWords, i: int, leaf, shape) -> jax.Array:
  """A per-probe factor of leaf ``i``: Gaussian of ``shape`` from the leaf's key."""
  return gaussian(words.key(i), shape, factor_dtype(leaf))


def factor_key(noise_key: jax.Array, i: Any, salt: int = 0) -> jax.Array:
  """The key of leaf ``i``'s lazily resampled factor (``i`` may be an array of indices: the
  keys of several leaves from one hash, each the same as its own call's)."""
  base = jax.random.fold_in(noise_key, FACTOR_TAG + salt)
  if jnp.ndim(i) == 0:
    return jax.random.fold_in(base, i)
  return jax.vmap(lambda k: jax.random.fold_in(base, k))(jnp.asarray(i, jnp.uint32))


def resampled(noise_key: jax.Array, i: int, leaf, shape, salt: int = 0) -> jax.Array:
  """A lazily resampled factor of leaf ``i`` (drawn on the steps that refresh it)."""
  return gaussian(factor_key(noise_key, i, salt), shape, factor_dtype(leaf))


def refreshed_subspaces(noise, flag: jax.Array, stored: tuple,
                        draw: Callable[[jax.Array, int, Any], Any]) -> tuple:
  """Each matrix leaf's orthonormal factor at this step: ``stored[i]`` (None for a vector),
  or on the steps that redraw them (``flag``), ``draw(key, i, leaf)`` with ``key`` leaf
  ``i``'s :func:`factor_key`.

  For a method's :meth:`~hizoo_jax._src.method.Method.prepare`: one ``lax.cond`` for every
  leaf, traced once a step, the leaves' keys from one hash. (Drawn where each pass reads a
  factor, the draws and the QR factorisations are traced into every pass and into the
  update: three times over on ZO-Muon's MiniLM step, a third of its first call.)"""
  matrices = [i for i, x in enumerate(noise.leaves) if is_matrix(x)]

  def fresh():
    keys = factor_key(noise.noise_key, jnp.asarray(matrices))
    out = list(stored)
    for k, i in enumerate(matrices):
      out[i] = draw(keys[k], i, noise.leaves[i])
    return tuple(out)

  if not matrices:
    return tuple(stored)
  return refreshed(flag, fresh, tuple(stored))


def orthonormal(g: jax.Array, sign_fix: bool = False) -> jax.Array:
  """The ``Q`` of a reduced QR of ``g [..., m, r]`` (Haar-distributed with ``sign_fix``:
  columns multiplied by the sign of ``diag(R)``)."""
  q, r = jnp.linalg.qr(g)
  if sign_fix:
    d = jnp.sign(jnp.diagonal(r, axis1=-2, axis2=-1))
    q = q * jnp.where(d == 0, 1, d)[..., None, :]
  return q


def refreshed(flag: jax.Array, fresh: Callable[[], Any], stored: Any) -> Any:
  """``fresh()`` on the steps that redraw a factor (``flag``), else ``stored``. A
  ``lax.cond``, not a ``where``: the QR of a fresh orthonormal factor is then computed only
  on the steps that use it, not in every pass of every step (ZO-Muon redraws every 100
  steps, SubZero every 2000)."""
  def draw():
    return jax.tree.map(lambda f, s: f.astype(s.dtype), fresh(), stored)
  return jax.lax.cond(flag, draw, lambda: stored)


def every(hyper_value, count) -> jax.Array:
  """Whether step ``count`` refreshes a factor resampled every ``hyper_value`` steps."""
  k = jnp.maximum(jnp.asarray(hyper_value, jnp.int32), 1)
  return (count % k) == 0
