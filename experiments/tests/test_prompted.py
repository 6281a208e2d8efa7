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
a_untested = table.find(os.path.join(tmp, "a.jsonl.gz"), "mezo-lora-k4-s0-lr0.03-constant-T6-b4")
run.main(a + ["--test"])  # recorded without the test: scored at its last checkpoint
a_end = table.find(os.path.join(tmp, "a.jsonl.gz"), "mezo-lora-k4-s0-lr0.03-constant-T6-b4")
run.main(a + ["--test", "--rerun"])  # rerun, checked, recorded again with both points
run.main(a + ["--test", "--rerun"])  # now recorded with both: skipped
c = common + ["--table", os.path.join(tmp, "c.jsonl.gz"), "--ckpt-dir", os.path.join(tmp, "cc"),
              "--start-layer", "1", "--cache-dir", os.path.join(tmp, "cache"), "--test"]
run.main(c)
d = common + ["--table", os.path.join(tmp, "d.jsonl.gz"), "--ckpt-dir", os.path.join(tmp, "cd"),
              "--start-layer", "1", "--cache-dir", os.path.join(tmp, "cache"), "--test"]
run.main(d)  # the same run again: its layer inputs read from the cache
# a constant-rate run of 8 steps resumed from the 6-step run's last checkpoint, and whole
import shutil
longer = [x if x != "6" else "8" for x in common]
key = "mezo-lora-k4-s0-lr0.03-constant-T{{}}-b4"
shutil.copytree(os.path.join(tmp, "ca", key.format(6)), os.path.join(tmp, "ce", key.format(8)))
for name in "ef":
  run.main(longer + ["--table", os.path.join(tmp, name + ".jsonl.gz"),
                     "--ckpt-dir", os.path.join(tmp, "c" + name)])
# a run whose last checkpoint is its end (stopped before it was recorded): resumed there, it
# reports the steps' time its checkpoint kept
shutil.copytree(os.path.join(tmp, "ca", key.format(6)), os.path.join(tmp, "ch", key.format(6)))
run.main(common + ["--table", os.path.join(tmp, "h.jsonl.gz"),
                   "--ckpt-dir", os.path.join(tmp, "ch")])
# a run held to a bound it cannot keep: stopped at its first evaluation, the rest recorded
# as diverged (the tiny model's CE does not rise at any rate, so the bound is below 1)
run.main(common + ["--diverged", "0.5", "--evals", "3", "--table", os.path.join(tmp, "g.jsonl.gz"),
                   "--ckpt-dir", os.path.join(tmp, "cg")])
