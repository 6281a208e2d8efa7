"""Named settings of HiZOO: the library's defaults, the reference scripts', and the
recommended ones (with ``alpha`` set by size).

The paper (Zhao et al., ICLR 2025) gives ``mu = 1e-3`` for full fine-tuning and LoRA
(``1e-1`` for prefix tuning) in its hyperparameter tables but no value of the smoothing
``alpha``: its ablation only says that the best ``alpha`` depends on the dataset. The
public reference scripts use ``alpha = 1e-6`` for full fine-tuning and prefix tuning and
``1e-10`` for LoRA (:data:`REFERENCE_FT`, :data:`REFERENCE_LORA`). :data:`PAPER` is the
library's default, ``alpha = 1e-8``, with ``mu = 1e-3`` and the paper estimator::

    tx = hz.hizoo(1e-6, **hz.presets.REFERENCE_FT)

The recommended settings scale the smoothing factor with the number of parameters ``d``,
``alpha = SMOOTHING_PER_PARAM / d`` (at most ``MAX_SMOOTHING``), and use ``mu = 1e-2``::

    tx = hz.presets.hizoo(3e-3)          # alpha decided at init from the params' size
    tx = hz.hizoo(3e-3, **hz.presets.recommended(params))   # the same, spelled out

Why ``1 / d``: with the paper estimator the EMA's fixed point is ``H = (1 + d/2) diag(A)``
on a quadratic, and near it each update multiplies ``H_i`` by ``1 - alpha + alpha c z_i^2``
with ``c ~ 1`` while pulling it back only at a rate ``~ alpha / d``: the spread of ``H``
grows with ``alpha d`` (``notebooks/02_curvature_estimate.ipynb`` measures it), so ``alpha
d`` must stay O(1); a much smaller ``alpha d`` makes ``H`` (and the step size) adapt ``1 /
(alpha d)`` times more slowly. ``SMOOTHING_PER_PARAM = 0.5`` gives ``alpha = 0.25`` on the
paper's 2-D test functions and ``1.9e-5`` on the 26k-parameter digits MLP, and both converge
(``notebooks/01_test_functions.ipynb``, ``notebooks/03_ablations.ipynb``); on a
3.5e8-parameter model it gives ``1.4e-9``, between the reference scripts' ``1e-6`` and
``1e-10``. Why ``mu =
1e-2``: at that fixed point the second difference ``l+ + l- - 2 l0`` is about ``2 mu^2``
whatever ``d``; in float32 it must exceed a few ``eps |l|`` to be measured, which ``mu =
1e-3`` misses once the loss is above ~4.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import jax
import numpy as np
import optax

from hizoo_jax._src import alias

PAPER: Mapping[str, Any] = MappingProxyType(
    dict(mu=1e-3, hessian_smoothing=1e-8, estimator="paper", hessian_clip=(1e-8, 1e8)))
"""``hz.hizoo``'s defaults: the paper's ``mu`` and estimator, and ``alpha = 1e-8``, which
the paper does not state (see the module docstring); pass as ``hz.hizoo(lr, **PAPER)``."""

REFERENCE_FT: Mapping[str, Any] = MappingProxyType(
    dict(mu=1e-3, hessian_smoothing=1e-6, estimator="paper", hessian_clip=(1e-8, 1e8)))
"""The public reference scripts' full fine-tuning settings (``alpha = 1e-6``; their prefix
tuning uses the same ``alpha`` with ``mu = 1e-1``). On the digits MLP this ``alpha`` was
HiZOO's best of the three measured (docs/results/choosing.md)."""

REFERENCE_LORA: Mapping[str, Any] = MappingProxyType(
    dict(mu=1e-3, hessian_smoothing=1e-10, estimator="paper", hessian_clip=(1e-8, 1e8)))
"""The public reference scripts' LoRA settings (``alpha = 1e-10``)."""

SMOOTHING_PER_PARAM = 0.5
"""``alpha * d`` of the recommended settings (``d``: number of parameters)."""

MAX_SMOOTHING = 0.5
"""Upper bound of the recommended ``alpha`` (an EMA with ``alpha`` near 1 does not average)."""

RECOMMENDED_MU = 1e-2
"""The recommended perturbation scale."""


def num_params(params: Any) -> int:
  """Number of scalars in a params pytree (what the zeroth-order estimate perturbs)."""
  return int(sum(np.prod(np.shape(x)) for x in jax.tree.leaves(params)))


def smoothing(params_or_size: Any, per_param: float = SMOOTHING_PER_PARAM) -> float:
  """The recommended ``hessian_smoothing``: ``min(MAX_SMOOTHING, per_param / d)``.

  Args:
    params_or_size: the params pytree, or the number of parameters ``d`` itself.
    per_param: ``alpha * d``.
  """
  if isinstance(params_or_size, int | np.integer):
    d = int(params_or_size)
  else:
    d = num_params(params_or_size)
  if d < 1:
    raise ValueError(f"smoothing: the params have no scalars (d = {d})")
  if not per_param > 0:
    raise ValueError(f"smoothing: per_param must be > 0, got {per_param!r}")
  return float(min(MAX_SMOOTHING, per_param / d))


def recommended(params: Any) -> dict[str, Any]:
  """The recommended settings for ``params``, as keyword arguments of :func:`hizoo_jax.hizoo`.

  ``dict(mu=1e-2, hessian_smoothing=0.5 / d, estimator="paper", hessian_clip=(1e-8, 1e8))``.
  """
  return dict(mu=RECOMMENDED_MU, hessian_smoothing=smoothing(params), estimator="paper",
              hessian_clip=(1e-8, 1e8))


def hizoo(
    learning_rate: alias.ScalarOrSchedule, *, factored: bool = False, **options: Any
) -> optax.GradientTransformationExtraArgs:
  """:func:`hizoo_jax.hizoo` with the recommended settings, ``alpha`` decided by size.

  The smoothing factor is :func:`smoothing` of the params that ``init`` and ``update``
  receive (a static property of their shapes, so this traces like ``hz.hizoo``). Any
  keyword of :func:`hizoo_jax.hizoo` overrides the recommendation (``hessian_smoothing``
  included). Under ``optax.inject_hyperparams`` (which cannot pass ``**options``), use
  ``hz.hizoo`` with ``**recommended(params)`` instead.

  Args:
    learning_rate: a float or an Optax schedule.
    factored: HiZOO-L (:func:`hizoo_jax.hizoo_l`) instead of HiZOO.
    **options: further keywords of :func:`hizoo_jax.hizoo`.
  """

  def make(params):
    kwargs = {**recommended(params), **options}
    if factored:
      return alias.hizoo_l(learning_rate, **kwargs)
    return alias.hizoo(learning_rate, **kwargs)

  def init_fn(params):
    return make(params).init(params)

  def update_fn(updates, state, params=None, **extra_args):
    if params is None:
      raise ValueError("params must be given to init/update of a zeroth-order transform")
    return make(params).update(updates, state, params, **extra_args)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def hizoo_l(
    learning_rate: alias.ScalarOrSchedule, **options: Any
) -> optax.GradientTransformationExtraArgs:
  """HiZOO-L with the recommended settings: ``hizoo(learning_rate, factored=True, ...)``."""
  return hizoo(learning_rate, factored=True, **options)
