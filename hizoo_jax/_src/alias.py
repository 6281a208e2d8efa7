"""Ready-to-use zeroth-order optimizers: ``hizoo``, ``hizoo_l`` and ``mezo``.

Each is ``scale_by_* -> add_decayed_weights -> scale_by_learning_rate``, i.e.
``theta <- theta - lr * (g + weight_decay * theta)`` as in the reference trainer. The
options of the estimate are stated once, on :func:`hizoo_jax.scale_by_hizoo` and
:func:`hizoo_jax.scale_by_zo`; the aliases forward them and carry the full signature
(``inspect.signature``), so ``optax.inject_hyperparams`` can schedule or change any numeric
option (list ``num_directions`` in its ``static_args``).
"""

from __future__ import annotations

import inspect
from typing import Any

import jax
import optax

from hizoo_jax._src import guard, transform

ScalarOrSchedule = float | jax.Array | optax.Schedule

_KW = inspect.Parameter.KEYWORD_ONLY
_ALIAS_PARAMS = (
    inspect.Parameter("learning_rate", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                      annotation=ScalarOrSchedule),
    inspect.Parameter("weight_decay", _KW, default=0.0, annotation=float),
    inspect.Parameter("weight_decay_mask", _KW, default=None, annotation=Any),
)


def _signature(options, drop=()):
  params = _ALIAS_PARAMS + tuple(p for p in options if p.name not in drop)
  return inspect.Signature(params, return_annotation=optax.GradientTransformationExtraArgs)


def _with_decay_and_lr(estimate, learning_rate, weight_decay, weight_decay_mask):
  # A NaN, infinite or negative learning rate or weight decay would cost the params: refused
  # here when concrete, the step skipped (and counted) when traced or scheduled (guard.py).
  guard.check_nonnegative("learning_rate", learning_rate)
  guard.check_nonnegative("weight_decay", weight_decay)
  parts = [estimate]
  # A literal 0 adds nothing; an array (e.g. under inject_hyperparams) is kept.
  if not (isinstance(weight_decay, int | float) and weight_decay == 0):
    parts.append(optax.add_decayed_weights(weight_decay, weight_decay_mask))
  parts.append(optax.scale_by_learning_rate(learning_rate))
  return guard.guarded_chain(
      parts, {"learning_rate": learning_rate, "weight_decay": weight_decay})


def mezo(
    learning_rate: ScalarOrSchedule,
    *,
    weight_decay: float = 0.0,
    weight_decay_mask: Any = None,
    **options: Any,
) -> optax.GradientTransformationExtraArgs:
  """MeZO / ZO-SGD: ``theta <- theta - lr * (g_spsa + weight_decay * theta)``.

  Args:
    learning_rate: a float or an Optax schedule.
    weight_decay: L2 coefficient added to the estimate, as in MeZO.
    weight_decay_mask: optional tree of bools (or callable) selecting decayed leaves.
    **options: ``mu``, ``num_directions``, ``sampler``, ``seed``: as in
      :func:`hizoo_jax.scale_by_zo`.

  Example:
    >>> import jax.numpy as jnp, hizoo_jax as hz
    >>> tx = hz.mezo(1e-2, mu=1e-3)
    >>> params = {"w": jnp.ones(4)}
    >>> step = hz.make_train_step(tx, lambda p, x: jnp.sum((p["w"] - x) ** 2))
    >>> params, state, loss = step(params, tx.init(params), jnp.zeros(4))
    >>> float(loss) > 0
    True

  References:
    Malladi et al., "Fine-Tuning Language Models with Just Forward Passes", NeurIPS 2023.
  """
  return _with_decay_and_lr(transform.scale_by_zo(**options), learning_rate, weight_decay,
                            weight_decay_mask)


_ZO_OPTIONS = tuple(
    p.replace(kind=_KW) for p in inspect.signature(transform.scale_by_zo).parameters.values())
mezo.__signature__ = _signature(_ZO_OPTIONS)  # type: ignore[attr-defined]


def hizoo(
    learning_rate: ScalarOrSchedule,
    *,
    weight_decay: float = 0.0,
    weight_decay_mask: Any = None,
    **options: Any,
) -> optax.GradientTransformationExtraArgs:
  """HiZOO: ``theta <- theta - lr * (g_hizoo + weight_decay * theta)``.

  The defaults are ``mu=1e-3`` (the paper's) and ``hessian_smoothing=1e-8`` (the paper
  states no value; its reference scripts use 1e-6 for full fine-tuning and 1e-10 for LoRA:
  :data:`hizoo_jax.presets.REFERENCE_FT`, :data:`~hizoo_jax.presets.REFERENCE_LORA`). On
  small models that ``alpha`` barely moves the Hessian from 1, and HiZOO then behaves like
  MeZO with one more forward pass; :func:`hizoo_jax.presets.hizoo` sets
  ``alpha = 0.5 / d`` (d = number of params) and ``mu = 1e-2`` instead.

  Args:
    learning_rate: a float or an Optax schedule.
    weight_decay: L2 coefficient added to the estimate, as in the reference trainer.
    weight_decay_mask: optional tree of bools (or callable) selecting decayed leaves.
    **options: every option of :func:`hizoo_jax.scale_by_hizoo` (``mu``,
      ``hessian_smoothing``, ``estimator``, ``num_directions``, ``factored``, ...).

  Example:
    >>> import jax.numpy as jnp, hizoo_jax as hz
    >>> tx = hz.hizoo(1e-2, mu=1e-2, hessian_smoothing=1e-3)
    >>> params = {"w": jnp.ones(4)}
    >>> step = hz.make_train_step(tx, lambda p, x: jnp.sum((p["w"] - x) ** 2))
    >>> params, state, loss = step(params, tx.init(params), jnp.zeros(4))
    >>> float(loss)  # l0 = f(theta) on a Hessian step
    4.0

  References:
    Zhao et al., "Second-Order Fine-Tuning without Pain for LLMs: A Hessian Informed
    Zeroth-Order Optimizer", ICLR 2025, Algorithms 1 and 3.
  """
  return _with_decay_and_lr(transform.scale_by_hizoo(**options), learning_rate, weight_decay,
                            weight_decay_mask)


