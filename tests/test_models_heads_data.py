"""Classifier heads, objectives (including the non-differentiable ones) and the data helpers."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hizoo_jax.models import bert, data, heads, llama
from tests.test_models_parity import _mlm_logit_rounding_bound, matmul_rounding_bound

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
ROOT = os.path.dirname(HERE)
RNG = np.random.default_rng(0)


def _np_macro_f1(pred, labels, k):
  f1s = []
  for c in range(k):
    tp = np.sum((pred == c) & (labels == c))
    denom = np.sum(pred == c) + np.sum(labels == c)
    f1s.append(1.0 if denom == 0 else 2 * tp / denom)
  return np.mean(f1s)


@pytest.mark.parametrize("k", [2, 3])
def test_objectives_match_numpy(k):
  logits = RNG.standard_normal((50, k)).astype(np.float32)
  labels = RNG.integers(0, k, 50)
  pred = logits.argmax(-1)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  np.testing.assert_allclose(heads.cross_entropy(jnp.asarray(logits), jnp.asarray(labels)),
                             -logp[np.arange(50), labels].mean(), rtol=1e-5)
  np.testing.assert_allclose(heads.accuracy(logits, labels), np.mean(pred == labels), rtol=1e-6)
  np.testing.assert_allclose(heads.macro_f1(logits, labels), _np_macro_f1(pred, labels, k),
                             rtol=1e-6)
  assert heads.objective("accuracy")(logits, labels) == -heads.accuracy(logits, labels)
  assert heads.objective("f1")(logits, labels) == -heads.macro_f1(logits, labels)
  assert heads.objective("ce") is heads.cross_entropy
  with pytest.raises(ValueError, match="objective must be one of"):
    heads.objective("auc")


def test_accuracy_and_f1_objectives_have_no_gradient():
  """What makes them need a zeroth-order optimizer: the gradient is zero a.e."""
  logits = jnp.asarray(RNG.standard_normal((8, 2)), jnp.float32)
  labels = jnp.asarray(RNG.integers(0, 2, 8))
  for f in (heads.neg_accuracy, heads.neg_f1):
    assert float(jnp.max(jnp.abs(jax.grad(f)(logits, labels)))) == 0.0
  # but a large enough change of the logits changes them
  right = 2.0 * jax.nn.one_hot(labels, 2) - 1.0
  assert float(heads.neg_accuracy(right, labels)) == -1.0
  assert float(heads.neg_accuracy(-right, labels)) == 0.0


def test_f1_of_absent_class_counts_as_perfect():
  logits = jnp.asarray([[2.0, 0.0, 0.0], [0.0, 2.0, 0.0]])
  assert float(heads.macro_f1(logits, jnp.asarray([0, 1]))) == 1.0


@pytest.fixture(scope="module")
def tiny_bert():
  return bert.from_pretrained(os.path.join(DATA, "tiny_bert_mlm"))


def test_label_word_classifier_scores_label_words_at_the_mask(tiny_bert):
  mask_id = 4
  ids = jnp.asarray([[1, 9, 10, mask_id, 2, 0], [1, mask_id, 11, 12, 13, 2]])
  am = jnp.asarray([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
  clf = heads.LabelWordClassifier(tiny_bert, [20, 30], mask_token_id=mask_id)
  hidden = tiny_bert(ids, am)
  full = tiny_bert.word_logits(hidden, jnp.arange(128))
  expect = jnp.stack([full[0, 3, jnp.asarray([20, 30])], full[1, 1, jnp.asarray([20, 30])]])
  # the same logits up to the order of the hidden-size sums (test_models_parity derives it)
  bound = _mlm_logit_rounding_bound(tiny_bert, jnp.asarray([20, 30]))
  np.testing.assert_array_less(np.abs(np.asarray(clf(ids, am)) - np.asarray(expect)),
                               np.broadcast_to(bound, expect.shape))
  with pytest.raises(ValueError, match="mask_token_id"):
    heads.LabelWordClassifier(tiny_bert, [20, 30])
  with pytest.raises(ValueError, match="position"):
    heads.LabelWordClassifier(tiny_bert, [20, 30], position="first", mask_token_id=4)
  with pytest.raises(TypeError, match="word_logits"):
    heads.LabelWordClassifier(object(), [1, 2], mask_token_id=4)


def test_label_word_classifier_last_position_on_a_decoder():
  model = llama.from_pretrained(os.path.join(DATA, "tiny_llama"))
  ids = jnp.asarray([[1, 50, 60, 70, 0], [1, 80, 90, 100, 110]])
  am = jnp.asarray([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
  clf = heads.LabelWordClassifier(model, [7, 8], position="last")
  logits = model.logits(model(ids, am))
  expect = jnp.stack([logits[0, 3, jnp.asarray([7, 8])], logits[1, 4, jnp.asarray([7, 8])]])
  # the same logits up to the order of the hidden-size sums
  hidden = model(ids, am)
  at = jnp.stack([hidden[0, 3], hidden[1, 4]])
  rows = (model.embed_tokens.embedding[...][jnp.asarray([7, 8])] if model.lm_head is None
          else model.lm_head.kernel[...][:, jnp.asarray([7, 8])].T)
  np.testing.assert_array_less(np.abs(np.asarray(clf(ids, am)) - np.asarray(expect)),
                               matmul_rounding_bound(at, rows.T))


@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_sequence_classifier_pooling(tiny_bert, pooling):
  ids = jnp.asarray([[1, 9, 10, 2, 0, 0], [1, 11, 12, 13, 14, 2]])
  am = jnp.asarray([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
  clf = heads.SequenceClassifier(tiny_bert, 32, 3, pooling=pooling)
  np.testing.assert_array_equal(clf(ids, am), np.zeros((2, 3)))  # zero-initialised head
  w = RNG.standard_normal((32, 3)).astype(np.float32)
  clf.kernel[...] = jnp.asarray(w)
  h = np.asarray(tiny_bert(ids, am))
  pooled = {"mean": np.stack([h[0, :4].mean(0), h[1].mean(0)]), "cls": h[:, 0],
            "last": np.stack([h[0, 3], h[1, 5]])}[pooling]
  # float32 rounding of two implementations: the K = 32 sums of pooled @ w (gamma_32 each)
  # and, for "mean", the <= 6-row means (gamma_7 each, carried through |w|): bounded by
  # 2 gamma_{32+7} (mean of |h| over the pooled rows) @ |w|.
  rows = {"mean": [h[0, :4], h[1]], "cls": [h[0, :1], h[1, :1]], "last": [h[0, 3:4], h[1, 5:]]}
  abs_pooled = np.stack([np.abs(r).mean(0) for r in rows[pooling]])
  u = 2.0**-24
  bound = 2 * 39 * u / (1 - 39 * u) * (abs_pooled.astype(np.float64) @ np.abs(w))
  np.testing.assert_array_less(np.abs(np.asarray(clf(ids, am)) - pooled @ w), bound)
  with pytest.raises(ValueError, match="pooling"):
    heads.SequenceClassifier(tiny_bert, 32, 3, pooling="max")


# ----------------------------------------------------------------------------------------
# Data.


def test_read_glue_tsv_and_load_sst2(tmp_path):
  rows = ("sentence\tlabel\nit 's a charming and often affecting journey . \t1\n"
          "unflinchingly bleak\t0\n\n")
  (tmp_path / "train.tsv").write_text(rows)
  (tmp_path / "dev.tsv").write_text("label\tsentence\n1\ta \"quoted\" gem\n")
  sets = data.load_sst2(tmp_path)
  assert sets["train"][0] == ["it 's a charming and often affecting journey . ",
                              "unflinchingly bleak"]
  np.testing.assert_array_equal(sets["train"][1], [1, 0])
  assert sets["dev"][0] == ['a "quoted" gem'] and sets["dev"][1].dtype == np.int32
  (tmp_path / "bad.tsv").write_text("text\tlabel\nx\t1\n")
  with pytest.raises(ValueError, match="header"):
    data.read_glue_tsv(tmp_path / "bad.tsv")
  (tmp_path / "dev.tsv").unlink()
  with pytest.raises(FileNotFoundError, match="dev.tsv"):
    data.load_sst2(tmp_path)


def test_shipped_synthetic_sentiment_set():
  sets = data.load_sst2(os.path.join(ROOT, "examples", "data", "sentiment"))
  (tr, ytr), (dv, ydv) = sets["train"], sets["dev"]
  assert len(tr) == 384 and len(dv) == 192
  assert not set(tr) & set(dv)  # disjoint splits
  assert 0.4 < ytr.mean() < 0.6 and 0.4 < ydv.mean() < 0.6
  # the generator script reproduces the files
  import importlib.util

  spec = importlib.util.spec_from_file_location(
      "make_sentiment", os.path.join(ROOT, "examples", "data", "make_sentiment.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  train, dev = mod.make()
  assert [t for t, _ in train] == tr and [lab for _, lab in dev] == ydv.tolist()


def test_encode_prompts_truncates_the_sentence_not_the_template():
  ids, mask = data.encode_prompts(data.byte_tokenize, ["abcdefghij", "ab"], suffix="!?",
                                  max_length=8, bos=[1], eos=[2], pad_id=0)
  b = lambda s: data.byte_tokenize(s)  # noqa: E731
  assert ids[0].tolist() == [1, *b("abcd"), *b("!?"), 2]
  assert ids[1].tolist() == [1, *b("ab"), *b("!?"), 2, 0, 0]
  assert mask.tolist() == [[1] * 8, [1] * 6 + [0, 0]]
  with pytest.raises(ValueError, match="no room"):
    data.encode_prompts(data.byte_tokenize, ["a"], suffix="long suffix", max_length=5)


def test_label_token_ids_must_differ():
  assert data.label_token_ids(data.byte_tokenize, ["great", "terrible"]) == [3 + ord("g"),
                                                                             3 + ord("t")]
  with pytest.raises(ValueError, match="share their first token"):
    data.label_token_ids(data.byte_tokenize, [" great", " terrible"])


def test_batch_indices_are_seeded_epochs():
  n, bs = 10, 3
  epoch0 = np.concatenate([data.batch_indices(n, bs, 7, k) for k in range(3)])
  assert len(set(epoch0.tolist())) == 9  # no repeats within an epoch
  np.testing.assert_array_equal(data.batch_indices(n, bs, 7, 4), data.batch_indices(n, bs, 7, 4))
  assert not np.array_equal(data.batch_indices(n, bs, 7, 0), data.batch_indices(n, bs, 8, 0))
  assert not np.array_equal(data.batch_indices(n, bs, 7, 0), data.batch_indices(n, bs, 7, 3))
  with pytest.raises(ValueError, match="batch_size"):
    data.batch_indices(n, 11, 0, 0)


# ----------------------------------------------------------------------------------------
# Linear-probe initialisation and the k-shot protocol.

SST2 = os.path.join(ROOT, "..", "shared", "data", "sst2")
requires_sst2 = pytest.mark.skipif(
    not os.path.isfile(os.path.join(SST2, "train.tsv")),
    reason="needs GLUE SST-2 at ../shared/data/sst2 (train.tsv, dev.tsv) next to the repo")


def _probe_objective(x, y, w, b, l2):
  logits = x @ w + b
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  return -logp[np.arange(len(y)), y].mean() + 0.5 * l2 * np.sum(w * w)


@pytest.mark.parametrize("k", [2, 3])
def test_linear_probe_is_the_regularised_optimum(k):
  rng = np.random.default_rng(k)
  x = rng.standard_normal((120, 6))
  y = np.argmax(x[:, :k] + 0.5 * rng.standard_normal((120, k)), axis=1)
  l2 = 1e-2
  w, b = heads.linear_probe(x, y, k, l2=l2)
  assert w.shape == (6, k) and b.shape == (k,) and w.dtype == jnp.float32
  w, b = np.asarray(w, np.float64), np.asarray(b, np.float64)
  # optimal: the gradient of the objective vanishes (central differences, float64)
  f = lambda ww, bb: _probe_objective(x, y, ww, bb, l2)  # noqa: E731
  eps = 1e-5
  for idx in np.ndindex(w.shape):
    e = np.zeros_like(w)
    e[idx] = eps
    assert abs(f(w + e, b) - f(w - e, b)) / (2 * eps) < 1e-5
  for c in range(k):
    e = np.zeros(k)
    e[c] = eps
    assert abs(f(w, b + e) - f(w, b - e)) / (2 * eps) < 1e-5
  assert np.mean(np.argmax(x @ w + b, 1) == y) > 0.6
  # a stronger ridge shrinks the weights
  w_big, _ = heads.linear_probe(x, y, k, l2=10.0)
  assert np.linalg.norm(w_big) < np.linalg.norm(w)
  with pytest.raises(ValueError, match="l2"):
    heads.linear_probe(x, y, k, l2=0.0)
  with pytest.raises(ValueError, match="features"):
    heads.linear_probe(x[0], y, k)


def test_init_linear_probe_writes_the_head(tiny_bert):
  rng = np.random.default_rng(1)
  ids = jnp.asarray(rng.integers(5, 120, (24, 6)))
  am = jnp.ones((24, 6), jnp.int32)
  clf = heads.SequenceClassifier(tiny_bert, 32, 2)
  feats = heads.pooled_features(clf, ids, am, batch_size=10)  # uneven last batch
  np.testing.assert_allclose(feats, heads.mean_pool(tiny_bert(ids, am), am), rtol=1e-5,
                             atol=1e-6)
  labels = (np.asarray(feats)[:, 0] > np.median(np.asarray(feats)[:, 0])).astype(np.int32)
  stats = heads.init_linear_probe(clf, ids, am, labels, l2=1e-3)
  w, b = heads.linear_probe(feats, labels, 2, l2=1e-3)
  # init_linear_probe pools its own features (another program, float32): they differ from
  # ``feats`` by ~eps32 |feats|, and the ridge solve (l2 = 1e-3) passes that on to every
  # weight in proportion to the largest ones, not to each weight's own size (measured:
  # 1.9e-6 on a weight of 0.036 where the largest are 3.6, with LLVM at -O0). 1e-5 of the
  # largest weight: a factor of ~20 over that.
  scale = 1e-5 * float(np.max(np.abs(w)))
  np.testing.assert_allclose(clf.kernel[...], w, rtol=1e-5, atol=scale)
  np.testing.assert_allclose(clf.bias[...], b, rtol=1e-5, atol=max(scale, 1e-6))
  logits = clf(ids, am)
  assert stats["train_accuracy"] == pytest.approx(float(heads.accuracy(logits, labels)))
  assert stats["train_accuracy"] >= 0.9  # linearly separable by construction
  assert stats["train_ce"] < np.log(2)  # better than the zero head's chance
  with pytest.raises(TypeError, match="SequenceClassifier"):
    heads.pooled_features(heads.LabelWordClassifier(tiny_bert, [1, 2], mask_token_id=4), ids, am)


def test_k_shot_split_is_balanced_disjoint_and_seeded():
  labels = np.repeat([0, 1, 2], [50, 30, 40])
  tr, va = data.k_shot_split(labels, 8, seed=3)
  assert np.bincount(labels[tr]).tolist() == [8, 8, 8]
  assert np.bincount(labels[va]).tolist() == [8, 8, 8]
  assert not set(tr) & set(va) and list(tr) == sorted(tr)
  tr2, va2 = data.k_shot_split(labels, 8, seed=3)
  np.testing.assert_array_equal(tr, tr2)
  np.testing.assert_array_equal(va, va2)
  assert set(data.k_shot_split(labels, 8, seed=4)[0]) != set(tr)
  tr3, va3 = data.k_shot_split(labels, 10, seed=3, val_per_class=0)
  assert len(tr3) == 30 and len(va3) == 0
  with pytest.raises(ValueError, match="class 1 has 30"):
    data.k_shot_split(labels, 20, seed=0)


def test_k_shot_split_draws_only_from_its_pool():
  labels = np.repeat([0, 1], [40, 40])
  pool = np.arange(0, 80, 2)  # every other row: 20 of each class
  tr, va = data.k_shot_split(labels, 6, seed=1, val_per_class=4, pool=pool)
  assert set(tr) | set(va) <= set(pool) and not set(tr) & set(va)
  assert np.bincount(labels[tr]).tolist() == [6, 6]
  # a pool of every row is the default draw, index for index
  full = data.k_shot_split(labels, 6, seed=1, val_per_class=4, pool=np.arange(80))
  for a, b in zip(full, data.k_shot_split(labels, 6, seed=1, val_per_class=4), strict=True):
    np.testing.assert_array_equal(a, b)
  with pytest.raises(ValueError, match="class 0 has 20"):
    data.k_shot_split(labels, 16, seed=0, pool=pool)
  with pytest.raises(ValueError, match="pool indices"):
    data.k_shot_split(labels, 1, seed=0, pool=[80])


def test_whole_sentences_keeps_ended_rows_of_enough_words():
  rows = ["a great cast", "It is a film that never once lets its audience down, ever.",
          "Why would anyone sit through these two long and tedious hours of it ?",
          "one two three four five six seven eight nine ten", "Too short."]
  assert data.whole_sentences(rows).tolist() == [1, 2]
  assert data.whole_sentences(rows, min_words=2).tolist() == [1, 2, 4]


@requires_sst2
def test_k_shot_split_of_sst2():
  """MeZO's k-shot protocol on the real GLUE SST-2 train set (67,349 sentences)."""
  sets = data.load_sst2(SST2)
  sents, labels = sets["train"]
  assert len(labels) == 67349 and len(sets["dev"][1]) == 872
  tr, va = data.k_shot_split(labels, 16, seed=0)
  assert np.bincount(labels[tr]).tolist() == [16, 16]
  assert np.bincount(labels[va]).tolist() == [16, 16]
  assert not set(tr) & set(va)
  # the study's k = 512 split: 1024 train, 256 validation sentences
  tr, va = data.k_shot_split(labels, 512, seed=0, val_per_class=128)
  assert len(tr) == 1024 and len(va) == 256
  # its whole sentences are as long as the test's (median 19 words), the phrases are not
  whole = data.whole_sentences(sents)
  assert len(whole) == 9845 and np.bincount(labels[whole]).tolist() == [4695, 5150]
  words = lambda rows: np.median([len(r.split()) for r in rows])  # noqa: E731
  assert words(sents) == 7 and words([sents[i] for i in whole]) == words(sets["dev"][0]) == 19
