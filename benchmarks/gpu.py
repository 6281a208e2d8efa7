"""The step-cost table of every method on real models: one command, for a GPU (or a CPU).

For each model and each method (the zeroth-order methods by their public names, each built
as ``hz.<name>(1e-7)`` at its defaults and stepped by ``hz.make_train_step``, plus a
first-order ``adam`` baseline: ``jax.value_and_grad`` + ``optax.adam`` in one jitted
function with params and optimizer state donated) it measures:

* time: the step timed alternately with the jitted forward pass (the loss of the same
  batch), after 2 warm-up pairs; the median and quartiles of the per-pair ratios step /
  forward, and the median milliseconds of each;
* compiled memory: ``memory_analysis()`` of the step's executable (arguments + outputs -
  aliased + temporaries) over that of the jitted forward pass;
* live memory (GPU only): ``peak_bytes_in_use`` of the device, in a fresh child process per
  (model, method) that builds the model and runs 3 steps, over the same in an
  inference-only child that runs 3 forward passes (the peak is cumulative per process,
  hence one process each). On a CPU ``memory_stats()`` is None and the column reads n/a.

Models: ``minilm``, real all-MiniLM-L6-v2 full fine-tuning in float32, batch 16 x 32 tokens
(built as in ``benchmarks/minilm_speed.py``); ``llama1b``, a TinyLlama-1.1B-shaped Llama
decoder (random init: the weights do not change the cost), bfloat16 params, full
fine-tuning, next-token cross-entropy on random token ids, batch 4 x 256
(``--llama-batch``, ``--llama-length``); ``tiny``, ``llama.tiny_config()`` in float32,
batch 2 x 16, for tests and smoke runs. Each method gets its own copy of the params (the
step donates them). A method that fails (out of memory, say) gets a row saying so and the
run goes on. The learning rate is tiny so that nothing diverges while it is timed.

    python benchmarks/gpu.py [--models minilm llama1b] [--methods mezo hizoo ...]
                             [--repeats 9] [--out benchmarks/results/gpu.json]

Default models: minilm and llama1b on a GPU, minilm alone on a CPU (llama1b runs there when
asked, slowly). Prints a Markdown table and writes JSON with the machine's description.
CI never has a GPU: ``experiments/tests/test_gpu_benchmark.py`` runs the ``tiny`` model on the CPU.
Where one call has a time limit (a lent device: 10 minutes a command), build the table in
parts with ``--append``, e.g. ``--models minilm``, then ``--models llama1b --methods mezo
hizoo hizoo_l adam --append``, then the other methods with ``--append``.
GPU memory is not preallocated (``XLA_PYTHON_CLIENT_PREALLOCATE=false`` unless set), so
that the child processes find the device free while this process holds its own arrays.
On a busy CPU, OpenBLAS's threads (LAPACK's QR, which ``zo_muon`` calls every step) can fight
XLA's for the cores and make that row hundreds of times slower: ``OPENBLAS_NUM_THREADS=1``.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import subprocess
import sys

# Before JAX makes its GPU client: the children of the live-memory column need the device.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import minilm_speed  # noqa: E402
import optax  # noqa: E402
from common import (  # noqa: E402
    compiled_peak,
    machine,
    quartiles,
    run_child,
    time_paired,
    write_json,
)
from flax import nnx  # noqa: E402

import hizoo_jax as hz  # noqa: E402
from hizoo_jax.models import bert, heads, llama, peft  # noqa: E402

LR = 1e-7
ZO_METHODS = ("mezo", "hizoo", "hizoo_l", "fzoo", "sparse_mezo", "forward_gradient", "lozo",
              "subzero", "zo_muon")
# FZOO's 8 probes and ZO-Muon's 4 in one vmapped forward pass (make_train_step's
# batch_probes): for accelerators; on 2 CPU cores it does not pay (FZOO on MiniLM 10.4
# forward passes against 9.8 sequential).
BATCHED = ("fzoo_batched", "zo_muon_batched")
# Settings other than a method's defaults, by row name -> (method, options): ZO-Muon at
# the rank hz.presets.measured("zo_muon", "sst2_ft") holds (rank 16, 4 probes).
# A "restore" option goes to make_train_step, not to the method: the bfloat16 decoder's
# default step (restore="exact", theta + c mu D formed where the forward pass reads it)
# against the in-place one, and MiniLM's float32 default (in place) against the exact one.
VARIANTS: dict[str, tuple[str, dict]] = {
    "zo_muon_r16": ("zo_muon", {"rank": 16}),
    "mezo_inplace": ("mezo", {"restore": "inplace"}),
    "hizoo_inplace": ("hizoo", {"restore": "inplace"}),
    "mezo_exact": ("mezo", {"restore": "exact"}),
    "hizoo_exact": ("hizoo", {"restore": "exact"}),
}
METHODS = ZO_METHODS + tuple(VARIANTS) + BATCHED + ("adam",)


def resolve(method: str) -> tuple[str, dict]:
  """The ``hz`` function of a row and its options beyond that function's defaults."""
  name = method.removesuffix("_batched")
  return VARIANTS.get(name, (name, {}))
