"""Sentiment data for the examples: GLUE SST-2 TSV files and prompt encoding.

* :func:`read_glue_tsv` / :func:`load_sst2` read the GLUE SST-2 layout (``train.tsv`` and
  ``dev.tsv``, a ``sentence<TAB>label`` header, label 1 = positive).
* :func:`encode_prompts` turns sentences into fixed-length, right-padded id arrays with a
  prompt template appended (``"<sentence> It was [MASK]."``), truncating the sentence,
  never the template.
* :func:`batch_indices` gives minibatch ``step`` of a seeded shuffle (resumable).
* :func:`k_shot_split` samples MeZO's k-shot protocol from a training set: ``k`` examples
  per class for training and a disjoint, class-balanced validation split, by seed.
* :func:`whole_sentences` picks the rows of GLUE's ``train.tsv`` that are sentences, not
  the parse-tree phrases it mostly holds, to draw k-shot sets that look like the test.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable, Sequence

import numpy as np

Tokenize = Callable[[str], list[int]]


def read_glue_tsv(path: str | os.PathLike) -> tuple[list[str], np.ndarray]:
  """``(sentences, labels)`` of a GLUE single-sentence TSV (a ``sentence`` and a ``label``
  column, header first; other columns are ignored)."""
  with open(path, newline="", encoding="utf-8") as fh:
    reader = csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)
    header = next(reader, None)
    if header is None or "sentence" not in header or "label" not in header:
      raise ValueError(f"{os.fspath(path)!r}: expected a header with 'sentence' and 'label', "
                       f"got {header!r}")
    si, li = header.index("sentence"), header.index("label")
    sentences, labels = [], []
    for n, row in enumerate(reader, start=2):
      if not row:
        continue
      if len(row) <= max(si, li):
        raise ValueError(f"{os.fspath(path)!r} line {n}: expected {len(header)} columns")
      sentences.append(row[si])
      labels.append(int(row[li]))
  return sentences, np.asarray(labels, np.int32)


def load_sst2(directory: str | os.PathLike) -> dict[str, tuple[list[str], np.ndarray]]:
  """``{"train": ..., "dev": ...}`` from a GLUE SST-2 directory (``train.tsv``, ``dev.tsv``)."""
  out = {}
  for split in ("train", "dev"):
    path = os.path.join(os.fspath(directory), f"{split}.tsv")
    if not os.path.isfile(path):
      raise FileNotFoundError(f"no {split}.tsv in {os.fspath(directory)!r} (GLUE SST-2 layout)")
    out[split] = read_glue_tsv(path)
  return out


def hf_tokenize(tokenizer) -> Tokenize:
  """``text -> ids`` without special tokens, for a ``tokenizers.Tokenizer``."""
  return lambda text: tokenizer.encode(text, add_special_tokens=False).ids


def byte_tokenize(text: str, offset: int = 3) -> list[int]:
  """UTF-8 bytes shifted by ``offset`` (ids 0..2 left for pad/bos/eos): a tokenizer for
  random-weight smoke tests of models with ``vocab_size >= 256 + offset``."""
  return [offset + b for b in text.encode("utf-8")]


def label_token_ids(tokenize: Tokenize, words: Sequence[str]) -> list[int]:
  """The first token of each label word; they must be distinct."""
  ids = []
  for word in words:
    toks = tokenize(word)
    if not toks:
      raise ValueError(f"label word {word!r} tokenizes to nothing")
    ids.append(toks[0])
  if len(set(ids)) != len(ids):
    raise ValueError(f"label words {list(words)} share their first token ({ids}); pick others")
  return ids


def encode_prompts(
    tokenize: Tokenize,
    sentences: Sequence[str],
    *,
    suffix: str = "",
    max_length: int = 64,
    bos: Sequence[int] = (),
    eos: Sequence[int] = (),
    pad_id: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
  """``bos + sentence + suffix + eos`` as ``(ids, mask)`` int32 ``[n, max_length]``.

  The sentence is cut to fit, so the template (e.g. ``" It was [MASK]."``) always survives.

  Args:
    tokenize: ``text -> ids`` without special tokens (see :func:`hf_tokenize`).
    sentences: the texts.
    suffix: template text appended to every sentence.
    max_length: padded length.
    bos, eos: special ids before and after (``[CLS]``/``[SEP]`` for BERT, ``<s>`` for Llama).
    pad_id: id of padding (mask 0).
  """
  tail = list(tokenize(suffix)) if suffix else []
  budget = max_length - len(bos) - len(tail) - len(eos)
  if budget < 1:
    raise ValueError(f"max_length={max_length} leaves no room for the sentence")
  ids = np.full((len(sentences), max_length), pad_id, np.int32)
  mask = np.zeros((len(sentences), max_length), np.int32)
  for i, text in enumerate(sentences):
    row = [*bos, *list(tokenize(text))[:budget], *tail, *eos]
    ids[i, : len(row)] = row
    mask[i, : len(row)] = 1
  return ids, mask


def batch_indices(num_examples: int, batch_size: int, seed: int, step: int) -> np.ndarray:
  """The example indices of minibatch ``step``: a pure function of ``(seed, step)``.

  Each epoch is a fresh permutation (``default_rng([seed, epoch])``) cut into full
  batches, so a run resumed at any step sees the same batches as an uninterrupted one.
  """
  if not 0 < batch_size <= num_examples:
    raise ValueError(f"batch_size must be in [1, {num_examples}], got {batch_size}")
  per_epoch = num_examples // batch_size
  epoch, k = divmod(int(step), per_epoch)
  perm = np.random.default_rng([int(seed), epoch]).permutation(num_examples)
  return perm[k * batch_size : (k + 1) * batch_size]


def whole_sentences(sentences: Sequence[str], *, min_words: int = 10) -> np.ndarray:
  """Indices of the rows that end with ``.``, ``!`` or ``?`` and hold ``min_words`` words.

  GLUE SST-2's ``train.tsv`` holds every phrase of SST's parse trees: its median row is 7
  words and one row in five ends a sentence, while ``dev.tsv`` (the test set) is whole
  sentences, median 19 words. A k-shot set drawn from all rows is mostly fragments
  (``"a great cast"``), so a prompt tuned on it learns a task the test never asks; drawn
  from these rows (9,845 of 67,349) its median length is the test's.
  """
  keep = [i for i, s in enumerate(sentences)
          if s.rstrip().endswith((".", "!", "?")) and len(s.split()) >= min_words]
  return np.asarray(keep, np.int64)


def k_shot_split(labels: Sequence[int] | np.ndarray, k: int, seed: int, *,
                 val_per_class: int | None = None,
                 pool: Sequence[int] | np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
  """Indices of a k-shot training set and a disjoint validation set, sampled by ``seed``.

  MeZO's (and LM-BFF's) few-shot protocol: ``k`` examples of each class are drawn without
  replacement from the full training set for training, ``val_per_class`` (default ``k``)
  more of each class for model selection, and the official dev set serves as the test set.
  The draw is a pure function of ``(labels, k, seed, val_per_class, pool)``.

  Args:
    labels: the class of every training example.
    k: training examples per class.
    seed: the sampling seed.
    val_per_class: validation examples per class (default ``k``; 0 for none).
    pool: the indices to draw from (default all), e.g. :func:`whole_sentences`.

  Returns:
    ``(train_idx, val_idx)``, each sorted, int64.
  """
  y = np.asarray(labels)
  v = k if val_per_class is None else int(val_per_class)
  if k < 1 or v < 0:
    raise ValueError(f"k_shot_split: need k >= 1 and val_per_class >= 0, got {k}, {v}")
  allowed = np.ones(len(y), bool)
  if pool is not None:
    idx = np.asarray(pool, np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= len(y)):
      raise ValueError(f"k_shot_split: pool indices must lie in [0, {len(y)})")
    allowed[:] = False
    allowed[idx] = True
  rng = np.random.default_rng([int(seed), 0x5EED])
  train, val = [], []
  for c in np.unique(y):
    rows = np.flatnonzero((y == c) & allowed)
    if len(rows) < k + v:
      raise ValueError(f"k_shot_split: class {c} has {len(rows)} examples, need {k + v}")
    pick = rng.permutation(rows)[: k + v]
    train.append(pick[:k])
    val.append(pick[k:])
  return np.sort(np.concatenate(train)), np.sort(np.concatenate(val))
