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


# ----------------------------------------------------------------------------------------
# The measured best settings (docs/results/choosing.md).

DECAY_FLOOR = 0.3
"""The floor of :func:`decay_to_floor`, as a fraction of the peak learning rate."""


def decay_to_floor(peak: float, total_steps: int, floor: float = DECAY_FLOOR
                   ) -> optax.Schedule:
  """Cosine decay from ``peak`` to ``floor * peak`` over ``total_steps`` (then constant).

  The best schedule of the tuned MeZO baseline on the digits MLP: of constant, cosine and
  linear decay to 0 and cosine decay to 10%, 30% and 50% of the peak, each with its own
  learning-rate grid, cosine to 30% reached the lowest training and validation loss
  (0.096 / 0.181 against 0.132 / 0.200 for linear decay to 0, 40,000 forward passes,
  3 seeds); FZOO gains from it too (training loss 0.087 constant, 0.061 with it).
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

  Every method of the library was compared with this, forward passes counted
  (docs/results/choosing.md). Its best peak on the digits MLP (batch 64) was
  ``1.78e-3``; the learning rate depends on the task, so tune ``peak_lr`` on a grid of
  half-decades. The schedule depends on the budget too: on MiniLM-L6 SST-2 full
  fine-tuning at 4,000 forward passes, where the loss is far from a floor, a constant rate
  (``floor=1.0``) beat cosine and linear decay, each at its best rate (``1e-5`` for all
  three).

  Args:
    peak_lr: the learning rate at step 0.
    total_steps: the steps of the run (the decay's horizon).
    floor: the final learning rate as a fraction of ``peak_lr``.
    **options: further keywords of :func:`hizoo_jax.mezo` (``mu``, ``seed``, ...).
  """
  return alias.mezo(decay_to_floor(peak_lr, total_steps, floor), **options)


def fzoo(peak_lr: float, total_steps: int, *, num_directions: int = 8,
         floor: float = DECAY_FLOOR, **options: Any) -> optax.GradientTransformationExtraArgs:
  """:func:`hizoo_jax.fzoo` with 8 probes and :func:`decay_to_floor`: the fastest setting
  measured.

  On the digits MLP it reached the tuned MeZO baseline's final training loss in 0.65-0.70
  of the forward passes (3 seeds, peak ``0.01``; 16 probes: 0.70-0.80, 4 probes never);
  its validation loss ended within one standard deviation of the baseline's. On MiniLM-L6
  SST-2 full fine-tuning (4,000 forward passes, 3 paired seeds) it ended level with the
  tuned MeZO there (constant ``1e-5``) under either schedule; at 20,000 forward passes,
  with a constant rate (``floor=1.0``) of ``1.78e-4``, it reached the tuned cosine MeZO's
  final training loss in 0.45, 0.37 and 0.59 of its passes (3 paired seeds) and ended
  lower in training loss on every seed, level in validation loss and +0.3 points in test
  accuracy on the mean (+0.8, +1.0, -0.9). Perturbing only MiniLM's layers 1-3 and the
  head (``hizoo_jax.models.peft.trainable_filter("ft", layers=(1, 2, 3))``) at a constant
  ``5.62e-4`` (selected on validation between ``1.78e-4``, slower, and ``1.78e-3``,
  unstable) it took 0.11, 0.12 and 0.31 of the passes, ended lower in training and test
  loss on every seed and +0.8 points in test accuracy on the mean (+0.7 on five paired
  seeds); it is the MiniLM example's default with ``--data``. FZOO's step
  is normalised by the spread of the probe losses, so its learning rate is in other units
  than MeZO's: on digits its best peak was about 5.6 times MeZO's. Heavy-ball momentum
  chained after the estimate (``optax.chain(hz.scale_by_fzoo(), optax.trace(0.9),
  optax.scale_by_learning_rate(schedule))``, at a tenth of the rate) ended lower on every
  digits seed (0.56-0.65 of the baseline's passes; decay 0.95 at about a twentieth of
  the rate: 0.52-0.60) but level with FZOO on SST-2 LoRA, at the cost of a params-sized
  buffer, so it is not part of this preset.

  Args:
    peak_lr: the learning rate at step 0.
    total_steps: the steps of the run (``N + 1`` forward passes each).
    num_directions: probes a step.
    floor: the final learning rate as a fraction of ``peak_lr``.
    **options: further keywords of :func:`hizoo_jax.fzoo` (``mu``, ``seed``, ...).
  """
  return alias.fzoo(decay_to_floor(peak_lr, total_steps, floor),
                    num_directions=num_directions, **options)


# ----------------------------------------------------------------------------------------
# Every method at its measured best, per task.

def _frozen(table: dict) -> Mapping[str, Mapping[str, Mapping[str, Any]]]:
  return MappingProxyType({task: MappingProxyType({name: MappingProxyType(kw)
                                                   for name, kw in methods.items()})
                           for task, methods in table.items()})