MODELS = ("minilm", "llama1b", "tiny")
# TinyLlama-1.1B's shape.
LLAMA_1B = llama.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                             num_hidden_layers=22, num_attention_heads=32,
                             num_key_value_heads=4, max_position_embeddings=2048,
                             rms_norm_eps=1e-5)
LIVE_CALLS = 3


class Model:
  """A model ready to step: trainable ``params``, ``batch`` (frozen state first) and
  ``loss_fn(params, *batch)``, and a description ``info``."""

  def __init__(self, params, batch, loss_fn, info):
    self.params, self.batch, self.loss_fn, self.info = params, batch, loss_fn, info


def next_token_loss(model, ids, mask):
  """Mean next-token cross-entropy (float32) over the real tokens."""
  logits = model.logits(model(ids, mask))[:, :-1].astype(jnp.float32)
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, ids[:, 1:])
  w = mask[:, 1:].astype(jnp.float32)
  return jnp.sum(nll * w) / jnp.maximum(jnp.sum(w), 1.0)


def build(name, llama_batch=4, llama_length=256):
  """The model ``name`` of :data:`MODELS`."""
  if name == "minilm":
    encoder = bert.from_pretrained(bert.minilm_path())
    clf = heads.SequenceClassifier(encoder, encoder.config.hidden_size, 2, pooling="mean")
    graphdef, params, frozen = peft.split_trainable(clf, "ft")
    loss_fn = peft.make_loss_fn(graphdef,
                                lambda m, i, am, y: heads.cross_entropy(m(i, am), y))
    ids, mask, labels = minilm_speed.batch(bert.load_tokenizer(bert.minilm_path()))
    batch = (frozen, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32),
             jnp.asarray(labels, jnp.int32))
    info = dict(description="all-MiniLM-L6-v2 (pretrained weights), mean pooling + 2-way "
                "head, full fine-tuning", dtype="float32",
                batch=[minilm_speed.BATCH, minilm_speed.LENGTH])
  elif name in ("llama1b", "tiny"):
    if name == "llama1b":
      cfg, dtype, shape = LLAMA_1B, jnp.bfloat16, (llama_batch, llama_length)
      what = "TinyLlama-1.1B-shaped Llama decoder (random init), full fine-tuning"
    else:
      cfg, dtype, shape = llama.tiny_config(), jnp.float32, (2, 16)
      what = "llama.tiny_config() (random init), full fine-tuning"
    model = llama.LlamaForCausalLM(cfg, param_dtype=dtype, dtype=dtype, rngs=nnx.Rngs(0))
    graphdef, params, frozen = peft.split_trainable(model, "ft")
    del model
    loss_fn = peft.make_loss_fn(graphdef, next_token_loss)
    ids = jax.random.randint(jax.random.key(1), shape, 0, cfg.vocab_size, jnp.int32)
    batch = (frozen, ids, jnp.ones(shape, jnp.int32))
    info = dict(description=what + ", next-token cross-entropy on random token ids",
                dtype=jnp.dtype(dtype).name, batch=list(shape))
  else:
    raise ValueError(f"unknown model {name!r}; choose from {MODELS}")
  leaves = jax.tree.leaves(params)
  info.update(params=int(sum(x.size for x in leaves)),
              param_bytes=int(sum(x.nbytes for x in leaves)))
  return Model(params, batch, loss_fn, info)


def make_step(method, loss_fn):
  """``(tx, step)``: the optimizer and its jitted, donating ``step(params, state, *batch)
  -> (params, state, loss)`` (with a ``.lower``)."""
  if method == "adam":
    tx = optax.adam(LR)

    def adam_step(params, state, *batch):
      loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
      updates, state = tx.update(grads, state, params)
      return optax.apply_updates(params, updates), state, loss

    return tx, jax.jit(adam_step, donate_argnums=(0, 1))
  if method not in METHODS:
    raise ValueError(f"unknown method {method!r}; choose from {METHODS}")
  fn, opts = resolve(method)
  opts = dict(opts)
  restore = opts.pop("restore", "auto")
  tx = getattr(hz, fn)(LR, **opts)
  return tx, hz.make_train_step(tx, loss_fn, batch_probes=method in BATCHED, restore=restore)


