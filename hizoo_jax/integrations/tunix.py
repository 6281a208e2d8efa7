"""Zeroth-order fine-tuning of Tunix's models with Tunix's own trainer.

Tunix (PyPI ``google-tunix``) fine-tunes Flax NNX LLMs (Llama 3, Qwen 2/3, Gemma) with LoRA
through ``qwix``, Orbax checkpoints, sharding, metrics and a progress bar, all driven by
``tunix.sft.peft_trainer.PeftTrainer``. Its train step computes a gradient with
``nnx.value_and_grad``. :class:`ZOPeftTrainer` is that trainer with one method replaced,
``create_train_step_fn`` (the override point Tunix documents): the step runs
:func:`hizoo_jax.make_train_step`'s lean zeroth-order engine on the params the trainer's
``nnx.Optimizer`` trains (the ``nnx.LoRAParam`` leaves when qwix LoRA is applied, else every
``nnx.Param``), with the trainer's loss function. Everything else is Tunix's code::

    from hizoo_jax.integrations.tunix import ZOPeftTrainer

    trainer = ZOPeftTrainer(lora_model, hz.hizoo(1e-3, mu=1e-2), training_config)
    trainer = trainer.with_gen_model_input_fn(gen_model_input)    # as for PeftTrainer
    trainer.train(train_ds, eval_ds)

What a zeroth-order step cannot report is a gradient norm: it never forms the gradient. The
trainer logs, instead of ``grad_norm``, ``zo_projected_grad``: the step's measured
directional derivative ``(l+ - l-) / (2 mu)`` along its perturbation (the scalar the update
is made of; the mean over directions with several). For MeZO's Gaussian ``z`` its square is
an unbiased estimate of the squared gradient norm, so its RMS over a window of steps
estimates the norm; for HiZOO, that of ``H^{-1/2}`` times the gradient. It also logs
``zo_forward_passes``, the forward passes executed so far (:func:`hizoo_jax.forward_passes`):
methods differ in passes per step, so compare runs by it, not by steps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

try:
  from tunix.sft import peft_trainer, profiler
  from tunix.sft import utils as tunix_utils
except ImportError as e:  # pragma: no cover - depends on the environment
  raise ImportError(
      "hizoo_jax.integrations.tunix needs Tunix: pip install 'hizoo-jax[tunix]'") from e

import hizoo_jax as hz
from hizoo_jax.models import peft

ZO_METRIC = "zo_projected_grad"
PASSES_METRIC = "zo_forward_passes"
_ZO_STATES = (hz.ZOState,)
_RESTORE_MODES = ("auto", "inplace", "exact")

_NO_ZO = (
    "ZOPeftTrainer needs an optimizer containing a zeroth-order transform (hz.hizoo, "
    "hz.hizoo_l, hz.mezo, hz.presets.*, hz.scale_by_hizoo/scale_by_zo, or an Optax chain, "
    "schedule or wrapper around one); got one without. For a first-order optimizer use "
    "tunix.sft.peft_trainer.PeftTrainer.")

def zo_states(opt_state: Any) -> list[Any]:
  """The zeroth-order transforms' states (``hz.ZOState``) in
  ``opt_state``, in tree order; empty for an optimizer without one.

  Args:
    opt_state: an Optax state (or the pure state of an ``nnx.Optimizer``'s ``opt_state``).

  Returns:
    The list of states.
  """
  is_zo = lambda x: isinstance(x, _ZO_STATES)  # noqa: E731
  return [x for x in jax.tree.leaves(opt_state, is_leaf=is_zo) if is_zo(x)]


def projected_gradient(opt_state: Any) -> jax.Array:
  """The last step's directional-derivative estimate (MeZO: ``(l+ - l-) / (2 mu)``),
  averaged over its probes, read from the first zeroth-order state in ``opt_state``.

  Args:
    opt_state: an optimizer state after a zeroth-order step.

  Returns:
    A float32 scalar.
  """
  (st, *_) = zo_states(opt_state)
  return st.projected.astype(jnp.float32)


def trainable_filter(model: nnx.Module) -> Any:
  """The NNX filter of the params Tunix's trainer trains: ``nnx.LoRAParam`` when the model
  carries LoRA params (qwix LoRA), else ``nnx.Param``."""
  return nnx.LoRAParam if tunix_utils.is_lora_enabled(model) else nnx.Param


def check_zeroth_order(model: nnx.Module, optimizer: optax.GradientTransformation,
                       opt_state: Any = None) -> None:
  """Raises ValueError unless ``optimizer``'s state for ``model``'s trainable params holds a
  zeroth-order transform's state.

  Args:
    model: the model the trainer will train.
    optimizer: the Optax transformation given to the trainer.
    opt_state: the optimizer's state if it exists; None: ``optimizer.init`` is traced
      abstractly (nothing allocated).

  Raises:
    ValueError: no zeroth-order transform.
    Exception: whatever an abstract ``init`` raises where the optimizer needs concrete
      hyperparameters at init (``optax.inject_hyperparams`` around an alias does); the
      trainer then checks the state it builds instead.
  """
  if opt_state is None:
    params = nnx.as_pure(nnx.state(model, trainable_filter(model)))
    opt_state = jax.eval_shape(optimizer.init, params)
  if not zo_states(opt_state):
    raise ValueError(_NO_ZO)


class ZOPeftTrainer(peft_trainer.PeftTrainer):
  """Tunix's ``PeftTrainer`` training with a zeroth-order optimizer: forward passes only.

  Same constructor and methods as ``tunix.sft.peft_trainer.PeftTrainer``: ``with_loss_fn``,
  ``with_gen_model_input_fn``, hooks, ``train(train_ds, eval_ds)``, checkpointing and resume
  (the optimizer state, the ZO transform's PRNG key and HiZOO's Hessian included, is Tunix's
  ``nnx.Optimizer`` state), metrics, progress bar and the mesh the training runs under.
  ``gradient_accumulation_steps = k`` runs :func:`hizoo_jax.accumulate` instead of Tunix's
  ``optax.MultiSteps`` (which would discard all but the last micro-batch's zeroth-order
  measurements): each step's direction is measured on its ``k`` micro-batches and the step
  made from the means, the step the ``k`` micro-batches together would give. The train
  step is the library's lean engine (:func:`hizoo_jax.models.peft.nnx_zo_step`, i.e.
  :func:`hizoo_jax.make_train_step` traced into Tunix's ``nnx.jit``): the trainable params
  perturbed in place, the noise regenerated from the optimizer state's key, no params-sized
  temporary beyond the forward pass's.

  Logged per step: Tunix's ``loss`` (the loss the ZO transform records: ``l0`` on HiZOO's
  Hessian steps, else the mean of ``l+`` and ``l-``), ``perplexity`` and ``learning_rate``
  (when the optimizer injects it, as in ``optax.inject_hyperparams(hz.hizoo)(...)``), and
  ``zo_projected_grad`` in place of ``grad_norm`` (module docstring), and
  ``zo_forward_passes``, the forward passes executed up to the logged step (the optimizer
  state's count; logged as Tunix logs every metric, in float32, exact up to 2**24).

  Args:
    model: the NNX model (with qwix LoRA applied for LoRA fine-tuning).
    optimizer: any Optax transformation containing a zeroth-order transform (every method
      of the library, presets, chains, ``optax.inject_hyperparams``, schedules, masks).
    training_config: ``tunix.sft.peft_trainer.TrainingConfig``.
    metrics_logger, perf_tracer, perf_tracer_v2: as for ``PeftTrainer``.
    restore: how the step restores the params after the perturbations, as in
      :func:`hizoo_jax.make_train_step`. ``"exact"`` (default) perturbs a separate buffer
      and keeps ``theta`` untouched: no rounding drift, and here no extra memory, because
      Tunix does not donate the model to its step, so the new params need a buffer of their
      own anyway and the perturbed copy lives in it (measured, compiled as Tunix compiles
      it, full fine-tuning: 0.003-0.004 param bytes of temporaries over the forward pass
      for MeZO, HiZOO and HiZOO-L). ``"inplace"`` (the choice of a donating caller) must then
      copy the params once for HiZOO's unperturbed pass (0.96 param bytes); ``"auto"``.

  Raises:
    ValueError: ``optimizer`` contains no zeroth-order transform (or, with gradient
      accumulation, more than one); ``restore`` is not one of its modes.
  """

  def __init__(
      self,
      model: nnx.Module,
      optimizer: optax.GradientTransformation,
      training_config: peft_trainer.TrainingConfig,
      metrics_logger: peft_trainer.MetricsLogger | None = None,
      perf_tracer: Any = None,
      perf_tracer_v2: Any = None,
      *,
      restore: str = "exact",
  ):
    if restore not in _RESTORE_MODES:
      raise ValueError(f"restore must be one of {_RESTORE_MODES}, got {restore!r}")
    # Before Tunix builds its optimizer, checkpoint manager and logger where an abstract
    # init can tell (then nothing is set up for a refused optimizer), else on the state
    # Tunix builds, releasing what it set up.
    try:
      check_zeroth_order(model, optimizer)
      checked = True
    except ValueError:
      raise
    except Exception:  # noqa: BLE001 - the abstract init needs concrete hyperparameters
      checked = False
    self._zo_step_options = {"restore": restore}
    # Gradient accumulation: Tunix would wrap the optimizer in optax.MultiSteps, which holds
    # the zeroth-order state (and its direction) until it emits and so discards all but the
    # last micro-batch's measurements. hz.accumulate measures the step's direction on every
    # micro-batch instead. Tunix gets a config without accumulation (no MultiSteps) and then
    # the real one, which its loop reads to count micro-steps into steps.
    k = training_config.gradient_accumulation_steps
    accumulating = k is not None and k > 1
    if accumulating:
      optimizer = hz.accumulate(optimizer, k)
    tunix_config = (dataclasses.replace(training_config, gradient_accumulation_steps=None)
                    if accumulating else training_config)
    super().__init__(model, optimizer, tunix_config, metrics_logger=metrics_logger,
                     perf_tracer=perf_tracer, perf_tracer_v2=perf_tracer_v2)
    if accumulating:
      # What PeftTrainer.__init__ derives from the accumulation (Tunix 0.1.x): the
      # micro-step count a restored run resumes at, and the profiler's last step.
      self.config = training_config
      self._iter_steps = self._train_steps * k
      self._prof = profiler.Profiler(
          initial_step=self._iter_steps,
          max_step=None if training_config.max_steps is None else training_config.max_steps * k,
          profiler_options=training_config.profiler_options)
    if not checked:
      try:
        check_zeroth_order(model, optimizer, nnx.as_pure(self.optimizer.opt_state))
      except ValueError:
        self.checkpoint_manager.close()
        self.metrics_logger.close()
        raise

  def create_train_step_fn(self) -> Callable[..., tuple[Any, Any, Any]]:
    """The zeroth-order train step, ``step(model, optimizer, inputs) -> (loss, aux,
    metrics)``, ``metrics`` the projected gradient and the forward passes executed so far:
    Tunix jits it with the optimizer donated."""
    return self._zo_train_step

  def _zo_train_step(self, model: nnx.Module, optimizer: nnx.Optimizer,
                     inputs: Any) -> tuple[Any, Any, Any]:
    inputs = self.gen_model_input_fn(inputs)
    loss = lambda m: self.loss_fn(m, **inputs)  # noqa: E731
    out = peft.nnx_zo_step(optimizer, model, loss, has_aux=self._has_aux,
                           **self._zo_step_options)
    loss_value, aux = out if self._has_aux else (out, None)
    state = nnx.as_pure(optimizer.opt_state)
    return loss_value, aux, {ZO_METRIC: projected_gradient(state),
                             PASSES_METRIC: hz.forward_passes(state)}

  def _buffer_metrics(self, metrics_buffer, loss, step, additional_metrics=None):
    # Tunix's loop logs the step's third output as "grad_norm" (averaged over the steps it
    # buffers); a ZO step has no gradient, and its third output holds the projected
    # gradient (averaged the same way) and the forward-pass count (the latest: the count
    # is cumulative), each logged under its own name.
    if additional_metrics and "grad_norm" in additional_metrics:
      additional_metrics = dict(additional_metrics)
      value, op = additional_metrics.pop("grad_norm")
      if isinstance(value, dict):
        additional_metrics[ZO_METRIC] = (value[ZO_METRIC], op)
        additional_metrics[PASSES_METRIC] = (value[PASSES_METRIC], np.max)
      else:  # a step function of a subclass that returns the projected gradient alone
        additional_metrics[ZO_METRIC] = (value, op)
    return super()._buffer_metrics(metrics_buffer, loss, step, additional_metrics)


__all__ = ["PASSES_METRIC", "ZO_METRIC", "ZOPeftTrainer", "check_zeroth_order",
           "projected_gradient", "trainable_filter", "zo_states"]
