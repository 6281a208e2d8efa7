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

What a zeroth-order step cannot report is a gradient norm: it never forms the gradient.
Tunix logs the step's third output as ``grad_norm``; here it is ``|zo_projected_grad| *
sqrt(pi / 2)``, a one-probe estimate of the norm (for MeZO's Gaussian ``z``, the measured
directional derivative is ``N(0, |g|^2)`` and the mean of its magnitude is ``|g| sqrt(2 /
pi)``; for HiZOO the norm of ``H^{-1/2} g``; averaged over ``N`` probes it is ``sqrt(N)``
times smaller). The trainer also logs ``zo_projected_grad``, the step's measured
directional derivative ``(l+ - l-) / (2 mu)`` (the scalar the update is made of; the mean
over probes), and ``zo_forward_passes``, the forward passes executed so far
(:func:`hizoo_jax.forward_passes`): methods differ in passes per step, so compare runs by
it, not by steps.

Tunix versions: the trainer uses Tunix's public surface (its constructor, ``config``,
``metrics_logger``, ``with_loss_fn``, ``create_train_step_fn`` and the documented
``_post_process_train_step`` hook) and runs on the released 0.1.7, whose loop calls the
step as ``(model, optimizer, inputs)`` and accumulates gradients with ``optax.MultiSteps``,
and on the later loop that calls it as ``(model, optimizer, grad_accumulator, inputs,
is_update_step)`` without ``MultiSteps``; another step signature is refused with the
installed version named.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import inspect
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

try:
  from tunix.sft import metrics_logger as tunix_metrics
  from tunix.sft import peft_trainer
  from tunix.sft import utils as tunix_utils
except ImportError as e:  # pragma: no cover - depends on the environment
  raise ImportError(
      "hizoo_jax.integrations.tunix needs Tunix: pip install 'hizoo-jax[tunix]'") from e

import hizoo_jax as hz

ZO_METRIC = "zo_projected_grad"
PASSES_METRIC = "zo_forward_passes"

_NO_ZO = (
    "ZOPeftTrainer needs an optimizer containing a zeroth-order transform (hz.hizoo, "
    "hz.hizoo_l, hz.mezo, hz.fzoo, hz.sparse_mezo, hz.forward_gradient, hz.lozo, "
    "hz.subzero, hz.zo_muon, hz.presets.*, a hz.scale_by_* transform, or an Optax chain, "
    "schedule or wrapper around one); got one without. For a first-order optimizer use "
    "tunix.sft.peft_trainer.PeftTrainer.")


def _tunix_version() -> str:
  try:
    return "google-tunix " + importlib.metadata.version("google-tunix")
  except importlib.metadata.PackageNotFoundError:  # pragma: no cover
    return "Tunix (version unknown)"


def step_signature(trainer_class: type = peft_trainer.PeftTrainer) -> str:
  """Which train-step signature a Tunix ``PeftTrainer`` class's loop calls: ``"inputs"``
  (google-tunix 0.1.7: ``step(model, optimizer, inputs)``, gradient accumulation through
  ``optax.MultiSteps``) or ``"accumulator"`` (its successor: ``step(model, optimizer,
  grad_accumulator, inputs, is_update_step)``, no ``MultiSteps``). Read from its default
  step's parameters; any other raises ImportError naming the installed version."""
  params = list(inspect.signature(trainer_class._train_step).parameters)[1:]
  if params == ["model", "optimizer", "inputs"]:
    return "inputs"
  if params == ["model", "optimizer", "grad_accumulator", "inputs", "is_update_step"]:
    return "accumulator"
  raise ImportError(
      f"hizoo_jax.integrations.tunix supports Tunix train steps called as (model, "
      f"optimizer, inputs) (google-tunix 0.1.7) or (model, optimizer, grad_accumulator, "
      f"inputs, is_update_step); the installed {_tunix_version()} calls "
      f"({', '.join(params)})")


STEP_SIGNATURE = step_signature()
"""The installed Tunix's train-step signature (:func:`step_signature`)."""

zo_states = hz.zo_states

def projected_gradient(opt_state: Any) -> jax.Array:
  """The last step's directional-derivative estimate (MeZO: ``(l+ - l-) / (2 mu)``),
  averaged over its probes, read from the first zeroth-order state in ``opt_state``.

  Args:
    opt_state: an optimizer state after a zeroth-order step.

  Returns:
    A float32 scalar.
  """
  (st, *_) = hz.zo_states(opt_state)
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
  if not hz.zo_states(opt_state):
    raise ValueError(_NO_ZO)


