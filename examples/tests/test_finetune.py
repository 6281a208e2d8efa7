"""The fine-tuning examples in their --smoke modes (subprocesses, CPU, temporary outputs)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import requires_minilm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_example(script, *args, timeout=900):
  env = dict(os.environ, JAX_PLATFORMS="cpu", MPLBACKEND="Agg")
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  out = subprocess.run([sys.executable, os.path.join("examples", script), "--smoke",
                        "--no-progress", *args], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=timeout)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  return out.stdout


def load_example(name):
  """examples/<name>.py as a module (its ``main`` not run)."""
  import importlib.util

  spec = importlib.util.spec_from_file_location(f"{name}_example",
                                                os.path.join(ROOT, "examples", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def results(out_dir):
  with open(os.path.join(out_dir, "results.json")) as fh:
    return json.load(fh)


def check_outputs(out_dir, optimizers, steps=6):
  """The three output files, the runs by optimizer, ``steps`` finite losses each."""
  for name in ("loss_curve.png", "results.json", "results.md"):
    assert os.path.getsize(os.path.join(out_dir, name)) > 0
  res = results(out_dir)
  assert list(res["runs"]) == optimizers
  for name in optimizers:
    (run,) = res["runs"][name]
    assert len(run["losses"]) == steps and all(abs(x) < 10 for x in run["losses"])
    assert 0.0 <= run["final"]["accuracy"] <= 1.0
  return res


@pytest.mark.slow
@requires_minilm
def test_finetune_minilm_runs_the_new_methods_by_name_and_adam(tmp_path, capsys):
  """FZOO and LOZO by their hz names (on the synthetic set the methods of 0.4 have no
  measured default lr: outside --smoke the example asks for --lr) beside first-order Adam,
  on LoRA of two layers with a cosine schedule, 3 steps each; the saved run re-summarised."""
  out = run_example("finetune_minilm.py", "--mode", "lora", "--optimizer", "fzoo,lozo,adam",
                    "--lr", "1e-3", "--layers", "1,2", "--schedule", "cosine",
                    "--steps", "3", "--out", str(tmp_path))
  assert "synthetic set" in out and "(cosine)" in out
  assert "| fzoo |" in out and "| lozo |" in out and "| adam |" in out
  assert "head_init=zero" in out  # the synthetic set keeps the zero head (minilm.md's runs)
  res = check_outputs(str(tmp_path), ["fzoo", "lozo", "adam"], steps=3)
  # --layers 1,2: the LoRA A and B of query/value in two layers, and the 384x2 head
  assert res["runs"]["fzoo"][0]["trainable_params"] == 2 * 2 * 2 * 384 * 8 + 384 * 2 + 2
  # the state's counter, step by step: an FZOO step (8 probes) executes nine forward
  # passes; Adam (backprop) has no count and no Hessian
  assert res["runs"]["fzoo"][0]["forward_passes"] == [9, 18, 27]
  assert res["runs"]["adam"][0]["forward_passes"] is None
  assert res["runs"]["adam"][0]["hessian"] is None
  # re-summarise the saved run at other loss levels (no training, so in this process): FZOO
  # in forward passes (its first step reaches 100: 9 passes), Adam in steps
  load_example("finetune_minilm").main(["--from-results", str(tmp_path / "results.json"),
                                        "--target-loss", "100,-1"])
  table = capsys.readouterr().out
  assert "| fzoo | 9 (1/1: 9) | never (0/1: -) |" in table, table
  assert "| adam | 1 steps (1/1: 1) | never (0/1: -) |" in table, table
  assert "27 (9 a step)" in table and "3 steps (a forward and a backward pass each)" in table


@pytest.mark.parametrize("args, message", [
    (["--optimizer", "fzoo"], "pass --lr"),
    # a frozen zero head would keep the logits at zero
    (["--freeze-head"], "--freeze-head keeps a zero head at zero"),
    (["--optimizer", "adam", "--objective", "accuracy"], "differentiable"),
])
def test_finetune_minilm_refuses_what_it_cannot_run(args, message, capsys):
  """Refused from the arguments, before the model is loaded (so in this process)."""
  with pytest.raises(SystemExit) as exit_info:
    load_example("finetune_minilm").main(args)
  assert exit_info.value.code == 2
  assert message in capsys.readouterr().err


@pytest.mark.slow
@requires_minilm
def test_finetune_minilm_matches_optimizers_by_forward_passes_and_resumes_the_count(tmp_path):
  """--forward-passes 12: HiZOO (3 passes a step) runs 4 steps, MeZO (2) 6; the counts are
  the state's, step by step, and a run resumed from its step-3 checkpoint continues them
  (and its losses) bit for bit. HiZOO on LoRA of every layer at its default rate: its
  Hessian estimate is reported and positive. The resumed process runs HiZOO alone (its
  state holds the Hessian as well as the counter); MeZO's resume from step 3 with its pass
  counts: test_finetune_minilm_resumes_old_checkpoints_and_runs_of_other_lengths."""
  common = ("--mode", "lora", "--optimizer", "hizoo,mezo", "--forward-passes", "12")
  a, b = tmp_path / "a", tmp_path / "b"
  out = run_example("finetune_minilm.py", *common, "--out", str(a), "--ckpt-dir",
                    str(tmp_path / "ckpt"))
  assert "steps=4,6 " in out and "4 steps" in out and "12 forward passes" in out
  assert "synthetic set" in out and "| hizoo |" in out and "| mezo |" in out
  assert "Hessian estimate quantiles" in out
  first = results(str(a))["runs"]
  assert first["hizoo"][0]["forward_passes"] == [3, 6, 9, 12]
  assert first["mezo"][0]["forward_passes"] == [2, 4, 6, 8, 10, 12]
  # LoRA rank 8 on query/value of 6 layers + the 384x2 linear head
  assert first["hizoo"][0]["trainable_params"] == 6 * 2 * 2 * 384 * 8 + 384 * 2 + 2
  assert first["hizoo"][0]["hessian"]["min"] > 0 and first["mezo"][0]["hessian"] is None
  # checkpoints every 3 steps and at the last: drop HiZOO's last, so it resumes at 3
  assert sorted(os.listdir(tmp_path / "ckpt" / "hizoo_seed0")) == ["3", "4"]
  shutil.rmtree(tmp_path / "ckpt" / "hizoo_seed0" / "4")
  out = run_example("finetune_minilm.py", "--mode", "lora", "--optimizer", "hizoo",
                    "--forward-passes", "12", "--out", str(b), "--ckpt-dir",
                    str(tmp_path / "ckpt"), "--resume")
  assert out.count("resumed from") == 1 and out.count("at step 3") == 1
  (again,) = results(str(b))["runs"]["hizoo"]
  assert again["forward_passes"] == first["hizoo"][0]["forward_passes"]
  assert again["losses"] == first["hizoo"][0]["losses"]


@pytest.mark.parametrize("args, message", [
    (["--forward-passes", "100", "--steps", "50"], "pass one of it and --steps"),
    (["--forward-passes", "100", "--optimizer", "mezo,adam"], "run it with --steps"),
    (["--forward-passes", "0"], "must be positive"),
])
def test_finetune_minilm_forward_pass_budget_refuses(args, message, capsys):
  with pytest.raises(SystemExit) as exit_info:
    load_example("finetune_minilm").main(args)
  assert exit_info.value.code == 2
  assert message in capsys.readouterr().err


def test_finetune_minilm_passes_per_step_is_the_methods_count():
  """What --forward-passes divides by: each optimizer's own counter (HiZOO measures the
  centre and two sides, as HiZOO-L does, FZOO with 8 probes the centre and 8 one-sided
  points)."""
  example = load_example("finetune_minilm")

  def cost(name):
    return example.passes_per_step(example.make_optimizer(name, 1e-3, mu=1e-3, alpha=1e-3,
                                                          seed=0))

  assert [cost(n) for n in ("hizoo", "hizoo_l", "mezo", "fzoo", "zo_adam")] == [
      3.0, 3.0, 2.0, 9.0, 2.0]
  with pytest.raises(ValueError, match="not a zeroth-order optimizer"):
    cost("adam")


@pytest.mark.slow
@requires_minilm
def test_finetune_minilm_prefix_prompt_on_accuracy(tmp_path):
  out = run_example("finetune_minilm.py", "--mode", "prefix", "--head", "prompt",
                    "--objective", "accuracy", "--optimizer", "zo_adam", "--out", str(tmp_path))
  res = check_outputs(str(tmp_path), ["zo_adam"])
  losses = res["runs"]["zo_adam"][0]["losses"]
  # the objective is -accuracy on a batch of 4: multiples of 1/4 in [-1, 0]
  assert all(-1.0 <= x <= 0.0 and (4 * x) == round(4 * x) for x in losses), losses
  assert res["runs"]["zo_adam"][0]["trainable_params"] == 6 * 2 * 5 * 384
  assert "objective=accuracy" in out


@pytest.mark.slow
def test_finetune_lm_full_fine_tuning_and_bit_for_bit_resume_in_a_new_process(tmp_path):
  """Full fine-tuning with HiZOO, checkpoints at steps 3 and 6; drop 6, resume from 3 in a
  fresh process: the same losses, evals and Hessian. (HiZOO-L would keep dense Hessians
  here, the smoke LM's dims being below its min_dim_size_to_factor; the factored state's
  resume is tested in-process in test_models_peft.py; the example's
  HiZOO-L by name: test_finetune_minilm_passes_per_step_is_the_methods_count.)"""
  a, b, ckpt = tmp_path / "a", tmp_path / "b", tmp_path / "ckpt"
  names = ["hizoo"]
  common = ["--mode", "ft", "--optimizer", ",".join(names), "--save-every", "3",
            "--ckpt-dir", str(ckpt)]
  run_example("finetune_lm.py", *common, "--out", str(a))
  for name in names:
    assert sorted(os.listdir(ckpt / f"{name}_seed0")) == ["3", "6"]
    shutil.rmtree(ckpt / f"{name}_seed0" / "6")
  out = run_example("finetune_lm.py", *common, "--out", str(b), "--resume")
  assert out.count("resumed from") == 1 and "at step 3" in out
  ra, rb = check_outputs(str(a), names), check_outputs(str(b), names)
  for name in names:
    (x,), (y,) = ra["runs"][name], rb["runs"][name]
    assert x["trainable_params"] > 100_000  # every param of the tiny LM
    assert x["losses"] == y["losses"] and x["final"] == y["final"]
    assert x["hessian"] == y["hessian"] and x["hessian"]["min"] > 0
    assert sorted(os.listdir(ckpt / f"{name}_seed0")) == ["3", "6"]


def docs_page(page):
  with open(os.path.join(ROOT, "docs", page)) as fh:
    return fh.read()


@requires_minilm
def test_docs_flax_quickstart_runs():
  """The first example of the Flax fine-tuning guide runs as written."""
  import re

  guide = docs_page("guides/flax_finetuning.md")
  code = re.search(r"<!-- flax-quickstart -->\s*```python\n(.*?)```", guide, re.S).group(1)
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  loss = float(re.search(r"loss ([0-9.]+)", out.stdout).group(1))
  assert 0.0 < loss < 2.0
  # 6 layers x (query, value) x (A, B) + the head's kernel and bias: nothing else has a Hessian
  assert "Hessian leaves: 26" in out.stdout


SST2 = os.path.join(ROOT, "..", "shared", "data", "sst2")


@pytest.mark.slow
@requires_minilm
@pytest.mark.skipif(not os.path.isfile(os.path.join(SST2, "train.tsv")),
                    reason="needs GLUE SST-2 at ../shared/data/sst2 next to the repo")
def test_finetune_minilm_k_shot_sst2_from_a_linear_probe(tmp_path):
  """--data SST-2 --k-shot 16: the head starts as a linear probe (l2 picked on the k-shot
  validation split), so the first training losses are well below chance's ln 2; the LoRA
  learning rate is the SST-2 study's. Two steps show both."""
  out = run_example("finetune_minilm.py", "--data", SST2, "--k-shot", "16", "--steps", "2",
                    "--out", str(tmp_path))  # no --optimizer: MeZO, the default
  assert "16 per class by seed" in out and "head_init=lp" in out
  assert "linear-probe head, l2=" in out
  res = check_outputs(str(tmp_path), ["mezo"], steps=2)
  (run,) = res["runs"]["mezo"]
  assert run["probe"]["l2"] in (1e-4, 1e-3, 1e-2, 1e-1)
  assert run["lr"] == 5e-4  # the SST-2 study's MeZO LoRA lr (SST2_LR), the default with --data
  assert 0.0 <= run["probe"]["val_accuracy"] <= 1.0
  assert max(run["losses"]) < np.log(2)