MEASURED = _frozen({
    # The 26k-parameter MLP on scikit-learn's digits, batch 64, 40,000 forward passes.
    "digits": {
        "mezo": dict(learning_rate=1e-3, mu=1e-3),
        "fzoo": dict(learning_rate=1e-2, mu=1e-3, num_directions=16),
        "forward_gradient": dict(learning_rate=1e-3),
        "lozo": dict(learning_rate=5.62e-4, mu=1e-3, rank=2),
        "subzero": dict(learning_rate=1e-3, mu=1e-3, rank=8),
        "zo_muon": dict(learning_rate=5.62e-2, mu=1e-3, rank=8, num_directions=4),
        "hizoo": dict(learning_rate=1.78e-3, mu=1e-3, hessian_smoothing=1e-6),
        "hizoo_l": dict(learning_rate=1.78e-3, mu=1e-3, hessian_smoothing=1e-6),
    },
    # MiniLM-L6 (22.6M parameters) fully fine-tuned on GLUE SST-2, batch 16, 4,000 passes.
    "sst2_ft": {
        "mezo": dict(learning_rate=1e-5, mu=1e-3),
        "fzoo": dict(learning_rate=5.62e-4, mu=1e-3, num_directions=8),
        "sparse_mezo": dict(learning_rate=1e-4, mu=1e-3, sparsity=0.8),
        "forward_gradient": dict(learning_rate=1e-5),
        "lozo": dict(learning_rate=3.16e-6, mu=1e-3, rank=2),
        "subzero": dict(learning_rate=1e-5, mu=1e-3, rank=8),
        # rank 16 (measured later than the library's default 64, over the same five seeds)
        "zo_muon": dict(learning_rate=1e-2, mu=1e-3, rank=16, num_directions=4),
        # alpha 0.5/d of these 22,566,146 trainable numbers (the best of 0.5/d, 1e-6, 1e-3)
        "hizoo": dict(learning_rate=1e-5, mu=1e-3, hessian_smoothing=0.5 / 22_566_146),
    },
    # MiniLM-L6 with rank-8 LoRA adapters (and its head) on GLUE SST-2, batch 16, 4,000
    # passes.
    "sst2_lora": {
        "mezo": dict(learning_rate=1.78e-4, mu=1e-3),
        "fzoo": dict(learning_rate=1.78e-3, mu=1e-3, num_directions=8),
    },
})
"""Each method's learning rate and key options as the forward-pass matched benchmark
selected them (docs/results/choosing.md): per task, every method got the same budget of
forward passes at a constant learning rate, on a grid of half-decades widened until the
best was interior, and the setting with the lowest validation loss (3 seeds on digits,
seed 0 on SST-2) is the one here; where a key option was measured at several values in
the method's own table (FZOO's probes, LOZO's, SubZero's and ZO-Muon's rank on digits,
HiZOO's ``alpha``) the best of them. Values tried later (on SST-2 full fine-tuning: FZOO
with 16 probes, LOZO rank 8, SubZero rank 32, ZO-Muon rank 16) are on the results page and
enter here only once their paired seeds beat the setting here, since one seed's validation
loss at 4,000 passes moves by as much as the differences between them. ZO-Muon rank 16 did
(five seeds, lower mean validation loss than rank 64 at a quarter of its state); the
others ran at one seed only and ended higher in training loss (FZOO-16 and LOZO rank 8
lower in validation loss at that seed). Use it through :func:`measured`. What the numbers
say about these settings:

- They are starting points for the same kind of model and budget, not universal rates:
  the best rate moves with the model, the batch and the budget (MeZO's best on SST-2 full
  fine-tuning is ``1e-5`` at 4,000 passes and ``3.16e-6`` at 20,000).
- On SST-2 full fine-tuning only ZO-Muon ends below the tuned constant MeZO over paired
  seeds, and by little: at rank 16, training CE -0.0043 +- 0.0019, test CE -0.0085 +-
  0.0028 and test accuracy +0.8 +- 0.5 points over five seeds (mean +- standard error).
  Sparse MeZO and SubZero end below it at seed 0 only; FZOO ends level, LOZO above, and
  forward gradients repeat MeZO's run. HiZOO's best ``alpha`` there is ``0.5/d``, which
  leaves its ``H`` at 1: it is MeZO with a third of its passes spent on the unperturbed
  loss, and ends a little above it; with ``alpha = 1e-3`` its ``H`` rises to ~900 and
  freezes every usable rate. FZOO's learning rate and ZO-Muon's are in other units than
  MeZO's (their steps are normalised).
- Sparse MeZO is absent from digits: it did not train that MLP at any rate from ``1e-4``
  to ``0.1``. Rates for the paper's decay schedules are in :func:`mezo` and :func:`fzoo`.
"""


def measured(method: str, task: str = "sst2_ft", **options: Any
             ) -> optax.GradientTransformationExtraArgs:
  """``hz.<method>`` at the setting :data:`MEASURED` holds for ``task``.

  ::

    tx = hz.presets.measured("zo_muon", "sst2_ft")            # rank 16, 4 probes, 1e-2
    tx = hz.presets.measured("mezo", "digits", learning_rate=optax.cosine_decay_schedule(
        1e-3, 10_000))                                          # any keyword overrides

  Args:
    method: a method measured on ``task`` (``MEASURED[task]``'s keys).
    task: ``"digits"``, ``"sst2_ft"`` or ``"sst2_lora"``.
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
  return getattr(alias, method)(learning_rate, **kw)
