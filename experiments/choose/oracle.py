"""The curvature oracle: MeZO preconditioned by the true curvature, measured by autodiff.

How much could a perfect curvature estimate buy a zeroth-order method? This runs HiZOO's
update (``hz.hizoo``: perturb along ``H^{-1/2} z``, step along ``H^{-1/2} z`` scaled by the
two-point difference) with its own estimate switched off (``hessian_smoothing=0``,
``hessian_update_every`` past the budget) and ``H`` written into its state from the loss's
Hessian diagonal, estimated by Hutchinson's method with exact Hessian-vector products:
``diag(A) ~ mean_i z_i * (A z_i)``, ``z_i`` Rademacher, one training batch per sample.

Two preconditioners (option ``oracle``):

* ``"diag"``: ``|diag(A)|`` per parameter;
* ``"tensor"``: the mean of ``|diag(A)|`` over each tensor (one scale per leaf).

Both are divided by their mean over all parameters (so the learning rate keeps MeZO's
meaning; tuning absorbs any overall scale) and floored at ``floor`` (default 1e-2, i.e.
at most 100x the average step in the flattest direction; the absolute value because the
diagonal of a non-convex loss has negative entries, which a step size cannot use).
``refresh`` (steps; 0 = never) re-measures ``H`` at the current params, which turns the
fixed oracle into a refreshed one. The autodiff cost is not a forward pass of the method:
it is the oracle's, reported apart (``oracle_seconds``), since no zeroth-order method can
pay it.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

ORACLE_KEYS = ("oracle", "refresh", "samples", "floor")
NEVER = 2**30  # hessian_update_every: the method never measures l0 after step 0


def hutchinson_diag(loss_fn, params, extra: tuple, batches: list, seed: int):
  """``mean_i z_i * H_i z_i`` over ``len(batches)`` samples (``H_i``: the Hessian of the
  loss on batch ``i``), float32, shaped like ``params``."""
  grad = jax.grad(loss_fn)

  @jax.jit
  def sample(p, key, *batch):
    leaves, treedef = jax.tree.flatten(p)
    keys = jax.random.split(key, len(leaves))
    z = treedef.unflatten([jax.random.rademacher(k, x.shape, jnp.float32).astype(x.dtype)
                           for k, x in zip(keys, leaves, strict=True)])
    _, hz = jax.jvp(lambda q: grad(q, *extra, *batch), (p,), (z,))
    return jax.tree.map(lambda a, b: (a * b).astype(jnp.float32), z, hz)

  acc = None
  base = jax.random.key(seed)
  for i, batch in enumerate(batches):
    s = sample(params, jax.random.fold_in(base, i), *batch)
    acc = s if acc is None else jax.tree.map(jnp.add, acc, s)
  return jax.tree.map(lambda a: a / len(batches), acc)


def preconditioner(diag, kind: str, floor: float):
  """``|diag|`` per parameter (``"diag"``) or per tensor (``"tensor"``), mean 1, floored."""
  mag = jax.tree.map(jnp.abs, diag)
  if kind == "tensor":
    mag = jax.tree.map(lambda a: jnp.full_like(a, jnp.mean(a)), mag)
  elif kind != "diag":
    raise ValueError(f"oracle must be 'diag' or 'tensor', got {kind!r}")
  leaves = jax.tree.leaves(mag)
  total = sum(float(jnp.sum(a)) for a in leaves)
  count = sum(a.size for a in leaves)
  mean = total / max(count, 1)
  return jax.tree.map(lambda a: jnp.maximum(a / max(mean, 1e-30), floor), mag)


def split_options(options: dict) -> tuple[dict, dict]:
  """``(oracle options with defaults, the rest for hz.hizoo)``."""
  ora = {"oracle": "diag", "refresh": 0, "samples": 32, "floor": 1e-2}
  ora.update({k: v for k, v in options.items() if k in ORACLE_KEYS})
  rest = {k: v for k, v in options.items() if k not in ORACLE_KEYS}
  rest.update(hessian_smoothing=0.0, hessian_update_every=NEVER)
  return ora, rest


def due(ora: dict, t: int) -> bool:
  """Whether step ``t`` (0-based) starts by measuring the curvature."""
  r = int(ora["refresh"])
  return t == 0 or (r > 0 and t % r == 0)


def install(opt_state, params, inst, ora: dict, t: int, seed: int) -> tuple[Any, dict]:
  """Measures the curvature at ``params`` (batches ``t .. t + samples - 1`` of the run's
  order) and writes the preconditioner into the state's ``hessian``; returns the state and
  a summary of the preconditioner."""
  batches = [inst.batch(t + i) for i in range(int(ora["samples"]))]
  diag = hutchinson_diag(inst.loss_fn, params, inst.extra, batches, seed * 1_000_003 + t)
  h = preconditioner(diag, ora["oracle"], float(ora["floor"]))
  flat = np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree.leaves(h)])
  old = optax.tree_utils.tree_get(opt_state, "hessian")
  h = jax.tree.map(lambda new, o: new.astype(o.dtype), h, old)
  state = optax.tree_utils.tree_set(opt_state, hessian=h)
  q = np.quantile(flat, [0.0, 0.5, 0.99, 1.0])
  return state, {"step": t, "min": float(q[0]), "median": float(q[1]), "p99": float(q[2]),
                 "max": float(q[3]), "floored": float(np.mean(flat <= float(ora["floor"])))}