def measure(model, method, forward, repeats):
  """Times and compiled memory of one method's step on ``model`` (a row of the table)."""
  params = jax.tree.map(jnp.copy, model.params)
  tx, step = make_step(method, model.loss_fn)
  state = tx.init(params)
  # Compiled before the first call: the call then reuses this executable.
  step_bytes = compiled_peak(step.lower(params, state, *model.batch).compile())
  box = {"p": params, "s": state, "loss": None}
  del params, state

  def call():
    box["p"], box["s"], box["loss"] = step(box["p"], box["s"], *model.batch)
    jax.block_until_ready((box["p"], box["loss"]))

  t_step, t_fwd, ratios = time_paired(call, forward, repeats=repeats, warmup=2)
  return dict(step_ms=t_step * 1e3, forward_ms=t_fwd * 1e3, ratio=list(quartiles(ratios)),
              ratios=ratios, compiled_step_bytes=step_bytes, loss=float(box["loss"]))


def child(spec, llama_batch, llama_length):
  """One fresh process: builds the model, runs ``LIVE_CALLS`` forward passes (method
  ``inference``) or steps, and prints the device's peak bytes in use as JSON."""
  name, method = spec.split(":")
  model = build(name, llama_batch, llama_length)
  if method == "inference":
    fwd = jax.jit(model.loss_fn)
    for _ in range(LIVE_CALLS):
      loss = fwd(model.params, *model.batch)
      loss.block_until_ready()
  else:
    tx, step = make_step(method, model.loss_fn)
    params, state = model.params, tx.init(model.params)
    model.params = None  # donated to the step
    for _ in range(LIVE_CALLS):
      params, state, loss = step(params, state, *model.batch)
      jax.block_until_ready((params, loss))
  stats = jax.devices()[0].memory_stats() or {}
  print(json.dumps(dict(spec=spec, peak=stats.get("peak_bytes_in_use"),
                        loss=float(loss))))


def live_memory_available():
  stats = jax.devices()[0].memory_stats()
  return bool(stats) and "peak_bytes_in_use" in stats


def live_peak(name, method, args):
  """Peak device bytes of a child process, or an error string."""
  try:
    r = run_child(os.path.abspath(__file__), "--child", f"{name}:{method}",
                  "--llama-batch", str(args.llama_batch), "--llama-length",
                  str(args.llama_length))
  except subprocess.CalledProcessError as e:
    lines = (e.stderr or "").strip().splitlines()
    last = lines[-1][:160].replace("|", "/") if lines else f"exit status {e.returncode}"
    return "failed: " + last
  return r["peak"] if r.get("peak") else "failed: no device memory stats in the child"


def human(n):
  for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
    if n >= size:
      return f"{n / size:.1f} {unit}"
  return f"{n} B"


def format_row(r):
  if r.get("error"):
    return f"| {r['model']} | {r['method']} | failed: {r['error']} | | | | |"
  q = r["ratio"]
  comp = (f"{r['compiled_ratio']:.2f} ({human(r['compiled_step_bytes'])} / "
          f"{human(r['compiled_forward_bytes'])})")
  live = r.get("live_ratio")
  if live is not None:
    live = f"{live:.2f} ({human(r['live_step_bytes'])} / {human(r['live_inference_bytes'])})"
  else:
    live = r.get("live_error") or "n/a"
  return (f"| {r['model']} | {r['method']} | {r['step_ms']:.1f} | {r['forward_ms']:.1f} | "
          f"**{q[1]:.2f}** ({q[0]:.2f}-{q[2]:.2f}) | {comp} | {live} |")


