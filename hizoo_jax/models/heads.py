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

Linear-probe initialisation ("LP-then-FT"): :func:`pooled_features` runs the frozen backbone
once over a data set, :func:`linear_probe` fits an L2-regularised multinomial logistic
regression on those features in closed-form Newton steps, and :func:`init_linear_probe` does
both and writes the fitted weights into a :class:`SequenceClassifier`'s head, so that
zeroth-order fine-tuning starts from the probe's accuracy instead of chance.

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


class FrozenActivation(nnx.Variable):
  """The Variable type of activations a module holds as constants (never trained)."""


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
    prefix_ids: token ids that come before every row's ``input_ids`` (a prompt's shared
      head, e.g. a chat template's system and instruction text); decoder LMs only
      (``position="last"``). The rows are then the per-example rest, right-padded.
    share_prefix: compute the prefix's keys and values once per call, for one row, and run
      the rows against them (the backbone's ``layer_key_values`` and ``past_key_values``);
      False runs every row as ``prefix + row`` in full (the same logits, more work).
    start_layer: ``L > 0`` when only the layers from ``L`` on are trained (decoder LMs with
      ``hidden_states``/``forward_from``): the rows' residual stream entering layer ``L`` is
      then a constant of each example, computed once by :meth:`inputs`, and the classifier
      is called on it (``clf(clf.inputs(ids, mask), mask)`` equals ``clf(ids, mask)`` at
      ``start_layer=0``). The prefix's residual stream entering ``L`` and its keys and
      values below ``L`` are computed here, from the backbone as it is now, and held as
      :class:`FrozenActivation` variables: the layers below ``L`` and the embeddings must not
      change after (train with ``peft.trainable_filter(mode, layers=range(L, n))``;
      ``peft.split_trainable`` refuses a split that trains them).
  """

  def __init__(self, backbone: nnx.Module, label_token_ids: Sequence[int], *,
               position: str = "mask", mask_token_id: int | None = None,
               prefix_ids: Sequence[int] = (), share_prefix: bool = True,
               start_layer: int = 0):
    if position not in ("mask", "last"):
      raise ValueError(f"position must be 'mask' or 'last', got {position!r}")
    if position == "mask" and mask_token_id is None:
      raise ValueError("position='mask' needs mask_token_id")
    if not hasattr(backbone, "word_logits"):
      raise TypeError(f"{type(backbone).__name__} has no word_logits(hidden, token_ids)")
    if len(prefix_ids) and position != "last":
      raise ValueError("prefix_ids needs position='last' (a decoder LM reading the next word)")
    if len(prefix_ids) and share_prefix and not hasattr(backbone, "layer_key_values"):
      raise TypeError(f"{type(backbone).__name__} has no layer_key_values: pass "
                      "share_prefix=False")
    self.backbone = backbone
    self.label_token_ids = tuple(int(i) for i in label_token_ids)
    self.position = position
    self.mask_token_id = mask_token_id
    self.prefix_ids = tuple(int(i) for i in prefix_ids)
    self.share_prefix = bool(share_prefix)
    self.start_layer = int(start_layer)
    self.prefix_hidden: FrozenActivation | None = nnx.data(None)
    self.prefix_past: tuple[FrozenActivation, FrozenActivation] | None = nnx.data(None)
    if self.start_layer:
      if position != "last" or not hasattr(backbone, "forward_from"):
        raise ValueError("start_layer > 0 needs a decoder LM with hidden_states and "
                         "forward_from, scored at position='last'")
      num_layers = len(backbone.layers)
      if not 0 < self.start_layer < num_layers:
        raise ValueError(f"start_layer must be in [0, {num_layers - 1}] (the model's "
                         f"{num_layers} layers, one at least trained), got {start_layer}")
      if len(prefix_ids) and not share_prefix:
        raise ValueError("start_layer > 0 needs share_prefix=True (the rows' residual stream "
                         "is computed after the shared prefix)")
      if len(prefix_ids):
        ids = jnp.asarray(self.prefix_ids, jnp.int32)[None]
        hidden, kvs = backbone.hidden_states(ids, layer=self.start_layer,
                                             return_key_values=True)
        self.prefix_hidden = FrozenActivation(hidden)
        self.prefix_past = nnx.data((FrozenActivation(jnp.stack([k for k, _ in kvs])),
                                     FrozenActivation(jnp.stack([v for _, v in kvs]))))

  def positions(self, input_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
    """The scored position of each row."""
    if self.position == "mask":
      return jnp.argmax(input_ids == self.mask_token_id, axis=-1)
    return last_positions(attention_mask)

  def inputs(self, input_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
    """What ``__call__`` takes in place of ``input_ids``: the ids themselves, or with
    ``start_layer > 0`` the rows' residual stream entering that layer ``[batch, tokens,
    hidden]`` (after the shared prefix)."""
    if not self.start_layer:
      return input_ids
    past = None
    if self.prefix_past is not None:
      keys, values = (a[...] for a in self.prefix_past)
      past = list(zip(keys, values, strict=True))
    return self.backbone.hidden_states(input_ids, attention_mask, past, layer=self.start_layer)

  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
    """Label-word logits ``[batch, classes]``: the LM head at the scored position only,
    for the label words only. With ``start_layer > 0``, ``input_ids`` is :meth:`inputs`'s
    residual stream."""
    if self.start_layer:
      if input_ids.ndim != 3 or not jnp.issubdtype(input_ids.dtype, jnp.floating):
        raise TypeError(f"a classifier with start_layer={self.start_layer} takes "
                        "clf.inputs(ids, mask), the residual stream [batch, tokens, hidden], "
                        f"not token ids (got {input_ids.dtype}{list(input_ids.shape)})")
      past = None
      if self.prefix_hidden is not None:  # recomputed in the loss: the layers above move
        past = self.backbone.layer_key_values(hidden=self.prefix_hidden[...],
                                              layer=self.start_layer)
      hidden = self.backbone.forward_from(input_ids, attention_mask, past,
                                          layer=self.start_layer)
    elif not self.prefix_ids:
      hidden = self.backbone(input_ids, attention_mask)
    elif self.share_prefix:
      # inside the loss, so a perturbed or updated model recomputes its own prefix
      past = self.backbone.layer_key_values(jnp.asarray(self.prefix_ids, jnp.int32)[None])
      hidden = self.backbone(input_ids, attention_mask, past_key_values=past)
    else:
      prefix = jnp.broadcast_to(jnp.asarray(self.prefix_ids, input_ids.dtype),
                                (input_ids.shape[0], len(self.prefix_ids)))
      ids = jnp.concatenate([prefix, input_ids], axis=1)
      mask = jnp.concatenate([jnp.ones_like(prefix, attention_mask.dtype), attention_mask], 1)
      hidden = self.backbone(ids, mask)[:, len(self.prefix_ids):]
    at = gather_positions(hidden, self.positions(input_ids, attention_mask))
    return self.backbone.word_logits(at, jnp.asarray(self.label_token_ids))


# ----------------------------------------------------------------------------------------
# Linear-probe initialisation of the linear head.


def pooled_features(clf: SequenceClassifier, input_ids: Any, attention_mask: Any, *,
                    batch_size: int = 64) -> jax.Array:
  """The pooled backbone features ``[n, h]`` that ``clf``'s linear head sees (float32).

  Runs the backbone in batches of ``batch_size`` (a jitted function of the current weights,
  so LoRA or prefix parameters are included as they are).
  """
  if not isinstance(clf, SequenceClassifier):
    raise TypeError(f"pooled_features needs a SequenceClassifier, got {type(clf).__name__}")
  graphdef, state = nnx.split(clf)

  @jax.jit
  def pool(state, ids, mask):
    model = nnx.merge(graphdef, state)
    hidden = model.backbone(ids, mask)
    if model.pooling == "mean":
      return mean_pool(hidden, mask)
    if model.pooling == "cls":
      return hidden[:, 0]
    return gather_positions(hidden, last_positions(mask))

  ids, mask = jnp.asarray(input_ids), jnp.asarray(attention_mask)
  out = [pool(state, ids[s:s + batch_size], mask[s:s + batch_size])
         for s in range(0, ids.shape[0], batch_size)]
  return jnp.concatenate(out).astype(jnp.float32)


def linear_probe(features: Any, labels: Any, num_classes: int, *, l2: float = 1e-2,
                 iters: int = 30, tol: float = 1e-6) -> tuple[jax.Array, jax.Array]:
  """Fits ``logits = features @ W + b`` by L2-regularised logistic regression.

  Minimises ``mean CE(features @ W + b, labels) + l2 / 2 * ||W||^2`` (the bias is not
  penalised) with damped Newton steps on the ``(h + 1) * num_classes`` weights: the
  objective is strictly convex for ``l2 > 0``, so the fit is deterministic and needs no
  learning rate. ``h`` up to a few thousand is fine (the Newton system is
  ``(h + 1) C x (h + 1) C``).

  Args:
    features: ``[n, h]`` (e.g. :func:`pooled_features`).
    labels: ``[n]`` integer classes in ``[0, num_classes)``.
    num_classes: ``C``.
    l2: the ridge coefficient (> 0); pick it on a validation split.
    iters: maximum Newton steps.
    tol: stop when the objective decreases by less than this.

  Returns:
    ``(kernel [h, C], bias [C])`` in float32, ready for :class:`SequenceClassifier`.

  Example:
    >>> import numpy as np
    >>> x = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]], np.float32)
    >>> w, b = linear_probe(x, np.array([0, 0, 1, 1]), 2, l2=1e-3)
    >>> np.argmax(x @ np.asarray(w) + np.asarray(b), axis=1).tolist()
    [0, 0, 1, 1]
  """
  if not l2 > 0:
    raise ValueError(f"linear_probe: l2 must be > 0, got {l2!r}")
  x = jnp.asarray(features, jnp.float64 if jax.config.jax_enable_x64 else jnp.float32)
  y = jnp.asarray(labels, jnp.int32)
  if x.ndim != 2 or y.shape != (x.shape[0],):
    raise ValueError(f"linear_probe: features [n, h] and labels [n], got {x.shape} and {y.shape}")
  n, h = x.shape
  xb = jnp.concatenate([x, jnp.ones((n, 1), x.dtype)], axis=1)
  onehot = jax.nn.one_hot(y, num_classes, dtype=x.dtype)
  reg = jnp.concatenate([jnp.full((h, num_classes), l2, x.dtype),
                         jnp.zeros((1, num_classes), x.dtype)])

  w = jnp.zeros((h + 1, num_classes), x.dtype)
  for _ in range(iters):
    w, dec = _newton_step(w, xb, onehot, reg)
    if float(dec) < tol:
      break
  return w[:h].astype(jnp.float32), w[h].astype(jnp.float32)


def _probe_objective(w, xb, onehot, reg):
  logp = jax.nn.log_softmax(xb @ w, axis=-1)
  return -jnp.mean(jnp.sum(onehot * logp, axis=-1)) + 0.5 * jnp.sum(reg * w * w)


@jax.jit
def _newton_step(w, xb, onehot, reg):
  """One damped Newton step of :func:`linear_probe` (step halved until the objective drops)."""
  f = lambda v: _probe_objective(v, xb, onehot, reg)
  size = w.size
  g = jax.grad(f)(w).reshape(size)
  hess = jax.hessian(f)(w).reshape(size, size)
  # the softmax Hessian is singular along "add c to every class"; a tiny ridge fixes it
  step = jnp.linalg.solve(hess + 1e-6 * jnp.eye(size, dtype=w.dtype), g).reshape(w.shape)
  f0 = f(w)

  def halve(carry):
    t, _ = carry
    return t * 0.5, f(w - t * 0.5 * step)

  t, f1 = jax.lax.while_loop(lambda c: (c[1] > f0) & (c[0] > 1e-4), halve,
                             (jnp.asarray(1.0, w.dtype), f(w - step)))
  return jnp.where(f1 <= f0, w - t * step, w), f0 - jnp.minimum(f1, f0)


def init_linear_probe(clf: SequenceClassifier, input_ids: Any, attention_mask: Any,
                      labels: Any, *, l2: float = 1e-2, batch_size: int = 64,
                      iters: int = 30) -> dict[str, float]:
  """Linear-probe initialisation: fits ``clf``'s head on its frozen pooled features.

  The "LP-then-FT" recipe (Kumar et al., ICLR 2022): the backbone is untouched, the head
  (``clf.kernel``, ``clf.bias``) is replaced in place by :func:`linear_probe` of
  :func:`pooled_features` on ``(input_ids, attention_mask, labels)``. Fine-tuning then
  starts from the probe's accuracy, which is what MeZO's prompt gives a masked LM.

  Args:
    clf: a :class:`SequenceClassifier` (its head is overwritten).
    input_ids, attention_mask: ``[n, tokens]`` training inputs.
    labels: ``[n]`` integer classes.
    l2: ridge coefficient of the probe.
    batch_size: feature-extraction batch size.
    iters: Newton steps.

  Returns:
    ``{"train_ce": ..., "train_accuracy": ...}`` of the fitted head on these examples.
  """
  feats = pooled_features(clf, input_ids, attention_mask, batch_size=batch_size)
  num_classes = clf.kernel.shape[-1]
  kernel, bias = linear_probe(feats, labels, num_classes, l2=l2, iters=iters)
  clf.kernel[...] = kernel.astype(clf.kernel.dtype)
  clf.bias[...] = bias.astype(clf.bias.dtype)
  logits = feats @ kernel + bias
  y = jnp.asarray(labels, jnp.int32)
  return {"train_ce": float(cross_entropy(logits, y)), "train_accuracy": float(accuracy(logits, y))}


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
