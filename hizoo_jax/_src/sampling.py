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

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax.tree_utils as otu

Sampler = Callable[[jax.Array, tuple[int, ...], Any], jax.Array]


def gaussian(key: jax.Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
  """Standard normal noise, ``z ~ N(0, I)`` (the default sampler; E z^4 = 3)."""
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


def direction_noise(
    noise_key: jax.Array, direction: jax.typing.ArrayLike, params: Any, sampler: Sampler = gaussian
) -> Any:
  """The full noise tree ``z_j`` of one direction (materialises every leaf).

  The estimators never call this on a hot path that would keep the tree alive; it is the
  reference for tests and for users who want to look at the noise a step used.
  """
  keys = leaf_keys(direction_key(noise_key, direction), params)
  return jax.tree.map(lambda k, p: sample_leaf(sampler, k, p), keys, params)
