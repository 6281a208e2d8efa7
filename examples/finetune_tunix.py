"""Zeroth-order LoRA fine-tuning of a Tunix LLM with Tunix's own trainer.

What it shows: a Tunix model (Qwen 3 or Llama 3, Flax NNX) read from a Hugging Face
checkpoint directory, qwix LoRA on the query and value projections (MeZO's choice), and
``hizoo_jax.integrations.tunix.ZOPeftTrainer``, Tunix's ``PeftTrainer`` with the library's
lean zeroth-order step, fine-tuning it with any method of the library (HiZOO, HiZOO-L,
MeZO, FZOO, Sparse MeZO, forward gradients, LOZO, SubZero, ZO-Muon) or ZO-Adam, each at
its defaults but for the learning rate (``DEFAULT_LR``; ``adam`` runs Tunix's own
first-order ``PeftTrainer`` for comparison). The task is MeZO's prompt-based
SST-2: ``"<sentence> It was"``, scored by the next-token logits of the label words
``" terrible"``/``" great"`` at the last token; ``--data`` is a GLUE SST-2 directory, else
the synthetic set in ``examples/data/sentiment`` (a stand-in that runs offline, not a
benchmark). The last line printed is ``loss A -> B``: the dev-set loss before and after.

    pip install -e ".[tunix]"
    python examples/finetune_tunix.py --model /path/to/Qwen3-0.6B --data /path/to/SST-2 \\
        --optimizer hizoo --steps 2000 --dtype bfloat16

Tunix 0.1.7's attention uses RoPE theta 1e6 whatever the checkpoint says and has no llama3
RoPE scaling (tests/test_tunix.py measures it), so the script refuses checkpoints with
another RoPE (every Llama 3.x: use ``examples/finetune_lm.py`` and
``hizoo_jax.models.llama`` for those); Qwen 3's dense checkpoints use 1e6.

``--smoke`` (CI): a tiny random Qwen 3 of Tunix's class, the UTF-8 byte tokenizer, 100
steps on 32 training examples whose loss is the one printed (seconds on a CPU).
``--size 1b``: a random-weight Llama 3.2 1B configuration (what a GPU run measures: step
time and memory do not depend on the weights). ``--gpu-table`` runs the whole GPU table,
one fresh process per row (for a clean memory peak): first-order Adam, MeZO, HiZOO and
HiZOO-L on the 1B configuration in bfloat16, LoRA rank 8, batch 16 x 64
tokens; writes ``<out>/gpu_table.md`` and ``.json``::

    pip install -e ".[cuda,tunix]" && python examples/finetune_tunix.py --gpu-table
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import qwix
from flax import nnx
from tunix.models.llama3 import model as llama3
from tunix.models.llama3 import params as llama3_params
from tunix.models.qwen3 import model as qwen3
from tunix.models.qwen3 import params as qwen3_params
from tunix.sft import hooks, peft_trainer
from tunix.sft import utils as tunix_utils

import hizoo_jax as hz
from hizoo_jax.integrations.tunix import ZOPeftTrainer
from hizoo_jax.models import data

HERE = os.path.dirname(os.path.abspath(__file__))
SYNTHETIC = os.path.join(HERE, "data", "sentiment")
# The methods of the library at their defaults, by their hz names.
METHODS = ("fzoo", "sparse_mezo", "forward_gradient", "lozo", "subzero", "zo_muon")
OPTIMIZERS = ("hizoo", "hizoo_l", "mezo", *METHODS, "zo_adam", "adam")
LORA_TARGETS = ".*q_proj|.*v_proj"
TUNIX_ROPE_THETA = 1_000_000  # what Tunix 0.1.7's Llama 3 and Qwen 3 attention use


def make_optimizer(name: str, lr: float, mu: float, seed: int) -> optax.GradientTransformation:
  """The optimizer called ``name``; the ZO ones draw their noise from ``seed``."""
  if name == "hizoo":
    return hz.hizoo(lr, mu=mu, hessian_smoothing=1e-2, seed=seed)
  if name == "hizoo_l":
    return hz.hizoo_l(lr, mu=mu, hessian_smoothing=1e-2, seed=seed)
  if name == "mezo":
    return hz.mezo(lr, mu=mu, seed=seed)
  if name == "forward_gradient":
    return hz.forward_gradient(lr, seed=seed)
  if name in METHODS:
    return getattr(hz, name)(lr, mu=mu, seed=seed)
  if name == "zo_adam":
    return optax.chain(hz.scale_by_zo(mu=mu, seed=seed), optax.adam(lr))
  if name == "adam":
    return optax.adam(lr)
  raise ValueError(f"unknown optimizer {name!r}; one of {OPTIMIZERS}")


# ----------------------------------------------------------------------------------------
# Models.


def _hf_config(path: str) -> dict:
  with open(os.path.join(path, "config.json")) as fh:
    return json.load(fh)


def _check_rope(c: dict, path: str) -> None:
  rope = dict(c.get("rope_parameters") or c.get("rope_scaling") or {})
  theta = rope.get("rope_theta", c.get("rope_theta"))
  kind = rope.get("rope_type", rope.get("type", "default"))
  if theta != TUNIX_ROPE_THETA or kind != "default":
    raise ValueError(
        f"{path}: RoPE theta {theta}, type {kind!r}; Tunix 0.1.7's attention computes RoPE "
        f"with theta {TUNIX_ROPE_THETA:g} and no scaling, so it would misread this checkpoint "
        "(use examples/finetune_lm.py, whose hizoo_jax.models.llama reads it right)")


def load_checkpoint(path: str, dtype) -> nnx.Module:
  """A Tunix Qwen 3 or Llama 3 from a Hugging Face checkpoint directory."""
  c = _hf_config(path)
  _check_rope(c, path)
  common = dict(num_layers=c["num_hidden_layers"], vocab_size=c["vocab_size"],
                embed_dim=c["hidden_size"], hidden_dim=c["intermediate_size"],
                num_heads=c["num_attention_heads"], num_kv_heads=c["num_key_value_heads"],
                head_dim=c.get("head_dim", c["hidden_size"] // c["num_attention_heads"]),
                rope_theta=TUNIX_ROPE_THETA, norm_eps=c["rms_norm_eps"])
  tied = bool(c.get("tie_word_embeddings", False))
  if c["model_type"] == "qwen3":
    cfg = qwen3.ModelConfig(**common, use_tied_embedding=tied, dtype=dtype, param_dtype=dtype)
    return qwen3_params.create_model_from_safe_tensors(path, cfg, dtype=dtype)
  if c["model_type"] == "llama":
    cfg = llama3.ModelConfig(**common, weight_tying=tied)
    return llama3_params.create_model_from_safe_tensors(path, cfg, dtype=dtype)
  raise ValueError(f"{path}: model_type {c['model_type']!r}; this example reads qwen3 or llama")


def random_model(size: str, dtype) -> nnx.Module:
  """``"tiny"``: a Qwen 3 with 2 layers of width 64 (vocabulary 320: the byte tokenizer);
  ``"1b"``: Tunix's Llama 3.2 1B configuration (1.24B params), random weights."""
  if size == "tiny":
    cfg = qwen3.ModelConfig(num_layers=2, vocab_size=320, embed_dim=64, hidden_dim=128,
                            num_heads=4, head_dim=16, num_kv_heads=2,
                            rope_theta=TUNIX_ROPE_THETA, norm_eps=1e-6, dtype=dtype,
                            param_dtype=dtype)
    return qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))
  cfg = llama3.ModelConfig.llama3p2_1b()

  @nnx.jit
  def build():  # on the device, in its dtype: no float32 copy of 1B params on the host
    model = llama3.Llama3(cfg, rngs=nnx.Rngs(0))
    state = nnx.state(model)
    nnx.update(model, jax.tree.map(lambda x: x.astype(dtype), state))
    return model

  return build()


