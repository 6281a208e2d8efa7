"""Zeroth-order fine-tuning of a decoder-only LM (Llama layout) from a Hugging Face checkpoint.

What it shows: the Flax NNX Llama (``hizoo_jax.models.llama``) loading a Hugging Face
checkpoint directory (``config.json`` + safetensors, sharded or not), fine-tuned with HiZOO /
HiZOO-L / MeZO / ZO-Adam (forward passes only) or Adam, in full, LoRA or prefix mode, on
prompt-based sentiment classification as in MeZO: ``"<sentence> It was"`` followed by the
label word ``" terrible"``/``" great"``, scored by the LM's next-token logits at the last
token. Data as in ``finetune_minilm.py`` (``--data`` GLUE SST-2, else the SYNTHETIC set in
``examples/data/sentiment``). The training loop, checkpoints and outputs are the ones of
``finetune_minilm.py`` (imported from it).

GPU-sized use (not run in CI): any Llama-layout checkpoint with a ``tokenizer.json``, e.g.
Llama-3.2-1B, TinyLlama-1.1B, SmolLM2, Qwen2.5 (``attention_bias``)::

    pip install -e ".[cuda,examples]"
    python examples/finetune_lm.py --model /path/to/Llama-3.2-1B --dtype bfloat16 \\
        --mode lora --optimizer hizoo,mezo --steps 2000 --batch-size 16 --max-length 64

ZO training keeps no activations or gradients, so memory is close to inference: the bf16
weights, the LoRA/prefix params, and (HiZOO) one float32 Hessian per trainable param.

CI runs ``--smoke``: a tiny random Llama written to a temporary checkpoint with
``llama.save_pretrained`` and read back with ``llama.from_pretrained``, a UTF-8 byte
tokenizer, a few steps (about 20 s on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import finetune_minilm as shared  # noqa: E402  (the shared training loop)

from hizoo_jax.models import data, heads, llama, peft  # noqa: E402

DEFAULT_LR = {"ft": 1e-5, "lora": 1e-3, "prefix": 1e-2}
DEFAULT_MU = {"ft": 1e-3, "lora": 1e-2, "prefix": 1e-1}


def load(args, seed: int):
  """(classifier, tokenize, bos ids, pad id) for ``--model`` (or a tiny random smoke model)."""
  dtype = jnp.dtype(args.dtype)
  model = llama.from_pretrained(args.model, param_dtype=dtype, dtype=dtype)
  tok_file = os.path.join(args.model, "tokenizer.json")
  if os.path.isfile(tok_file):
    from tokenizers import Tokenizer

    tokenize = data.hf_tokenize(Tokenizer.from_file(tok_file))
    words = [" " + w for w in args.label_words.split(",")]
  else:
    if model.config.vocab_size < 259:
      raise ValueError(f"{args.model} has no tokenizer.json and a vocabulary too small for the "
                       "byte tokenizer")
    print("no tokenizer.json: using the UTF-8 byte tokenizer (random-weight smoke runs only)")
    tokenize = data.byte_tokenize
    words = args.label_words.split(",")
  rngs = nnx.Rngs(seed)
  if args.mode == "lora":
    peft.apply_lora(model, rank=args.lora_rank, alpha=args.lora_alpha, rngs=rngs)
  elif args.mode == "prefix":
    peft.add_prefix(model, num_tokens=args.prefix_tokens, rngs=rngs)
  clf = heads.LabelWordClassifier(model, data.label_token_ids(tokenize, words), position="last")
  bos = [] if model.config.bos_token_id is None else [model.config.bos_token_id]
  pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
  return clf, tokenize, bos, pad


def write_smoke_model(directory: str) -> str:
  """A random tiny Llama saved as a Hugging Face checkpoint (vocab 512 fits bytes)."""
  model = llama.LlamaForCausalLM(llama.tiny_config(), rngs=nnx.Rngs(0))
  llama.save_pretrained(model, directory)
  return directory


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--model", default=None, help="Hugging Face checkpoint directory (Llama layout)")
  p.add_argument("--dtype", default="float32", help="params/compute dtype: float32, bfloat16")
  p.add_argument("--mode", choices=peft.MODES, default="lora")
  p.add_argument("--optimizer", default="hizoo",
                 help=f"comma-separated list of {', '.join(shared.OPTIMIZERS)}")
  p.add_argument("--objective", choices=sorted(heads.OBJECTIVES), default="ce")
  p.add_argument("--seeds", default="0")
  p.add_argument("--data", default=None, help="GLUE SST-2 directory (default: synthetic set)")
  p.add_argument("--steps", type=int, default=1000)
  p.add_argument("--batch-size", type=int, default=16)
  p.add_argument("--max-length", type=int, default=64)
  p.add_argument("--lr", type=float, default=None)
  p.add_argument("--mu", type=float, default=None)
  p.add_argument("--alpha", type=float, default=1e-2, help="HiZOO hessian_smoothing")
  p.add_argument("--estimator", choices=("paper", "unbiased"), default="paper")
  p.add_argument("--lora-rank", type=int, default=8)
  p.add_argument("--lora-alpha", type=float, default=16.0)
  p.add_argument("--prefix-tokens", type=int, default=5)
  p.add_argument("--template", default=" It was")
  p.add_argument("--label-words", default="terrible,great")
  p.add_argument("--eval-every", type=int, default=200)
  p.add_argument("--window", type=int, default=50)
  p.add_argument("--target-loss", default=None, help="comma-separated loss levels")
  p.add_argument("--out", default="outputs/finetune_lm")
  p.add_argument("--ckpt-dir", default=None)
  p.add_argument("--save-every", type=int, default=200)
  p.add_argument("--resume", action="store_true")
  p.add_argument("--no-progress", action="store_true")
  p.add_argument("--smoke", action="store_true", help="tiny random model, a few steps (CI)")
  args = p.parse_args(argv)

  optimizers = shared.parse_list(args.optimizer)
  for name in optimizers:
    if name not in shared.OPTIMIZERS:
      p.error(f"unknown optimizer {name!r}")
  tmp = None
  if args.smoke:
    if args.model is None:
      tmp = tempfile.TemporaryDirectory()
      args.model = write_smoke_model(os.path.join(tmp.name, "tiny-llama"))
    args.steps, args.batch_size, args.eval_every = min(args.steps, 6), 4, 3
    args.save_every, args.window, args.max_length = 3, 2, min(args.max_length, 48)
  if args.model is None:
    p.error("--model is required (or --smoke)")
  sets = data.load_sst2(args.data or shared.SYNTHETIC)
  if args.smoke:
    sets = {k: (s[:16], y[:16]) for k, (s, y) in sets.items()}
  runs: dict[str, list[dict]] = {}
  objective = heads.objective(args.objective)
  for name in optimizers:
    lr = args.lr if args.lr is not None else DEFAULT_LR[args.mode]
    mu = args.mu if args.mu is not None else DEFAULT_MU[args.mode]
    for seed in shared.parse_list(args.seeds, int):
      clf, tokenize, bos, pad = load(args, seed)

      def encode(sentences, labels, tokenize=tokenize, bos=bos, pad=pad):
        ids, mask = data.encode_prompts(tokenize, sentences, suffix=args.template,
                                        max_length=args.max_length, bos=bos, pad_id=pad)
        return ids, mask, np.asarray(labels, np.int32)

      graphdef, params, frozen = peft.split_trainable(clf, args.mode)
      del clf
      loss_fn = peft.make_loss_fn(graphdef, lambda m, i, am, y: objective(m(i, am), y))
      tx = shared.make_optimizer(name, lr, mu=mu, alpha=args.alpha, seed=seed,
                                 estimator=args.estimator)
      desc = f"{name} seed {seed}"
      n_train = sum(x.size for x in jax.tree.leaves(params))
      print(f"{desc}: lr={lr:g} mu={mu:g}, {n_train:,} trainable params", flush=True)
      ckpt = os.path.join(args.ckpt_dir, f"{name}_seed{seed}") if args.ckpt_dir else None
      run = shared.train(name=name, tx=tx, loss_fn=loss_fn, graphdef=graphdef, params=params,
                         frozen=frozen, train_set=encode(*sets["train"]),
                         eval_set=encode(*sets["dev"]), steps=args.steps,
                         batch_size=args.batch_size, seed=seed, eval_every=args.eval_every,
                         ckpt_dir=ckpt, save_every=args.save_every, resume=args.resume,
                         show_progress=not args.no_progress, desc=desc)
      run.update(seed=seed, lr=lr, mu=mu, trainable_params=n_train)
      f = run["final"]
      print(f"{desc}: final eval accuracy {f['accuracy']:.3f} ce {f['ce']:.4f}; "
            f"{run['sec_per_step']:.3f} s/step", flush=True)
      runs.setdefault(name, []).append(run)
  title = f"{os.path.basename(os.path.normpath(args.model))} {args.mode}, batch {args.batch_size}"
  targets = shared.parse_list(args.target_loss, float) if args.target_loss else None
  print(shared.write_outputs(args.out, runs, args, args.window, targets, title))
  print(f"wrote {args.out}/loss_curve.png, results.json, results.md")
  if tmp is not None:
    tmp.cleanup()


if __name__ == "__main__":
  main()
