"""Named settings: HiZOO's (the library's defaults, the reference READMEs', and the
recommended ones, with ``alpha`` set by size), and the measured best of the forward-pass
matched benchmark (:func:`mezo`, :func:`fzoo`, :func:`decay_to_floor`).

The paper (Zhao et al., ICLR 2025) gives ``mu = 1e-3`` for full fine-tuning and LoRA
(``1e-1`` for prefix tuning) in its hyperparameter tables but no value of the smoothing
``alpha``: its ablation only says that the best ``alpha`` depends on the dataset. The
reference code (Yanjun-Zhao/HiZOO) does not settle it either: its 2024 RoBERTa README
uses ``alpha = 1e-6`` for full fine-tuning and prefix tuning and ``1e-10`` for LoRA
(:data:`REFERENCE_FT`, :data:`REFERENCE_LORA`); its 2024 OPT README the reverse (``1e-10``
for full fine-tuning and prefix tuning, ``1e-6`` for LoRA); its current README (Feb 2025)
``1e-8`` for OPT-13B full fine-tuning; and its current ``HiZOO.sh`` and ``run.py`` default to
``alpha = 0`` (``constant0``: ``H`` stays at 1, MeZO with one more forward pass).
:data:`PAPER` is the library's default, ``alpha = 1e-8``, with ``mu = 1e-3`` and the paper
estimator::

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
3.5e8-parameter model it gives ``1.4e-9``, between the reference READMEs' ``1e-6`` and
``1e-10``. Why ``mu =
1e-2``: at that fixed point the second difference ``l+ + l- - 2 l0`` is about ``2 mu^2``
whatever ``d``; in float32 it must exceed a few ``eps |l|`` to be measured, which ``mu =
1e-3`` misses once the loss is above ~4.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from types import MappingProxyType
from typing import Any

import jax
import numpy as np
import optax

from hizoo_jax._src import alias
from hizoo_jax._src.methods import ALIASES

PAPER: Mapping[str, Any] = MappingProxyType(
    dict(mu=1e-3, hessian_smoothing=1e-8, estimator="paper", hessian_clip=(1e-8, 1e8)))
"""``hz.hizoo``'s defaults: the paper's ``mu`` and estimator, and ``alpha = 1e-8``, which
the paper does not state (see the module docstring); pass as ``hz.hizoo(lr, **PAPER)``."""

REFERENCE_FT: Mapping[str, Any] = MappingProxyType(
    dict(mu=1e-3, hessian_smoothing=1e-6, estimator="paper", hessian_clip=(1e-8, 1e8)))
"""The full fine-tuning settings of the reference code's 2024 RoBERTa README (``alpha =
1e-6``; its prefix tuning uses the same ``alpha`` with ``mu = 1e-1``; its OPT README uses
``1e-10`` there, its current README ``1e-8``: see the module docstring). On the digits MLP
this ``alpha`` was HiZOO's best of the three measured (docs/results/choosing.md)."""

REFERENCE_LORA: Mapping[str, Any] = MappingProxyType(
    dict(mu=1e-3, hessian_smoothing=1e-10, estimator="paper", hessian_clip=(1e-8, 1e8)))
"""The LoRA settings of the reference code's 2024 RoBERTa README (``alpha = 1e-10``; its
OPT README uses ``1e-6`` for LoRA: see the module docstring)."""

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
      return ALIASES["hizoo_l"](learning_rate, **kwargs)
    return ALIASES["hizoo"](learning_rate, **kwargs)

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


# ----------------------------------------------------------------------------------------
# The measured best settings (docs/results/choosing.md).

DECAY_FLOOR = 0.3
"""The floor of :func:`decay_to_floor`, as a fraction of the peak learning rate."""


def decay_to_floor(peak: float, total_steps: int, floor: float = DECAY_FLOOR
                   ) -> optax.Schedule:
  """Cosine decay from ``peak`` to ``floor * peak`` over ``total_steps`` (then constant).

  The schedule the tuned MeZO baseline selected on the digits MLP among constant, cosine
  and linear decay to 0 and cosine to 10%, 30% and 50% of the peak (``experiments/choose``).
  ``total_steps`` counts optimizer steps: for a budget of forward passes, divide it by the
  method's passes a step (MeZO 2, FZOO ``N + 1``).
  """
  if not 0.0 <= floor <= 1.0:
    raise ValueError(f"floor must lie in [0, 1], got {floor!r}")
  if int(total_steps) < 1:
    raise ValueError(f"total_steps must be >= 1, got {total_steps!r}")
  return optax.cosine_decay_schedule(peak, int(total_steps), alpha=floor)


