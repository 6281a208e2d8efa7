"""Pieces shared by the BERT and Llama models: attention with optional prefix key/values."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx


class PrefixParam(nnx.Param):
  """The Variable type of prefix-tuning key/values (filter on it to train only them)."""


class PrefixKV(nnx.Module):
  """``num_tokens`` trainable key/value vectors prepended to one attention layer's keys.

  Every query attends to them (they are never masked); they carry no position (no RoPE).
  Shapes: ``key`` and ``value`` are ``[num_tokens, num_kv_heads, head_dim]``.
  """

  def __init__(self, key: jax.Array, value: jax.Array):
    if key.shape != value.shape or key.ndim != 3:
      raise ValueError(f"prefix key/value must share a [n, heads, head_dim] shape, got "
                       f"{key.shape} and {value.shape}")
    self.key = PrefixParam(jnp.asarray(key))
    self.value = PrefixParam(jnp.asarray(value))

  @property
  def num_tokens(self) -> int:
    """Prefix length."""
    return self.key.shape[0]


def mask_bias(mask: jax.Array, dtype: Any) -> jax.Array:
  """Additive attention bias: 0 where ``mask`` is true, the dtype's minimum elsewhere."""
  return jnp.where(mask, jnp.zeros((), dtype), jnp.finfo(dtype).min)


def attend(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    bias: jax.Array,
    prefix: PrefixKV | None = None,
) -> jax.Array:
  """Softmax attention ``softmax(q k^T / sqrt(d) + bias) v`` with grouped key/value heads.

  Args:
    q: ``[batch, q_len, heads, head_dim]``.
    k, v: ``[batch, kv_len, kv_heads, head_dim]``; ``heads`` is a multiple of ``kv_heads``.
    bias: additive bias broadcastable to ``[batch, heads, q_len, kv_len]``.
    prefix: optional prefix key/values, prepended to ``k``/``v`` for every example.

  Returns:
    ``[batch, q_len, heads, head_dim]``; the softmax runs in at least float32.
  """
  batch, _, heads, head_dim = q.shape
  if prefix is not None:
    pk = jnp.broadcast_to(prefix.key[...].astype(k.dtype), (batch, *prefix.key.shape))
    pv = jnp.broadcast_to(prefix.value[...].astype(v.dtype), (batch, *prefix.value.shape))
    k = jnp.concatenate([pk, k], axis=1)
    v = jnp.concatenate([pv, v], axis=1)
    bias = jnp.pad(bias, [(0, 0)] * (bias.ndim - 1) + [(prefix.num_tokens, 0)])
  groups = heads // k.shape[2]
  if groups > 1:
    k = jnp.repeat(k, groups, axis=2)
    v = jnp.repeat(v, groups, axis=2)
  scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(head_dim).astype(q.dtype)
  acc = jnp.promote_types(scores.dtype, jnp.float32)
  probs = jax.nn.softmax(scores.astype(acc) + bias.astype(acc), axis=-1).astype(v.dtype)
  return jnp.einsum("bhqk,bkhd->bqhd", probs, v)


def linear_kernel(weight, dtype: Any):
  """A PyTorch ``[out, in]`` weight as an ``nnx.Linear`` ``[in, out]`` kernel."""
  return jnp.asarray(weight.T, dtype)