def test_finetune_minilm_writes_its_results_before_it_plots(tmp_path, monkeypatch, capsys):
  """Without matplotlib the run's numbers are still written (results.json, results.md)
  and the user is told how to get the plot."""
  import argparse

  example = load_example("finetune_minilm")
  monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
  runs = {"mezo": [{"losses": [0.7, 0.6, 0.5, 0.4], "final": {"accuracy": 0.75},
                    "sec_per_step": 0.1}]}
  table = example.write_outputs(str(tmp_path), runs, argparse.Namespace(seed=0), 2, None,
                                "title")
  assert "| mezo |" in table
  assert results(str(tmp_path))["runs"]["mezo"][0]["losses"] == [0.7, 0.6, 0.5, 0.4]
  assert os.path.getsize(tmp_path / "results.md") > 0
  assert not (tmp_path / "loss_curve.png").exists()
  assert "no plot" in capsys.readouterr().err


def test_finetune_minilm_default_lr_follows_the_budget():
  """With --data, MeZO LoRA's default rate is the short-run one up to SST2_LR_LONG's step
  count and the long-run one past it; without real data, and for pairs with no long-run
  entry, the budget does not matter."""
  example = load_example("finetune_minilm")
  max_steps, long_lr = example.SST2_LR_LONG[("lora", "mezo")]
  short_lr = example.SST2_LR[("lora", "mezo")]
  assert long_lr < short_lr
  assert example.default_lr("lora", "mezo", 400, True) == short_lr
  assert example.default_lr("lora", "mezo", max_steps, True) == short_lr
  assert example.default_lr("lora", "mezo", max_steps + 1, True) == long_lr
  assert example.default_lr("lora", "mezo", 10_000, False) == example.DEFAULT_LR[("lora", "mezo")]
  assert example.default_lr("lora", "fzoo", 10_000, True) == example.SST2_LR[("lora", "fzoo")]
  # the rates the forward-pass-matched harness selected on SST-2 LoRA
  assert example.default_lr("lora", "fzoo", 400, True) == 1.78e-3
  assert example.default_lr("lora", "mezo", 400, True) == 5e-4
  assert example.default_lr("lora", "zo_adam", 400, False) == 1e-3


