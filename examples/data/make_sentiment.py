"""Writes the small synthetic sentiment set that ships with the fine-tuning examples.

    python examples/data/make_sentiment.py      # rewrites examples/data/sentiment/*.tsv

The sentences are SYNTHETIC: movie-review-like sentences built from templates, with
hand-picked positive and negative adjectives, some negations ("is not dull": positive) and
some contrasts ("..., but the ending is hollow": the clause after "but" decides). They are
not real reviews and not SST-2; they exist so that the examples and the tests run offline.
The files use the GLUE SST-2 layout (``sentence<TAB>label`` with a header, label 1 =
positive), so the same loader reads them and real SST-2. Deterministic (seeded).
"""

from __future__ import annotations

import os
import random

SUBJECTS = [
    "the movie", "this film", "the acting", "the script", "the soundtrack", "the ending",
    "the cast", "the dialogue", "the cinematography", "the plot", "the sequel", "the story",
    "every scene", "the lead performance", "the direction", "the humor", "the final act",
    "the premise", "the pacing", "the characters",
]
POSITIVE = [
    "wonderful", "moving", "brilliant", "delightful", "gripping", "charming", "superb",
    "heartfelt", "hilarious", "stunning", "clever", "beautiful", "memorable", "fresh",
    "touching", "engaging", "witty", "masterful", "uplifting", "powerful", "inventive",
    "joyful", "thrilling", "elegant",
]
NEGATIVE = [
    "dull", "boring", "clumsy", "tedious", "lifeless", "predictable", "awful", "forgettable",
    "bland", "painful", "messy", "shallow", "pointless", "stale", "tiresome", "incoherent",
    "lazy", "grating", "dreary", "hollow", "sloppy", "joyless", "confusing", "cheap",
]
ADVERBS = ["", "truly ", "utterly ", "remarkably ", "rather ", "simply ", "quite ", "so "]
NOUNS = ["film", "movie", "story", "performance", "experience", "comedy", "drama", "thriller"]


def _adj(rng: random.Random, label: int) -> str:
  return rng.choice(POSITIVE if label else NEGATIVE)


def sentence(rng: random.Random) -> tuple[str, int]:
  """One synthetic sentence and its label (1 positive, 0 negative)."""
  label = rng.randint(0, 1)
  kind = rng.random()
  s1, s2 = rng.sample(SUBJECTS, 2)
  if kind < 0.25:
    text = f"{s1} is {rng.choice(ADVERBS)}{_adj(rng, label)}."
  elif kind < 0.40:
    text = f"what a {_adj(rng, label)} {rng.choice(NOUNS)}!"
  elif kind < 0.55:
    a, b = rng.sample(POSITIVE if label else NEGATIVE, 2)
    text = f"i found {s1} {a} and {b}."
  elif kind < 0.70:
    text = f"{s1} was {_adj(rng, label)}, and {s2} was even more {_adj(rng, label)}."
  elif kind < 0.85:  # negation flips the adjective's polarity
    text = f"{s1} is not {rng.choice(ADVERBS[:1] + ['at all ', 'really '])}{_adj(rng, 1 - label)}."
  else:  # contrast: the clause after "but" decides
    text = f"{s1} is {_adj(rng, 1 - label)}, but {s2} is {_adj(rng, label)}."
  return text[0].upper() + text[1:], label


def make(n_train: int = 384, n_dev: int = 192, seed: int = 0):
  """``(train, dev)`` lists of unique ``(sentence, label)``, disjoint."""
  rng = random.Random(seed)
  seen: set[str] = set()
  rows: list[tuple[str, int]] = []
  while len(rows) < n_train + n_dev:
    text, label = sentence(rng)
    if text not in seen:
      seen.add(text)
      rows.append((text, label))
  return rows[:n_train], rows[n_train:]


def write_tsv(path: str, rows) -> None:
  with open(path, "w") as fh:
    fh.write("sentence\tlabel\n")
    for text, label in rows:
      fh.write(f"{text}\t{label}\n")


def main() -> None:
  out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sentiment")
  os.makedirs(out, exist_ok=True)
  train, dev = make()
  write_tsv(os.path.join(out, "train.tsv"), train)
  write_tsv(os.path.join(out, "dev.tsv"), dev)
  print(f"wrote {len(train)} train and {len(dev)} dev sentences to {out}")


if __name__ == "__main__":
  main()
