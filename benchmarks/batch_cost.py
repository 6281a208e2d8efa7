"""What a forward pass costs at each batch size: MiniLM-L6 full fine-tuning, MeZO steps.

A zeroth-order step costs a fixed number of forward passes whatever the batch, and on SST-2
at batch 16 the minibatch gradient's squared norm is ~110x the true gradient's
(``experiments/choose/zo_rate.py --batch-sizes``), so a larger batch buys almost
proportionally more loss decrease per forward pass and about the same per sentence. Whether
it buys more per *second* is this table: the median wall time of a MeZO step (the lean step
of ``hz.make_train_step``, params and state donated) at each batch size, and per sentence,
relative to the smallest batch. On CPU cores a step costs about its sentences; on an
accelerator that a small batch leaves idle it should cost much less than that.

Every row is all-MiniLM-L6-v2 (real weights; ``--tiny``: a 2-layer random BERT, for tests)
with mean pooling and a 2-way head, every parameter trained, ``B`` rows of ``--length``
tokens (random token ids: the cost does not depend on them; 48 is where SST-2 batches of 64
land after padding to 16-token buckets).

    python benchmarks/batch_cost.py [--batches 16 32 64 128 256] [--length 48] \\
        [--repeats 7] [--out benchmarks/results/batch_cost.json]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from common import machine, quartiles, time_calls, write_json  # noqa: E402
from flax import nnx  # noqa: E402

import hizoo_jax as hz  # noqa: E402
from hizoo_jax.models import bert, heads, peft  # noqa: E402

LR, MU = 1e-5, 1e-3
TINY = bert.BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2,
                       num_attention_heads=4, intermediate_size=128,
                       max_position_embeddings=128)


def model(tiny: bool):
  """``(params, frozen, loss_fn, vocab, description)``."""
  if tiny:
    encoder = bert.BertModel(TINY, rngs=nnx.Rngs(0))
    what = "2-layer BERT, hidden 64 (random init)"
  else:
    encoder = bert.from_pretrained(bert.minilm_path())
    what = "all-MiniLM-L6-v2 (pretrained weights)"
  clf = heads.SequenceClassifier(encoder, encoder.config.hidden_size, 2, pooling="mean")
  graphdef, params, frozen = peft.split_trainable(clf, "ft")
  loss_fn = peft.make_loss_fn(graphdef, lambda m, i, am, y: heads.cross_entropy(m(i, am), y))
  return params, frozen, loss_fn, encoder.config.vocab_size, what


def row(params, frozen, loss_fn, vocab, rows, length, repeats):
  """Median and quartiles of a MeZO step at ``rows`` x ``length`` (seconds)."""
  k1, k2 = jax.random.split(jax.random.key(rows))
  ids = jax.random.randint(k1, (rows, length), 1, vocab, jnp.int32)
  mask = jnp.ones((rows, length), jnp.int32)
  labels = jax.random.randint(k2, (rows,), 0, 2, jnp.int32)
  tx = hz.mezo(LR, mu=MU)
  step = hz.make_train_step(tx, loss_fn)
  # the step donates its params: each row steps its own copy
  box = {"p": jax.tree.map(jnp.copy, params)}
  box["s"] = tx.init(box["p"])

  def call():
    box["p"], box["s"], loss = step(box["p"], box["s"], frozen, ids, mask, labels)
    loss.block_until_ready()

  _, times = time_calls(call, repeats=repeats, warmup=2)
  passes = int(hz.forward_passes(box["s"])) // (repeats + 2)
  return quartiles(times), passes


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--batches", type=int, nargs="+", default=[16, 32, 64, 128, 256])
  ap.add_argument("--length", type=int, default=48)
  ap.add_argument("--repeats", type=int, default=7)
  ap.add_argument("--tiny", action="store_true", help="a 2-layer random BERT (tests)")
  ap.add_argument("--out", default=None, help="write the rows (JSON)")
  a = ap.parse_args(argv)
  params, frozen, loss_fn, vocab, what = model(a.tiny)
  n = sum(x.size for x in jax.tree.leaves(params))
  print(f"{what}, {n:,} params trained, MeZO steps of {a.length} tokens a row, "
        f"median of {a.repeats} after 2 warm-up ({machine()['device']})", flush=True)
  print("| batch | step (s), quartiles | forward passes a step | s per sentence | step "
        f"relative to batch {a.batches[0]} | per sentence |")
  print("|---|---|---|---|---|---|")
  rows = []
  for b in a.batches:
    (q1, med, q3), passes = row(params, frozen, loss_fn, vocab, b, a.length, a.repeats)
    rows.append(dict(batch=b, step_s=med, q1=q1, q3=q3, passes_per_step=passes,
                     s_per_sentence=med / b))
    base = rows[0]
    print(f"| {b} | {med:.4g} ({q1:.4g}-{q3:.4g}) | {passes} | {med / b:.3g} | "
          f"{med / base['step_s']:.2f}x | "
          f"{(med / b) / base['s_per_sentence']:.2f}x |", flush=True)
  if a.out:
    write_json(a.out, dict(model=what, params=n, length=a.length, repeats=a.repeats,
                           machine=machine(), rows=rows))
  return rows


if __name__ == "__main__":
  main()