def test_finetune_minilm_default_steps_are_the_measured_setting():
  """Without --steps a run has the measured length of its setting (MEASURED_STEPS: FZOO on
  layers 1-3 in full fine-tuning, 2,222 steps = 19,998 forward passes; MeZO on LoRA, 10,000
  steps at the long-run rate) only in that setting on all of train with the linear-probe
  head; any other mode, optimizer, layers or head, the k-shot protocol or the synthetic set
  keeps the quick 400 steps. Evaluations come about 20 to a run, every 100 steps at least."""
  example = load_example("finetune_minilm")
  steps = example.default_steps
  assert steps("ft", ["fzoo"], True, 0, True, (1, 2, 3)) == 2_222
  assert steps("ft", ["fzoo"], True, 0, True, (3, 1, 2)) == 2_222
  assert steps("lora", ["mezo"], True, 0, True) == 10_000
  # the long LoRA default runs at the long-run rate
  assert (example.default_lr("lora", "mezo", 10_000, True)
          == example.SST2_LR_LONG[("lora", "mezo")][1])
  assert example.default_lr("ft", "fzoo", 2_222, True) == 5.62e-4
  for args in [("lora", ["mezo"], False, 0, True), ("lora", ["mezo"], True, 512, True),
               ("ft", ["mezo"], True, 0, True), ("lora", ["mezo", "hizoo"], True, 0, True),
               ("lora", ["fzoo"], True, 0, True), ("lora", ["mezo"], True, 0, False),
               ("ft", ["fzoo"], True, 0, True), ("ft", ["fzoo"], True, 0, True, (1, 2)),
               ("ft", ["fzoo"], False, 0, True, (1, 2, 3)),
               ("ft", ["fzoo"], True, 512, True, (1, 2, 3)),
               ("ft", ["fzoo", "mezo"], True, 0, True, (1, 2, 3))]:
    assert steps(*args) == example.STEPS == 400, args
  every = example.default_eval_every
  assert [every(n) for n in (6, 400, 600, 2000, 2001, 5000, 10_000)] == [
      100, 100, 100, 100, 200, 300, 500]
  assert 20 <= 10_000 // every(10_000) <= 21