def mezo(peak_lr: float, total_steps: int, *, floor: float = DECAY_FLOOR,
         **options: Any) -> optax.GradientTransformationExtraArgs:
  """The tuned baseline: :func:`hizoo_jax.mezo` with :func:`decay_to_floor`.

  The baseline every method was compared with, forward passes counted
  (docs/results/choosing.md). Tune ``peak_lr`` on a grid of half-decades for the task, and
  the schedule for the budget: far from a floor (a short budget) a constant rate
  (``floor=1.0``) can beat decay.

  Args:
    peak_lr: the learning rate at step 0.
    total_steps: the steps of the run (the decay's horizon).
    floor: the final learning rate as a fraction of ``peak_lr``.
    **options: further keywords of :func:`hizoo_jax.mezo` (``mu``, ``seed``, ...).
  """
  return ALIASES["mezo"](decay_to_floor(peak_lr, total_steps, floor), **options)


def fzoo(peak_lr: float, total_steps: int, *, num_directions: int = 8,
         floor: float = DECAY_FLOOR, **options: Any) -> optax.GradientTransformationExtraArgs:
  """:func:`hizoo_jax.fzoo` with 8 probes and :func:`decay_to_floor`.

  FZOO normalises its step by the spread of the probe losses, so its learning rate is in
  other units than MeZO's (on the digits MLP its best peak was about 5.6 times MeZO's);
  tune ``peak_lr`` on a grid of half-decades. Measured against the tuned :func:`mezo` in
  ``experiments/choose`` (docs/results/choosing.md); heavy-ball momentum chained after
  the estimate (``optax.chain(hz.scale_by_fzoo(), optax.trace(0.9),
  optax.scale_by_learning_rate(schedule))``) is left out, as it costs a params-sized
  buffer.

  Args:
    peak_lr: the learning rate at step 0.
    total_steps: the steps of the run (``N + 1`` forward passes each).
    num_directions: probes a step.
    floor: the final learning rate as a fraction of ``peak_lr``.
    **options: further keywords of :func:`hizoo_jax.fzoo` (``mu``, ``seed``, ...).
  """
  return ALIASES["fzoo"](decay_to_floor(peak_lr, total_steps, floor),
                    num_directions=num_directions, **options)


# ----------------------------------------------------------------------------------------
# Every method at its measured best, per task.

def _frozen(table: dict) -> Mapping[str, Mapping[str, Mapping[str, Any]]]:
  return MappingProxyType({task: MappingProxyType({name: MappingProxyType(kw)
                                                   for name, kw in methods.items()})
                           for task, methods in table.items()})


def _load_measured() -> Mapping[str, Mapping[str, Mapping[str, Any]]]:
  text = resources.files("hizoo_jax").joinpath("measured.json").read_text(encoding="utf-8")
  return _frozen({task: entry["methods"] for task, entry in json.loads(text)["tasks"].items()})


MEASURED = _load_measured()
"""Each method's learning rate and key options as the forward-pass matched benchmark
selected them, per task (``"digits"``, ``"sst2_ft"``, ``"sst2_lora"`` and the prompted LLM's
``"smollm2_prompted_lora"`` and ``"smollm2_prompted_lora_k512"``), read from the package's
``measured.json``, which says for each task what was measured and how the setting was
chosen. They are starting points for the same kind of model and budget, not universal
rates: the best rate moves with the model, the batch and the budget. Use it through
:func:`measured`."""


def measured(method: str, task: str = "sst2_ft", **options: Any
             ) -> optax.GradientTransformationExtraArgs:
  """``hz.<method>`` at the setting :data:`MEASURED` holds for ``task``.

  ::

    tx = hz.presets.measured("zo_muon", "sst2_ft")            # rank 16, 4 probes, 1e-2
    tx = hz.presets.measured("mezo", "digits", learning_rate=optax.cosine_decay_schedule(
        1e-3, 10_000))                                          # any keyword overrides

  Args:
    method: a method measured on ``task`` (``MEASURED[task]``'s keys).
    task: ``"digits"``, ``"sst2_ft"``, ``"sst2_lora"``, ``"smollm2_prompted_lora"`` (16
      training sentences a class) or ``"smollm2_prompted_lora_k512"`` (512 a class).
    **options: keywords of ``hz.<method>`` that replace the measured ones (``seed``,
      ``learning_rate``, ...).
  """
  if task not in MEASURED:
    raise ValueError(f"measured: unknown task {task!r}; measured tasks: {sorted(MEASURED)}")
  if method not in MEASURED[task]:
    raise ValueError(f"measured: {method!r} was not measured on {task!r}; measured there: "
                     f"{sorted(MEASURED[task])}")
  kw = {**MEASURED[task][method], **options}
  learning_rate = kw.pop("learning_rate")
  return ALIASES[method](learning_rate, **kw)
