"""Classification on top of an encoder or LM, and the losses zeroth-order training uses.

Two ways to classify, both ``nnx.Module``s called as ``clf(input_ids, attention_mask)``
and returning logits ``[batch, classes]``:

* :class:`SequenceClassifier`: a linear head (:class:`HeadParam`) on mean-pooled or
  ``[CLS]`` hidden states; the standard fine-tuning head.
* :class:`LabelWordClassifier`: prompt-based classification as in MeZO and HiZOO. The
  input holds a template, e.g. ``"<sentence> It was [MASK]."``, and class ``c`` is scored
  by its label word (``"terrible"``/``"great"``) at the ``[MASK]`` position (masked LMs) or
  at the last real token (decoder LMs, next-word prediction). No new parameters: training
  starts from the pretrained model's zero-shot guess.

Objectives (``loss(logits, labels) -> scalar``): :func:`cross_entropy`, and the
non-differentiable :func:`neg_accuracy` and :func:`neg_f1` that only a zeroth-order
optimizer can train on directly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx


class HeadParam(nnx.Param):
  """The Variable type of task-head weights (trainable in every fine-tuning mode)."""


def mean_pool(hidden: jax.Array, attention_mask: jax.Array) -> jax.Array:
  """Mean of the hidden states over real tokens: ``[batch, tokens, h] -> [batch, h]``."""
  m = attention_mask.astype(hidden.dtype)[..., None]
  return jnp.sum(hidden * m, axis=-2) / jnp.maximum(jnp.sum(m, axis=-2), 1)


class SequenceClassifier(nnx.Module):
  """``logits = pool(backbone(ids, mask)) @ W + b`` with a zero-initialised head.

  Args:
    backbone: a module mapping ``(input_ids, attention_mask)`` to ``[batch, tokens, h]``.
    hidden_size: ``h``.
    num_classes: number of classes.
    pooling: ``"mean"`` (over real tokens), ``"cls"`` (first token) or ``"last"`` (last real
      token, for decoder LMs).
  """

  def __init__(self, backbone: nnx.Module, hidden_size: int, num_classes: int, *,
               pooling: str = "mean", param_dtype: Any = jnp.float32):
    if pooling not in ("mean", "cls", "last"):
      raise ValueError(f"pooling must be 'mean', 'cls' or 'last', got {pooling!r}")
    self.backbone = backbone
    self.pooling = pooling
    self.kernel = HeadParam(jnp.zeros((hidden_size, num_classes), param_dtype))
    self.bias = HeadParam(jnp.zeros((num_classes,), param_dtype))

  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
    hidden = self.backbone(input_ids, attention_mask)
    if self.pooling == "mean":
      pooled = mean_pool(hidden, attention_mask)
    elif self.pooling == "cls":
      pooled = hidden[:, 0]
    else:
      pooled = gather_positions(hidden, last_positions(attention_mask))
    return pooled @ self.kernel[...].astype(pooled.dtype) + self.bias[...].astype(pooled.dtype)


def last_positions(attention_mask: jax.Array) -> jax.Array:
  """Index of the last real token of each (right-padded) row."""
  return jnp.sum(attention_mask.astype(jnp.int32), axis=-1) - 1


def gather_positions(hidden: jax.Array, positions: jax.Array) -> jax.Array:
  """``hidden[b, positions[b]]`` for each row ``b``: ``[batch, h]``."""
  return jnp.take_along_axis(hidden, positions[:, None, None], axis=1)[:, 0]


class LabelWordClassifier(nnx.Module):
  """Prompt-based classification: class scores are the backbone's scores of label words.

  The backbone must provide ``word_logits(hidden, token_ids) -> [..., len(token_ids)]``
  (:class:`~hizoo_jax.models.bert.BertModel` with or without an MLM head,
  :class:`~hizoo_jax.models.llama.LlamaForCausalLM`).

  Args:
    backbone: the encoder or decoder LM.
    label_token_ids: one vocabulary id per class (the label words).
    position: ``"mask"`` (score at the first ``mask_token_id`` of each row: masked LMs) or
      ``"last"`` (at the last real token: decoder LMs predicting the next word).
    mask_token_id: the ``[MASK]`` id, required for ``position="mask"``.
  """

  def __init__(self, backbone: nnx.Module, label_token_ids: Sequence[int], *,
               position: str = "mask", mask_token_id: int | None = None):
    if position not in ("mask", "last"):
      raise ValueError(f"position must be 'mask' or 'last', got {position!r}")
    if position == "mask" and mask_token_id is None:
      raise ValueError("position='mask' needs mask_token_id")
    if not hasattr(backbone, "word_logits"):
      raise TypeError(f"{type(backbone).__name__} has no word_logits(hidden, token_ids)")
    self.backbone = backbone
    self.label_token_ids = tuple(int(i) for i in label_token_ids)
    self.position = position
    self.mask_token_id = mask_token_id

  def positions(self, input_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
    """The scored position of each row."""
    if self.position == "mask":
      return jnp.argmax(input_ids == self.mask_token_id, axis=-1)
    return last_positions(attention_mask)

  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
    hidden = self.backbone(input_ids, attention_mask)
    at = gather_positions(hidden, self.positions(input_ids, attention_mask))
    return self.backbone.word_logits(at, jnp.asarray(self.label_token_ids))


# ----------------------------------------------------------------------------------------
# Objectives.


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Mean softmax cross-entropy of integer ``labels``, computed in float32 or wider."""
  logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
  logp = jax.nn.log_softmax(logits, axis=-1)
  return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=-1))


def accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Fraction of rows whose arg-max class is the label (float32)."""
  return jnp.mean((jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32))


def macro_f1(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Macro-averaged F1 of the arg-max predictions over the classes (float32).

  A class absent from both labels and predictions has F1 = 1 (no error on it).
  """
  num_classes = logits.shape[-1]
  pred = jax.nn.one_hot(jnp.argmax(logits, axis=-1), num_classes)
  true = jax.nn.one_hot(labels, num_classes)
  tp = jnp.sum(pred * true, axis=0)
  denom = jnp.sum(pred, axis=0) + jnp.sum(true, axis=0)
  f1 = jnp.where(denom > 0, 2 * tp / jnp.maximum(denom, 1), 1.0)
  return jnp.mean(f1).astype(jnp.float32)


def neg_accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """``-accuracy``: a piecewise-constant objective (zero gradient almost everywhere)."""
  return -accuracy(logits, labels)


def neg_f1(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """``-macro F1``: non-differentiable, as in the paper's F1 experiments (Section 5.3)."""
  return -macro_f1(logits, labels)


OBJECTIVES: dict[str, Callable[[jax.Array, jax.Array], jax.Array]] = {
    "ce": cross_entropy,
    "accuracy": neg_accuracy,
    "f1": neg_f1,
}


def objective(name: str) -> Callable[[jax.Array, jax.Array], jax.Array]:
  """The loss ``f(logits, labels) -> scalar`` called ``name``: ``"ce"``, ``"accuracy"``
  (minimises ``-accuracy``) or ``"f1"`` (minimises ``-macro F1``)."""
  if name not in OBJECTIVES:
    raise ValueError(f"objective must be one of {sorted(OBJECTIVES)}, got {name!r}")
  return OBJECTIVES[name]
