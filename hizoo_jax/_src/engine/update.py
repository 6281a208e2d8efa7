"""The engine's final update: the optimizer's own ``tx.update`` with the measured losses.

Everything chained after the estimate is the plain path's code; what this module adds is
the order of its writes, so that XLA keeps no copy of the params or the method's state.
"""

from __future__ import annotations

import jax
import jax.extend.core
import jax.numpy as jnp
import optax

from hizoo_jax._src import method as m
from hizoo_jax._src import sampling
from hizoo_jax._src.engine import locate, order


def final_update(tx, params, opt_state, losses, loc=None):
  """``theta + updates`` and the new state: the optimizer's own ``update`` with the losses
  the step measured, so everything chained after the estimate is the plain path's code.

  One call computes both. The ZO transform then draws the noise of its Hessian update
  with a key XLA cannot merge with the gradient's (``ZOCall.losses`` tells it so), so the
  params' pass and the state's pass each regenerate ``z`` rather than share a stored copy
  (an extra hash per element; measured: 1.0 param bytes of temporaries otherwise).

  Where both passes read the method's stored state (``method.state_after_params``: HiZOO
  with several probes), nothing orders the state's in-place write after the params' read,
  and XLA keeps a copy of the state (1.0 param bytes, measured; an optimization barrier
  does not order them for XLA's copy insertion, a data dependency does). So the method's
  state is taken from a second ``update`` whose losses depend on the new params by an
  exact zero (:func:`order.after_written`): XLA drops the first call's state and the second's
  updates as unused, so each pass is still computed once.
  """
  method = None if loc is None else loc.method
  updates, new_state = tx.update(locate.zeros_like(params), opt_state, params,
                                 zo_call=m.ZOCall(losses=losses), value_params=params)
  params_new = optax.apply_updates(params, updates)
  if method is not None and method.serial_products:
    return _serial_update(tx, params, opt_state, losses, params_new, new_state, loc)
  if method is None or not method.state_after_params:
    return params_new, new_state
  zero = order.after_written(params_new)
  tied = _tied(losses, zero)
  _, later = tx.update(locate.zeros_like(params), opt_state, params,
                       zo_call=m.ZOCall(losses=tied), value_params=params)
  return params_new, order.with_method_states(new_state, later)


# A group of leaves whose update products may be alive at once (Method.serial_products):
# up to this fraction of the params' bytes, or one leaf where a leaf is larger.
SERIAL_GROUP_FRACTION = 0.05


def _serial_groups(leaves) -> list[list[int]]:
  """Consecutive leaves in groups of at most ``SERIAL_GROUP_FRACTION`` of the params'
  bytes (a larger leaf alone)."""
  sizes = [int(jnp.size(x)) * jnp.dtype(jnp.result_type(x)).itemsize for x in leaves]
  budget = SERIAL_GROUP_FRACTION * sum(sizes)
  groups, total = [[]], 0
  for i, size in enumerate(sizes):
    if groups[-1] and total + size > budget:
      groups.append([])
      total = 0
    groups[-1].append(i)
    total += size
  return groups


def _serial_update(tx, params, opt_state, losses, params_new, new_state, loc):
  """``(params, state)`` computed group of leaves after group (``Method.serial_products``).

  The products of a leaf's update are formed inside the ZO transform, before the rest of
  the chain, so ordering them after the previous leaves' writes takes one ``update`` per
  group: each call's losses and method state depend on those writes by an exact zero
  (:func:`order.after_whole`), and each call estimates its own group's leaves alone
  (``ZOCall.leaves``, ``Method.estimate_some``); XLA drops what a call computes for the other
  leaves. The first call is the full ``update`` (its first group, and every leaf outside
  the ZO transform). The new state comes from the last call: its reads of the method's
  state (e.g. ZO-Muon's projectors) come after every other call's, so the state is written
  in place, with no copy kept for the readers. This holds where the rest of the chain
  treats each leaf alone and keeps no state of the updates (:func:`_leafwise`, read from
  the jaxpr); elsewhere (Adam's moments, a global-norm clip) the single ``update`` is
  kept, with every product formed before any is applied."""
  leaves, treedef = jax.tree.flatten(params_new)
  position = loc.leaf_positions(params)  # ZO leaf i is leaves[position[i]]
  groups = _serial_groups([leaves[k] for k in position])
  if len(groups) < 2 or not _leafwise(tx, params, opt_state, losses, position, groups[1]):
    return params_new, new_state
  out = list(leaves)
  state = new_state
  for prev, group in zip(groups[:-1], groups[1:], strict=True):
    zero = order.after_whole([out[position[i]] for i in prev])
    tied = _tied(losses, zero)
    updates, state = tx.update(locate.zeros_like(params), order.tied_method_states(opt_state, zero),
                               params, value_params=params,
                               zo_call=m.ZOCall(losses=tied, leaves=tuple(group)))
    later = jax.tree.leaves(optax.apply_updates(params, updates))
    for i in group:
      out[position[i]] = later[position[i]]
  return treedef.unflatten(out), state


def _tied(losses, zero):
  """``losses`` (with what the method prepared: the state its products read) plus the
  exact zero ``zero``: the same values, computed after whatever ``zero`` depends on."""
  l0, values, *rest = losses
  return (l0 + zero.astype(l0.dtype), values + zero.astype(values.dtype),
          *order.plus(rest, zero))


def _leafwise(tx, params, opt_state, losses, position, group) -> bool:
  """Whether the updates of ``group``'s leaves depend on the ZO estimate of those leaves
  alone, and the new state on no estimate, read from the jaxpr of ``tx.update`` with the
  other leaves' estimates as inputs. A transform after the estimate that reduces over
  every leaf (``clip_by_global_norm``, ``apply_if_finite``) or keeps a state of the updates
  (Adam's moments) fails it, as does anything the walk cannot see into (a nested call
  counts as depending on all of its inputs)."""
  group = set(group)
  full = jax.tree.leaves(params)
  outside = [jnp.zeros(jnp.shape(full[k]), sampling.noise_dtype(jnp.result_type(full[k])))
             for i, k in enumerate(position) if i not in group]

  def updates_of_group(outside):
    call = m.ZOCall(losses=losses, leaves=tuple(sorted(group)), outside=outside)
    updates, state = tx.update(locate.zeros_like(params), opt_state, params, zo_call=call,
                               value_params=params)
    ups = jax.tree.leaves(updates)
    return [ups[position[i]] for i in sorted(group)], jax.tree.leaves(state)

  jaxpr = jax.make_jaxpr(updates_of_group)(outside).jaxpr
  tainted = set(jaxpr.invars)
  for eqn in jaxpr.eqns:
    if any(not isinstance(v, jax.extend.core.Literal) and v in tainted for v in eqn.invars):
      tainted.update(eqn.outvars)
  return not any(not isinstance(v, jax.extend.core.Literal) and v in tainted
                 for v in jaxpr.outvars)
