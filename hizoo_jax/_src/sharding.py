"""Shardings for zeroth-order training on a device mesh (data parallel, FSDP).

Zeroth-order steps need little communication: every device regenerates the same noise
from the same key, so with replicated params the devices only agree on a few scalar
losses per step (data parallel). With sharded params (FSDP) each device perturbs and
updates its own shard, drawing only that shard's noise (the default sampler computes each
element from its index, which XLA partitions like any elementwise op), and the forward
pass gathers the params as usual.

The optimizer state is sharded like the params it describes: a dense Hessian like its
param; a factored one (HiZOO-L) keeps the param's partitioning of the rows in ``row`` and
of the columns in ``col``; scalars, keys and losses are replicated.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from hizoo_jax._src import curvature as hess


def as_tree(param_shardings: Any, params: Any) -> Any:
  """A tree of shardings shaped like ``params`` (a single sharding applies to all)."""
  if isinstance(param_shardings, jax.sharding.Sharding):
    return jax.tree.map(lambda _: param_shardings, params)
  return param_shardings


def mesh_of(shardings: Any) -> jax.sharding.Mesh:
  for s in jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding)):
    if isinstance(s, NamedSharding):
      return s.mesh
  raise TypeError("param shardings must be jax.sharding.NamedSharding (on a Mesh)")


def _spec(sharding: NamedSharding, ndim: int) -> tuple:
  spec = tuple(sharding.spec)
  return spec + (None,) * (ndim - len(spec))


def _factored_shardings(param_sharding: NamedSharding, ndim: int) -> hess.FactoredHessian:
  spec = _spec(param_sharding, ndim)
  mesh = param_sharding.mesh
  return hess.FactoredHessian(
      row=NamedSharding(mesh, PartitionSpec(*spec[:-1])),
      col=NamedSharding(mesh, PartitionSpec(*(spec[:-2] + spec[-1:]))),
  )


def state_shardings(state: Any, params: Any, param_shardings: Any) -> Any:
  """Shardings for an optimizer state, following the params' shardings.

  Any part of the state shaped like the params (the HiZOO Hessian, or the moments of an
  Optax transformation chained after a ZO estimate) is sharded like them; factored
  Hessian leaves as described in the module docstring; everything else is replicated on
  the params' mesh.

  Args:
    state: the optimizer state, or its ``jax.eval_shape(tx.init, params)``.
    params: the params (or their shapes).
    param_shardings: a ``NamedSharding`` for all params, or a tree of them shaped like
      ``params``.

  Returns:
    A tree of ``NamedSharding`` shaped like ``state``.
  """
  shardings = as_tree(param_shardings, params)
  mesh = mesh_of(shardings)
  replicated = NamedSharding(mesh, PartitionSpec())
  params_def = jax.tree.structure(params)
  param_leaves = params_def.flatten_up_to(params)
  sharding_leaves = params_def.flatten_up_to(shardings)

  def params_like(node) -> bool:
    try:
      leaves = params_def.flatten_up_to(node)
    except (ValueError, TypeError):
      return False
    for leaf, p in zip(leaves, param_leaves, strict=True):
      if hess.is_factored(leaf):
        continue
      if not hasattr(leaf, "shape") or tuple(leaf.shape) != tuple(p.shape):
        return False
    return True

  def assign(node):
    leaves = params_def.flatten_up_to(node)
    out = []
    for leaf, p, s in zip(leaves, param_leaves, sharding_leaves, strict=True):
      if hess.is_factored(leaf):
        out.append(_factored_shardings(s, len(p.shape)))
      else:
        out.append(s)
    return params_def.unflatten(out)

  def walk(node):
    if node is None:
      return None
    if params_like(node) and jax.tree.leaves(node):
      return assign(node)
    if isinstance(node, tuple) and hasattr(node, "_fields"):  # NamedTuple
      return type(node)(*(walk(x) for x in node))
    if isinstance(node, tuple | list):
      return type(node)(walk(x) for x in node)
    if isinstance(node, dict):
      return type(node)((k, walk(v)) for k, v in node.items())
    if hasattr(node, "shape"):
      return replicated
    # another pytree node: map its leaves
    return jax.tree.map(lambda _: replicated, node)

  return walk(state)


def shard_state(state: Any, params: Any, param_shardings: Any) -> Any:
  """``jax.device_put`` of ``state`` with :func:`state_shardings`."""
  return jax.device_put(state, state_shardings(state, params, param_shardings))