hizoo.__signature__ = _signature(transform.HIZOO_OPTIONS)  # type: ignore[attr-defined]


def hizoo_l(
    learning_rate: ScalarOrSchedule,
    *,
    weight_decay: float = 0.0,
    weight_decay_mask: Any = None,
    **options: Any,
) -> optax.GradientTransformationExtraArgs:
  """HiZOO-L: HiZOO with a rank-1 (Adafactor-style) Hessian for large matrices.

  A ``p x q`` matrix leaf keeps ``p + q`` Hessian floats instead of ``p q``; leaves whose
  last two dims are not both ``>= min_dim_size_to_factor`` (and vectors) keep a dense
  Hessian. Arguments as in :func:`hizoo` (``factored`` is implied).

  References:
    Zhao et al., ICLR 2025, Appendix D.1, Algorithm 2; Shazeer & Stern, 2018 (Adafactor).
  """
  if "factored" in options:
    raise TypeError("hizoo_l() is hizoo(factored=True); it takes no 'factored' argument")
  return hizoo(learning_rate, weight_decay=weight_decay, weight_decay_mask=weight_decay_mask,
               factored=True, **options)


hizoo_l.__signature__ = _signature(  # type: ignore[attr-defined]
    transform.HIZOO_OPTIONS, drop=("factored",))


def _alias(name: str, scale_fn, summary: str, reference: str):
  """An alias ``name(learning_rate, *, weight_decay=0, weight_decay_mask=None, **options)``
  that chains ``scale_fn(**options)`` with weight decay and the learning rate; its
  docstring is ``summary``, the shared arguments and ``reference``."""

  def alias(learning_rate, *, weight_decay=0.0, weight_decay_mask=None, **options):
    return _with_decay_and_lr(scale_fn(**options), learning_rate, weight_decay,
                              weight_decay_mask)

  options = [p for p in inspect.signature(scale_fn).parameters.values()]
  alias.__name__ = alias.__qualname__ = name
  alias.__doc__ = f"""{summary}

  ``theta <- theta - lr * (g + weight_decay * theta)`` with ``g`` the estimate of
  :func:`hizoo_jax.{scale_fn.__name__}`.

  Args:
    learning_rate: a float or an Optax schedule.
    weight_decay: L2 coefficient added to the estimate.
    weight_decay_mask: optional tree of bools (or callable) selecting decayed leaves.
    **options: {", ".join(f"``{p.name}``" for p in options)}: as in
      :func:`hizoo_jax.{scale_fn.__name__}`.

  References:
    {reference}
  """
  alias.__signature__ = _signature(tuple(  # type: ignore[attr-defined]
      p.replace(kind=_KW) for p in options))
  return alias


fzoo = _alias(
    "fzoo", transform.scale_by_fzoo,
    "FZOO: one-sided Rademacher probes, the step normalised by the spread of their losses "
    "(``N + 1`` forward passes, default ``N = 8``; learning rates far above MeZO's).",
    "Dang et al., ICLR 2026.")

forward_gradient = _alias(
    "forward_gradient", transform.scale_by_forward_gradient,
    "Forward-gradient descent: the exact directional derivative by ``jax.jvp``.",
    "Baydin et al., 2022; Zhang et al., ICML 2024 (ZO-Bench's Forward-Grad).")

sparse_mezo = _alias(
    "sparse_mezo", transform.scale_by_sparse_mezo,
    "Sparse MeZO: MeZO on the small-magnitude weights of each matrix (default 20%).",
    "Liu et al., NeurIPS 2025.")

lozo = _alias(
    "lozo", transform.scale_by_lozo,
    "LOZO / LOZO-M: low-rank ``U V^T`` perturbations per matrix (``momentum > 0``: LOZO-M).",
    "Chen et al., ICLR 2025.")

subzero = _alias(
    "subzero", transform.scale_by_subzero,
    "SubZero: SPSA in random orthonormal subspaces of each matrix.",
    "Yu et al., ICCV 2025.")

zo_muon = _alias(
    "zo_muon", transform.scale_by_zo_muon,
    "ZO-Muon: subspace probes and a Newton-Schulz-orthogonalised step per matrix (the "
    "learning rate is a step length: 1e-2 in the reference README).",
    "arXiv 2602.17155, 2026.")