def apply_lora(model: nnx.Module, rank: int, alpha: float, seed: int) -> nnx.Module:
  provider = qwix.LoraProvider(module_path=LORA_TARGETS, rank=rank, alpha=alpha)
  dummy = dict(input_tokens=jnp.ones((1, 4), jnp.int32), positions=jnp.ones((1, 4), jnp.int32),
               cache=None, attention_mask=jnp.ones((1, 4, 4), bool))
  return qwix.apply_lora_to_model(model, provider, rngs=nnx.Rngs(seed), **dummy)


# ----------------------------------------------------------------------------------------
# The task: prompt-based SST-2 scored at the last token.


def tokenizer_for(path: str | None, vocab_size: int):
  tok_file = os.path.join(path, "tokenizer.json") if path else ""
  if os.path.isfile(tok_file):
    from tokenizers import Tokenizer

    return data.hf_tokenize(Tokenizer.from_file(tok_file)), [" terrible", " great"]
  if vocab_size < 259:
    raise ValueError("no tokenizer.json and a vocabulary too small for the byte tokenizer")
  return data.byte_tokenize, ["terrible", "great"]  # distinct first bytes


def make_loss_fn(label_ids: list[int]):
  """Cross-entropy of the label words' logits at each row's last token (Tunix calls it
  as ``loss_fn(model, **gen_model_input(batch))``)."""
  words = jnp.asarray(label_ids)

  def loss_fn(model, input_tokens, input_mask, positions, attention_mask, labels):
    logits, _ = model(input_tokens, positions, None, attention_mask)
    last = jnp.sum(input_mask, axis=1) - 1
    scores = logits[jnp.arange(logits.shape[0]), last][:, words].astype(jnp.float32)
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(scores, labels))

  return loss_fn


