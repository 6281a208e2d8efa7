"""A Llama-architecture decoder-only LM in Flax NNX that loads Hugging Face checkpoints.

    from hizoo_jax.models import llama
    model = llama.from_pretrained("path/to/Llama-3.2-1B")     # config.json + safetensors
    hidden = model(input_ids, attention_mask)                 # [batch, tokens, hidden]
    logits = model.logits(hidden)                             # [batch, tokens, vocab]

RMSNorm, rotary position embeddings (``default`` and ``llama3`` scaling), grouped-query
attention and the SwiGLU MLP, as ``transformers.LlamaForCausalLM`` computes them (eval
mode), to < 1e-4 in float32. Also reads Llama-layout models such as Qwen2
(``attention_bias=True``) and TinyLlama/SmolLM. Padding must be on the right: positions are
``0 .. tokens-1`` for every row, as transformers uses without explicit ``position_ids``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hizoo_jax.models import _io
from hizoo_jax.models._layers import PrefixKV, attend, linear_kernel, mask_bias


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
  """The architecture fields of a Hugging Face Llama ``config.json``.

  ``rope_scaling`` is ``None`` (plain RoPE) or a tuple of ``(key, value)`` pairs of the
  ``llama3`` scaling (``factor``, ``low_freq_factor``, ``high_freq_factor``,
  ``original_max_position_embeddings``).
  """

  vocab_size: int = 32000
  hidden_size: int = 4096
  intermediate_size: int = 11008
  num_hidden_layers: int = 32
  num_attention_heads: int = 32
  num_key_value_heads: int | None = None
  head_dim: int | None = None
  max_position_embeddings: int = 2048
  rms_norm_eps: float = 1e-6
  rope_theta: float = 10000.0
  rope_scaling: tuple[tuple[str, Any], ...] | None = None
  attention_bias: bool = False
  mlp_bias: bool = False
  tie_word_embeddings: bool = False
  hidden_act: str = "silu"
  bos_token_id: int | None = 1
  eos_token_id: int | None = 2
  pad_token_id: int | None = None

  def __post_init__(self):
    if self.num_key_value_heads is None:
      object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
    if self.head_dim is None:
      object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
    if self.num_attention_heads % self.num_key_value_heads:
      raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
    if self.hidden_act != "silu":
      raise ValueError(f"hidden_act={self.hidden_act!r} is not supported (only 'silu')")

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> LlamaConfig:
    """Reads a ``config.json`` dict, old (``rope_theta``/``rope_scaling``) or new
    (``rope_parameters``, transformers >= 5) RoPE fields alike."""
    d = dict(d)
    rope = d.pop("rope_parameters", None) or d.pop("rope_scaling", None) or {}
    rope = dict(rope)
    if "rope_theta" in rope:
      d["rope_theta"] = rope.pop("rope_theta")
    kind = rope.pop("rope_type", rope.pop("type", "default"))
    if kind == "llama3":
      keep = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
      d["rope_scaling"] = tuple((k, rope[k]) for k in keep)
    elif kind == "default":
      d["rope_scaling"] = None
    else:
      raise ValueError(f"rope type {kind!r} is not supported (only 'default' and 'llama3')")
    for name in ("eos_token_id", "bos_token_id"):
      if isinstance(d.get(name), list):
        d[name] = d[name][0]
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names and (v is not None or k ==
                                                                 "rope_scaling")})

  def to_dict(self) -> dict[str, Any]:
    """A ``config.json`` dict that ``transformers.LlamaConfig`` reads."""
    d = dataclasses.asdict(self)
    d.pop("rope_scaling")
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": self.rope_theta}
    if self.rope_scaling is not None:
      rope = dict(self.rope_scaling, rope_type="llama3", rope_theta=self.rope_theta)
    d["rope_parameters"] = rope
    d["rope_scaling"] = rope
    return dict(d, model_type="llama", architectures=["LlamaForCausalLM"])


def rope_frequencies(cfg: LlamaConfig) -> np.ndarray:
  """RoPE inverse frequencies ``[head_dim / 2]`` (float64), with llama3 scaling if set.

  llama3 scaling: wavelengths longer than ``original / low_freq_factor`` are stretched by
  ``factor``, shorter than ``original / high_freq_factor`` kept, and the band in between
  interpolated linearly in ``original / wavelength``.
  """
  dim = cfg.head_dim
  inv = 1.0 / (cfg.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
  if cfg.rope_scaling is None:
    return inv
  s = dict(cfg.rope_scaling)
  factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
  original = s["original_max_position_embeddings"]
  wavelength = 2 * math.pi / inv
  ramp = np.clip((original / wavelength - lo) / (hi - lo), 0.0, 1.0)
  return inv / factor * (1 - ramp) + inv * ramp


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotates ``x`` ``[batch, tokens, heads, head_dim]`` (halves layout, as in HF Llama)."""
  x1, x2 = jnp.split(x, 2, axis=-1)
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  return x * cos[:, None, :] + rotated * sin[:, None, :]