out = {{k: list(table.read(os.path.join(tmp, k + ".jsonl.gz"))) for k in "abcdefgh"}}
out["a_untested"] = a_untested
out["a_end"] = a_end
out["cache"] = sorted(os.listdir(os.path.join(tmp, "cache")))
json.dump(out, open(os.path.join(tmp, "out.json"), "w"))
"""


def test_run_resumes_bit_for_bit_and_skips_what_is_recorded(tmp_path):
  import json

  import numpy as np

  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  proc = subprocess.run([sys.executable, "-c", DRIVER.format(root=ROOT, tmp=str(tmp_path))],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert proc.stdout.count("resumed at step 3") == 1, proc.stdout[-3000:]
  # the 8-step run from the 6-step one's checkpoint, and the test scored at that checkpoint
  assert proc.stdout.count("resumed at step 6") == 3, proc.stdout[-3000:]
  assert proc.stdout.count("test at its last checkpoint") == 1, proc.stdout[-3000:]
  assert proc.stdout.count("skipped") == 2, proc.stdout[-3000:]
  out = json.loads((tmp_path / "out.json").read_text())
  a, b = out["a"], out["b"]
  assert [r["key"] for r in a] == [r["key"] for r in b] == ["mezo-lora-k4-s0-lr0.03-constant-T6-b4"]
  untested = out["a_untested"]
  assert "test" not in untested and untested["curve"] == b[0]["curve"]
  # scored at its last checkpoint: the end only, the same scores as the rerun's end below
  end = out["a_end"]
  assert end["test_from"] == "last checkpoint" and end["losses"] == untested["losses"]
  assert [c["step"] for c in end["curve"] if "test" in c] == [6]
  assert end["test"] == a[0]["test"] == end["curve"][-1]["test"]
  assert [{k: v for k, v in c.items() if k != "test"} for c in end["curve"]] == b[0]["curve"]
  for ra, rb in zip(a, b, strict=True):
    assert ra["losses"] == rb["losses"]
    # the rerun for the test reproduced the recorded run and scored the test file at the
    # evaluation nearest half the run and at its end, nowhere else
    assert ra["rerun_max_ce_diff"] == 0.0
    assert [{k: v for k, v in c.items() if k != "test"} for c in ra["curve"]] == rb["curve"]
    assert [c["step"] for c in ra["curve"] if "test" in c] == [3, 6]
    assert ra["test"] == ra["curve"][-1]["test"] and set(ra["test"]) == {"accuracy", "ce"}
    assert ra["curve"][1]["test"] != ra["test"]
    assert [c["step"] for c in ra["curve"]] == [0, 3, 6]
    assert [c["passes"] for c in ra["curve"]] == [0, 6, 12]  # MeZO: two passes a step
    assert ra["val_per_class"] == 128 and ra["batch_size"] == 4 and ra["rows"] == "all"
    assert "test" not in rb
  # From layer 1 (layer 0's outputs computed once and kept): the same validation at step 0
  # (float32, another program), a record of its own, the test set scored at the end.
  (c,) = out["c"]
  assert c["key"] == a[0]["key"] + "-from1" and c["start_layer"] == 1
  assert abs(c["curve"][0]["ce"] - a[0]["curve"][0]["ce"]) < 1e-5 * a[0]["curve"][0]["ce"]
  assert c["curve"][-1]["ce"] != c["curve"][0]["ce"] and set(c["test"]) == {"accuracy", "ce"}
  assert [name.split("-")[0] for name in out["cache"]] == ["test", "train", "val"]
  (d,) = out["d"]
  assert d["curve"] == c["curve"] and d["test"] == c["test"] and d["losses"] == c["losses"]
  # a longer constant-rate run from a shorter one's checkpoint: the whole run's losses
  (e,), (f,) = out["e"], out["f"]
  assert e["losses"] == f["losses"] and e["losses"][:6] == a[0]["losses"]
  assert e["curve"][-1] == f["curve"][-1]
  # the steps' time: each start's first step (compilation) untimed, the rest kept across a
  # resumption, so that a run resumed at its end reports the same time as when recorded
  (h,) = out["h"]
  assert h["losses"] == untested["losses"] and h["curve"] == untested["curve"]
  assert untested["sec_per_step"] > 0 and h["sec_per_step"] == untested["sec_per_step"]
  assert e["sec_per_step"] > 0
  # diverged: two steps run, the evaluations after them recorded as NaN
  (g,) = out["g"]
  assert g["diverged_at"] == 2 and "diverged at step 2, stopped" in proc.stdout
  assert [c["step"] for c in g["curve"]] == [0, 2, 4, 6]
  assert [c["passes"] for c in g["curve"]] == [0, 4, 8, 12]
  ce = [c["ce"] for c in g["curve"]]
  assert ce[1] > 0.5 * ce[0] and all(np.isnan(ce[2:]))
  assert np.isnan(g["losses"][2:]).all() and np.isfinite(g["losses"][:2]).all()


def test_report_tunes_each_budget_on_the_tuning_seeds_and_pairs_the_seeds(tmp_path):
  """Constant-rate runs serve every budget they reach, scheduled runs only their own; the
  configuration is chosen by the tuning seeds' mean (a diverged run never wins); the
  comparison with MeZO pairs the other seeds."""
  import numpy as np

  from experiments.prompted import report

  def run(arm, lr, seed, ces, schedule="constant", steps=4, every=100):
    curve = [{"step": i, "passes": every * i, "ce": c} for i, c in enumerate(ces)]
    return {"arm": arm, "lr": lr, "seed": seed, "schedule": schedule, "steps": steps,
            "mu": 1e-2, "alpha": None, "options": {}, "mode": "lora", "curve": curve}

  seeds = range(4)
  records = [run("mezo", 1e-3, s, [0.6, 0.59, 0.58, 0.57, 0.56]) for s in seeds]
  records += [run("mezo", 3e-3, s, [0.6, 0.55, 0.54, 0.53, 0.5 + 0.01 * s]) for s in seeds]
  records += [run("mezo", 1e-2, s, [0.6, 0.7, float("nan"), float("nan"), float("nan")])
              for s in range(2)]
  records += [run("fzoo", 3e-3, s, [0.6, 0.52, 0.5 - 0.01 * s], "cosine", 2) for s in seeds]
  records.append(run("mezo", 3e-3, 0, [0.6, 0.55], steps=1))  # shorter, read last
  mezo = report.select(records, arm="mezo")
  best, mean = report.tune(mezo, 400)
  assert best[:3] == ("mezo", "constant", 3e-3) and np.isclose(mean, 0.505)
  assert report.interior(mezo, best, 400)
  assert report.tune(mezo, 100)[0][2] == 3e-3
  assert report.value_at(records[-1], 400) is None  # the 200-pass cosine run serves 200
  assert report.value_at(run("fzoo", 1, 0, [0.6, 0.5], "cosine", every=201), 200) == 0.5
  assert report.value_at(run("mezo", 1, 0, [0.6, 0.5, 0.4], every=150), 400) is None
  assert report.value_at(records[8], 300) == float("inf")  # diverged: never the best
  rows = {r["arm"]: r for r in report.summary(records, 400)}
  p = rows["fzoo"]["B/2"]["vs_mezo_B"]  # seeds 2, 3: 0.48 - 0.52, 0.47 - 0.53
  assert p["seeds"] == [2, 3] and np.allclose(p["diffs"], [-0.04, -0.06])
  assert p["t_lo"] < p["lo"] <= p["mean"] <= p["hi"] < p["t_hi"]
  assert rows["fzoo"]["B/2"]["vs_mezo_B_tuning"]["seeds"] == [0, 1, 2, 3]
  table = report.markdown(list(rows.values()), 400)
  assert "fzoo" in table and "-0.0400, -0.0600" in table
  assert "test" not in rows["fzoo"]["B/2"]
  assert report.test_markdown(list(rows.values()), 400).count("\n") == 1
  # test accuracy where the serving evaluation scored it: every seed, paired with MeZO's at B
  for r in records:
    if r["arm"] == "mezo" and r["lr"] == 3e-3 and r["steps"] == 4:
      r["curve"][2]["test"] = {"accuracy": 0.70, "ce": 0.6}
      r["curve"][4]["test"] = {"accuracy": 0.80 + 0.01 * r["seed"], "ce": 0.5}
    if r["arm"] == "fzoo":
      r["curve"][-1]["test"] = {"accuracy": 0.84 - 0.01 * r["seed"], "ce": 0.5}
  rows = {r["arm"]: r for r in report.summary(records, 400)}
  assert rows["mezo"]["B"]["test"] == {s: 0.80 + 0.01 * s for s in seeds}
  assert rows["mezo"]["B/2"]["test"] == {s: 0.70 for s in seeds}
  p = rows["fzoo"]["B/2"]["test_vs_mezo_B"]
  assert p["seeds"] == [0, 1, 2, 3] and np.allclose(p["diffs"], [0.04, 0.02, 0.0, -0.02])
  assert "B" not in rows["fzoo"]  # a 200-pass cosine run serves B/2 only
  tests = report.test_markdown(list(rows.values()), 400)
  assert "| fzoo |  |  | 0.8250 (CE 0.5000; 4 seeds) | +1.0 [" in tests, tests
  # the figure's panel of the configurations tuned at B that ran beyond the tuning seeds:
  # MeZO's four seeds (seed 0's longest run), not FZOO (no configuration at B)
  ((arm, _), (passes, ces)), = report.confirmed_curves(records, 400).items()
  assert arm == "mezo" and passes.tolist() == [0, 100, 200, 300, 400] and ces.shape == (4, 5)
  assert np.allclose(ces[:, -1], [0.5, 0.51, 0.52, 0.53])
  report.figure(records, str(tmp_path / "f.png"), 400)
  assert (tmp_path / "f.png").stat().st_size > 10_000
  # passes to tuned MeZO's CE at 400 (0.50, 0.51, 0.52, 0.53 by seed)
  assert rows["fzoo"]["reach"]["passes"] == {0: 200.0, 1: 200.0, 2: 100.0, 3: 100.0}
  assert rows["mezo"]["reach"]["passes"][0] == 400.0
  # the settings measured.json gets: MeZO's interior constant rate; FZOO's cosine is not a rate
  assert report.measured_settings(records, 400) == {"mezo": {"learning_rate": 3e-3, "mu": 1e-2}}
  for r in records:
    for c in r["curve"]:
      c.setdefault("accuracy", 0.5)
  listing = report.runs(records, 400).splitlines()
  assert listing[0] == "| run | seed | 100 | 200 | 300 | 400 |"
  assert "| mezo, lr 0.003, constant, 4 steps | 2 | 0.5500 (0.500) | 0.5400 (0.500) | 0.5300 " \
         "(0.500) | 0.5200 (0.500) |" in listing


def test_a_run_at_another_batch_is_its_own_arm_with_sentences_per_pass_matched(tmp_path):
  """``report.read`` keeps one table (start layer, k, whole sentences); a run at twice the
  batch becomes the arm ``mezo_batch32`` with each pass counted as two, so it serves the
  budget at half the steps and is compared with batch-16 MeZO there."""
  from experiments import table
  from experiments.prompted import report

  def run(seed, batch, steps, ces):
    # two passes a step, each over a batch of the run's own size
    curve = [{"step": i * steps // 4, "passes": i * steps // 4 * 2, "ce": c, "accuracy": 0.5}
             for i, c in enumerate(ces)]
    return {"key": f"mezo-s{seed}-b{batch}", "arm": "mezo", "mode": "lora", "k": 16,
            "seed": seed, "lr": 1e-3, "mu": 1e-2, "alpha": None, "schedule": "constant",
            "options": {}, "steps": steps, "batch_size": batch, "rows": "sentences",
            "curve": curve}

  path = str(tmp_path / "t.jsonl.gz")
  records = [run(s, 16, 200, [0.6, 0.55, 0.5, 0.45, 0.4]) for s in range(3)]
  records += [run(s, 32, 100, [0.6, 0.56, 0.52, 0.48, 0.44]) for s in range(3)]
  other = [0.6, 0.1, 0.1, 0.1, 0.1]  # runs of other tables
  records.append({**run(0, 16, 200, other), "start_layer": 24, "key": "from24"})
  records.append({**run(1, 16, 200, other), "rows": "all", "key": "all-rows"})
  table.write(path, records)
  read = report.read(path)
  assert sorted(r["arm"] for r in read) == ["mezo"] * 3 + ["mezo_batch32"] * 3
  wide = [r for r in read if r["arm"] == "mezo_batch32"]
  assert [c["passes"] for c in wide[0]["curve"]] == [0, 100, 200, 300, 400]
  rows = {r["arm"]: r for r in report.summary(read, 400)}
  assert rows["mezo_batch32"]["B"]["vs_mezo_B"]["diffs"] == pytest.approx([0.04])
  assert rows["mezo"]["B"]["tuning_mean"] == pytest.approx(0.4)
  # passes counted in rows of 32: the batch-16 runs become the other arm
  assert {r["arm"] for r in report.read(path, batch_size=32)} == {"mezo", "mezo_batch16"}


def test_read_counts_adams_steps_as_three_passes_and_names_the_fzoo_ablation(tmp_path):
  """Adam's record counts steps (one a step): ``report.read`` counts each as three passes,
  in rows of the table's batch. FZOO with ``normalize: false`` is an arm of its own, so that
  it is tuned apart from FZOO."""
  from experiments import table
  from experiments.prompted import report

  def run(arm, batch, options, per_step):
    curve = [{"step": s, "passes": per_step * s, "ce": 0.5, "accuracy": 0.5}
             for s in (0, 10, 20)]
    return {"key": f"{arm}-{batch}-{options}", "arm": arm, "mode": "lora", "k": 16,
            "seed": 0, "lr": 1e-3, "mu": 1e-2, "alpha": None, "schedule": "constant",
            "options": options, "steps": 20, "batch_size": batch, "rows": "sentences",
            "curve": curve}

  path = str(tmp_path / "t.jsonl.gz")
  table.write(path, [run("adam", 16, {}, 1), run("adam", 32, {}, 1),
                     run("fzoo", 16, {}, 9), run("fzoo", 16, {"normalize": False}, 9),
                     run("fzoo", 16, {"normalize": True}, 9)])
  got = {(r["arm"], r["batch_size"], str(r["options"])): [c["passes"] for c in r["curve"]]
         for r in report.read(path)}
  assert got == {("adam", 16, "{}"): [0, 30, 60], ("adam_batch32", 32, "{}"): [0, 60, 120],
                 ("fzoo", 16, "{}"): [0, 90, 180],
                 ("fzoo_unnormalised", 16, "{'normalize': False}"): [0, 90, 180],
                 ("fzoo", 16, "{'normalize': True}"): [0, 90, 180]}


def test_passes_to_mezo_name_the_configuration_that_gets_there_on_most_seeds():
  """Where no configuration of an arm reaches tuned MeZO's CE at B on every tuning seed, the
  row names the one that reaches it on most of them, soonest (not an arbitrary one)."""
  from experiments.prompted import report

  def run(arm, lr, seed, ces):
    curve = [{"step": i, "passes": 100 * i, "ce": c} for i, c in enumerate(ces)]
    return {"arm": arm, "lr": lr, "seed": seed, "schedule": "constant", "steps": 4,
            "mu": 1e-2, "alpha": None, "options": {}, "mode": "lora", "curve": curve}

  records = [run("mezo", 1e-3, s, [0.6, 0.58, 0.56, 0.54, 0.5]) for s in (0, 1)]
  records += [run("fzoo", 3e-3, s, [0.6, 0.59, 0.58, 0.57, 0.56]) for s in (0, 1)]
  records += [run("fzoo", 1e-2, 0, [0.6, 0.55, 0.52, 0.49, 0.51]),
              run("fzoo", 1e-2, 1, [0.6, 0.55, 0.52, 0.51, 0.51])]
  rows = {r["arm"]: r for r in report.summary(records, 400)}
  assert rows["fzoo"]["reach"]["passes"] == {0: 300.0, 1: float("inf")}
  assert "lr 0.01" in rows["fzoo"]["reach"]["label"]


def test_the_pages_compute_line_counts_the_steps_each_run_ran():
  """Core-hours: seconds a step times the steps run (a diverged run to its last finite
  evaluation), evaluations and test scores counted from the curves."""
  from experiments.prompted import report

  def run(seed, ces, sec, test_at=()):
    curve = [{"step": 50 * i, "passes": 100 * i, "ce": c, "accuracy": 0.5}
             | ({"test": {"accuracy": 0.8, "ce": 0.4}} if i in test_at else {})
             for i, c in enumerate(ces)]
    return {"seed": seed, "steps": 200, "sec_per_step": sec, "val_per_class": 128,
            "curve": curve}

  records = [run(0, [0.6, 0.5, 0.45, 0.44, 0.43], 36.0, test_at=(2, 4)),
             run(1, [0.6, 0.9, float("nan"), float("nan"), float("nan")], 72.0)]
  line = report.compute(records)
  # 200 steps of 36 s and 50 of 72 s: 3 core-hours
  assert line.startswith("2 runs recorded over 2 seeds: 3.0 core-hours")
  assert "10 evaluations of 256 validation sentences and 2 of the test file's" in line


def test_run_keys_name_every_setting_that_changes_the_run():
  """Two runs that differ in any of run.py's settings of the method, data draw, schedule or
  parameter set have different keys (a key names its checkpoint directory and its record;
  the model and the data files are the table's)."""
  import argparse
  import itertools

  sys.path.insert(0, os.path.join(ROOT, "examples"))
  sys.path.insert(0, os.path.join(ROOT, "experiments", "prompted"))
  import run

  base = dict(arm="hizoo", mode="lora", k=16, seed=0, schedule="constant", steps=100,
              batch_size=16, mu=None, rows="sentences", start_layer=0, options={}, alpha=1e-6)
  changes = dict(arm="hizoo_l", mode="ft", k=512, seed=1, schedule="cosine", steps=50,
                 batch_size=32, mu=1e-3, rows="all", start_layer=24, alpha=1e-8)
  keys = {run.run_key(argparse.Namespace(**base), lr) for lr in (1e-3, 3e-3)}
  for name, value in changes.items():
    keys.add(run.run_key(argparse.Namespace(**{**base, name: value}), 1e-3))
  fzoo = dict(base, arm="fzoo")  # options: the new methods' keywords
  keys |= {run.run_key(argparse.Namespace(**dict(fzoo, options=o)), 1e-3)
           for o in ({}, {"num_directions": 4}, {"num_directions": 16})}
  assert len(keys) == 2 + len(changes) + 3
  with pytest.raises(SystemExit):  # HiZOO takes no --options
    run.main(["--arm", "hizoo", "--lr", "1e-3", "--steps", "1", "--options", '{"rank": 2}'])
  assert len(set(itertools.chain(base, changes))) == len(base)


@pytest.mark.parametrize("k, arms", [(16, {"mezo", "fzoo", "hizoo"}),
                                     (512, {"mezo", "fzoo", "hizoo", "zo_muon", "lozo"})])
def test_the_measured_prompted_settings_are_the_tables_selection(k, arms):
  """``hz.presets.MEASURED``'s prompted-LLM tasks are what the committed table selects at
  each k (``report --measured [--k 512]``), and each setting builds its method."""
  import jax.numpy as jnp

  import hizoo_jax as hz
  from experiments.prompted import report

  task = report.measured_task(k)
  assert dict(hz.presets.MEASURED[task]) == report.measured_settings(report.read(k=k), 400)
  assert set(hz.presets.MEASURED[task]) >= arms
  params = {"w": jnp.ones((8, 8), jnp.float32)}
  for method in hz.presets.MEASURED[task]:
    assert hz.presets.measured(method, task).init(params) is not None


# Every option of the measured methods that the table's runs left at the library default,
# as those defaults stood when they ran.
DEFAULTS_THE_RUNS_TOOK = {
    "mezo": {"weight_decay": 0.0, "num_directions": 1, "mu_resolution": 0.0},
    "hizoo": {"weight_decay": 0.0, "estimator": "paper", "num_directions": 1,
              "factored": False, "hessian_update_every": 1, "hessian_clip": (1e-8, 1e8),
              "hessian_init": 1.0, "curvature_floor": 4.0, "mu_resolution": 4.0},
    "fzoo": {"weight_decay": 0.0, "normalize": True, "mu_resolution": 0.0},
    "zo_muon": {"weight_decay": 0.0, "resample_every": 100, "vector_scale": 1e-5,
                "mu_resolution": 0.0, "layout": "flax"},
    "lozo": {"weight_decay": 0.0, "resample_every": 50, "mu_resolution": 0.0,
             "layout": "flax"},
}


def test_the_measured_settings_rest_on_defaults_that_have_not_moved():
  """A measured setting names only what the table tuned (and ``report.RUN_DEFAULTS``'s pins);
  the rest it takes from the library's defaults. A default that moves would change the
  setting away from the one that ran: pin it in ``RUN_DEFAULTS`` and regenerate
  ``measured.json`` before changing this table."""
  import inspect

  import hizoo_jax as hz
  from experiments.prompted import report

  measured = hz.presets.MEASURED[report.MEASURED_TASK]
  assert set(measured) <= set(DEFAULTS_THE_RUNS_TOOK)
  for method, taken in DEFAULTS_THE_RUNS_TOOK.items():
    params = inspect.signature(getattr(hz, method)).parameters
    now = {k: params[k].default for k in taken}
    moved = {k: (taken[k], now[k]) for k in taken
             if now[k] != taken[k] and k not in measured.get(method, {})}
    assert not moved, f"{method}: defaults moved (ran with, now) {moved}"
    for k, v in report.RUN_DEFAULTS.get(method, {}).items():
      assert taken[k] == v, f"{method}: RUN_DEFAULTS pins {k}={v!r}, the runs took {taken[k]!r}"


def test_the_llm_examples_defaults_are_the_measured_settings():
  """``examples/finetune_llm.py`` trains LoRA at the table's setting of each method it holds
  (options included) and falls back to the pilot's rates elsewhere."""
  import hizoo_jax as hz
  from experiments.prompted import report

  sys.path.insert(0, os.path.join(ROOT, "examples"))
  import finetune_llm

  measured = hz.presets.MEASURED[report.MEASURED_TASK]
  got = finetune_llm.default_setting("mezo", "lora")
  assert got["lr"] == measured["mezo"]["learning_rate"] and got["mu"] == measured["mezo"]["mu"]
  assert got["source"] == report.MEASURED_TASK and got["options"] == {}
  got = finetune_llm.default_setting("fzoo", "lora")
  assert got["options"] == {"num_directions": 8}
  assert finetune_llm.default_setting("hizoo", "lora")["alpha"] == 1e-6
  got = finetune_llm.default_setting("mezo", "ft")
  assert got["source"] == "pilot" and got["lr"] == finetune_llm.DEFAULT_LR[("ft", "zo")]


def test_report_writes_its_task_into_a_measured_json_and_keeps_the_others(tmp_path):
  import json
  import shutil

  from experiments.prompted import report

  path = tmp_path / "measured.json"
  shutil.copy(os.path.join(ROOT, "hizoo_jax", "measured.json"), path)
  before = json.loads(path.read_text())
  before["tasks"].pop(report.MEASURED_TASK, None)  # replaced whole, the others kept
  settings = {"mezo": {"learning_rate": 1e-3, "mu": 1e-2},
              "hizoo": {"learning_rate": 1e-3, "mu": 1e-2, "hessian_smoothing": 1e-6}}
  report.write_measured(str(path), settings, 400)
  after = json.loads(path.read_text())
  task = after["tasks"].pop(report.MEASURED_TASK)
  assert after == before and task["methods"] == settings and "400 forward passes" in task["what"]
  assert "k = 16 per class" in task["what"]
  # another k is a task of its own: k = 16's is kept
  report.write_measured(str(path), settings, 400, k=512)
  again = json.loads(path.read_text())
  assert again["tasks"][report.MEASURED_TASK] == task
  assert "k = 512 per class" in again["tasks"][report.measured_task(512)]["what"]


def test_each_k_has_its_own_block_on_the_page(tmp_path):
  """``--page`` at one k rewrites that task's block only; a task with no run says so."""
  from experiments.prompted import report

  page = tmp_path / "page.md"
  (b16, e16), (b512, e512) = report.markers(16), report.markers(512)
  page.write_text(f"head\n{b16}\nold\n{e16}\nmiddle\n{b512}\nold\n{e512}\ntail\n")
  report.write_page(str(page), report.page_block([], 400), k=512)
  assert page.read_text() == (f"head\n{b16}\nold\n{e16}\nmiddle\n{b512}\n"
                              f"No run recorded yet.\n{e512}\ntail\n")
  with pytest.raises(ValueError, match="k1024"):
    report.write_page(str(page), "x", k=1024)


def test_queue_runs_every_line_once_two_at_a_time_and_picks_up_appended_lines(tmp_path):
  """The queue runner on a stand-in script: every line once, in order, two at a time, each
  line's output in its own log, and a line appended while it runs is run too."""
  from experiments.prompted import run_queue as queue

  script = tmp_path / "fake_run.py"
  script.write_text(
      "import os, sys, time\n"
      f"queue = {str(tmp_path / 'queue.txt')!r}\n"
      "if sys.argv[1:] == ['--arm', 'a']:\n"
      "  with open(queue, 'a') as fh:\n"
      "    fh.write('--arm d\\n')\n"
      "time.sleep(0.2)\n"
      "print('ran', *sys.argv[1:], os.environ['XLA_FLAGS'])\n")
  (tmp_path / "queue.txt").write_text("# a comment\n--arm a\n--arm b\n\n--arm c\n")
  queue.main(["--queue", str(tmp_path / "queue.txt"), "--runs", "2", "--script", str(script),
              "--logs", str(tmp_path / "logs")])
  logs = sorted(os.listdir(tmp_path / "logs"))
  assert logs == ["arm_a.log", "arm_b.log", "arm_c.log", "arm_d.log"]
  for name in logs:
    (line,) = (tmp_path / "logs" / name).read_text().splitlines()
    assert line.startswith(f"ran --arm {name[4]}") and queue.ONE_CORE in line


def test_no_module_beside_run_py_shadows_the_standard_library():
  """run.py runs as a script, so its folder comes first on sys.path: a module there named
  like a standard one (a ``queue.py``) replaces it for every import, Orbax's included."""
  folder = os.path.join(ROOT, "experiments", "prompted")
  names = {f[:-3] for f in os.listdir(folder) if f.endswith(".py")}
  assert not names & set(sys.stdlib_module_names)