def run_model(name, methods, args, live, on_row=None):
  """Every method's row for one model; ``on_row(info, rows)`` after each row (the JSON is
  written as the table grows, so that a call cut off by a time limit keeps its rows)."""
  inference_peak = live_peak(name, "inference", args) if live else None
  model = build(name, args.llama_batch, args.llama_length)
  info = dict(model.info)
  print(f"\n{name}: {info['description']}; {info['params'] / 1e6:.1f}M params "
        f"({human(info['param_bytes'])}, {info['dtype']}), batch {info['batch'][0]} x "
        f"{info['batch'][1]} tokens", flush=True)
  print("\n| model | method | step ms | forward ms | step / forward (quartiles) | "
        "compiled memory step / forward | live peak / inference peak |")
  print("|---|---|---|---|---|---|---|", flush=True)
  fwd = jax.jit(model.loss_fn)
  fwd_bytes = compiled_peak(fwd.lower(model.params, *model.batch).compile())
  info["compiled_forward_bytes"] = fwd_bytes
  if isinstance(inference_peak, str):
    info["live_inference_error"] = inference_peak
  else:
    info["live_inference_bytes"] = inference_peak

  def forward():
    fwd(model.params, *model.batch).block_until_ready()

  rows = []
  for method in methods:
    row = dict(model=name, method=method, opts=resolve(method)[1], lr=LR)
    try:
      row.update(measure(model, method, forward, args.repeats))
      row.update(compiled_forward_bytes=fwd_bytes,
                 compiled_ratio=row["compiled_step_bytes"] / fwd_bytes)
    except Exception as e:  # noqa: BLE001 - a failed method is a row of the table
      first = (str(e).strip().splitlines() or [""])[0][:160].replace("|", "/")
      row["error"] = f"{type(e).__name__}: {first}" if first else type(e).__name__
    gc.collect()
    if live and not row.get("error"):
      peak = live_peak(name, method, args)
      if isinstance(peak, str):
        row["live_error"] = peak
      elif isinstance(inference_peak, str):
        row.update(live_step_bytes=peak, live_error="inference child " + inference_peak)
      else:
        row.update(live_step_bytes=peak, live_inference_bytes=inference_peak,
                   live_ratio=peak / inference_peak)
    rows.append(row)
    print(format_row(row), flush=True)
    if on_row is not None:
      on_row(info, rows)
  return info, rows


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--models", nargs="+", choices=MODELS, default=None,
                  help="default: minilm llama1b on a GPU, minilm on a CPU")
  ap.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
  ap.add_argument("--repeats", type=int, default=9)
  ap.add_argument("--out", default="benchmarks/results/gpu.json")
  ap.add_argument("--llama-batch", type=int, default=4)
  ap.add_argument("--llama-length", type=int, default=256)
  ap.add_argument("--no-live", action="store_true",
                  help="skip the live-memory children (GPU)")
  ap.add_argument("--append", action="store_true",
                  help="merge into an existing --out: rows of other (model, method) pairs are "
                       "kept, so that several shorter calls build one table")
  ap.add_argument("--child", help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.child:
    child(args.child, args.llama_batch, args.llama_length)
    return None
  backend = jax.default_backend()
  models = args.models or (["minilm", "llama1b"] if backend == "gpu" else ["minilm"])
  live = live_memory_available() and not args.no_live
  mach = machine()
  print(f"step cost on {mach['device']} ({backend}), jax {mach['jax']}, hizoo-jax "
        f"{hz.__version__}; lr {LR}, {args.repeats} timed pairs after 2 warm-up pairs; "
        f"live memory: {'measured' if live else 'n/a (no device memory stats)'}")
  out = dict(machine=mach, version=hz.__version__, lr=LR, repeats=args.repeats, warmup=2,
             live_memory=live, models={}, rows=[])
  kept = []
  if args.append and os.path.exists(args.out):
    with open(args.out) as fh:
      prev = json.load(fh)
    if prev.get("machine", {}).get("device") != mach["device"]:
      raise SystemExit(f"--append: {args.out} was measured on {prev['machine'].get('device')}, "
                       f"not {mach['device']}")
    now = {(m, meth) for m in models for meth in args.methods}
    kept = [r for r in prev.get("rows", []) if (r["model"], r["method"]) not in now]
    out["models"] = dict(prev.get("models", {}))
  for name in models:

    def on_row(info, rows, name=name):
      write_json(args.out, dict(out, models=dict(out["models"], **{name: info}),
                                rows=kept + out["rows"] + rows))

    info, rows = run_model(name, args.methods, args, live, on_row)
    out["models"][name] = info
    out["rows"].extend(rows)
  out["rows"] = kept + out["rows"]
  if kept:
    print("\nThe whole table (rows of earlier calls included):\n")
    print("| model | method | step ms | forward ms | step / forward (quartiles) | "
          "compiled memory step / forward | live peak / inference peak |")
    print("|---|---|---|---|---|---|---|")
    for r in sorted(out["rows"], key=lambda r: (r["model"], METHODS.index(r["method"]))):
      print(format_row(r))
  failed = [f"{r['model']}/{r['method']}" for r in out["rows"] if r.get("error")]
  if any(m != "minilm" for m in models):
    print("\nThe Llama models are randomly initialised: the cost of a step does not depend "
          "on the weights.")
  if failed:
    print(f"failed: {', '.join(failed)}")
  if any(not math.isfinite(r.get("loss", 0.0)) for r in out["rows"]):
    print("warning: a non-finite loss after timing (see the JSON rows' loss)")
  print(f"wrote {args.out}")
  return out


if __name__ == "__main__":
  main()