class RMSNorm(nnx.Module):
  """``x / sqrt(mean(x^2) + eps) * weight``, computed in float32."""

  def __init__(self, size: int, eps: float, *, param_dtype: Any = jnp.float32):
    self.weight = nnx.Param(jnp.ones((size,), param_dtype))
    self.eps = eps

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return self.weight[...] * x32.astype(x.dtype)


class LlamaAttention(nnx.Module):
  """Grouped-query self-attention with RoPE; ``prefix`` is None or a ``PrefixKV``."""

  def __init__(self, cfg: LlamaConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
    h, d = cfg.hidden_size, cfg.head_dim
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.num_heads, self.num_kv_heads, self.head_dim = (cfg.num_attention_heads,
                                                        cfg.num_key_value_heads, d)
    self.q_proj = nnx.Linear(h, self.num_heads * d, use_bias=cfg.attention_bias, **kw)
    self.k_proj = nnx.Linear(h, self.num_kv_heads * d, use_bias=cfg.attention_bias, **kw)
    self.v_proj = nnx.Linear(h, self.num_kv_heads * d, use_bias=cfg.attention_bias, **kw)
    self.o_proj = nnx.Linear(self.num_heads * d, h, use_bias=cfg.attention_bias, **kw)
    self.prefix: PrefixKV | None = nnx.data(None)  # set by peft.add_prefix

  def project_kv(self, x, cos, sin):
    """Rotated keys and values ``[batch, tokens, kv_heads, head_dim]``."""
    shape = (*x.shape[:-1], self.num_kv_heads, self.head_dim)
    return apply_rope(self.k_proj(x).reshape(shape), cos, sin), self.v_proj(x).reshape(shape)

  def __call__(self, x, cos, sin, bias, past=None):
    q = self.q_proj(x).reshape(*x.shape[:-1], self.num_heads, self.head_dim)
    k, v = self.project_kv(x, cos, sin)
    if past is not None:  # keys/values of earlier tokens, seen by every query of every row
      pk, pv = (jnp.broadcast_to(t, (x.shape[0], *t.shape[1:])).astype(k.dtype) for t in past)
      k, v = jnp.concatenate([pk, k], axis=1), jnp.concatenate([pv, v], axis=1)
      bias = jnp.pad(bias, [(0, 0)] * (bias.ndim - 1) + [(pk.shape[1], 0)])
    ctx = attend(apply_rope(q, cos, sin), k, v, bias, self.prefix)
    return self.o_proj(ctx.reshape(*x.shape[:-1], self.num_heads * self.head_dim))


class LlamaMLP(nnx.Module):
  """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

  def __init__(self, cfg: LlamaConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
    kw = dict(use_bias=cfg.mlp_bias, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.gate_proj = nnx.Linear(cfg.hidden_size, cfg.intermediate_size, **kw)
    self.up_proj = nnx.Linear(cfg.hidden_size, cfg.intermediate_size, **kw)
    self.down_proj = nnx.Linear(cfg.intermediate_size, cfg.hidden_size, **kw)

  def __call__(self, x):
    return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nnx.Module):
  """Pre-norm decoder block: ``x + attn(norm(x))`` then ``x + mlp(norm(x))``."""

  def __init__(self, cfg: LlamaConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, param_dtype=param_dtype)
    self.self_attn = LlamaAttention(cfg, **kw)
    self.post_attention_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps,
                                       param_dtype=param_dtype)
    self.mlp = LlamaMLP(cfg, **kw)

  def __call__(self, x, cos, sin, bias, past=None):
    x = x + self.self_attn(self.input_norm(x), cos, sin, bias, past)
    return x + self.mlp(self.post_attention_norm(x))


class LlamaForCausalLM(nnx.Module):
  """Llama decoder LM: ``model(input_ids, attention_mask)`` returns the final-norm hidden
  states ``[batch, tokens, hidden]``; :meth:`logits` maps them to the vocabulary.

  Args:
    config: a :class:`LlamaConfig`.
    dtype: computation dtype (None: from the params); param_dtype: params' dtype.
    rngs: random init (``from_pretrained`` overwrites every param).
  """

  lora_targets = ("q_proj", "v_proj")

  def __init__(self, config: LlamaConfig, *, dtype: Any = None, param_dtype: Any = jnp.float32,
               rngs: nnx.Rngs):
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.config = config
    self.embed_tokens = nnx.Embed(config.vocab_size, config.hidden_size, **kw)
    self.layers = nnx.List([LlamaBlock(config, **kw) for _ in range(config.num_hidden_layers)])
    self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, param_dtype=param_dtype)
    self.lm_head = None if config.tie_word_embeddings else nnx.Linear(
        config.hidden_size, config.vocab_size, use_bias=False, **kw)

  def attention_layers(self) -> list[LlamaAttention]:
    """The self-attention modules, first layer first (where prefixes attach)."""
    return [layer.self_attn for layer in self.layers]

  def _rope(self, length: int, dtype, offset: int = 0):
    inv = rope_frequencies(self.config)
    angles = np.arange(offset, offset + length, dtype=np.float64)[:, None] * inv[None]
    angles = np.concatenate([angles, angles], axis=-1)
    return jnp.asarray(np.cos(angles), dtype), jnp.asarray(np.sin(angles), dtype)

  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
               past_key_values: list[tuple[jax.Array, jax.Array]] | None = None) -> jax.Array:
    """Hidden states after the final RMSNorm, ``[batch, tokens, hidden]``.

    Args:
      input_ids: int ``[batch, tokens]``, right-padded.
      attention_mask: ``[batch, tokens]``, 1 for real tokens (default all 1).
      past_key_values: None, or each layer's keys and values of ``P`` earlier tokens (as
        :meth:`layer_key_values` returns them, batch 1 or ``batch``): ``input_ids`` then
        continue them at positions ``P .. P + tokens - 1`` and attend to all ``P``. A
        prompt prefix that every row shares is computed once this way.
    """
    return self._forward(input_ids, attention_mask, past=past_key_values)[0]

  def layer_key_values(self, input_ids: jax.Array) -> list[tuple[jax.Array, jax.Array]]:
    """Each layer's (rotated) keys and values ``[batch, tokens, kv_heads, head_dim]`` for
    ``input_ids`` (no padding): prefix-tuning init, or a shared prompt prefix to pass as
    ``past_key_values``."""
    return self._forward(input_ids, None, collect_kv=True)[1]

  def _forward(self, input_ids, attention_mask, collect_kv=False, past=None):
    length = input_ids.shape[-1]
    if attention_mask is None:
      attention_mask = jnp.ones(input_ids.shape, jnp.int32)
    if past is not None and len(past) != len(self.layers):
      raise ValueError(f"past_key_values has {len(past)} layers, the model {len(self.layers)}")
    x = self.embed_tokens(input_ids)
    cos, sin = self._rope(length, jnp.float32, offset=0 if past is None else past[0][0].shape[1])
    causal = jnp.tril(jnp.ones((length, length), bool))
    allowed = causal[None, None] & attention_mask[:, None, None, :].astype(bool)
    bias = mask_bias(allowed, jnp.float32)
    kvs = []
    for i, layer in enumerate(self.layers):
      if collect_kv:
        kvs.append(layer.self_attn.project_kv(layer.input_norm(x), cos, sin))
      x = layer(x, cos, sin, bias, None if past is None else past[i])
    return self.norm(x), kvs

  def logits(self, hidden: jax.Array) -> jax.Array:
    """Vocabulary logits ``[..., vocab]`` of hidden states ``[..., hidden]``."""
    if self.lm_head is None:
      return self.embed_tokens.attend(hidden)
    return self.lm_head(hidden)

  def word_logits(self, hidden: jax.Array, token_ids: jax.Array) -> jax.Array:
    """Logits of the words ``token_ids`` ``[k]`` only: ``[..., k]`` (cheap label scoring)."""
    token_ids = jnp.asarray(token_ids)
    if self.lm_head is None:
      rows = self.embed_tokens.embedding[...][token_ids]
    else:
      rows = self.lm_head.kernel[...][:, token_ids].T
    return hidden @ rows.T.astype(hidden.dtype)


# ----------------------------------------------------------------------------------------
# Hugging Face checkpoints.


def _pure_state(cfg: LlamaConfig, tensors: dict[str, np.ndarray], dtype) -> dict:
  t = dict(tensors)
  h, d, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
  nq, nkv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d

  def lin(name, n_in, n_out, bias):
    out = {"kernel": linear_kernel(_io.take(t, f"{name}.weight", (n_out, n_in)), dtype)}
    if bias:
      out["bias"] = jnp.asarray(_io.take(t, f"{name}.bias", (n_out,)), dtype)
    return out

  def norm(name):
    return {"weight": jnp.asarray(_io.take(t, f"{name}.weight", (h,)), dtype)}

  embed = jnp.asarray(_io.take(t, "model.embed_tokens.weight", (cfg.vocab_size, h)), dtype)
  state: dict[str, Any] = {"embed_tokens": {"embedding": embed}, "layers": {},
                           "norm": norm("model.norm")}
  ab, mb = cfg.attention_bias, cfg.mlp_bias
  for i in range(cfg.num_hidden_layers):
    p = f"model.layers.{i}"
    state["layers"][i] = {
        "input_norm": norm(f"{p}.input_layernorm"),
        "post_attention_norm": norm(f"{p}.post_attention_layernorm"),
        "self_attn": {
            "q_proj": lin(f"{p}.self_attn.q_proj", h, nq, ab),
            "k_proj": lin(f"{p}.self_attn.k_proj", h, nkv, ab),
            "v_proj": lin(f"{p}.self_attn.v_proj", h, nkv, ab),
            "o_proj": lin(f"{p}.self_attn.o_proj", nq, h, ab),
        },
        "mlp": {
            "gate_proj": lin(f"{p}.mlp.gate_proj", h, inter, mb),
            "up_proj": lin(f"{p}.mlp.up_proj", h, inter, mb),
            "down_proj": lin(f"{p}.mlp.down_proj", inter, h, mb),
        },
    }
  if not cfg.tie_word_embeddings:
    state["lm_head"] = lin("lm_head", h, cfg.vocab_size, False)
  return state


def from_pretrained(path: str | os.PathLike, *, dtype: Any = None,
                    param_dtype: Any = jnp.float32) -> LlamaForCausalLM:
  """Loads a Hugging Face Llama-layout checkpoint directory (config.json + safetensors,
  single file or sharded).

  Args:
    path: the checkpoint directory.
    dtype: computation dtype (None: the params' dtype).
    param_dtype: dtype the weights are cast to (float32 by default; bfloat16 for big models
      on an accelerator).

  Returns:
    A :class:`LlamaForCausalLM` holding the checkpoint's weights.
  """
  raw = _io.read_config(path)
  if raw.get("model_type", "llama") not in ("llama", "qwen2", "mistral"):
    raise ValueError(f"model_type={raw['model_type']!r} is not a Llama-layout model")
  cfg = LlamaConfig.from_dict(raw)
  tensors = _io.read_tensors(path)
  model = nnx.eval_shape(lambda: LlamaForCausalLM(cfg, dtype=dtype, param_dtype=param_dtype,
                                                  rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(model)
  nnx.replace_by_pure_dict(state, _pure_state(cfg, tensors, param_dtype))
  return nnx.merge(graphdef, state)


def to_hf_tensors(model: LlamaForCausalLM) -> dict[str, np.ndarray]:
  """The model's weights under Hugging Face ``LlamaForCausalLM`` names."""
  s = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  out = {"model.embed_tokens.weight": np.asarray(s["embed_tokens"]["embedding"]),
         "model.norm.weight": np.asarray(s["norm"]["weight"])}

  def lin(name, d):
    out[f"{name}.weight"] = np.asarray(d["kernel"]).T
    if "bias" in d:
      out[f"{name}.bias"] = np.asarray(d["bias"])

  for i, layer in s["layers"].items():
    p = f"model.layers.{i}"
    out[f"{p}.input_layernorm.weight"] = np.asarray(layer["input_norm"]["weight"])
    out[f"{p}.post_attention_layernorm.weight"] = np.asarray(
        layer["post_attention_norm"]["weight"])
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
      lin(f"{p}.self_attn.{name}", layer["self_attn"][name])
    for name in ("gate_proj", "up_proj", "down_proj"):
      lin(f"{p}.mlp.{name}", layer["mlp"][name])
  if "lm_head" in s:
    lin("lm_head", s["lm_head"])
  return out


def save_pretrained(model: LlamaForCausalLM, path: str | os.PathLike) -> None:
  """Writes ``config.json`` + ``model.safetensors`` that :func:`from_pretrained` and
  ``transformers.LlamaForCausalLM.from_pretrained`` read."""
  _io.write_checkpoint(path, model.config.to_dict(), to_hf_tensors(model))


def tiny_config(**overrides: Any) -> LlamaConfig:
  """A few-kilobyte random-init config for tests and smoke runs (vocab 512, 2 layers,
  hidden 64, 4 query heads over 2 key/value heads)."""
  base = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              rms_norm_eps=1e-6, rope_theta=10000.0, bos_token_id=1, eos_token_id=2,
              pad_token_id=0)
  base.update(overrides)
  return LlamaConfig(**base)
