"""HiZOO full fine-tuning of real MiniLM-L6 in bfloat16 against float32.

The same run twice (same seed, data and noise): the params in float32, then in bfloat16
(the forward pass in bfloat16 too, the loss reduced in float32). Full fine-tuning of all
MiniLM weights and a zero-initialised linear head on mean-pooled features, on 512 GLUE
SST-2 training sentences, batch 16, 32 tokens. Reports the training loss (mean of the last
50 steps and of the first 10), the median of H and the mu in use.

    python experiments/bf16/minilm.py [--data ../shared/data/sst2] [--steps 200]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

import hizoo_jax as hz
from hizoo_jax.models import bert, data, heads, peft

HERE = os.path.dirname(os.path.abspath(__file__))


def batches(ids, mask, labels, batch, seed):
  rng = np.random.default_rng(seed)
  while True:
    order = rng.permutation(len(labels))
    for i in range(0, len(order) - batch + 1, batch):
      j = order[i:i + batch]
      yield ids[j], mask[j], labels[j]


def run(dtype, args, ids, mask, labels):
  path = bert.minilm_path()
  model = bert.from_pretrained(path, param_dtype=dtype)
  clf = heads.SequenceClassifier(model, model.config.hidden_size, 2, param_dtype=dtype)
  graphdef, params, frozen = peft.split_trainable(clf, "ft")
  loss = lambda m, i, k, y: heads.cross_entropy(m(i, k).astype(jnp.float32), y)  # noqa: E731
  loss_fn = peft.make_loss_fn(graphdef, loss)
  tx = hz.hizoo(args.lr, mu=1e-3, hessian_smoothing=args.alpha, seed=0)
  state = tx.init(params)
  step = hz.make_train_step(tx, loss_fn)
  losses, t0 = [], time.perf_counter()
  it = batches(ids, mask, labels, 16, 0)
  for _ in range(args.steps):
    i, k, y = next(it)
    params, state, value = step(params, state, frozen, jnp.asarray(i), jnp.asarray(k),
                                jnp.asarray(y))
    losses.append(float(value))
  h = np.concatenate([np.ravel(np.asarray(v, np.float32))
                      for v in jax.tree.leaves(hz.get_hessian(state))])
  return dict(dtype=str(jnp.dtype(dtype)), final_loss=float(np.mean(losses[-50:])),
              first_loss=float(np.mean(losses[:10])), median_h=float(np.median(h)),
              mu=float(state[0].hyper["mu"]),
              seconds_per_step=(time.perf_counter() - t0) / args.steps)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--data", default=os.path.join(HERE, "..", "..", "..", "shared", "data",
                                                 "sst2"))
  ap.add_argument("--steps", type=int, default=200)
  ap.add_argument("--lr", type=float, default=1e-4)
  ap.add_argument("--alpha", type=float, default=1e-3)
  args = ap.parse_args()
  sents, labels = data.load_sst2(args.data)["train"]
  sents, labels = list(sents[:512]), np.asarray(labels[:512])
  tok = bert.load_tokenizer(bert.minilm_path())
  cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
  ids, mask = data.encode_prompts(data.hf_tokenize(tok), sents, max_length=32,
                                  bos=[cls_id], eos=[sep_id])
  out = {}
  for dtype in (jnp.float32, jnp.bfloat16):
    out[str(jnp.dtype(dtype))] = r = run(dtype, args, ids, mask, labels)
    print(json.dumps(r), flush=True)
  f32, b16 = out["float32"], out["bfloat16"]
  out["ratios"] = dict(loss=b16["final_loss"] / f32["final_loss"],
                       median_h=b16["median_h"] / f32["median_h"])
  print(json.dumps(out["ratios"]))
  with open(os.path.join(HERE, "minilm.json"), "w") as fh:
    json.dump(dict(settings=vars(args), runs=out), fh, indent=1)


if __name__ == "__main__":
  main()
