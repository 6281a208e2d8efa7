"""Exact zeros that order XLA's passes: values that depend on a tree and are always 0.

Adding one to an input makes XLA compute that input's readers after the tree is written,
which an optimization barrier does not guarantee for its copy insertion. The engine uses
them to write the optimizer state in place and to form ZO-Muon's products leaf by leaf.
"""

from __future__ import annotations

import jax
import jax.extend.core
import jax.numpy as jnp

from hizoo_jax._src import transform


def plus(tree, zero):
  """``tree`` plus the exact zero ``zero``: the same values, computed after it."""
  return jax.tree.map(lambda a: a + zero.astype(a.dtype), tree)


def tie_leaf_state(state, i, n, zero):
  """``state`` plus ``zero`` where leaf ``i``'s directions read it: of a NamedTuple state
  whose fields are tuples with one entry per leaf (the low-rank methods'), entry ``i`` of
  each such field and the other fields whole; of any other state, all of it. (Tying every
  entry for every leaf would trace n² additions.)"""
  tie = lambda tree: plus(tree, zero)
  if not (isinstance(state, tuple) and hasattr(state, "_fields")):
    return tie(state)
  return state._replace(**{
      f: (tuple(tie(x) if k == i else x for k, x in enumerate(v))
          if isinstance(v, tuple) and len(v) == n else tie(v))
      for f, v in zip(state._fields, state, strict=True)})


def tied_method_states(opt_state, zero):
  """``opt_state`` with each ZO state's method state plus ``zero`` (the same values,
  computed after whatever ``zero`` depends on)."""
  return jax.tree.map(
      lambda a: a._replace(method=plus(a.method, zero)) if transform.is_zo_state(a) else a,
      opt_state, is_leaf=transform.is_zo_state)


def after_written(tree) -> jax.Array:
  """An int32 0 that depends on every non-empty leaf of ``tree`` (one element of each,
  compared with +inf: false for every value, NaN included, and not folded by XLA), so
  whatever uses it is computed after those leaves are."""
  flags = [jnp.ravel(x)[0] > jnp.inf for x in jax.tree.leaves(tree) if jnp.size(x)]
  return sum((f.astype(jnp.int32) for f in flags), jnp.zeros((), jnp.int32))


def after_whole(leaves) -> jax.Array:
  """An int32 0 that depends on every element of ``leaves`` (the largest element above
  +inf: false for every value, NaN included): unlike :func:`after_written`, XLA cannot
  compute it from a slice of the producer's inputs, so the producer's whole pass comes
  first. (``any(x > inf)`` would store the comparison's boolean array.)"""
  flags = [jnp.max(x) > jnp.inf for x in leaves if jnp.size(x)]
  return sum((f.astype(jnp.int32) for f in flags), jnp.zeros((), jnp.int32))


def with_method_states(opt_state, source):
  """``opt_state`` with each ZO state's method state taken from ``source`` (same
  structure)."""
  return jax.tree.map(
      lambda a, b: a._replace(method=b.method) if transform.is_zo_state(a) else a,
      opt_state, source, is_leaf=transform.is_zo_state)