def gen_model_input(batch: dict) -> dict:
  mask = jnp.asarray(batch["input_mask"], bool)
  return dict(input_tokens=batch["input_tokens"], input_mask=batch["input_mask"],
              positions=tunix_utils.build_positions_from_mask(mask),
              attention_mask=tunix_utils.make_causal_attn_mask(mask),
              labels=batch["labels"])


def encode(tokenize, sentences, labels, max_length: int) -> dict:
  ids, mask = data.encode_prompts(tokenize, sentences, suffix=" It was", max_length=max_length)
  return {"input_tokens": ids, "input_mask": mask, "labels": np.asarray(labels, np.int32)}


def train_batches(train: dict, batch_size: int, seed: int, steps: int):
  n = len(train["labels"])
  for step in range(steps):
    idx = data.batch_indices(n, batch_size, seed, step)
    yield {k: v[idx] for k, v in train.items()}


class StepTimer(hooks.TrainingHooks):
  """Wall time at the end of each step (Tunix reads the previous step's loss there, so the
  device has finished it)."""

  def __init__(self):
    self.times: list[float] = []

  def on_train_start(self, trainer):
    pass

  def on_train_end(self, trainer):
    pass

  def on_train_step_start(self, trainer):
    pass

  def on_train_step_end(self, trainer, train_step, train_loss):
    self.times.append(time.perf_counter())

  def on_eval_step_start(self, trainer):
    pass

  def on_eval_step_end(self, trainer, eval_loss):
    pass


def mean_loss(loss_fn, model, sets: list[dict]) -> float:
  f = nnx.jit(lambda m, b: loss_fn(m, **gen_model_input(b)))
  return float(np.mean([float(f(model, b)) for b in sets]))


