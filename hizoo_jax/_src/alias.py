"""What every optimizer alias (``hz.mezo``, ``hz.hizoo``, ``hz.fzoo``, ...) shares; each
alias lives in its method's file in ``_src/methods/``.

Each is ``scale_by_* -> add_decayed_weights -> scale_by_learning_rate``, i.e.
``theta <- theta - lr * (g + weight_decay * theta)``. Weight decay follows one convention for
every method (``decay_mask``): leaves with ``ndim >= 2`` (weight matrices, kernels,
embeddings) are decayed, 1-D and scalar leaves (biases, norm scales) are not, as the MeZO,
LOZO and ZO-Muon reference trainers and Hugging Face's ``Trainer`` do by parameter name;
``weight_decay_mask`` replaces that default. The
options of the estimate are stated once, on the method's ``scale_by_*``; the aliases forward
them and carry the full signature
(``inspect.signature``), so ``optax.inject_hyperparams`` can schedule or change any numeric
option (list ``num_directions`` in its ``static_args``).
"""

from __future__ import annotations

import inspect
from typing import Any

import jax
import jax.numpy as jnp
import optax

from hizoo_jax._src import guard

ScalarOrSchedule = float | jax.Array | optax.Schedule

KEYWORD_ONLY = inspect.Parameter.KEYWORD_ONLY
_ALIAS_PARAMS = (
    inspect.Parameter("learning_rate", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                      annotation=ScalarOrSchedule),
    inspect.Parameter("weight_decay", KEYWORD_ONLY, default=0.0, annotation=float),
    inspect.Parameter("weight_decay_mask", KEYWORD_ONLY, default=None, annotation=Any),
)


def signature(options, drop=()):
  params = _ALIAS_PARAMS + tuple(p for p in options if p.name not in drop)
  return inspect.Signature(params, return_annotation=optax.GradientTransformationExtraArgs)


def decay_mask(params: Any) -> Any:
  """The default ``weight_decay_mask`` of every alias: True for the leaves with ``ndim >= 2``.

  The reference trainers of MeZO, LOZO and ZO-Muon (and Hugging Face's ``Trainer``) leave
  out the parameters whose names contain ``bias`` or ``layer_norm``; in a params tree the
  same leaves are the ones with fewer than two dimensions. To decay every leaf, pass
  ``weight_decay_mask=lambda p: jax.tree.map(lambda _: True, p)``.
  """
  return jax.tree.map(lambda x: jnp.ndim(x) >= 2, params)


def _restricted(mask: Any, keep) -> Any:
  """The mask ``mask`` (a tree of bools, a prefix of the params' tree, or a callable of the
  params) further restricted to the leaves for which ``keep(leaf)`` is true."""
  def fn(params):
    chosen = mask(params) if callable(mask) else mask
    return jax.tree.map(lambda on, sub: jax.tree.map(lambda x: bool(on) and keep(x), sub),
                        chosen, params)
  return fn


def _decay(weight_decay, weight_decay_mask, vector_scale=None) -> list:
  """The weight-decay stages: ``weight_decay * theta`` on the leaves of the mask (default
  :func:`decay_mask`). With ``vector_scale`` (ZO-Muon), the mask's leaves of ``ndim < 2``
  decay at ``vector_scale * weight_decay``, as that method's vectors step."""
  # A literal 0 adds nothing; an array (e.g. under inject_hyperparams) is kept.
  if isinstance(weight_decay, int | float) and weight_decay == 0:
    return []
  mask = decay_mask if weight_decay_mask is None else weight_decay_mask
  if vector_scale is None:
    return [optax.add_decayed_weights(weight_decay, mask)]
  return [optax.add_decayed_weights(weight_decay, _restricted(mask, lambda x: jnp.ndim(x) >= 2)),
          optax.add_decayed_weights(_scaled(weight_decay, vector_scale),
                                    _restricted(mask, lambda x: jnp.ndim(x) < 2))]


def _scaled(weight_decay, scale):
  if callable(weight_decay):
    return lambda count: weight_decay(count) * scale
  return weight_decay * scale


def with_decay_and_lr(estimate, learning_rate, weight_decay, weight_decay_mask,
                       vector_scale=None):
  # A NaN, infinite or negative learning rate or weight decay would cost the params: refused
  # here when concrete, the step skipped (and counted) when traced or scheduled (guard.py).
  guard.check_nonnegative("learning_rate", learning_rate)
  guard.check_nonnegative("weight_decay", weight_decay)
  parts = [estimate, *_decay(weight_decay, weight_decay_mask, vector_scale)]
  parts.append(optax.scale_by_learning_rate(learning_rate))
  return guard.guarded_chain(
      parts, {"learning_rate": learning_rate, "weight_decay": weight_decay})


# The arguments every alias shares, as its docstring's Args section gives them.
SHARED_ARGS = """learning_rate: a float or an Optax schedule.
    weight_decay: L2 coefficient added to the estimate, ``g + weight_decay * theta``, on the
      leaves of ``weight_decay_mask``.
    weight_decay_mask: a tree of bools (or a callable of the params returning one) selecting
      the decayed leaves; by default the leaves with ``ndim >= 2`` (biases and norm scales
      are not decayed, as in the reference trainers and Hugging Face)."""


def shared_args_doc(fn):
  """Puts :data:`SHARED_ARGS` where ``fn``'s docstring says ``{shared_args}``."""
  fn.__doc__ = fn.__doc__.replace("{shared_args}", SHARED_ARGS)
  return fn


def make_alias(name: str, scale_fn, summary: str, reference: str, extra: str = "",
           scaled_vectors: bool = False):
  """An alias ``name(learning_rate, *, weight_decay=0, weight_decay_mask=None, **options)``
  that chains ``scale_fn(**options)`` with weight decay and the learning rate; its
  docstring is ``summary``, ``extra``, the shared arguments and ``reference``. With
  ``scaled_vectors`` the decayed vectors decay at ``vector_scale * weight_decay``."""
  options = [p for p in inspect.signature(scale_fn).parameters.values()]
  defaults = {p.name: p.default for p in options}

  def alias(learning_rate, *, weight_decay=0.0, weight_decay_mask=None, **opts):
    scale = opts.get("vector_scale", defaults.get("vector_scale")) if scaled_vectors else None
    return with_decay_and_lr(scale_fn(**opts), learning_rate, weight_decay,
                              weight_decay_mask, scale)

  alias.__name__ = alias.__qualname__ = name
  alias.__doc__ = f"""{summary}

  ``theta <- theta - lr * (g + weight_decay * theta)`` with ``g`` the estimate of
  :func:`hizoo_jax.{scale_fn.__name__}`.{extra}

  Args:
    {SHARED_ARGS}
    **options: {", ".join(f"``{p.name}``" for p in options)}: as in
      :func:`hizoo_jax.{scale_fn.__name__}`.

  References:
    {reference}
  """
  alias.__signature__ = signature(tuple(  # type: ignore[attr-defined]
      p.replace(kind=KEYWORD_ONLY) for p in options))
  return alias


