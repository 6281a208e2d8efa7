"""The prompted-LLM benchmark's harness (experiments/prompted/run.py) on a tiny random Llama."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("flax")
pytest.importorskip("orbax.checkpoint")
pytest.importorskip("tokenizers")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# One process (JAX as the harness runs it: float32, no x64): a run left after 3 of its 6
# steps and resumed, then the same run uninterrupted in another table, then the first again
# (in its table already: skipped).
DRIVER = """
import json, os, sys, tempfile
sys.path.insert(0, os.path.join({root!r}, "examples"))
sys.path.insert(0, os.path.join({root!r}, "experiments", "prompted"))
import finetune_llm, run
from hizoo_jax.models import data
from experiments import table
tmp = {tmp!r}
sets = data.load_sst2(finetune_llm.shared.SYNTHETIC)
model = finetune_llm.write_smoke_model(os.path.join(tmp, "tiny"), sets["train"][0])
common = ["--model", model, "--data", finetune_llm.shared.SYNTHETIC, "--k", "4", "--steps", "6",
          "--evals", "2", "--batch-size", "4", "--lr", "3e-2", "--rows", "all"]
a = common + ["--table", os.path.join(tmp, "a.jsonl.gz"), "--ckpt-dir", os.path.join(tmp, "ca")]
b = common + ["--table", os.path.join(tmp, "b.jsonl.gz"), "--ckpt-dir", os.path.join(tmp, "cb")]
run.main(a + ["--stop-after", "4"])
assert not os.path.exists(os.path.join(tmp, "a.jsonl.gz"))
run.main(a)
run.main(b)
run.main(a)
c = common + ["--table", os.path.join(tmp, "c.jsonl.gz"), "--ckpt-dir", os.path.join(tmp, "cc"),
              "--start-layer", "1", "--cache-dir", os.path.join(tmp, "cache"), "--test"]
run.main(c)
out = {{k: list(table.read(os.path.join(tmp, k + ".jsonl.gz"))) for k in ("a", "b", "c")}}
out["cache"] = sorted(os.listdir(os.path.join(tmp, "cache")))
json.dump(out, open(os.path.join(tmp, "out.json"), "w"))
"""


def test_run_resumes_bit_for_bit_and_skips_what_is_recorded(tmp_path):
  import json

  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  proc = subprocess.run([sys.executable, "-c", DRIVER.format(root=ROOT, tmp=str(tmp_path))],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert proc.stdout.count("resumed at step 3") == 1, proc.stdout[-3000:]
  assert proc.stdout.count("skipped") == 1, proc.stdout[-3000:]
  out = json.loads((tmp_path / "out.json").read_text())
  a, b = out["a"], out["b"]
  assert [r["key"] for r in a] == [r["key"] for r in b] == ["mezo-lora-k4-s0-lr0.03-constant-T6-b4"]
  for ra, rb in zip(a, b, strict=True):
    assert ra["losses"] == rb["losses"] and ra["curve"] == rb["curve"]
    assert [c["step"] for c in ra["curve"]] == [0, 3, 6]
    assert [c["passes"] for c in ra["curve"]] == [0, 6, 12]  # MeZO: two passes a step
    assert ra["val_per_class"] == 128 and ra["batch_size"] == 4 and ra["rows"] == "all"
    assert "test" not in ra
  # From layer 1 (layer 0's outputs computed once and kept): the same validation at step 0
  # (float32, another program), a record of its own, the test set scored at the end.
  (c,) = out["c"]
  assert c["key"] == a[0]["key"] + "-from1" and c["start_layer"] == 1
  assert abs(c["curve"][0]["ce"] - a[0]["curve"][0]["ce"]) < 1e-5 * a[0]["curve"][0]["ce"]
  assert c["curve"][-1]["ce"] != c["curve"][0]["ce"] and set(c["test"]) == {"accuracy", "ce"}
  assert [name.split("-")[0] for name in out["cache"]] == ["test", "train", "val"]


def test_report_tunes_each_budget_on_the_tuning_seeds_and_pairs_the_seeds():
  """Constant-rate runs serve every budget they reach, scheduled runs only their own; the
  configuration is chosen by the tuning seeds' mean; differences are paired by seed."""
  import numpy as np

  from experiments.prompted import report

  def run(arm, lr, seed, ces, schedule="constant", steps=4):
    curve = [{"step": i, "passes": 100 * i, "ce": c} for i, c in enumerate(ces)]
    return {"arm": arm, "lr": lr, "seed": seed, "schedule": schedule, "steps": steps,
            "mu": 1e-2, "alpha": None, "options": {}, "curve": curve}

  records = [run("mezo", 1e-3, s, [0.6, 0.59, 0.58, 0.57, 0.56]) for s in range(3)]
  records += [run("mezo", 3e-3, s, [0.6, 0.55, 0.54, 0.53, 0.5 + 0.01 * s]) for s in range(3)]
  records += [run("mezo", 1e-2, s, [0.6, 0.7, 0.8, 0.9, 1.0]) for s in range(2)]
  records += [run("fzoo", 3e-3, s, [0.6, 0.52, 0.5 - 0.01 * s], "cosine", 2) for s in range(3)]
  best, mean = report.tune(report.select(records, arm="mezo"), 400)
  assert best[:3] == ("mezo", "constant", 3e-3) and np.isclose(mean, 0.505)
  assert report.interior(report.select(records, arm="mezo"), best, 400)
  assert report.tune(report.select(records, arm="mezo"), 100)[0][2] == 3e-3
  # the cosine run of 200 passes serves 200 only
  assert report.tune(report.select(records, arm="fzoo"), 400) is None
  rows = {r["arm"]: r for r in report.summary(records, 400)}
  p = rows["fzoo"]["B/2"]["vs_mezo_B"]
  assert p["seeds"] == [0, 1, 2] and np.isclose(p["mean"], np.mean([-0.0, -0.02, -0.04]))
  assert p["lo"] <= p["mean"] <= p["hi"]
  assert "fzoo" in report.markdown(list(rows.values()), 400)
  # passes to tuned MeZO's CE at 400 (0.5, 0.51, 0.52 by seed)
  assert rows["fzoo"]["reach"]["passes"] == {0: 200.0, 1: 200.0, 2: 100.0}
  assert rows["mezo"]["reach"]["passes"][0] == 400.0


def test_run_keys_name_every_setting_that_changes_the_run():
  """Two runs that differ in any setting have different keys (a key names its checkpoint
  directory and its record)."""
  import argparse
  import itertools

  sys.path.insert(0, os.path.join(ROOT, "examples"))
  sys.path.insert(0, os.path.join(ROOT, "experiments", "prompted"))
  import run

  base = dict(arm="hizoo", mode="lora", k=16, seed=0, schedule="constant", steps=100,
              batch_size=16, mu=None, rows="sentences", start_layer=0, options={}, alpha=1e-6)
  changes = dict(arm="hizoo_l", mode="ft", k=512, seed=1, schedule="cosine", steps=50,
                 batch_size=32, mu=1e-3, rows="all", start_layer=24, options={"rank": 16},
                 alpha=1e-8)
  keys = {run.run_key(argparse.Namespace(**base), lr) for lr in (1e-3, 3e-3)}
  for name, value in changes.items():
    keys.add(run.run_key(argparse.Namespace(**{**base, name: value}), 1e-3))
  assert len(keys) == 2 + len(changes)
  assert len(set(itertools.chain(base, changes))) == len(base)
