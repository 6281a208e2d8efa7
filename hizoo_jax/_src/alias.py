"""Ready-to-use zeroth-order optimizers: ``hizoo``, ``hizoo_l`` and ``mezo``.

Each is ``scale_by_* -> add_decayed_weights -> scale_by_learning_rate``, i.e.
``theta <- theta - lr * (g + weight_decay * theta)``. Weight decay follows one convention for
every method (``decay_mask``): leaves with ``ndim >= 2`` (weight matrices, kernels,
embeddings) are decayed, 1-D and scalar leaves (biases, norm scales) are not, as the MeZO,
LOZO and ZO-Muon reference trainers and Hugging Face's ``Trainer`` do by parameter name;
``weight_decay_mask`` replaces that default. The
options of the estimate are stated once, on :func:`hizoo_jax.scale_by_hizoo` and
:func:`hizoo_jax.scale_by_zo`; the aliases forward them and carry the full signature
(``inspect.signature``), so ``optax.inject_hyperparams`` can schedule or change any numeric
option (list ``num_directions`` in its ``static_args``).
"""

from __future__ import annotations

import inspect
from typing import Any

import jax
import jax.numpy as jnp
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


def _with_decay_and_lr(estimate, learning_rate, weight_decay, weight_decay_mask,
                       vector_scale=None):
  # A NaN, infinite or negative learning rate or weight decay would cost the params: refused
  # here when concrete, the step skipped (and counted) when traced or scheduled (guard.py).
  guard.check_nonnegative("learning_rate", learning_rate)
  guard.check_nonnegative("weight_decay", weight_decay)
  parts = [estimate, *_decay(weight_decay, weight_decay_mask, vector_scale)]
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
    weight_decay: L2 coefficient added to the estimate, ``g + weight_decay * theta``, on the
      leaves of ``weight_decay_mask``.
    weight_decay_mask: a tree of bools (or a callable of the params returning one) selecting
      the decayed leaves; by default the leaves with ``ndim >= 2`` (biases and norm scales
      are not decayed, as in the reference trainers and Hugging Face).
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
  states no value; the reference code's READMEs disagree: 1e-6 for full fine-tuning and
  1e-10 for LoRA in its 2024 RoBERTa README, the reverse in its 2024 OPT README, 1e-8 in
  its current one, and its scripts default to 0; see :mod:`hizoo_jax.presets`,
  :data:`~hizoo_jax.presets.REFERENCE_FT`, :data:`~hizoo_jax.presets.REFERENCE_LORA`). On
  small models that ``alpha`` barely moves the Hessian from 1, and HiZOO then behaves like
  MeZO with one more forward pass; :func:`hizoo_jax.presets.hizoo` sets
  ``alpha = 0.5 / d`` (d = number of params) and ``mu = 1e-2`` instead.

  Args:
    learning_rate: a float or an Optax schedule.
    weight_decay: L2 coefficient added to the estimate, ``g + weight_decay * theta``, on the
      leaves of ``weight_decay_mask``.
    weight_decay_mask: a tree of bools (or a callable of the params returning one) selecting
      the decayed leaves; by default the leaves with ``ndim >= 2`` (biases and norm scales
      are not decayed, as in the reference trainers and Hugging Face).
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


def _alias(name: str, scale_fn, summary: str, reference: str, extra: str = "",
           scaled_vectors: bool = False):
  """An alias ``name(learning_rate, *, weight_decay=0, weight_decay_mask=None, **options)``
  that chains ``scale_fn(**options)`` with weight decay and the learning rate; its
  docstring is ``summary``, ``extra``, the shared arguments and ``reference``. With
  ``scaled_vectors`` the decayed vectors decay at ``vector_scale * weight_decay``."""
  options = [p for p in inspect.signature(scale_fn).parameters.values()]
  defaults = {p.name: p.default for p in options}

  def alias(learning_rate, *, weight_decay=0.0, weight_decay_mask=None, **opts):
    scale = opts.get("vector_scale", defaults.get("vector_scale")) if scaled_vectors else None
    return _with_decay_and_lr(scale_fn(**opts), learning_rate, weight_decay,
                              weight_decay_mask, scale)

  alias.__name__ = alias.__qualname__ = name
  alias.__doc__ = f"""{summary}

  ``theta <- theta - lr * (g + weight_decay * theta)`` with ``g`` the estimate of
  :func:`hizoo_jax.{scale_fn.__name__}`.{extra}

  Args:
    learning_rate: a float or an Optax schedule.
    weight_decay: L2 coefficient added to the estimate, ``g + weight_decay * theta``, on the
      leaves of ``weight_decay_mask``.
    weight_decay_mask: a tree of bools (or a callable of the params returning one) selecting
      the decayed leaves; by default the leaves with ``ndim >= 2`` (biases and norm scales
      are not decayed, as in the reference trainers and Hugging Face).
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
    "arXiv 2602.17155, 2026.",
    extra="""

  Vectors step at ``vector_scale`` times the learning rate, and so does their weight decay
  when ``weight_decay_mask`` selects them: ``lr * vector_scale * weight_decay * theta``
  (the reference trainer's ``1e-7 * weight_decay`` at its ``lr = 1e-2``). The default
  mask decays no vector, as the reference does on OPT (whose vectors are all biases and
  layer norms).""",
    scaled_vectors=True)
