"""Fine-tuning modes for NNX models: full (``"ft"``), LoRA and prefix tuning.

A zeroth-order optimizer perturbs every leaf of the pytree it is given, and HiZOO keeps a
Hessian entry for each. So the trainable params must be split from the rest and handed over
alone; the frozen rest is passed to the loss as data::

    model = peft.apply_lora(bert.from_pretrained(path), rank=8, alpha=16, rngs=nnx.Rngs(0))
    graphdef, params, frozen = peft.split_trainable(model, "lora")   # LoRA params only
    loss_fn = peft.make_loss_fn(graphdef, lambda m, x, y: ce(m(*x), y))
    tx = hz.hizoo(1e-4)
    step = hz.make_train_step(tx, loss_fn)           # loss_fn(params, frozen, x, y)
    state = tx.init(params)
    params, state, loss = step(params, state, frozen, x, y)
    model = peft.merge(graphdef, params, frozen)     # a live model again

Passing ``frozen`` as an argument (not a closure) keeps the frozen weights out of the
compiled program's constants.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from hizoo_jax.models._adapter import engine_step
from hizoo_jax.models._layers import PrefixKV, PrefixParam
from hizoo_jax.models.heads import HeadParam, LabelWordClassifier

MODES = ("ft", "lora", "prefix")


class LoRA(nnx.LoRA):
  """``nnx.LoRA`` around a frozen ``nnx.Linear``: ``base(x) + (alpha / rank) x A B``.

  ``A`` (``[in, rank]``) and ``B`` (``[rank, out]``, zero at init) are ``nnx.LoRAParam``s,
  so the wrapped model computes exactly what the base model did until ``B`` moves.
  """

  def __init__(self, base: nnx.Linear, rank: int, alpha: float, *, rngs: nnx.Rngs,
               param_dtype: Any = jnp.float32):
    super().__init__(base.in_features, rank, base.out_features, base_module=base,
                     param_dtype=param_dtype, rngs=rngs)
    self.scale = float(alpha) / rank

  def __call__(self, x: jax.Array, **kwargs: Any) -> jax.Array:
    a, b = self.lora_a[...].astype(x.dtype), self.lora_b[...].astype(x.dtype)
    return self.base_module(x, **kwargs) + self.scale * ((x @ a) @ b)


def apply_lora(model: nnx.Module, *, rank: int = 8, alpha: float = 16.0,
               targets: tuple[str, ...] | None = None, rngs: nnx.Rngs) -> nnx.Module:
  """Wraps the ``nnx.Linear`` attributes named ``targets`` of every submodule in :class:`LoRA`.

  Args:
    model: modified in place (and returned).
    rank, alpha: LoRA rank ``r`` and scale numerator (the update is ``alpha / r * x A B``);
      the paper and MeZO use ``(8, 16)``.
    targets: attribute names to wrap; default ``model.lora_targets`` (the query and value
      projections, as in MeZO).
    rngs: initialises ``A``.

  Returns:
    ``model``.
  """
  if rank < 1:
    raise ValueError(f"rank must be >= 1, got {rank}")
  targets = tuple(targets or getattr(model, "lora_targets", ()))
  if not targets:
    raise ValueError("no LoRA targets: pass targets=('query', 'value') or similar")
  found = 0
  for _, module in list(nnx.iter_modules(model)):
    for name in targets:
      linear = getattr(module, name, None)
      if isinstance(linear, nnx.Linear):
        setattr(module, name, LoRA(linear, rank, alpha, rngs=rngs,
                                   param_dtype=linear.param_dtype))
        found += 1
  if not found:
    raise ValueError(f"no nnx.Linear attribute named {targets} found in the model")
  return model


def add_prefix(model: nnx.Module, *, num_tokens: int = 5, init: str = "real",
               rngs: nnx.Rngs, scale: float = 0.02) -> nnx.Module:
  """Attaches ``num_tokens`` trainable prefix key/values (:class:`PrefixParam`) to every
  attention layer of ``model`` (a model with ``attention_layers()``), in place.

  Args:
    model: a :class:`~hizoo_jax.models.bert.BertModel` or
      :class:`~hizoo_jax.models.llama.LlamaForCausalLM` (or anything with
      ``attention_layers()`` and ``layer_key_values(ids)``).
    num_tokens: prefix length (5 in MeZO and the HiZOO paper).
    init: ``"real"``: the keys/values each layer computes for ``num_tokens`` random vocabulary
      tokens (MeZO's ``init_by_real_act``); ``"random"``: ``N(0, scale^2)``.
    rngs: draws the tokens or the random values.
    scale: standard deviation for ``init="random"``.

  Returns:
    ``model``.
  """
  if num_tokens < 1:
    raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
  layers = model.attention_layers()
  if init == "real":
    vocab = model.config.vocab_size
    ids = jax.random.randint(rngs.params(), (1, num_tokens), 0, vocab)
    kvs = [(k[0], v[0]) for k, v in model.layer_key_values(ids)]
  elif init == "random":
    kvs = []
    for attn in layers:
      shape = (num_tokens, getattr(attn, "num_kv_heads", attn.num_heads), attn.head_dim)
      dtype = jnp.float32
      kvs.append((scale * jax.random.normal(rngs.params(), shape, dtype),
                  scale * jax.random.normal(rngs.params(), shape, dtype)))
  else:
    raise ValueError(f"init must be 'real' or 'random', got {init!r}")
  for attn, (k, v) in zip(layers, kvs, strict=True):
    attn.prefix = PrefixKV(jax.lax.stop_gradient(k), jax.lax.stop_gradient(v))
  return model


def trainable_filter(mode: str, layers: Any = None, head: bool = True
                     ) -> nnx.filterlib.Filter:
  """The NNX filter of the params a mode trains (task-head params included by default).

  ``"ft"``: every ``nnx.Param``; ``"lora"``: ``nnx.LoRAParam`` and :class:`HeadParam`;
  ``"prefix"``: :class:`PrefixParam` and :class:`HeadParam`.

  ``layers`` (indices into the model's ``layers``, e.g. ``range(4)``) keeps, of the mode's
  params, those of these transformer layers (and the head); the embeddings and the other
  layers are frozen. ``head=False`` freezes the task head too (e.g. a linear probe fitted
  before fine-tuning).

  Why a subset: a zeroth-order method gains, per step at its best learning rate,
  ``|g_S|^4 / (E|g_B,S|^2 tr H_S)`` on the subset ``S`` it perturbs (``g`` the gradient,
  ``g_B`` a minibatch's, ``H`` the Hessian), so a subset whose share of the gradient is
  larger than its share of the curvature goes further per forward pass than every
  parameter does (``experiments/choose/zo_rate.py`` measures the shares per leaf).
  """
  if mode == "ft":
    base = nnx.Param
  elif mode == "lora":
    base = nnx.Any(nnx.LoRAParam, HeadParam)
  elif mode == "prefix":
    base = nnx.Any(PrefixParam, HeadParam)
  else:
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
  if not head:
    base = nnx.All(base, nnx.Not(HeadParam))
  if layers is None:
    return base
  keep = frozenset(int(i) for i in layers)
  if not keep or min(keep) < 0:
    raise ValueError(f"layers must be non-negative layer indices, got {sorted(keep)}")

  def in_layers(path, value) -> bool:
    for a, b in zip(path[:-1], path[1:], strict=False):
      if a == "layers" and isinstance(b, int):
        return b in keep
    return False

  return nnx.All(base, nnx.Any(HeadParam, in_layers) if head else in_layers)


def split_trainable(model: nnx.Module, mode_or_filter: Any) -> tuple[nnx.GraphDef, Any, Any]:
  """``(graphdef, trainable, frozen)``: pure (array-only) states of the model.

  ``trainable`` is the pytree to give the optimizer; ``frozen`` is everything else. Both
  are copies of the references (arrays are immutable), so training them leaves the live
  ``model`` untouched; rebuild a model with :func:`merge`.
  """
  wrt = trainable_filter(mode_or_filter) if isinstance(mode_or_filter, str) else mode_or_filter
  graphdef, trainable, frozen = nnx.split(model, wrt, ...)
  if not jax.tree.leaves(trainable):
    raise ValueError(f"the model has no params matching {mode_or_filter!r} (apply_lora or "
                     "add_prefix first?)")
  _check_frozen_below(model, trainable)
  return graphdef, nnx.as_pure(trainable), nnx.as_pure(frozen)


def _check_frozen_below(model: nnx.Module, trainable: Any) -> None:
  """A classifier run from layer ``L`` (``LabelWordClassifier(start_layer=L)``) reads the
  layers below ``L`` and the embeddings once, when its inputs are computed: training them
  would change nothing the loss sees, or (tied embeddings) only its head."""
  starts = {tuple(path): m.start_layer for path, m in nnx.iter_modules(model)
            if isinstance(m, LabelWordClassifier) and m.start_layer}
  if not starts:
    return
  for path, _ in nnx.to_flat_state(trainable):
    for at, start in starts.items():
      rest = tuple(path[len(at):]) if tuple(path[:len(at)]) == at else ()
      below = (rest[:2] == ("backbone", "layers") and isinstance(rest[2], int)
               and rest[2] < start) if len(rest) > 2 else False
      if below or rest[:2] == ("backbone", "embed_tokens"):
        raise ValueError(
            f"{'/'.join(map(str, path))} is trainable, but the classifier runs from layer "
            f"{start}: its layers below and the embeddings are read once, by its inputs. "
            f"Train only the layers from {start} on: "
            f"peft.trainable_filter(mode, layers=range({start}, num_layers))")


def merge(graphdef: nnx.GraphDef, trainable: Any, frozen: Any) -> nnx.Module:
  """The model rebuilt from :func:`split_trainable`'s parts."""
  return nnx.merge(graphdef, trainable, frozen)


def make_loss_fn(graphdef: nnx.GraphDef,
                 loss: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
  """``loss_fn(trainable, frozen, *batch) = loss(merge(graphdef, trainable, frozen), *batch)``.

  Its signature is what :func:`hizoo_jax.make_train_step` expects with ``frozen`` as the
  first batch argument; for a bare Optax update close over the batch:
  ``value_fn = lambda p: loss_fn(p, frozen, *batch)``.
  """

  def loss_fn(trainable, frozen, *batch):
    return loss(nnx.merge(graphdef, trainable, frozen), *batch)

  return loss_fn


def nnx_value_fn(model: nnx.Module, wrt: Any, loss: Callable[[nnx.Module], jax.Array]):
  """``value_fn(params)`` for ``nnx.Optimizer(model, tx, wrt=wrt).update(model, ...)``.

  ``params`` is the pure state of ``wrt`` that ``nnx.Optimizer`` hands the transform; the
  rest of the model is read from ``model`` when called (inside ``nnx.jit`` that is the
  traced state, not a constant)::

      @nnx.jit
      def train_step(model, optimizer, x, y):
        value_fn = peft.nnx_value_fn(model, nnx.LoRAParam, lambda m: ce(m(*x), y))
        optimizer.update(model, nnx.state(model, nnx.LoRAParam), value_fn=value_fn)
  """
  wrt = trainable_filter(wrt) if isinstance(wrt, str) else wrt
  graphdef, _, rest = nnx.split(model, wrt, ...)
  rest = nnx.as_pure(rest)
  return lambda params: loss(nnx.merge(graphdef, params, rest))


def nnx_zo_step(optimizer: nnx.Optimizer, model: nnx.Module,
                loss: Callable[[nnx.Module], Any], *, has_aux: bool = False,
                **step_options: Any) -> Any:
  """One lean zeroth-order step of an ``nnx.Optimizer``, in place; call it in ``nnx.jit``.

  ``optimizer.update(model, grads, value_fn=...)`` runs the optimizer's plain ``update``,
  which keeps a perturbed copy of the trainable params (and HiZOO's estimate) alive. This
  runs :func:`hizoo_jax.make_train_step`'s lean step on the optimizer's ``wrt`` state
  instead (the perturbation in place, in one traced loop) and writes the new params, the
  optimizer state and the step count back, like ``optimizer.update``::

      optimizer = nnx.Optimizer(model, hz.hizoo(1e-3), wrt=nnx.LoRAParam)

      @nnx.jit
      def train_step(model, optimizer, ids, mask, labels):
        return peft.nnx_zo_step(
            optimizer, model, lambda m: heads.cross_entropy(m(ids, mask), labels))

  Args:
    optimizer: an ``nnx.Optimizer`` whose ``tx`` contains a zeroth-order transform.
    model: the model it optimizes.
    loss: ``loss(model) -> scalar`` (``-> (scalar, aux)`` with ``has_aux``), the batch
      closed over.
    has_aux: as in :func:`hizoo_jax.make_train_step`.
    **step_options: further options of :func:`hizoo_jax.make_train_step` (``restore``).

  Returns:
    The step's loss (and aux with ``has_aux``), as ``make_train_step`` returns them.
  """
  graph = getattr(optimizer, "graph", None)
  graphdef, params, rest = nnx.split(model, optimizer.wrt, ...)
  params, rest = nnx.as_pure(params), nnx.as_pure(rest)
  loss_fn = lambda p: loss(nnx.merge(graphdef, p, rest))  # noqa: E731
  out = engine_step(optimizer.tx, loss_fn, params, nnx.as_pure(optimizer.opt_state),
                    has_aux=has_aux, **step_options)
  nnx.update(model, out[0])
  nnx.update(optimizer.opt_state, nnx.state(out[1], graph=graph))
  optimizer.step[...] += 1
  return out[2:] if has_aux else out[2]
