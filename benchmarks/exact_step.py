"""The exact step against the in-place step: time in forward passes and kernels per pass.

Model: a MiniLM-L6-shaped BERT (6 layers, hidden 384, intermediate 1536, vocab 30522:
22.7M params, random init) with mean pooling and a 2-way head, full fine-tuning, batch
16 x 32 tokens, in float32 and in bfloat16. For each dtype and method it compiles the
default step's two restores (``restore="exact"``: theta is never written until the update,
each measuring pass forms ``theta + c mu D`` where the forward pass reads it;
``restore="inplace"``: the passes move theta itself) and reports:

* time: the forward pass, the exact step and the in-place step called in turn, ``repeats``
  rounds after 2 warm-up rounds, in one process; the median (quartiles) of each step's
  per-round ratio to that round's forward pass, and of exact / in place;
* kernels per pass over the params, from the compiled HLO: the kernels (fusions, custom
  calls and other non-trivial instructions) of the step's loop body, its conditionals'
  largest branch counted, minus those of the jitted forward pass: what one measuring pass
  launches beyond its forward pass;
* compiled temporaries beyond the forward pass's, in params-worths.

    python benchmarks/exact_step.py [--methods mezo hizoo] [--dtypes float32 bfloat16]
                                    [--repeats 7] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from common import machine, quartiles, write_json  # noqa: E402
from flax import nnx  # noqa: E402

import hizoo_jax as hz  # noqa: E402
from hizoo_jax.models import bert, heads, peft  # noqa: E402

MINILM = bert.BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                         intermediate_size=1536)
BATCH, LENGTH = 16, 32
RESTORES = ("exact", "inplace")
# Instructions that launch nothing: bookkeeping of buffers and control flow.
_FREE = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "while",
         "conditional", "call", "after-all", "opt-barrier", "partition-id", "replica-id"}


def build(dtype):
  encoder = bert.BertModel(MINILM, dtype=dtype, param_dtype=dtype, rngs=nnx.Rngs(0))
  clf = heads.SequenceClassifier(encoder, MINILM.hidden_size, 2, pooling="mean",
                                 param_dtype=dtype)
  graphdef, params, frozen = peft.split_trainable(clf, "ft")
  params = jax.tree.map(lambda x: x.astype(dtype), params)
  loss_fn = peft.make_loss_fn(
      graphdef, lambda m, i, am, y: heads.cross_entropy(m(i, am), y).astype(jnp.float32))
  ids = jax.random.randint(jax.random.key(2), (BATCH, LENGTH), 1, MINILM.vocab_size)
  batch = (frozen, ids, jnp.ones((BATCH, LENGTH), jnp.int32),
           jnp.zeros((BATCH,), jnp.int32))
  return params, batch, loss_fn


def computations(hlo: str) -> dict[str, list[str]]:
  """The instructions (``name = shape op(...)`` lines) of each computation of an HLO text."""
  out, name = {}, None
  for line in hlo.splitlines():
    head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
    if head and not line.startswith(" "):
      name = "ENTRY" if line.startswith("ENTRY") else head.group(1)
      out[name] = []
    elif name is not None and line.startswith("  ") and " = " in line:
      out[name].append(line.strip())
  return out


def _op(instr: str) -> str:
  rhs = instr.split(" = ", 1)[1]
  m = re.search(r"\s([a-z][\w\-]*)\(", rhs)
  return m.group(1) if m else ""


def kernels(comps, name: str) -> int:
  """Kernels one run of computation ``name`` launches (a conditional: its largest branch;
  a call: its callee; a while: its body once)."""
  n = 0
  for instr in comps[name]:
    op = _op(instr)
    if op == "conditional":
      branches = re.search(r"branch_computations=\{([^}]*)\}", instr)
      names = [b.strip().lstrip("%") for b in branches.group(1).split(",")] if branches else \
          [x.lstrip("%") for x in re.findall(r"(?:true|false)_computation=(%?[\w.\-]+)", instr)]
      n += max(kernels(comps, b) for b in names)
    elif op == "call":
      n += kernels(comps, re.search(r"to_apply=%?([\w.\-]+)", instr).group(1))
    elif op == "while":
      n += kernels(comps, re.search(r"body=%?([\w.\-]+)", instr).group(1))
    elif op not in _FREE:
      n += 1
  return n


def loop_body_kernels(hlo: str) -> int:
  """Kernels of the step's main loop body (the while with the most kernels in ENTRY)."""
  comps = computations(hlo)
  bodies = [re.search(r"body=%?([\w.\-]+)", i).group(1)
            for i in comps["ENTRY"] if _op(i) == "while"]
  return max(kernels(comps, b) for b in bodies)


