"""Ready-to-use zeroth-order optimizers: ``hizoo``, ``hizoo_l`` and ``mezo``.

Each is ``scale_by_* -> add_decayed_weights -> scale_by_learning_rate``, i.e.
``theta <- theta - lr * (g + weight_decay * theta)`` as in the reference trainer. Every
option is a named parameter, so ``optax.inject_hyperparams`` can schedule or change any
numeric one (list ``num_directions`` in its ``static_args``).
"""

from __future__ import annotations

from typing import Any

import jax
import optax

from hizoo_jax._src import sampling, transform

ScalarOrSchedule = float | jax.Array | optax.Schedule


def _with_decay_and_lr(
    estimate: optax.GradientTransformationExtraArgs,
    learning_rate: ScalarOrSchedule,
    weight_decay: Any,
    weight_decay_mask: Any,
) -> optax.GradientTransformationExtraArgs:
  parts = [estimate]
  # A literal 0 adds nothing; an array (e.g. under inject_hyperparams) is kept.
  if not (isinstance(weight_decay, int | float) and weight_decay == 0):
    parts.append(optax.add_decayed_weights(weight_decay, weight_decay_mask))
  parts.append(optax.scale_by_learning_rate(learning_rate))
  tx = optax.chain(*parts)
  # The ZO state is the chain's first: let make_train_step find it (the lean path).
  hooks = transform.zo_hooks(estimate)
  tx.update.zo_hooks = hooks._replace(locate=lambda opt_state: opt_state[0])
  return tx


def mezo(
    learning_rate: ScalarOrSchedule,
    *,
    mu: float = 1e-3,
    weight_decay: float = 0.0,
    weight_decay_mask: Any = None,
    num_directions: int = 1,
    sampler: sampling.Sampler | None = None,
    seed: int | jax.Array = 0,
) -> optax.GradientTransformationExtraArgs:
  """MeZO / ZO-SGD: ``theta <- theta - lr * (g_spsa + weight_decay * theta)``.

  Args:
    learning_rate: a float or an Optax schedule.
    mu: perturbation scale.
    weight_decay: L2 coefficient added to the estimate, as in MeZO.
    weight_decay_mask: optional tree of bools (or callable) selecting decayed leaves.
    num_directions, sampler, seed: as in :func:`hizoo_jax.scale_by_zo`.

  References:
    Malladi et al., "Fine-Tuning Language Models with Just Forward Passes", NeurIPS 2023.
  """
  return _with_decay_and_lr(
      transform.scale_by_zo(mu=mu, num_directions=num_directions, sampler=sampler, seed=seed),
      learning_rate,
      weight_decay,
      weight_decay_mask,
  )


def hizoo(
    learning_rate: ScalarOrSchedule,
    *,
    mu: float = 1e-3,
    hessian_smoothing: ScalarOrSchedule = 1e-8,
    weight_decay: float = 0.0,
    weight_decay_mask: Any = None,
    estimator: str = "paper",
    num_directions: int = 1,
    factored: bool = False,
    min_dim_size_to_factor: int = 128,
    hessian_update_every: int = 1,
    hessian_clip: tuple[float, float] = (1e-8, 1e8),
    hessian_init: float = 1.0,
    hessian_dtype: Any = None,
    curvature_floor: float = 4.0,
    sampler: sampling.Sampler | None = None,
    seed: int | jax.Array = 0,
) -> optax.GradientTransformationExtraArgs:
  """HiZOO: ``theta <- theta - lr * (g_hizoo + weight_decay * theta)``.

  The defaults are the paper's (``mu=1e-3``, ``hessian_smoothing=1e-8``). On small models
  that ``alpha`` barely moves the Hessian from 1, and HiZOO then behaves like MeZO with one
  more forward pass; :func:`hizoo_jax.presets.hizoo` sets ``alpha = 0.5 / d`` (d = number
  of params) and ``mu = 1e-2`` instead (measured in the README's Results and Defaults).

  Args:
    learning_rate: a float or an Optax schedule.
    mu: perturbation scale.
    hessian_smoothing: EMA factor ``alpha`` of the diagonal Hessian (float or schedule).
    weight_decay: L2 coefficient added to the estimate, as in the reference trainer.
    weight_decay_mask: optional tree of bools (or callable) selecting decayed leaves.
    estimator, num_directions, factored, min_dim_size_to_factor, hessian_update_every,
    hessian_clip, hessian_init, hessian_dtype, curvature_floor, sampler, seed: as in
      :func:`hizoo_jax.scale_by_hizoo`.

  References:
    Zhao et al., "Second-Order Fine-Tuning without Pain for LLMs: A Hessian Informed
    Zeroth-Order Optimizer", ICLR 2025, Algorithms 1 and 3.
  """
  estimate = transform.scale_by_hizoo(
      mu=mu,
      hessian_smoothing=hessian_smoothing,
      estimator=estimator,
      num_directions=num_directions,
      factored=factored,
      min_dim_size_to_factor=min_dim_size_to_factor,
      hessian_update_every=hessian_update_every,
      hessian_clip=hessian_clip,
      hessian_init=hessian_init,
      hessian_dtype=hessian_dtype,
      curvature_floor=curvature_floor,
      sampler=sampler,
      seed=seed,
  )
  return _with_decay_and_lr(estimate, learning_rate, weight_decay, weight_decay_mask)


def hizoo_l(
    learning_rate: ScalarOrSchedule,
    *,
    mu: float = 1e-3,
    hessian_smoothing: ScalarOrSchedule = 1e-8,
    weight_decay: float = 0.0,
    weight_decay_mask: Any = None,
    estimator: str = "paper",
    num_directions: int = 1,
    min_dim_size_to_factor: int = 128,
    hessian_update_every: int = 1,
    hessian_clip: tuple[float, float] = (1e-8, 1e8),
    hessian_init: float = 1.0,
    hessian_dtype: Any = None,
    curvature_floor: float = 4.0,
    sampler: sampling.Sampler | None = None,
    seed: int | jax.Array = 0,
) -> optax.GradientTransformationExtraArgs:
  """HiZOO-L: HiZOO with a rank-1 (Adafactor-style) Hessian for large matrices.

  A ``p x q`` matrix leaf keeps ``p + q`` Hessian floats instead of ``p q``; leaves whose
  last two dims are not both ``>= min_dim_size_to_factor`` (and vectors) keep a dense
  Hessian. Arguments as in :func:`hizoo`.

  References:
    Zhao et al., ICLR 2025, Appendix D.1, Algorithm 2; Shazeer & Stern, 2018 (Adafactor).
  """
  return hizoo(
      learning_rate,
      mu=mu,
      hessian_smoothing=hessian_smoothing,
      weight_decay=weight_decay,
      weight_decay_mask=weight_decay_mask,
      estimator=estimator,
      num_directions=num_directions,
      factored=True,
      min_dim_size_to_factor=min_dim_size_to_factor,
      hessian_update_every=hessian_update_every,
      hessian_clip=hessian_clip,
      hessian_init=hessian_init,
      hessian_dtype=hessian_dtype,
      curvature_floor=curvature_floor,
      sampler=sampler,
      seed=seed,
  )