def run(args) -> dict:
  dtype = jnp.dtype(args.dtype)
  if args.model:
    model = load_checkpoint(args.model, dtype)
  else:
    model = random_model("tiny" if args.smoke else args.size, dtype)
  vocab = model.config.vocab_size
  tokenize, words = tokenizer_for(args.model, vocab)
  label_ids = data.label_token_ids(tokenize, words)
  model = apply_lora(model, args.lora_rank, args.lora_alpha, args.seed)
  n_lora = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.LoRAParam)))
  n_all = sum(x.size for x in jax.tree.leaves(nnx.state(model)))

  sets = data.load_sst2(args.data or SYNTHETIC)
  if args.smoke:  # learn a small train set: its loss is the one measured (a random model
    # has no features that carry sentiment to a dev set in a few steps)
    sets = {k: (sets["train"][0][:32], sets["train"][1][:32]) for k in ("train", "dev")}
  train = encode(tokenize, *sets["train"], args.max_length)
  dev_s, dev_y = sets["dev"]
  dev_s, dev_y = dev_s[: args.eval_examples], dev_y[: args.eval_examples]
  dev = encode(tokenize, dev_s, dev_y, args.max_length)
  dev_batches = [{k: v[i:i + args.batch_size] for k, v in dev.items()}
                 for i in range(0, len(dev_y), args.batch_size)]

  loss_fn = make_loss_fn(label_ids)
  before = mean_loss(loss_fn, model, dev_batches)
  tx = make_optimizer(args.optimizer, args.lr, args.mu, args.seed)
  cfg = peft_trainer.TrainingConfig(
      eval_every_n_steps=max(args.steps, 1), max_steps=args.steps,
      checkpoint_root_directory=args.ckpt_dir,
      pbar_description=None if args.no_progress else f"{args.optimizer}")
  cls = peft_trainer.PeftTrainer if args.optimizer == "adam" else ZOPeftTrainer
  trainer = cls(model, tx, cfg).with_gen_model_input_fn(gen_model_input)
  trainer = trainer.with_loss_fn(loss_fn)
  timer = StepTimer()
  trainer.with_training_hooks(timer)
  trainer.train(train_batches(train, args.batch_size, args.seed, args.steps))
  after = mean_loss(loss_fn, model, dev_batches)

  dev0 = jax.local_devices()[0]
  stats = dev0.memory_stats() or {}
  skip = min(3, len(timer.times) - 2)  # compilation is in the first steps
  per_step = (float(np.median(np.diff(timer.times[skip:]))) if len(timer.times) > skip + 1
              else float("nan"))
  # The forward passes the zeroth-order run executed (None for first-order Adam): methods
  # differ in passes per step (MeZO 2, HiZOO 3), so compare them by these, not by steps.
  passes = hz.forward_passes(nnx.as_pure(trainer.optimizer.opt_state))
  return dict(optimizer=args.optimizer, device=dev0.device_kind, dtype=args.dtype,
              params=int(n_all), lora_params=int(n_lora), steps=args.steps,
              batch_size=args.batch_size, max_length=args.max_length,
              forward_passes=None if passes is None else int(passes),
              sec_per_step=per_step, peak_bytes=stats.get("peak_bytes_in_use"),
              loss_before=before, loss_after=after)


# No method was tuned on this task: MeZO's rate for every zeroth-order method but FZOO and
# ZO-Muon, whose steps are normalised (their measured MiniLM SST-2 rates are 10x and 1000x
# MeZO's, hz.presets.MEASURED).
DEFAULT_LR = {"hizoo": 1e-3, "hizoo_l": 1e-3, "mezo": 1e-3, "fzoo": 1e-2, "sparse_mezo": 1e-3,
              "forward_gradient": 1e-3, "lozo": 1e-3, "subzero": 1e-3, "zo_muon": 1e-2,
              "zo_adam": 1e-3, "adam": 1e-4}
# --smoke's rates: 100 steps on 32 prompts of a tiny random model.
SMOKE_LR = {"fzoo": 3e-2, "zo_muon": 3e-2}