def test_finetune_minilm_resumes_old_checkpoints_and_runs_of_other_lengths(tmp_path,
                                                                           monkeypatch):
  """A checkpoint written before the example kept pass counts (no "forward_passes" in it)
  still resumes: the counts of the steps before it are rebuilt from the state's counter,
  and equal those of a run that kept them (MeZO: 2 a step). A 6-step run's checkpoints
  (3 and 6) resume a 5-step run from 3 (which saves its last step) and a 9-step run from 6,
  each the same as run whole."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from hizoo_jax.models import checkpoint, heads, peft

  example = load_example("finetune_minilm")

  class Toy(nnx.Module):  # a 4-feature linear classifier standing in for the encoder
    def __init__(self):
      self.lin = nnx.Linear(4, 2, rngs=nnx.Rngs(0))

    def __call__(self, ids, mask):
      return self.lin(ids.astype(jnp.float32) * mask)

  graphdef, params, frozen = nnx.split(Toy(), nnx.Param, ...)
  loss_fn = peft.make_loss_fn(graphdef, lambda m, i, am, y: heads.cross_entropy(m(i, am), y))
  rng = np.random.default_rng(0)
  data = (rng.normal(size=(32, 4)).astype(np.float32), np.ones((32, 4), np.float32),
          rng.integers(0, 2, 32))

  def run(ckpt_dir, resume=False, steps=6):
    return example.train(name="mezo", tx=example.make_optimizer("mezo", 1e-2, mu=1e-3,
                                                                alpha=0.0, seed=0),
                         loss_fn=loss_fn, graphdef=graphdef,
                         params=jax.tree.map(jnp.copy, params), frozen=frozen,
                         train_set=data, eval_set=data, steps=steps, batch_size=8,
                         seed=0, eval_every=0, ckpt_dir=str(ckpt_dir), save_every=3,
                         resume=resume, show_progress=False)

  whole = run(tmp_path / "whole")
  assert whole["forward_passes"] == [2, 4, 6, 8, 10, 12]
  save = checkpoint.Checkpointer.save
  with monkeypatch.context() as m:  # the old example: no pass counts in its checkpoints
    m.setattr(checkpoint.Checkpointer, "save", lambda self, step, tree: save(
        self, step, {k: v for k, v in tree.items() if k != "forward_passes"}))
    run(tmp_path / "old")
  shutil.rmtree(tmp_path / "old" / "6")
  resumed = run(tmp_path / "old", resume=True)
  assert resumed["forward_passes"] == whole["forward_passes"]
  assert resumed["losses"] == whole["losses"]
  shorter = run(tmp_path / "whole", resume=True, steps=5)
  assert shorter["losses"] == whole["losses"][:5]
  assert shorter["forward_passes"] == whole["forward_passes"][:5]
  assert checkpoint.Checkpointer(tmp_path / "whole").all_steps() == [3, 5, 6]  # and the last
  longer, nine = run(tmp_path / "whole", resume=True, steps=9), run(tmp_path / "nine", steps=9)
  assert longer["losses"][:6] == whole["losses"] and longer["losses"] == nine["losses"]
  assert longer["forward_passes"] == nine["forward_passes"] == list(range(2, 20, 2))
  assert jax.tree.all(jax.tree.map(np.array_equal, longer["params"], nine["params"]))


def test_finetune_minilm_defaults_follow_the_data():
  """With --data on all of train the unset flags take the measured best setting (full
  fine-tuning, FZOO, layers 1-3: its layers only with its own mode and optimizer); without
  --data or with --k-shot, LoRA and MeZO on every layer; --layers all is every layer."""
  resolve = load_example("finetune_minilm").resolve_defaults
  assert resolve(None, None, None, True, 0) == ("ft", "fzoo", (1, 2, 3))
  assert resolve(None, None, None, False, 0) == ("lora", "mezo", None)
  assert resolve(None, None, None, True, 512) == ("lora", "mezo", None)
  assert resolve(None, None, "all", True, 0) == ("ft", "fzoo", None)
  assert resolve(None, "mezo", None, True, 0) == ("ft", "mezo", None)
  assert resolve("lora", None, None, True, 0) == ("lora", "fzoo", None)
  assert resolve("ft", "fzoo", "2,3", False, 0) == ("ft", "fzoo", (2, 3))


def test_finetune_minilm_cuts_a_batch_to_its_width_without_changing_the_loss():
  """A batch is cut to its longest sentence rounded up to 16 tokens. The columns it drops
  are padding (mask 0), which attention and mean pooling ignore, so a BERT classifier's loss
  is the same up to float32 rounding: the sums over the key and pooling axes run over
  fewer exact zeros, in another order (at most a few ulps a sum, a dozen sums deep in this
  2-layer model: relative 1e-5 is more than 10x that)."""
  from hizoo_jax.models import bert, heads, peft

  width = load_example("finetune_minilm").batch_width
  mask = np.zeros((3, 64), np.int32)
  mask[0, :5], mask[1, :17], mask[2, :2] = 1, 1, 1
  assert width(mask) == 32 and width(mask[[0, 2]]) == 16 and width(mask[[1]]) == 32
  assert width(np.ones((2, 64), np.int32)) == 64 and width(np.ones((1, 60), np.int32)) == 60

  model = bert.from_pretrained(os.path.join(ROOT, "tests", "data", "tiny_bert_mlm"))
  clf = heads.SequenceClassifier(model, model.config.hidden_size, 2, pooling="mean")
  rng = np.random.default_rng(0)
  clf.kernel[...] = rng.normal(size=clf.kernel.shape).astype(np.float32)
  graphdef, params, frozen = peft.split_trainable(clf, peft.trainable_filter("ft"))
  loss = peft.make_loss_fn(graphdef, lambda m, i, am, y: heads.cross_entropy(m(i, am), y))
  ids = rng.integers(5, 100, size=(3, 64)).astype(np.int32) * mask
  labels = np.asarray([0, 1, 1], np.int32)
  w = width(mask)
  full = float(loss(params, frozen, ids, mask, labels))
  cut = float(loss(params, frozen, ids[:, :w], mask[:, :w], labels))
  assert cut == pytest.approx(full, rel=1e-5)


@pytest.mark.slow
@requires_minilm
@pytest.mark.skipif(not os.path.isfile(os.path.join(SST2, "train.tsv")),
                    reason="needs GLUE SST-2 at ../shared/data/sst2 next to the repo")
def test_finetune_minilm_data_default_is_fzoo_on_layers_1_to_3(tmp_path):
  """--data alone: full fine-tuning of layers 1-3 and the head (5,324,162 of MiniLM's
  scalars) with FZOO, 8 probes (9 forward passes a step), at the measured 5.62e-4; all of
  train.tsv less a validation split held out by seed (here --smoke's 16 sentences: 3 held
  out), the probe's l2 picked on it. ``--steps 2`` only shortens the run (the default
  length: test_finetune_minilm_default_steps_are_the_measured_setting). (The SST-2 LoRA
  rates: the k-shot test and test_finetune_minilm_default_lr_follows_the_budget.)"""
  out = run_example("finetune_minilm.py", "--data", SST2, "--steps", "2", "--out",
                    str(tmp_path))
  assert "all of train less 3 held out by seed for validation" in out
  assert "mode=ft layers=1,2,3" in out and "head_init=lp" in out
  assert "fzoo seed 0: lr=0.000562 (constant) mu=0.001 num_directions=8," in out
  assert "5,324,162 trainable params" in out
  res = check_outputs(str(tmp_path), ["fzoo"], steps=2)
  (run,) = res["runs"]["fzoo"]
  assert run["forward_passes"] == [9, 18]
  assert run["lr"] == 5.62e-4 and "val_accuracy" in run["probe"]


RESULT_LINE = (r"^seed (\d+): zero-shot accuracy ([01]\.\d+), final accuracy ([01]\.\d+) "
               r"after (\d+) forward passes$")


@pytest.mark.slow
def test_finetune_llm_smoke_prints_its_result_line_and_resumes_bit_for_bit(tmp_path):
  """The prompted-LLM example on a tiny random Llama (HF checkpoint, trained BPE tokenizer,
  ChatML template, shared prefix): one result line per seed, outputs, checkpoints at steps
  3 and 6; drop 6 and --resume from 3 in a fresh process: the same losses and accuracy."""
  a, b = tmp_path / "a", tmp_path / "b"
  out = run_example("finetune_llm.py", "--seeds", "0", "--out", str(a))
  lines = [m.groups() for m in map(re.compile(RESULT_LINE).match, out.splitlines()) if m]
  assert len(lines) == 1 and lines[0][0] == "0" and lines[0][3] == "12"  # 6 MeZO steps
  res = results(a)
  (run,) = res["runs"]["mezo"]
  assert run["total_forward_passes"] == 12 and run["peak_rss_mib"] > 0
  assert float(lines[0][1]) == pytest.approx(run["zero_shot"]["accuracy"], abs=1e-4)
  assert float(lines[0][2]) == pytest.approx(run["final"]["accuracy"], abs=1e-4)
  assert os.path.getsize(a / "loss_curve.png") > 0
  ckpt = a / "ckpt" / "seed0"
  assert sorted(os.listdir(ckpt)) == ["3", "6"]
  shutil.copytree(a / "ckpt", b / "ckpt")
  shutil.rmtree(b / "ckpt" / "seed0" / "6")
  out_b = run_example("finetune_llm.py", "--seeds", "0", "--out", str(b), "--resume")
  assert "resumed from" in out_b and "at step 3" in out_b
  (again,) = results(b)["runs"]["mezo"]
  assert again["losses"] == run["losses"] and again["final"] == run["final"]


@pytest.mark.slow
def test_finetune_llm_smoke_first_order_adam_full_fine_tuning(tmp_path):
  """The first-order reference (Adam through jax.grad, every weight) on the same task."""
  out = run_example("finetune_llm.py", "--optimizer", "adam", "--mode", "ft", "--out",
                    str(tmp_path))
  assert re.search(RESULT_LINE, out, re.M)
  (run,) = results(tmp_path)["runs"]["adam"]
  assert run["trainable_params"] > 100_000 and run["forward_passes"] is None
  assert all(np.isfinite(run["losses"]))


@pytest.mark.slow
def test_finetune_llm_template_search_reads_train_only(tmp_path):
  """--search-templates scores every template on a split of train.tsv, never on dev.tsv
  (here one sentence with an impossible label)."""
  data_dir = tmp_path / "data"
  data_dir.mkdir()
  shutil.copy(os.path.join(ROOT, "examples", "data", "sentiment", "train.tsv"), data_dir)
  (data_dir / "dev.tsv").write_text("sentence\tlabel\nnot read\t9\n")
  out = run_example("finetune_llm.py", "--search-templates", "--data", str(data_dir),
                    "--out", str(tmp_path / "out"))
  with open(tmp_path / "out" / "templates.json") as fh:
    accs = json.load(fh)["validation_accuracy"]
  load_example("finetune_llm")  # importable without running
  assert sorted(accs) == ["chat", "chat_space", "it_was", "it_was_good"]
  assert all(0 <= v <= 1 for v in accs.values())
  counts = re.findall(r"zero-shot validation accuracy [01]\.\d+ \((\d+) train.tsv", out)
  assert len(counts) == 4 and all(int(c) > 1 for c in counts)


def test_finetune_minilm_lr_takes_one_rate_or_rates_by_optimizer():
  """``--lr 1e-3`` sets every optimizer's rate; ``--lr fzoo=1e-3,zo_muon=1e-2`` sets those
  named (the others keep their default, None); a name outside --optimizer or a value that is
  not a number is refused naming the item."""
  parse = load_example("finetune_minilm").parse_lr
  assert parse(None, ["fzoo", "mezo"]) == {"fzoo": None, "mezo": None}
  assert parse("1e-3", ["fzoo", "mezo"]) == {"fzoo": 1e-3, "mezo": 1e-3}
  assert parse("fzoo=1e-3,zo_muon=1e-2", ["fzoo", "zo_muon", "mezo"]) == {
      "fzoo": 1e-3, "zo_muon": 1e-2, "mezo": None}
  for text, message in [("lozo=1e-3", "'lozo=1e-3' does not name an optimizer"),
                        ("fzoo=fast", "'fast' is not a number"),
                        ("fast", "neither a rate")]:
    with pytest.raises(ValueError, match=message):
      parse(text, ["fzoo", "mezo"])


def test_finetune_minilm_new_methods_default_to_their_measured_setting_on_sst2():
  """With real data every method measured on SST-2 (hz.presets.MEASURED) takes its measured
  rate and key options without --lr: ZO-Muon full fine-tuning 1e-2 at rank 16 with 4 probes,
  HiZOO its measured alpha; the example's own SST-2 rates (SST2_LR) come first. On the
  synthetic set the methods of 0.4 still have no default."""
  example = load_example("finetune_minilm")
  ft = hz_presets().MEASURED["sst2_ft"]
  for name in ("zo_muon", "fzoo", "lozo", "subzero", "sparse_mezo", "forward_gradient"):
    assert example.has_default_lr("ft", name, True), name
    assert example.default_lr("ft", name, 400, True) == ft[name]["learning_rate"], name
    assert not example.has_default_lr("ft", name, False), name
  assert example.method_options("ft", "zo_muon", True) == {"rank": 16, "num_directions": 4,
                                                               "layout": "torch"}
  assert example.method_options("ft", "zo_muon", False) == {}
  assert example.default_alpha("ft", "hizoo", True) == ft["hizoo"]["hessian_smoothing"]
  assert example.default_alpha("ft", "hizoo", False) == 1e-3
  assert example.default_lr("lora", "fzoo", 400, True) == example.SST2_LR[("lora", "fzoo")]
  assert not example.has_default_lr("lora", "zo_muon", True)


def hz_presets():
  import hizoo_jax as hz

  return hz.presets


@pytest.mark.parametrize("args, message", [
    (["--optimizer", "fzoo,zo_muon"], "pass --lr fzoo=RATE"),
    (["--optimizer", "fzoo", "--lr", "zo_muon=1e-2"], "does not name an optimizer"),
])
def test_finetune_minilm_refuses_a_missing_or_foreign_rate(args, message, capsys):
  with pytest.raises(SystemExit) as exit_info:
    load_example("finetune_minilm").main(args)
  assert exit_info.value.code == 2
  assert message in capsys.readouterr().err


def test_finetune_minilm_plot_says_the_window_it_averaged(tmp_path, monkeypatch):
  """A 20-step run under --window 50 is averaged over at most 20 steps, and the label says
  so; runs longer than the window keep it."""
  pytest.importorskip("matplotlib")
  import matplotlib.axes

  example = load_example("finetune_minilm")
  labels = []
  monkeypatch.setattr(matplotlib.axes.Axes, "set_ylabel",
                      lambda self, text, *a, **k: labels.append(text))
  run = {"losses": list(np.linspace(1.0, 0.5, 20)), "forward_passes": list(range(2, 42, 2))}
  example.plot({"mezo": [run]}, 50, str(tmp_path / "a.png"), "t")
  example.plot({"mezo": [run]}, 5, str(tmp_path / "b.png"), "t")
  assert labels == ["training loss (moving average, 20 steps)",
                    "training loss (moving average, 5 steps)"]


@pytest.mark.slow
@requires_minilm
@pytest.mark.skipif(not os.path.isfile(os.path.join(SST2, "train.tsv")),
                    reason="needs GLUE SST-2 at ../shared/data/sst2 next to the repo")
def test_finetune_minilm_compares_new_methods_at_their_measured_settings(tmp_path):
  """One call, several methods each at its own rate: MeZO by --lr, ZO-Muon at its measured
  setting (1e-2, rank 16, 4 probes); neither prints HiZOO's alpha. (A zero head: the linear
  probe is the default-run and k-shot tests'; FZOO's measured options printed: the
  default-run test.)"""
  out = run_example("finetune_minilm.py", "--data", SST2, "--mode", "ft", "--layers", "5",
                    "--optimizer", "mezo,zo_muon", "--lr", "mezo=1e-3", "--head-init", "zero",
                    "--steps", "2", "--out", str(tmp_path), timeout=1800)
  assert "head_init=zero" in out
  assert "mezo seed 0: lr=0.001 (constant) mu=0.001, " in out
  assert ("zo_muon seed 0: lr=0.01 (constant) mu=0.001 rank=16 num_directions=4 layout=torch,"
          in out)
  assert "alpha=" not in out
  res = check_outputs(str(tmp_path), ["mezo", "zo_muon"], steps=2)
  assert res["runs"]["mezo"][0]["lr"] == 1e-3
  assert res["runs"]["zo_muon"][0]["lr"] == 1e-2
  assert res["runs"]["zo_muon"][0]["options"] == {"rank": 16, "num_directions": 4,
                                                 "layout": "torch"}


def test_finetune_llm_defaults_follow_the_prompted_table_where_it_holds_the_optimizer():
  """The prompted-SmolLM2 table's tuned setting (hz.presets.MEASURED's task) is the LoRA
  default of every optimizer it holds; elsewhere the pilot's rates and the library's α."""
  example = load_example("finetune_llm")
  table = {example.MEASURED_TASK: {
      "hizoo": {"learning_rate": 3e-3, "mu": 1e-2, "hessian_smoothing": 1e-6},
      "zo_muon": {"learning_rate": 1e-2, "mu": 1e-2, "rank": 16, "num_directions": 4}}}
  hizoo = example.default_setting("hizoo", "lora", table)
  assert (hizoo["lr"], hizoo["mu"], hizoo["alpha"], hizoo["options"]) == (3e-3, 1e-2, 1e-6, {})
  muon = example.default_setting("zo_muon", "lora", table)
  assert muon["options"] == {"rank": 16, "num_directions": 4}
  assert muon["source"] == example.MEASURED_TASK
  mezo = example.default_setting("mezo", "lora", table)  # not in the table: the pilot's
  assert (mezo["lr"], mezo["source"]) == (example.DEFAULT_LR[("lora", "zo")], "pilot")
  ft = example.default_setting("hizoo", "ft", table)  # the table is LoRA's
  assert (ft["lr"], ft["alpha"]) == (example.DEFAULT_LR[("ft", "zo")], example.DEFAULT_ALPHA)
  assert example.default_setting("adam", "lora", {})["lr"] == example.DEFAULT_LR[("lora", "adam")]
