"""Numerics shared by every zeroth-order method: loss checks, the perturbation scale in use.

Every method measures losses at perturbed params and turns them into an estimate (see
:mod:`hizoo_jax._src.method`); what they all need of the numbers lives here: the loss
dtype and its checks, and the perturbation scale ``mu`` actually applied (sanitised when
it arrives traced, raised for 16-bit params).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def loss_dtype(params: Any) -> np.dtype:
  """The dtype losses are compared and recorded in: at least float32."""
  dtypes = [jnp.result_type(x) for x in jax.tree.leaves(params)]
  return jnp.result_type(jnp.float32, *dtypes) if dtypes else np.dtype(jnp.float32)


def check_loss(loss: Any, what: str = "value_fn") -> jax.Array:
  """``loss`` as a scalar array, or a ValueError naming what returned it."""
  if isinstance(loss, tuple):
    raise ValueError(
        f"{what} must return a scalar loss, got a tuple; for a (loss, aux) function use "
        "make_train_step(..., has_aux=True), or wrap it as lambda p: f(p)[0]"
    )
  loss = jnp.asarray(loss)
  if loss.shape != ():
    raise ValueError(f"{what} must return a scalar loss, got shape {loss.shape}")
  if not jnp.issubdtype(loss.dtype, jnp.floating):
    raise ValueError(f"{what} must return a floating-point loss, got dtype {loss.dtype}")
  return loss


def sanitize_mu(mu: Any) -> tuple[jax.Array, jax.Array]:
  """``(mu, ok)``: a traced ``mu`` that is not finite and > 0 becomes 0 with ``ok = False``.

  Under ``jit`` a bad injected ``mu`` cannot raise; the step then perturbs by 0 and counts
  its directions as skipped, so params and state stay as they were.
  """
  mu = jnp.asarray(mu)
  ok = jnp.isfinite(mu) & (mu > 0)
  return jnp.where(ok, mu, jnp.zeros_like(mu)), ok


def effective_mu(mu: Any, params: Any, resolution: Any) -> jax.Array:
  """``mu``, raised for 16-bit params to ``resolution * eps(dtype) * rms(theta)``.

  In bfloat16 (8 mantissa bits) ``theta + mu z`` rounds back to ``theta`` for most elements
  at ``mu = 1e-3`` when ``|theta| ~ 0.05``: the perturbation applied is not the one the
  estimate assumes, the second difference is mostly rounding, and HiZOO's ``H`` inflates
  (measured on an MLP: 94% of the elements rounded away, median H 4000x float32's, final
  loss 3.3x). A perturbation of a few ulp of a typical param is applied for most elements:
  with ``resolution = 4`` about 7% still round away, and HiZOO in bfloat16 then trains like
  float32 (loss 1.00x, median H 1.00x; float16 1.17x / 1.55x; experiments/bf16). The rms is
  over all leaves of each 16-bit dtype (the largest of those values counts); float32 and
  wider leaves leave ``mu`` as given.
  """
  mu = jnp.asarray(mu)
  by_dtype: dict[Any, list] = {}
  for x in jax.tree.leaves(params):
    dt = jnp.result_type(x)
    if jnp.finfo(dt).bits < 32:
      by_dtype.setdefault(dt, []).append(x)
  res = np.asarray(resolution) if not isinstance(resolution, jax.core.Tracer) else None
  if not by_dtype or (res is not None and float(res) == 0):
    return mu
  floor = jnp.zeros((), jnp.float32)
  for dt, xs in by_dtype.items():
    total = sum(jnp.sum(jnp.square(jnp.asarray(x, jnp.float32))) for x in xs)
    count = sum(int(np.prod(jnp.shape(x))) for x in xs)
    rms = jnp.sqrt(total / max(count, 1))
    floor = jnp.maximum(floor, float(jnp.finfo(dt).eps) * rms)
  return jnp.maximum(mu, (jnp.asarray(resolution, jnp.float32) * floor).astype(mu.dtype))


def sanitize_alpha(alpha: Any) -> jax.Array:
  """``hessian_smoothing`` clamped into [0, 1] (NaN: 0, no update).

  An EMA factor above 1 extrapolates past the estimate (``alpha = 2`` gives ``2 est - H``)
  and one below 0 pushes ``H`` away from it; a schedule may return such values under
  ``jit``, where nothing can raise.
  """
  alpha = jnp.asarray(alpha)
  return jnp.where(jnp.isnan(alpha), 0, jnp.clip(alpha, 0, 1)).astype(alpha.dtype)


def runtime_one(x: Any) -> jax.Array:
  """The int32 1, computed from the first element of ``x`` so that XLA cannot know it is 1
  (2 where that element is NaN).

  ``f != f`` is false for every float but NaN, and XLA does not fold a float's
  self-comparison, because of NaN.
  """
  f = jnp.ravel(jnp.asarray(x))[0].astype(jnp.float32)
  return 1 + (f != f).astype(jnp.int32)


def computed_once(tree: Any) -> Any:
  """``tree``, its arrays computed once per program into buffers of their own.

  XLA copies a cheap producer into every fused pass that reads it: the few dozen scalar
  ops that turn a step's losses into its coefficients would otherwise run inside the
  pass of every leaf, and a step's passes are most of its instructions, hence of its
  compile time, on a model with many tensors. An ``optimization_barrier`` does not stop
  this on XLA:CPU, which removes the barrier before it fuses (HiZOO's step on 200 tensors
  of one shape: 82,400 instructions behind barriers, 69,700 with this). On the CPU the
  values come out of a loop whose trip count (1, or 2 when the first value is NaN: the
  body gives the same values every time) XLA cannot see through, so it neither folds it
  nor fuses across it. Elsewhere they pass an ``optimization_barrier``: a GPU reads a
  loop's condition back to the host at every trip, and its fusion is not what this cost.
  Differentiable: the values' tangents pass through unchanged.
  """
  leaves, treedef = jax.tree.flatten(tree)
  if not leaves:
    return tree
  return treedef.unflatten(list(_computed_once(tuple(leaves))))


def _loop_once(leaves: tuple) -> tuple:
  one = runtime_one(leaves[0]) if jnp.size(leaves[0]) else jnp.ones((), jnp.int32)
  init = tuple(jnp.zeros_like(x) for x in leaves)
  _, out = jax.lax.while_loop(lambda c: c[0] < one, lambda c: (c[0] + 1, leaves),
                              (jnp.zeros((), jnp.int32), init))
  return out


@jax.custom_jvp
def _computed_once(leaves: tuple) -> tuple:
  return jax.lax.platform_dependent(leaves, cpu=_loop_once,
                                    default=jax.lax.optimization_barrier)


@_computed_once.defjvp
def _computed_once_jvp(primals, tangents):
  return _computed_once(*primals), tangents[0]