class ZOPeftTrainer(peft_trainer.PeftTrainer):
  """Tunix's ``PeftTrainer`` training with a zeroth-order optimizer: forward passes only.

  Same constructor and methods as ``tunix.sft.peft_trainer.PeftTrainer``: ``with_loss_fn``,
  ``with_gen_model_input_fn``, hooks, ``train(train_ds, eval_ds)``, checkpointing and resume
  (the optimizer state, the ZO transform's PRNG key and HiZOO's Hessian included, is Tunix's
  ``nnx.Optimizer`` state), metrics, progress bar and the mesh the training runs under.
  ``gradient_accumulation_steps = k`` runs :func:`hizoo_jax.accumulate`: each step's
  direction is measured on its ``k`` micro-batches and the step made from the means, the
  step the ``k`` micro-batches together would give (Tunix 0.1.7's ``optax.MultiSteps``
  would hold the zeroth-order state, and its direction, until it emits, discarding all
  but the last micro-batch's measurements; its state, with a params-sized buffer of
  gradients that stays zero, is kept for Tunix's checkpoints, and the step runs on the
  state inside it. Later Tunix allocates its own ``GradientAccumulator`` the same size
  and calls the step on every micro-batch). The train
  step is the library's lean engine (:func:`hizoo_jax.make_train_step` traced into Tunix's
  ``nnx.jit``): the trainable params
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
    if restore not in hz.RESTORE_MODES:
      raise ValueError(f"restore must be one of {hz.RESTORE_MODES}, got {restore!r}")
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
    self._zo_has_aux = False
    k = training_config.gradient_accumulation_steps
    self._zo_every = k if k is not None and k > 1 else 1
    if self._zo_every > 1:
      optimizer = hz.accumulate(optimizer, self._zo_every)
    # The transformation the step runs: Tunix 0.1.7 wraps it in optax.MultiSteps when it
    # accumulates, and the step then updates the state inside MultiSteps' own.
    self._zo_tx = optimizer
    super().__init__(model, optimizer, training_config, metrics_logger=metrics_logger,
                     perf_tracer=perf_tracer, perf_tracer_v2=perf_tracer_v2)
    if not checked:
      try:
        check_zeroth_order(model, optimizer, nnx.as_pure(self.optimizer.opt_state))
      except ValueError:
        self.checkpoint_manager.close()
        self.metrics_logger.close()
        raise

  def with_loss_fn(self, loss_fn: Callable[..., Any], has_aux: bool = False):
    """As ``PeftTrainer.with_loss_fn``; the zeroth-order step evaluates ``loss_fn``."""
    self._zo_has_aux = has_aux
    return super().with_loss_fn(loss_fn, has_aux=has_aux)

  def create_train_step_fn(self) -> Callable[..., tuple[Any, Any, Any]]:
    """The zeroth-order train step, with the signature the installed Tunix calls
    (:data:`STEP_SIGNATURE`): ``step(model, optimizer, inputs)`` or ``step(model,
    optimizer, grad_accumulator, inputs, is_update_step)``, returning ``(loss, aux,
    grad_norm)``; Tunix jits it with the optimizer donated. ``grad_norm`` is the one-probe
    estimate of the module docstring; ``aux`` carries the step's zeroth-order metrics to
    ``_post_process_train_step``, which logs them."""
    if STEP_SIGNATURE == "accumulator":
      def step(model, optimizer, grad_accumulator, inputs, is_update_step):
        del grad_accumulator, is_update_step  # hz.accumulate counts the micro-batches
        return self._zo_train_step(model, optimizer, inputs)

      return step
    return self._zo_train_step

  def _zo_train_step(self, model: nnx.Module, optimizer: nnx.Optimizer,
                     inputs: Any) -> tuple[Any, Any, Any]:
    inputs = self.gen_model_input_fn(inputs)
    graphdef, params, rest = nnx.split(model, optimizer.wrt, ...)
    params, rest = nnx.as_pure(params), nnx.as_pure(rest)
    loss_fn = lambda p: self.loss_fn(nnx.merge(graphdef, p, rest), **inputs)  # noqa: E731
    state = nnx.as_pure(optimizer.opt_state)
    multi = isinstance(state, optax.MultiStepsState)
    step = hz.make_train_step(self._zo_tx, loss_fn, has_aux=self._zo_has_aux,
                              **self._zo_step_options)
    out = step(params, state.inner_opt_state if multi else state)
    new_state = state._replace(inner_opt_state=out[1]) if multi else out[1]
    nnx.update(model, out[0])
    nnx.update(optimizer.opt_state, nnx.state(new_state))
    optimizer.step[...] += 1
    aux = out[3] if self._zo_has_aux else None
    projected = projected_gradient(new_state)
    metrics = {ZO_METRIC: projected, PASSES_METRIC: hz.forward_passes(new_state)}
    grad_norm = jnp.abs(projected) * math.sqrt(math.pi / 2)
    return out[2], _ZOAux(aux, metrics), grad_norm

  def _post_process_train_step(self, aux: Any) -> None:
    """Logs the step's zeroth-order metrics, then hands the loss function's aux to
    ``PeftTrainer``."""
    super()._post_process_train_step(self._log_zo_metrics(aux))

  def __init_subclass__(cls, **kwargs):
    # A subclass overriding Tunix's hook receives the loss function's aux, as it would
    # from PeftTrainer; the metrics are logged first.
    super().__init_subclass__(**kwargs)
    own = cls.__dict__.get("_post_process_train_step")
    if own is not None:
      def hook(self, aux, _own=own):
        _own(self, self._log_zo_metrics(aux))

      cls._post_process_train_step = hook

  def _log_zo_metrics(self, aux: Any) -> Any:
    """Logs a step's metrics (at Tunix's step number for the step, once per optimizer
    step) if ``aux`` carries them; returns the loss function's aux."""
    if not isinstance(aux, _ZOAux):
      return aux
    if (self.iter_steps + 1) % self._zo_every == 0:
      step = self.train_steps + 1
      for name, value in aux.metrics.items():
        self.metrics_logger.log(self.metrics_prefix, name,
                                np.asarray(jax.device_get(value), np.float32),
                                tunix_metrics.Mode.TRAIN, step)
    return aux.aux


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class _ZOAux:
  """The step's aux: the loss function's (None without ``has_aux``) and the metrics."""

  aux: Any
  metrics: dict[str, Any]


__all__ = ["PASSES_METRIC", "STEP_SIGNATURE", "ZO_METRIC", "ZOPeftTrainer",
           "check_zeroth_order", "projected_gradient", "step_signature", "trainable_filter",
           "zo_states"]