def transient(compiled) -> int:
  m = compiled.memory_analysis()
  return m.temp_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes


def run(dtype, method, repeats):
  params, batch, loss_fn = build(dtype)
  nbytes = sum(x.nbytes for x in jax.tree.leaves(params))
  fwd = jax.jit(loss_fn)
  fwd_c = fwd.lower(params, *batch).compile()
  fwd_kernels = kernels(computations(fwd_c.as_text()), "ENTRY")
  tx = getattr(hz, method)(1e-7)
  row = dict(dtype=jnp.dtype(dtype).name, method=method, param_bytes=nbytes,
             forward_kernels=fwd_kernels)
  carry, steps = {}, {}
  for restore in RESTORES:
    step = hz.make_train_step(tx, loss_fn, restore=restore)
    p = jax.tree.map(jnp.copy, params)
    s = tx.init(p)
    c = step.lower(p, s, *batch).compile()
    row[f"{restore}_extra"] = (transient(c) - transient(fwd_c)) / nbytes
    row[f"{restore}_kernels_per_pass"] = loop_body_kernels(c.as_text()) - fwd_kernels
    carry[restore], steps[restore] = (p, s), step

  def call(restore):
    p, s = carry[restore]
    p, s, loss = steps[restore](p, s, *batch)
    carry[restore] = (p, s)
    jax.block_until_ready(loss)

  times = {k: [] for k in ("forward",) + RESTORES}
  for r in range(repeats + 2):
    t = time.perf_counter()
    jax.block_until_ready(fwd(params, *batch))
    tf = time.perf_counter() - t
    for restore in RESTORES:
      t = time.perf_counter()
      call(restore)
      if r >= 2:
        times[restore].append(time.perf_counter() - t)
    if r >= 2:
      times["forward"].append(tf)
  for restore in RESTORES:
    row[f"{restore}_passes"] = quartiles([a / b for a, b in
                                          zip(times[restore], times["forward"], strict=True)])
  row["exact_over_inplace"] = quartiles([a / b for a, b in
                                         zip(times["exact"], times["inplace"], strict=True)])
  row["forward_ms"] = statistics.median(times["forward"]) * 1e3
  return row


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--methods", nargs="+", default=["mezo", "hizoo"])
  ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
  ap.add_argument("--repeats", type=int, default=7)
  ap.add_argument("--out", default=None)
  args = ap.parse_args(argv)
  out = dict(machine=machine(), load=os.getloadavg(), repeats=args.repeats, rows=[])
  print(f"{jax.default_backend()}, load {os.getloadavg()[0]:.1f}; median (quartiles) of "
        f"{args.repeats} rounds")
  print("| params | method | exact: forward passes | in place | exact / in place | kernels "
        "per pass exact / in place | temporaries over forward exact / in place |")
  print("|---|---|---|---|---|---|---|")
  for dtype in args.dtypes:
    for method in args.methods:
      row = run(jnp.dtype(dtype), method, args.repeats)
      out["rows"].append(row)
      q = lambda k, row=row: f"{row[k][1]:.2f} ({row[k][0]:.2f}-{row[k][2]:.2f})"  # noqa: E731
      print(f"| {dtype} | {method} | {q('exact_passes')} | {q('inplace_passes')} | "
            f"{q('exact_over_inplace')} | {row['exact_kernels_per_pass']} / "
            f"{row['inplace_kernels_per_pass']} | {row['exact_extra']:.3f} / "
            f"{row['inplace_extra']:.3f} |", flush=True)
  if args.out:
    write_json(args.out, out)
  return out


if __name__ == "__main__":
  main()
