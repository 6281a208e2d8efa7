"""The argument checks of the zeroth-order transforms.

Every check names the argument it refuses. Values that are concrete when the transform is
built are checked there; values that arrive traced (``optax.inject_hyperparams``, a
schedule) cannot raise under ``jit`` and are sanitised where they are used instead (see
:func:`hizoo_jax._src.numerics.sanitize_mu` and ``sanitize_alpha``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hizoo_jax._src import sampling


def concrete(x: Any) -> np.ndarray | None:
  """``x`` as a NumPy value, or None when it is traced (e.g. under inject_hyperparams)."""
  if isinstance(x, jax.core.Tracer):
    return None
  try:
    return np.asarray(x)
  except Exception:  # noqa: BLE001 - anything that is not array-like
    return None


def _check_number(name: str, value: Any, zero_ok: bool) -> None:
  v = concrete(value)
  if v is None:
    return
  if v.ndim != 0 or not jnp.issubdtype(v.dtype, jnp.number):
    raise TypeError(f"{name} must be a scalar number, got {value!r}")
  if not np.isfinite(v) or v < 0 or (v == 0 and not zero_ok):
    raise ValueError(f"{name} must be a finite number {'>=' if zero_ok else '>'} 0, "
                     f"got {value!r}")


def check_positive(name: str, value: Any) -> None:
  _check_number(name, value, zero_ok=False)


def check_nonnegative(name: str, value: Any) -> None:
  _check_number(name, value, zero_ok=True)


def check_unit_interval(name: str, value: Any) -> None:
  if callable(value):
    return  # a schedule: clamped into [0, 1] where it is evaluated
  v = concrete(value)
  if v is None:
    return
  if v.ndim != 0 or not jnp.issubdtype(v.dtype, jnp.number):
    raise TypeError(f"{name} must be a float in [0, 1] or a schedule, got {value!r}")
  if not 0.0 <= v <= 1.0:
    raise ValueError(f"{name} must lie in [0, 1], got {value!r}")


def check_int(name: str, value: Any, minimum: int) -> int | None:
  """A concrete int >= minimum, or None when traced."""
  v = concrete(value)
  if v is None:
    return None
  if v.ndim != 0 or not (np.issubdtype(v.dtype, np.integer) or v.dtype == np.bool_):
    if not (jnp.issubdtype(v.dtype, jnp.floating) and v.ndim == 0 and float(v).is_integer()):
      raise TypeError(f"{name} must be an integer, got {value!r}")
  if int(v) < minimum:
    raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
  return int(v)


def check_sampler(sampler: Any, *, needs_gaussian: bool) -> sampling.Sampler:
  sampler = sampling.as_sampler(sampler)
  if needs_gaussian and not sampler.is_gaussian:
    raise ValueError(
        "sampler: the HiZOO curvature estimate needs Gaussian noise (E z^4 = 3); a "
        f"Rademacher/non-Gaussian sampler ({sampler!r}) makes the Hessian estimate wrong. "
        "Use hz.fast_gaussian (the default) or hz.gaussian, or scale_by_zo/mezo, which "
        "accept Rademacher noise."
    )
  return sampler


def key_impl_of(seed: Any) -> str:
  if isinstance(seed, jax.Array) and jnp.issubdtype(seed.dtype, jax.dtypes.prng_key):
    return str(jax.random.key_impl(seed))
  return str(jax.config.jax_default_prng_impl)


def _only_masked(params: Any) -> bool:
  """Whether ``params`` is a view whose every leaf optax.masked left out (MaskedNode)."""
  import optax  # noqa: PLC0415

  nodes = jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, optax.MaskedNode))
  return bool(nodes) and all(isinstance(x, optax.MaskedNode) for x in nodes)


def check_state_matches(state_tree: Any, expected: Any, what: str) -> None:
  """Refuses a state part that does not fit the params (another model's optimizer state),
  naming the first leaf that differs; ``expected`` is its ``jax.eval_shape`` for these
  params."""
  got_def, want_def = jax.tree.structure(state_tree), jax.tree.structure(expected)
  if got_def != want_def:
    raise ValueError(
        f"the optimizer state's {what} does not fit these params (its structure is "
        f"{got_def}, these params need {want_def}): was the state built with tx.init for "
        "another model or another optimizer? Build it with tx.init(params).")
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(state_tree),
                          jax.tree.leaves(expected), strict=True):
    if jnp.shape(a) != b.shape:
      raise ValueError(
          f"the optimizer state's {what}{jax.tree_util.keystr(path)} has shape "
          f"{jnp.shape(a)} but these params need {b.shape}: was the state built with "
          "tx.init for another model? Build it with tx.init(params).")


def check_seed(seed: Any) -> None:
  """Refuses a seed that cannot become a key, naming ``seed`` (concrete seeds only)."""
  if isinstance(seed, jax.Array) and jnp.issubdtype(seed.dtype, jax.dtypes.prng_key):
    return
  if isinstance(seed, bool):
    raise TypeError(f"seed must be an int or a PRNG key, got {seed!r}")
  if isinstance(seed, int | np.integer):
    if not -(2**63) <= int(seed) < 2**64:
      raise ValueError(f"seed must fit in 64 bits, got {seed!r}")
    seed_to_key_data(seed, key_impl_of(seed))  # the impl-specific range, named
    return
  v = concrete(seed)
  if v is None:
    return
  if v.ndim == 0 and not np.issubdtype(v.dtype, np.integer):
    raise TypeError(f"seed must be an int or a PRNG key, got {seed!r}")
  if v.ndim > 0 and v.dtype != np.uint32:
    raise TypeError(f"seed must be an int or a PRNG key (raw key data is uint32), got {seed!r}")


def seed_to_key_data(seed: Any, impl: str) -> jax.Array:
  """Raw key data from an int seed, a typed key or raw key data."""
  if isinstance(seed, jax.Array) and jnp.issubdtype(seed.dtype, jax.dtypes.prng_key):
    return jax.random.key_data(seed)
  if isinstance(seed, int | np.integer) and not isinstance(seed, bool):
    s = int(seed)
    if -(2**31) <= s < 2**31:
      return jax.random.key_data(jax.random.key(s, impl=impl))
    if impl == "threefry2x32" and -(2**63) <= s < 2**64:
      # What jax.random.key(s) gives with jax_enable_x64: the two 32-bit halves. Without
      # x64, jax.random.key would silently drop the high half (2**40 -> the key of 0).
      s %= 2**64
      return jnp.asarray([s >> 32, s & 0xFFFFFFFF], jnp.uint32)
    raise ValueError(
        f"seed {seed!r} does not fit the {impl} key's int32 seed; pass a smaller int or a "
        "jax.random.key")
  arr = jnp.asarray(seed)  # may be traced (e.g. an injected hyperparameter)
  if arr.ndim == 0:
    if not jnp.issubdtype(arr.dtype, jnp.integer):
      raise TypeError(f"seed must be an int or a PRNG key, got {seed!r}")
    return jax.random.key_data(jax.random.key(arr, impl=impl))
  if arr.dtype != jnp.uint32:
    raise TypeError(f"seed must be an int or a PRNG key, got {seed!r}")
  return arr


def as_typed_key(key: Any, impl: str) -> jax.Array:
  if isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    return key
  key = jnp.asarray(key)
  if key.dtype != jnp.uint32:
    raise TypeError(f"key must be a PRNG key (jax.random.key or PRNGKey), got dtype {key.dtype}")
  return jax.random.wrap_key_data(key, impl=impl)


def check_params(params: Any) -> None:
  """Refuses missing, empty or non-float params, naming the leaf."""
  if params is None:
    raise ValueError("params must be given to init/update of a zeroth-order transform")
  with_none = jax.tree_util.tree_leaves_with_path(params, is_leaf=lambda x: x is None)
  for path, leaf in with_none:
    if leaf is None:
      raise ValueError(
          f"params leaf {jax.tree_util.keystr(path)} is None: a zeroth-order transform "
          "perturbs arrays; drop the entry or freeze it with optax.masked")
  if not jax.tree.leaves(params) and not _only_masked(params):
    raise ValueError(f"params have no array leaves ({params!r}): there is nothing to train")
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    dtype = jnp.result_type(leaf)
    if not jnp.issubdtype(dtype, jnp.floating):
      raise TypeError(
          f"params leaf {jax.tree_util.keystr(path)} has dtype {dtype}; zeroth-order "
          "transforms perturb floating-point params only. Pass the trainable params alone "
          "and close over the rest in value_fn (or freeze them with optax.masked)."
      )


def probes(num_directions: Any) -> int | None:
  """``num_directions`` as the static number of probes, or None when it is traced
  (``optax.inject_hyperparams``): then the state's shape tells (``zo_transform``)."""
  return check_int("num_directions", num_directions, 1)


def static_int(name: str, value: Any) -> int | None:
  """A static int option (it shapes the state), or None when it arrives traced (under
  ``optax.inject_hyperparams``): the method then recovers it from the state's shapes."""
  return check_int(name, value, 1)
