"""The tasks of the "choosing a method" study: what a run trains, on which data, and how it
is scored.

Each task's ``setup(seed, restoring)`` returns an :class:`Instance`: the trainable params,
the loss ``loss_fn(params, *extra, *batch)`` that ``hz.make_train_step`` steps on,
``batch(step)`` (a pure function of ``(seed, step)``, so a resumed run sees the same
batches), ``evaluate(params)`` (training-set loss and validation loss: the curve, and what
tuning selects on) and ``test(params)`` (test metrics, scored once at the end of a run and
never used to select anything).

* ``digits``: the 64-128-128-10 MLP of ``experiments/digits.py`` (26,122 params) on
  scikit-learn's digits; 1,437 training images split into 1,150 for training and 287 for
  validation (fixed, stratified), the 360 test images scored at the end. Batch 64; the
  curve is the loss on all 1,150 training images.
* ``sst2_<mode>_<data>``: all-MiniLM-L6-v2 (real weights) on GLUE SST-2, ``mode`` ``ft``
  (every weight, 22.7M) or ``lora`` (rank 8 on query/value + the head), ``data`` ``full``
  (all of ``train.tsv`` but 1,000 held-out validation sentences) or ``k512`` (MeZO's k-shot
  protocol: 512 per class by seed, 128 per class validation). ``dev.tsv`` (872) is the test
  set. Sentences are padded to 64 tokens at most: with the MiniLM tokenizer 64 cuts no
  ``dev.tsv`` sentence and 4 of 67,349 training sentences (56: 0.34% of dev; 48: 2.75%;
  the old 32: 24.7%; measured by ``python -m experiments.choose.tasks --truncation``).
  Each batch is padded only to its longest sentence rounded up to 16 tokens (SST-2 training
  sentences average 13 tokens; batches of 16 then average 43 tokens instead of 64), which
  changes nothing but the cost. The linear head starts
  as a linear probe (logistic regression on the frozen features of up to 8,192 training
  sentences drawn by seed, l2 picked on validation). On ``full`` the curve is the loss on a
  fixed 4,096-sentence training subsample, the same for every seed and method (the whole
  66k set would cost 16x more per evaluation, ~40 minutes on two shared CPU cores); on
  ``k512`` it is the whole k-shot training set.
* ``fa``, ``fb``, ``fc``: the paper's 2-D test functions (``experiments/problems.py``) from
  their fixed starting points; the "train", validation and test losses are the function
  itself (no data; the seed only changes the noise).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SST2_DIR = os.environ.get("HIZOO_SST2_DIR", os.path.join(ROOT, "..", "shared", "data", "sst2"))


@dataclasses.dataclass
class Instance:
  """A task set up for one seed (see the module docstring)."""

  params: Any
  extra: tuple
  loss_fn: Callable[..., jax.Array]
  batch: Callable[[int], tuple]
  evaluate: Callable[[Any], dict]
  test: Callable[[Any], dict]
  info: dict


# ----------------------------------------------------------------------------------------
# Digits.


@functools.lru_cache(maxsize=1)
def _digits_data():
  from sklearn.model_selection import train_test_split

  from experiments import digits as D

  d = D.load_data()
  xtr, ytr = np.asarray(d.x_train), np.asarray(d.y_train)
  idx_tr, idx_va = train_test_split(np.arange(len(ytr)), test_size=0.2, random_state=0,
                                    stratify=ytr)
  f32 = lambda a: jnp.asarray(a, jnp.float32)
  i32 = lambda a: jnp.asarray(a, jnp.int32)
  return (f32(xtr[idx_tr]), i32(ytr[idx_tr]), f32(xtr[idx_va]), i32(ytr[idx_va]),
          f32(d.x_test), i32(d.y_test))


@dataclasses.dataclass(frozen=True)
class Digits:
  """The digits MLP (``experiments/digits.py``), a validation split carved from train."""

  hidden: tuple = (128, 128)
  batch_size: int = 64
  name: str = "digits"

  def setup(self, seed: int, restoring: bool = False) -> Instance:
    from experiments import digits as D
    from hizoo_jax.models import data

    xtr, ytr, xva, yva, xte, yte = _digits_data()
    graphdef, params = D.init_model(seed, self.hidden)
    loss = D.make_loss(graphdef)
    acc = D.make_accuracy(graphdef)
    n, bs = int(ytr.shape[0]), self.batch_size
    ev = jax.jit(lambda p: (loss(p, xtr, ytr), loss(p, xva, yva)))
    te = jax.jit(lambda p: (loss(p, xte, yte), acc(p, xte, yte)))

    def evaluate(p):
      a, b = ev(p)
      return {"train_loss": float(a), "val_loss": float(b)}

    def test(p):
      a, b = te(p)
      return {"test_loss": float(a), "test_accuracy": float(b)}

    return Instance(
        params=params, extra=(xtr, ytr),
        loss_fn=lambda p, x, y, i: loss(p, x[i], y[i]),
        batch=lambda t: (jnp.asarray(data.batch_indices(n, bs, seed, t), jnp.int32),),
        evaluate=evaluate, test=test,
        info={"n_train": n, "n_val": int(yva.shape[0]), "n_test": int(yte.shape[0]),
              "batch_size": bs, "hidden": list(self.hidden), "model_seed": seed})


# ----------------------------------------------------------------------------------------
# The paper's test functions.


@dataclasses.dataclass(frozen=True)
class TestFunction:
  """``f_a``, ``f_b`` or ``f_c`` of ``experiments/problems.py`` from its fixed start."""

  fn: str = "f_a"
  name: str = "fa"

  def setup(self, seed: int, restoring: bool = False) -> Instance:
    from experiments import problems

    f = getattr(problems, self.fn)
    start = jnp.asarray(problems.START[self.fn], jnp.float32)
    ev = jax.jit(f)

    def evaluate(p):
      v = float(ev(p))
      return {"train_loss": v, "val_loss": v}

    return Instance(params=start, extra=(), loss_fn=lambda p: f(p), batch=lambda t: (),
                    evaluate=evaluate, test=lambda p: {"test_loss": float(ev(p))},
                    info={"start": np.asarray(start).tolist(), "dtype": "float32"})


# ----------------------------------------------------------------------------------------
# SST-2 on MiniLM-L6.

BUCKET = 16


@functools.lru_cache(maxsize=2)
def _sst2_encoded(max_length: int):
  """``{"train": (ids, mask, labels), "dev": ...}`` of all of SST-2, tokenised once."""
  from hizoo_jax.models import bert, data

  sets = data.load_sst2(SST2_DIR)
  tok = bert.load_tokenizer(bert.minilm_path())
  out = {}
  for split, (sents, labels) in sets.items():
    ids, mask = data.encode_prompts(
        data.hf_tokenize(tok), sents, max_length=max_length,
        bos=[tok.token_to_id("[CLS]")], eos=[tok.token_to_id("[SEP]")],
        pad_id=tok.token_to_id("[PAD]"))
    out[split] = (ids, mask, np.asarray(labels, np.int32))
  return out


def truncation(lengths=(32, 48, 56, 64, 72)) -> dict:
  """Share of SST-2 sentences longer than each length in MiniLM tokens (with [CLS]/[SEP])."""
  from hizoo_jax.models import bert, data

  sets = data.load_sst2(SST2_DIR)
  tok = bert.load_tokenizer(bert.minilm_path())
  out = {}
  for split, (sents, _) in sets.items():
    n = np.array([len(tok.encode(s, add_special_tokens=False).ids) + 2 for s in sents])
    out[split] = {"sentences": len(n), "max_tokens": int(n.max()),
                  **{f"cut_at_{L}": float(np.mean(n > L)) for L in lengths}}
  return out


def _bucket(mask_rows: np.ndarray, max_length: int) -> int:
  longest = int(mask_rows.sum(axis=1).max())
  return min(max_length, -(-longest // BUCKET) * BUCKET)


def _rows(split, idx):
  ids, mask, labels = split
  return ids[idx], mask[idx], labels[idx]


@dataclasses.dataclass(frozen=True)
class SST2:
  """MiniLM-L6 on SST-2 (see the module docstring)."""

  mode: str = "ft"
  data: str = "full"
  max_length: int = 64
  batch_size: int = 16
  val_size: int = 1000
  train_eval_size: int = 4096
  probe_size: int = 8192
  eval_batch: int = 128
  name: str = "sst2_ft_full"
  # Train only these transformer layers (and the head); None: every layer of the mode.
  layers: tuple | None = None
  head: bool = True  # False: the linear probe stays as fitted
  # The task whose runs these are paired with by seed (the same data, batches and probe
  # start; only the trainable subset differs): the baseline of `report --versus`.
  paired_with: str | None = None

  def _splits(self, seed):
    from hizoo_jax.models import data

    enc = _sst2_encoded(self.max_length)
    train_all = enc["train"]
    n_all = len(train_all[2])
    if self.data == "full":
      perm = np.random.default_rng(20240623).permutation(n_all)
      va_idx = np.sort(perm[:self.val_size])
      tr_idx = np.sort(perm[self.val_size:])
      ev_idx = np.sort(np.random.default_rng(20240624).choice(
          tr_idx, min(self.train_eval_size, len(tr_idx)), replace=False))
    elif self.data.startswith("k"):
      k = int(self.data[1:])
      tr_idx, va_idx = data.k_shot_split(train_all[2], k, seed, val_per_class=min(k, 128))
      ev_idx = tr_idx
    else:
      raise ValueError(f"data must be 'full' or 'k<K>', got {self.data!r}")
    pr_idx = tr_idx if len(tr_idx) <= self.probe_size else np.sort(
        np.random.default_rng([seed, 7]).choice(tr_idx, self.probe_size, replace=False))
    return (_rows(train_all, tr_idx), _rows(train_all, va_idx), _rows(train_all, ev_idx),
            _rows(train_all, pr_idx), enc["dev"])

  def _eval_fn(self, logits_fn):
    """``fn(params, frozen, split) -> (per-example CE, logits)``: rows sorted by length,
    padded to buckets of 16 tokens and to ``eval_batch`` rows (a handful of shapes)."""
    bs = self.eval_batch

    def fn(params, frozen, split):
      ids, mask, labels = split
      order = np.argsort(mask.sum(axis=1), kind="stable")
      out = np.zeros((len(labels), 2), np.float32)
      for s in range(0, len(order), bs):
        rows = order[s:s + bs]
        L = _bucket(mask[rows], self.max_length)
        pad = bs - len(rows)
        i = np.concatenate([ids[rows, :L], np.repeat(ids[rows[:1], :L], pad, 0)])
        m = np.concatenate([mask[rows, :L], np.repeat(mask[rows[:1], :L], pad, 0)])
        out[rows] = np.asarray(logits_fn(params, frozen, i, m))[:len(rows)]
      logp = jax.nn.log_softmax(jnp.asarray(out, jnp.float32), axis=-1)
      y = jnp.asarray(labels)
      ce = -jnp.take_along_axis(logp, y[:, None], axis=-1)[:, 0]
      return np.asarray(ce, np.float64), out

    return fn

  def setup(self, seed: int, restoring: bool = False) -> Instance:
    from flax import nnx

    from hizoo_jax.models import bert, heads, peft

    train, val, train_eval, probe, test = self._splits(seed)
    model = bert.from_pretrained(bert.minilm_path())
    if self.mode == "lora":
      peft.apply_lora(model, rank=8, alpha=16.0, rngs=nnx.Rngs(seed))
    clf = heads.SequenceClassifier(model, model.config.hidden_size, 2, pooling="mean")
    # Only a subset passes layers/head: the tables that train every parameter resume with
    # the hizoo_jax of the commit they started with (CHOOSE_REF), older than these arguments.
    subset = {}
    if self.layers is not None:
      subset["layers"] = self.layers
    if not self.head:
      subset["head"] = False
    wrt = peft.trainable_filter(self.mode, **subset)
    info = {"mode": self.mode, "data": self.data, "n_train": len(train[2]),
            "n_val": len(val[2]), "n_train_eval": len(train_eval[2]), "n_test": len(test[2]),
            "max_length": self.max_length, "batch_size": self.batch_size}
    if self.layers is not None:
      info["layers"] = list(self.layers)
    if not self.head:
      info["head"] = "frozen"
    graphdef, params, frozen = peft.split_trainable(clf, wrt)
    logits_fn = jax.jit(lambda p, f, i, m: nnx.merge(graphdef, p, f)(i, m))
    evalf = self._eval_fn(logits_fn)
    if not restoring:  # a resumed run takes its params from the checkpoint
      info.update(self._probe(clf, logits_fn, evalf, probe, val))
      graphdef, params, frozen = peft.split_trainable(clf, wrt)
    del clf
    loss_fn = peft.make_loss_fn(graphdef,
                                lambda m, i, am, y: heads.cross_entropy(m(i, am), y))
    ids, mask, labels = train
    n, bs = len(labels), self.batch_size

    def batch(t):
      from hizoo_jax.models import data

      b = data.batch_indices(n, bs, seed, t)
      L = _bucket(mask[b], self.max_length)
      return ids[b, :L], mask[b, :L], labels[b]

    def evaluate(p):
      return {"train_loss": float(evalf(p, frozen, train_eval)[0].mean()),
              "val_loss": float(evalf(p, frozen, val)[0].mean())}

    def test_fn(p):
      ce, logits = evalf(p, frozen, test)
      acc = float(np.mean(np.argmax(logits, -1) == test[2]))
      return {"test_loss": float(ce.mean()), "test_accuracy": acc}

    return Instance(params=params, extra=(frozen,), loss_fn=loss_fn, batch=batch,
                    evaluate=evaluate, test=test_fn, info=info)

  def _probe(self, clf, logits_fn, evalf, probe, val) -> dict:
    """Fits the head as a linear probe (l2 on the validation split) in place."""
    from hizoo_jax.models import heads

    l2s = (1e-4, 1e-3, 1e-2, 1e-1)
    feats = {}
    for name, (ids, mask, _) in (("probe", probe), ("val", val)):
      order = np.argsort(mask.sum(axis=1), kind="stable")
      f = np.zeros((len(ids), clf.kernel.shape[0]), np.float32)
      for s in range(0, len(order), self.eval_batch):
        rows = order[s:s + self.eval_batch]
        L = _bucket(mask[rows], self.max_length)
        f[rows] = np.asarray(heads.pooled_features(clf, ids[rows, :L], mask[rows, :L],
                                                   batch_size=self.eval_batch))
      feats[name] = f
    yv = jnp.asarray(val[2])
    best = None
    for l2 in l2s:
      w, b = heads.linear_probe(feats["probe"], probe[2], 2, l2=l2)
      lv = jnp.asarray(feats["val"]) @ w + b
      score = (-float(heads.cross_entropy(lv, yv)), float(heads.accuracy(lv, yv)))
      if best is None or score > best[0]:
        best = (score, l2, w, b)
    (ce, acc), l2, w, b = best
    clf.kernel[...] = w
    clf.bias[...] = b
    return {"probe_l2": l2, "probe_val_loss": -ce, "probe_val_accuracy": acc,
            "n_probe": len(probe[2])}


TASKS: dict[str, Any] = {
    "digits": Digits(),
    "fa": TestFunction("f_a", "fa"),
    "fb": TestFunction("f_b", "fb"),
    "fc": TestFunction("f_c", "fc"),
    **{f"sst2_{m}_{d}": SST2(mode=m, data=d, name=f"sst2_{m}_{d}")
       for m in ("ft", "lora") for d in ("full", "k512")},
    # Full fine-tuning of the lower transformer layers only (and the head), where
    # experiments/choose/zo_rate.py measures a larger share of the gradient than of the
    # curvature; paired with sst2_ft_full.
    **{f"sst2_ftl{''.join(map(str, ls))}_full": SST2(
        mode="ft", data="full", layers=ls, paired_with="sst2_ft_full",
        name=f"sst2_ftl{''.join(map(str, ls))}_full")
       for ls in ((0, 1, 2, 3), (1, 2, 3), (2, 3))},
    # Full fine-tuning at batch 64, paired with batch 16 by seed (the same probe start): the
    # rate model (zo_rate.py) puts the minibatch gradient's squared norm at ~110x the true
    # one's at batch 16, so a forward pass of 64 sentences should buy ~3.9x the loss
    # decrease of a pass of 16 (and ~0.97x per sentence).
    **{f"sst2_{m}_full_b64": SST2(mode=m, data="full", batch_size=64,
                                  paired_with=f"sst2_{m}_full", name=f"sst2_{m}_full_b64")
       for m in ("ft", "lora")},
    # LoRA with the probe head frozen ("nh"), on every layer or on layers 1-3 only: the
    # head holds a fifth of LoRA's curvature and a twentieth of its gradient.
    **{f"sst2_lora{'' if ls is None else 'l' + ''.join(map(str, ls))}nh_full": SST2(
        mode="lora", data="full", layers=ls, head=False, paired_with="sst2_lora_full",
        name=f"sst2_lora{'' if ls is None else 'l' + ''.join(map(str, ls))}nh_full")
       for ls in (None, (1, 2, 3))},
}


def main() -> None:
  import argparse
  import json

  p = argparse.ArgumentParser(description="Task utilities (measure SST-2 truncation).")
  p.add_argument("--truncation", action="store_true",
                 help="print the share of SST-2 sentences cut at several lengths")
  a = p.parse_args()
  if a.truncation:
    print(json.dumps(truncation(), indent=1))


if __name__ == "__main__":
  main()