def gpu_table(args) -> None:
  """One fresh process per row; the rows and a markdown table under ``args.out``."""
  os.makedirs(args.out, exist_ok=True)
  rows = []
  for name in ("adam", "mezo", "hizoo", "hizoo_l"):
    path = os.path.join(args.out, f"gpu_{name}.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--size", "1b", "--dtype", "bfloat16",
           "--optimizer", name, "--steps", str(args.steps), "--batch-size", "16",
           "--max-length", "64", "--no-progress", "--json", path]
    if args.data:
      cmd += ["--data", args.data]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    with open(path) as fh:
      rows.append(json.load(fh))
  lines = [f"Tunix Llama 3.2 1B configuration (random weights, {rows[0]['params']:,} params), "
           f"bfloat16, qwix LoRA rank 8 on q/v ({rows[0]['lora_params']:,} params), batch 16 x "
           f"64 tokens, {args.steps} steps, {rows[0]['device']}.", "",
           "| trainer / optimizer | s/step (median) | forward passes | peak device memory (GiB) "
           "| loss |",
           "|---|---|---|---|---|"]
  for r in rows:
    peak = "n/a" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**30:.2f}"
    who = "PeftTrainer / adam" if r["optimizer"] == "adam" else f"ZOPeftTrainer / {r['optimizer']}"
    fp = "backprop" if r.get("forward_passes") is None else f"{r['forward_passes']:,}"
    lines.append(f"| {who} | {r['sec_per_step']:.4f} | {fp} | {peak} | "
                 f"{r['loss_before']:.4f} -> {r['loss_after']:.4f} |")
  table = "\n".join(lines) + "\n"
  with open(os.path.join(args.out, "gpu_table.md"), "w") as fh:
    fh.write(table)
  with open(os.path.join(args.out, "gpu_table.json"), "w") as fh:
    json.dump(rows, fh, indent=1)
  print(table)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--model", default=None, help="Hugging Face checkpoint directory (qwen3/llama)")
  p.add_argument("--size", choices=("tiny", "1b"), default="tiny",
                 help="random-weight model without --model")
  p.add_argument("--dtype", default="float32", help="params/compute dtype: float32, bfloat16")
  p.add_argument("--optimizer", choices=OPTIMIZERS, default="hizoo")
  p.add_argument("--data", default=None, help="GLUE SST-2 directory (default: synthetic set)")
  p.add_argument("--steps", type=int, default=1000)
  p.add_argument("--batch-size", type=int, default=16)
  p.add_argument("--max-length", type=int, default=64)
  p.add_argument("--eval-examples", type=int, default=256)
  p.add_argument("--lr", type=float, default=None)
  p.add_argument("--mu", type=float, default=1e-2)
  p.add_argument("--lora-rank", type=int, default=8)
  p.add_argument("--lora-alpha", type=float, default=16.0)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--ckpt-dir", default=None, help="Tunix checkpoints (resumes from the last)")
  p.add_argument("--out", default="outputs/finetune_tunix")
  p.add_argument("--json", default=None, help="write the run's figures here")
  p.add_argument("--no-progress", action="store_true")
  p.add_argument("--smoke", action="store_true", help="tiny random Qwen 3, a few steps (CI)")
  p.add_argument("--gpu-table", action="store_true",
                 help="the GPU table: Adam, MeZO, HiZOO, HiZOO-L on the 1B configuration")
  args = p.parse_args(argv)
  if args.gpu_table:
    args.steps = min(args.steps, 50)
    return gpu_table(args)
  if args.smoke:
    args.steps, args.batch_size, args.max_length = min(args.steps, 100), 16, 48
    args.eval_examples, args.no_progress = 32, True
    args.lr = SMOKE_LR.get(args.optimizer, 0.3) if args.lr is None else args.lr
  if args.lr is None:
    args.lr = DEFAULT_LR[args.optimizer]
  r = run(args)
  if args.json:
    with open(args.json, "w") as fh:
      json.dump(r, fh, indent=1)
  fp = ("" if r["forward_passes"] is None
        else f", {r['forward_passes']:,} forward passes in {r['steps']} steps")
  print(f"{r['optimizer']}: {r['params']:,} params, {r['lora_params']:,} LoRA params trained, "
        f"{r['sec_per_step']:.4f} s/step on {r['device']}{fp}")
  print(f"loss {r['loss_before']:.4f} -> {r['loss_after']:.4f}")


if __name__ == "__main__":
  main()
