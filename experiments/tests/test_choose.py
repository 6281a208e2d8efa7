"""The "choosing a method" harness (experiments/choose): a tiny budget end to end, resume bit
for bit, the forward-pass count, the method registry, schedules and grid widening."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import numpy as np
import pytest

pytest.importorskip("sklearn")
pytest.importorskip("flax")
pytest.importorskip("orbax.checkpoint")

from experiments import table as results_table  # noqa: E402
from experiments.choose import harness, run, tasks  # noqa: E402


def _cfg(**kw):
  base = dict(schedule="cosine", options={"mu": 1e-3}, seed=1, budget=120, eval_every=40)
  return harness.make_config("digits", "mezo", 1e-2, **{**base, **kw})


def test_run_and_resume_bit_for_bit(tmp_path):
  cfg = _cfg()
  whole = harness.run(cfg, tasks.TASKS["digits"], results=str(tmp_path / "a"),
                      ckpts=str(tmp_path / "ca"), log=lambda s: None)
  assert whole["forward_passes"] == 120 and whole["steps"] == 60
  assert [e["fp"] for e in whole["curve"]] == [0, 40, 80, 120]
  assert whole["fp_source"].startswith(("harness count", "state counter"))
  assert whole["test"]["test_accuracy"] > 0 and whole["sec_per_fp"] > 0
  assert whole["state_bytes"] > 0 and whole["diverged_at_step"] is None
  assert 0 <= whole["test_at_start"]["test_accuracy"] <= 1  # the start, scored once
  # interrupted after the first evaluation, then the same call again continues
  kw = dict(results=str(tmp_path / "b"), ckpts=str(tmp_path / "cb"), log=lambda s: None)
  assert harness.run(cfg, tasks.TASKS["digits"], stop_after=40, **kw) is None
  assert harness.load_result(cfg.task, cfg.run_id, kw["results"]) is None
  resumed = harness.run(cfg, tasks.TASKS["digits"], **kw)
  for key in ("curve", "final", "test", "test_at_start", "task_info", "forward_passes", "steps"):
    a = [{k: v for k, v in e.items() if k != "seconds"} for e in whole[key]] \
        if key == "curve" else whole[key]
    b = [{k: v for k, v in e.items() if k != "seconds"} for e in resumed[key]] \
        if key == "curve" else resumed[key]
    assert a == b, key
  stored = harness.load_result(cfg.task, cfg.run_id, kw["results"])  # the task's table
  assert stored["final"] == results_table.compact(whole["final"])
  assert stored["config"] == whole["config"] and stored["machine"] == harness.machine()


# FZOO: several losses a step on the tape (5 passes), so a replay must split the tape into
# steps; MeZO's two a step are the same path.
@pytest.mark.parametrize("method,options", [("fzoo", {"mu": 1e-3, "num_directions": 4})])
def test_lost_checkpoint_replays_the_loss_tape(tmp_path, method, options):
  cfg = harness.make_config("digits", method, 1e-2, options=options, seed=1, budget=120,
                            eval_every=40)
  task = tasks.TASKS["digits"]
  whole = harness.run(cfg, task, results=str(tmp_path / "a"), ckpts=str(tmp_path / "ca"),
                      traces=str(tmp_path / "ta"), log=lambda s: None)
  assert not os.path.exists(harness.trace_dir(cfg, str(tmp_path / "ta")))  # finished: gone
  kw = dict(results=str(tmp_path / "b"), ckpts=str(tmp_path / "cb"), traces=str(tmp_path / "tb"))
  assert harness.run(cfg, task, stop_after=80, log=lambda s: None, **kw) is None
  tdir = harness.trace_dir(cfg, kw["traces"])
  with open(os.path.join(tdir, "history.json")) as fh:
    hist = json.load(fh)
  tape = np.load(os.path.join(tdir, "losses.npy"))
  assert hist["fp"] == 80 and len(tape) == hist["tape_len"] == 80  # one loss a forward pass
  shutil.rmtree(kw["ckpts"])  # a new machine: the checkpoint is gone, the tape is not
  logged = []
  replayed = harness.run(cfg, task, log=logged.append, **kw)
  # the replay consumed the whole tape; whether its params came out bit for bit depends on
  # how XLA compiles the step without its forward passes on this CPU (if not, the harness
  # starts again from step 0), and either way the run ends like the uninterrupted one
  assert any("replayed 16 steps" in m for m in logged), logged
  assert any("80 of 80 taped losses" in m for m in logged), logged
  strip = lambda r: [{k: v for k, v in e.items() if k != "seconds"} for e in r["curve"]]  # noqa: E731
  (rep,) = replayed["replays"]
  assert rep["step"] == hist["t"] and rep["off_by"] <= harness.REPLAY_TOLERANCE
  if rep["exact"]:  # the same params: the rest of the run is the uninterrupted one's
    assert any("the same" in m for m in logged), logged
    assert strip(replayed) == strip(whole)
    assert replayed["final"] == whole["final"] and replayed["test"] == whole["test"]
  else:  # rounding apart: the recorded part of the curve is kept as it was recorded
    assert any("not bit for bit" in m for m in logged), logged
    assert strip(replayed)[:len(hist["evals"])] == strip(whole)[:len(hist["evals"])]

  # a tape off by rounding (the last step's two losses moved by 1e-6, about 4 float32 ulps
  # of a loss of 2.3; one ulp moved no evaluation) replays within the tolerance (measured:
  # 3e-6 off), not bit for bit, and the run goes on from the replayed params
  kw = dict(results=str(tmp_path / "d"), ckpts=str(tmp_path / "cd"), traces=str(tmp_path / "td"))
  assert harness.run(cfg, task, stop_after=80, log=lambda s: None, **kw) is None
  shutil.rmtree(kw["ckpts"])
  tdir = harness.trace_dir(cfg, kw["traces"])
  near = np.load(os.path.join(tdir, "losses.npy"))
  near[-2:] += (1e-6, -1e-6)
  np.save(os.path.join(tdir, "losses.npy"), near)
  logged = []
  close = harness.run(cfg, task, log=logged.append, **kw)
  (rep,) = close["replays"]
  assert not rep["exact"] and 0 < rep["off_by"] <= harness.REPLAY_TOLERANCE, rep
  assert any("not bit for bit" in m for m in logged), logged
  assert not any("DIFFERENT" in m for m in logged), logged
  assert strip(close)[:len(hist["evals"])] == strip(whole)[:len(hist["evals"])]
  assert close["forward_passes"] == whole["forward_passes"]

  # a tape that does not reproduce its evaluation is dropped and the run starts again
  kw = dict(results=str(tmp_path / "c"), ckpts=str(tmp_path / "cc"), traces=str(tmp_path / "tc"))
  assert harness.run(cfg, task, stop_after=80, log=lambda s: None, **kw) is None
  shutil.rmtree(kw["ckpts"])
  tdir = harness.trace_dir(cfg, kw["traces"])
  bad = np.load(os.path.join(tdir, "losses.npy"))
  bad[::2] += 1.0
  np.save(os.path.join(tdir, "losses.npy"), bad)
  logged = []
  again = harness.run(cfg, task, log=logged.append, **kw)
  assert any("DIFFERENT" in m for m in logged), logged
  assert strip(again) == strip(whole) and again["final"] == whole["final"]


def test_seeds_are_paired_and_schedules_differ(tmp_path):
  kw = dict(results=str(tmp_path), ckpts=str(tmp_path / "c"), log=lambda s: None)
  a = harness.run(_cfg(budget=40, schedule="constant"), tasks.TASKS["digits"], **kw)
  b = harness.run(_cfg(budget=40, schedule="linear"), tasks.TASKS["digits"], **kw)
  # same seed: same start (init) whatever the schedule
  assert a["curve"][0] == b["curve"][0]
  assert a["final"] != b["final"]


def test_hizoo_cost_and_options():
  opts = {"hessian_update_every": 3, "num_directions": 2}
  costs = [harness.METHODS["hizoo"].cost(opts, t) for t in range(6)]
  assert costs == [5, 4, 4, 5, 4, 4]
  assert harness.METHODS["mezo"].cost({}, 0) == 2
  assert harness.resolve_options({"hessian_smoothing": "0.5/d", "mu": 1e-3}, 1000) == {
      "hessian_smoothing": 5e-4, "mu": 1e-3}
  with pytest.raises(ValueError, match="no public"):
    harness.public("no_such_method")
  s = harness.make_schedule("cosine", 1.0, 10)
  assert float(s(0)) == 1.0 and abs(float(s(10))) < 1e-7
  s = harness.make_schedule("linear", 2.0, 4)
  assert np.allclose([float(s(t)) for t in range(5)], [2.0, 1.5, 1.0, 0.5, 0.0])


def test_forward_gradient_runs_without_a_tape_and_resumes(tmp_path):
  # its step differentiates the loss: no tape (a host callback has no derivative), two
  # passes a step from the state's counter, and an interrupted run resumes bit for bit
  cfg = harness.make_config("digits", "forward_gradient", 1e-2, schedule="constant",
                            seed=1, budget=80, eval_every=40)
  task = tasks.TASKS["digits"]
  whole = harness.run(cfg, task, results=str(tmp_path / "a"), ckpts=str(tmp_path / "ca"),
                      traces=str(tmp_path / "ta"), log=lambda s: None)
  assert whole["forward_passes"] == 80 and whole["steps"] == 40
  assert whole["curve"][-1]["train_loss"] < whole["curve"][0]["train_loss"]
  kw = dict(results=str(tmp_path / "b"), ckpts=str(tmp_path / "cb"),
            traces=str(tmp_path / "tb"), log=lambda s: None)
  assert harness.run(cfg, task, stop_after=40, **kw) is None
  assert not os.path.exists(harness.trace_dir(cfg, kw["traces"]))
  resumed = harness.run(cfg, task, **kw)
  assert resumed["final"] == whole["final"]


def test_hizoo_runs_and_counts(tmp_path):
  cfg = harness.make_config("fa", "hizoo", 1e-2, options={"mu": 1e-2,
                            "hessian_smoothing": "0.5/d"}, budget=30, eval_every=10)
  res = harness.run(cfg, tasks.TASKS["fa"], results=str(tmp_path), ckpts=str(tmp_path / "c"),
                    log=lambda s: None)
  assert res["resolved_options"]["hessian_smoothing"] == 0.25  # d = 2
  assert res["forward_passes"] >= 30 and res["curve"][-1]["mean_h"] is not None
  assert res["fp_per_step_mean"] == 3.0


def test_optax_stage_between_estimate_and_learning_rate(tmp_path):
  """``then``: the harness builds the chain a user writes, step for step, and counts it."""
  import jax
  import jax.numpy as jnp
  import optax

  import hizoo_jax as hz

  def loss(p, x):
    return jnp.sum((p["w"] - x) ** 2) + jnp.sum(p["b"] ** 4)

  params = {"w": jnp.arange(6.0).reshape(2, 3) / 7, "b": jnp.ones(3) / 3}
  x = jnp.full((2, 3), 0.25)
  for opts, stage in (({"then": "adam", "b1": 0.8}, optax.scale_by_adam(b1=0.8)),
                      ({"then": "trace", "decay": 0.9}, optax.trace(decay=0.9)),
                      ({"then": "global_rms", "decay": 0.9}, hz.scale_by_global_rms(0.9))):
    built = harness.build_tx("mezo", 1e-2, {"mu": 1e-3, **opts}, seed=3)
    hand = optax.chain(hz.scale_by_zo(mu=1e-3, seed=3), stage,
                       optax.scale_by_learning_rate(1e-2))
    runs = []
    for tx in (built, hand):
      p = jax.tree.map(jnp.copy, params)  # the step donates its params
      s = tx.init(p)
      step = hz.make_train_step(tx, loss)
      for _ in range(3):
        p, s, _ = step(p, s, x)
      runs.append((p, harness.read_counter(s)))
    assert runs[0][1] == runs[1][1] == 6
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                 runs[0][0], runs[1][0])
    assert not np.allclose(np.asarray(runs[0][0]["w"]), np.asarray(params["w"]))
  with pytest.raises(ValueError, match="then must be one of"):
    harness.build_tx("mezo", 1e-2, {"then": "lion"}, seed=0)
  # a run through the harness: passes counted by the state, Adam's two buffers in its state
  cfg = harness.make_config("digits", "fzoo", 1e-3, options={"num_directions": 4,
                            "then": "adam"}, budget=50, eval_every=25, tag="_adam")
  res = harness.run(cfg, tasks.TASKS["digits"], results=str(tmp_path),
                    ckpts=str(tmp_path / "c"), log=lambda s: None)
  assert res["forward_passes"] == 50 and res["fp_per_step_mean"] == 5
  assert res["state_bytes"] >= 2 * res["params_bytes"]


def test_queue_skips_done_and_widens(tmp_path, capsys):
  res, ck = str(tmp_path / "r"), str(tmp_path / "c")
  grid = run.Grid("fa", "mezo", (-12, -10), ("constant",), (0,), 20, 10, widen=True,
                  max_points=6)
  run.run_grid(grid, results=res, ckpts=ck)
  done = [e for e in range(-20, 0) if run.load(grid.config(e, "constant", 0), res) is not None]
  assert len(done) > 2 and {-12, -10} <= set(done)  # widened
  best, _ = run.select(grid, "constant", done, res)
  assert min(done) < best < max(done)  # until the best is interior
  assert {best - 1, best + 1} <= set(done) or best % 2  # then refined to quarter-decades
  run.run_grid(grid, results=res, ckpts=ck)  # everything done: nothing runs again
  assert "===" not in capsys.readouterr().out.split("###")[-1]
  assert run.lr_of(-12) == pytest.approx(1e-3) and run.lr_of(-10) == pytest.approx(10 ** -2.5)
  assert run.lr_of(-16) == 10 ** (-8 / 2)  # the same float as a half-decade exponent


def test_confirm_seeds_run_only_at_the_selected_rate(tmp_path, monkeypatch):
  res, ck = str(tmp_path / "r"), str(tmp_path / "c")
  grid = run.Grid("fa", "mezo", (-12, -8, -4), ("constant",), (0,), 20, 10, widen=False,
                  refine=False, confirm_seeds=(1, 2))
  run.run_grid(grid, results=res, ckpts=ck)
  best, means = run.select(grid, "constant", grid.exponents, res)
  assert best is not None and len(means) == 3
  for e in grid.exponents:
    for s in (1, 2):
      done = run.load(grid.config(e, "constant", s), res) is not None
      assert done == (e == best), (e, s)
  # the confirming seeds are not part of the selection (seed 0 alone chose the rate)
  assert run.select(grid, "constant", grid.exponents, res) == (best, means)
  # and the report pairs them without being told
  from experiments.choose import report

  monkeypatch.setitem(run.TABLES, "t_confirm", [grid])
  ((_, lr, runs),) = report.selected_runs("t_confirm", res)
  assert lr == run.lr_of(best) and sorted(runs) == [0, 1, 2]


def test_only_runs_the_named_runs_and_counts_the_rest(tmp_path, capsys):
  res, ck = str(tmp_path / "r"), str(tmp_path / "c")
  grid = run.Grid("fa", "mezo", (-12, -8, -4), ("constant",), (0,), 20, 10, widen=False,
                  refine=False, confirm_seeds=(1,))
  ids = {e: grid.config(e, "constant", 0).run_id for e in grid.exponents}
  run.run_grid(grid, results=res, ckpts=ck, only=(ids[-8],))
  done = {e for e in grid.exponents if run.load(grid.config(e, "constant", 0), res)}
  assert done == {-8}
  assert run.select(grid, "constant", grid.exponents, res)[0] is None  # not selected yet
  # the rest, then a queue that takes only the confirming seed: the run the table would make
  run.run_grid(grid, results=res, ckpts=ck, only=("*_s0_*",))
  best, _ = run.select(grid, "constant", grid.exponents, res)
  assert best is not None and run.load(grid.config(best, "constant", 1), res) is None
  run.run_grid(grid, results=res, ckpts=ck, only=("fa/*_s1_*",))
  assert run.load(grid.config(best, "constant", 1), res) is not None
  out = capsys.readouterr().out
  assert out.count("=== ") == 4  # each run once, none of them twice
  with pytest.raises(SystemExit):
    run.main(["--table", "smoke", "--only"])  # a pattern is required


def test_lock_is_exclusive(tmp_path):
  path = str(tmp_path / "x.json")
  lock = run.claim(path)
  assert lock is not None and run.claim(path) is None
  os.remove(lock)
  with open(path + ".lock", "w") as fh:
    fh.write("another-host 1")
  assert run.claim(path) is not None  # a lock from another machine is stale


def test_hizoo_grid_runs_its_step_size_control(tmp_path):
  res, ck = str(tmp_path / "r"), str(tmp_path / "c")
  (grid,) = run.hizoo_grids("fa", "hizoo", (-8,), ("constant",), (0,), 60, 30, ("0.5/d",))
  grid = dataclasses.replace(grid, widen=False, refine=False)
  run.run_grid(grid, results=res, ckpts=ck)
  src = run.load(grid.config(-8, "constant", 0), res)
  ctl = run.load(grid.control_config(-8, "constant", 0), res)
  assert src["mean_h_trace"]["values"] and ctl is not None
  assert ctl["config"]["options"]["hctl_of"] == src["config"]["run_id"]
  assert ctl["fp_per_step_mean"] == 2.0 and ctl["forward_passes"] == 60
  # the control's lr is the HiZOO lr over its mean H(t)
  sched = harness.control_schedule(0.1, src, "constant", 30)
  h = src["mean_h_trace"]["values"]
  assert float(sched(0)) == pytest.approx(0.1 / h[0], rel=1e-6)
  assert float(sched(10 ** 6)) == pytest.approx(0.1 / h[-1], rel=1e-6)


def test_report_versus_baseline(tmp_path, monkeypatch):
  from experiments.choose import report

  res, ck = str(tmp_path / "r"), str(tmp_path / "c")
  base = run.Grid("fa", "mezo", (-8,), ("constant",), (0,), 40, 20, widen=False, refine=False)
  (hiz,) = run.hizoo_grids("fa", "hizoo", (-8,), ("constant",), (0,), 40, 20, (1e-3,))
  hiz = dataclasses.replace(hiz, widen=False, refine=False)
  monkeypatch.setitem(run.TABLES, "t_base", [base])
  monkeypatch.setitem(run.TABLES, "t_hiz", [hiz])
  for g in (base, hiz):
    run.run_grid(g, results=res, ckpts=ck)
  text = report.versus("t_hiz", "t_base", res)
  rows = [line for line in text.splitlines() if line.startswith("| ")]
  assert rows[1].startswith("| mezo constant (baseline) | 0.01 |") and "| 1.00 | 1.00 |" in rows[1]
  assert rows[2].startswith("| hizoo_a0.001 constant |")
  assert rows[3].startswith("|   control: MeZO, lr / mean H(t) of hizoo_a0.001 constant |")
  assert "Selection pending" not in report.report("t_hiz", res, None)
  # a seed run by another table at the selected lr joins the pairing; the selection does not
  # change, and a seed nobody ran is left out
  run.run_grid(dataclasses.replace(base, seeds=(1,)), results=res, ckpts=ck)
  text = report.versus("t_hiz", "t_base", res, extra_seeds=(1, 2))
  rows = [line for line in text.splitlines() if line.startswith("| ")]
  assert "| 1.00, 1.00 | 1.00, 1.00 |" in rows[1] and "," not in rows[2]  # hizoo: seed 0
  # to a fixed loss the start already reaches: every run at 0 passes (no ratio), and the
  # baseline row is still the one the selection picked
  text = report.versus("t_hiz", "t_base", res, target=1e9)
  rows = [line for line in text.splitlines() if line.startswith("| ")]
  assert "fastest to that loss" in text and rows[1].startswith("| mezo constant (baseline) |")
  assert "| — | — |" in rows[1]


def test_interpolated_crossing():
  from experiments.choose import report

  curve = [{"fp": 0, "train_loss": 1.0}, {"fp": 100, "train_loss": 0.8},
           {"fp": 200, "train_loss": 0.4}, {"fp": 300, "train_loss": 0.3}]
  res = {"curve": curve}
  assert report.fp_to_reach(res, 0.5) == 200
  assert report.fp_to_reach_interpolated(res, 0.5) == pytest.approx(175.0)  # 0.8 -> 0.4
  assert report.fp_to_reach_interpolated(res, 0.4) == pytest.approx(200.0)
  assert report.fp_to_reach_interpolated(res, 1.5) == 0.0
  assert report._ratio(0.0, {"forward_passes": 300}) == "start"
  assert report._ratio(150.0, {"forward_passes": 300}) == "0.50"
  assert report._ratio(None, {"forward_passes": 300}) == "never"
  assert report.fp_to_reach_interpolated(res, 0.1) is None
  nan = {"curve": [{"fp": 0, "train_loss": float("nan")}, *curve[2:]]}
  assert report.fp_to_reach_interpolated(nan, 0.5) == 200.0  # no finite point before it


def test_ratio_to_a_fixed_target():
  """``--target``: passes to reach a fixed loss over the baseline's passes to reach it."""
  from experiments.choose import report

  base = {"curve": [{"fp": 0, "train_loss": 1.0}, {"fp": 100, "train_loss": 0.6},
                    {"fp": 200, "train_loss": 0.2}]}
  fast = {"curve": [{"fp": 0, "train_loss": 1.0}, {"fp": 100, "train_loss": 0.2}]}
  # base reaches 0.4 at 200 on the grid, 150 interpolated; fast at 100 and 75
  assert report._target_ratio(fast, base, 0.4) == ("0.50", "0.50")
  assert report._target_ratio(base, fast, 0.4) == ("2.00", "2.00")
  assert report._target_ratio(base, fast, 0.1) == ("—", "—")  # the baseline never does
  assert report._target_ratio(base, {"curve": fast["curve"][:1] + [
      {"fp": 100, "train_loss": 0.05}]}, 0.1) == ("never", "never")


def test_curvature_oracle_installs_hessian_and_resumes(tmp_path):
  from experiments.choose import oracle

  d = {"w": np.array([4.0, -1.0, 0.0, 1.0], np.float32)}
  h = oracle.preconditioner(d, "diag", 0.01)
  assert np.allclose(h["w"], [8 / 3, 2 / 3, 0.01, 2 / 3])  # |d| / mean |d|, floored
  h = oracle.preconditioner({"a": np.ones(3, np.float32), "b": np.full(1, 5.0, np.float32)},
                            "tensor", 0.01)
  assert np.allclose(h["a"], 0.5) and np.allclose(h["b"], 2.5)  # per-tensor means / 2
  cfg = harness.make_config("fa", "oracle", 1e-3, options={
      "mu": 1e-3, "oracle": "diag", "refresh": 10, "samples": 2}, seed=0, budget=40,
      eval_every=20)
  kw = dict(results=str(tmp_path / "a"), ckpts=str(tmp_path / "c"), log=lambda s: None)
  whole = harness.run(cfg, tasks.TASKS["fa"], **kw)
  assert whole["forward_passes"] == 41 and whole["steps"] == 20  # 3 + 2 * 19: l0 on step 0
  assert [o["step"] for o in whole["oracle"]] == [0, 10]
  assert whole["curve"][1]["mean_h"] == pytest.approx(1.0, rel=0.05)
  kw = dict(results=str(tmp_path / "b"), ckpts=str(tmp_path / "d"), log=lambda s: None)
  assert harness.run(cfg, tasks.TASKS["fa"], stop_after=20, **kw) is None
  resumed = harness.run(cfg, tasks.TASKS["fa"], **kw)
  assert resumed["final"] == whole["final"] and resumed["test"] == whole["test"]


def test_the_measured_preset_schedule_is_the_harness_schedule():
  """``hz.presets.decay_to_floor`` is the ``cosine_f0.3`` the tables measured (the harness
  keeps its own copy: it also runs snapshots of hizoo_jax from before the preset)."""
  import hizoo_jax as hz

  ours = hz.presets.decay_to_floor(1.78e-3, 500)
  theirs = harness.make_schedule("cosine_f0.3", 1.78e-3, 500)
  steps = np.arange(0, 700, 7)
  np.testing.assert_array_equal([float(ours(t)) for t in steps],
                                [float(theirs(t)) for t in steps])


def test_zo_rate_on_a_quadratic_with_known_statistics():
  """The three sums of experiments/choose/zo_rate.py on f_B(x) = sum_i a_i x_i^2 / 2 - b_B.x,
  where they are known: g = a x - mean_B b_B, the minibatch noise cycles through vectors
  that sum to zero (so the mean of the gradients over whole cycles is g exactly, and the
  debiasing, made for independent batches, gives (N |g|^2 - E|g_B|^2) / (N - 1)), and the
  Hessian is diag(a), on which a Rademacher Hutchinson sample is exact."""
  import jax.numpy as jnp

  from experiments.choose import zo_rate

  rng = np.random.default_rng(0)
  a = {"u": rng.uniform(0.5, 2.0, 5), "w": rng.uniform(0.1, 0.3, (3, 4))}
  x = {"u": rng.normal(size=5), "w": rng.normal(size=(3, 4))}
  b = {k: rng.normal(size=v.shape) for k, v in a.items()}
  cyc = 4
  noise = {k: rng.normal(size=(cyc, *v.shape)) for k, v in a.items()}
  noise = {k: v - v.mean(0) for k, v in noise.items()}  # the cycle sums to zero

  def loss_fn(p, t):
    return sum(jnp.sum(a[k] * p[k] ** 2) / 2 - jnp.sum((b[k] + jnp.asarray(noise[k])[t]) * p[k])
               for k in p)

  inst = tasks.Instance(params={k: jnp.asarray(v, jnp.float32) for k, v in x.items()},
                        extra=(), loss_fn=loss_fn, batch=lambda t: (t % cyc,),
                        evaluate=None, test=None, info={})
  n = 8 * cyc
  m = zo_rate.measure_instance(inst, batches=n, hvp=3)
  assert m["names"] == ["['u']", "['w']"] and m["n"] == [5, 12]
  for i, k in enumerate(("u", "w")):
    g = a[k] * x[k] - b[k]
    gb2 = np.mean([np.sum((g - noise[k][t]) ** 2) for t in range(cyc)])
    np.testing.assert_allclose(m["gb2"][i], gb2, rtol=1e-5)
    np.testing.assert_allclose(m["g2"][i], (n * np.sum(g ** 2) - gb2) / (n - 1), rtol=1e-5)
    np.testing.assert_allclose(m["trh"][i], np.sum(a[k]), rtol=1e-5)
    assert m["trh_se"][i] < 1e-5 * np.sum(a[k])
  # the rate of a subset: |g_S|^4 / (E|g_B,S|^2 tr H_S), relative to every parameter
  rows = zo_rate.rates(m, {"all": lambda p: True, "u": lambda p: "u" in p,
                           "none": lambda p: False, "u again": lambda p: "w" not in p})
  assert [r["subset"] for r in rows] == ["all", "u"]  # empty or repeated subsets: left out
  g2, gb2, trh = (np.asarray(m[k]) for k in ("g2", "gb2", "trh"))
  rate = lambda s: np.sum(g2[s]) ** 2 / (np.sum(gb2[s]) * np.sum(trh[s]))
  np.testing.assert_allclose(rows[1]["relative_rate"], rate([0]) / rate([0, 1]), rtol=1e-9)
  np.testing.assert_allclose(rows[0]["lr_star"], np.sum(g2) / (np.sum(gb2) * np.sum(trh)),
                             rtol=1e-9)


def test_zo_rate_batch_scaling_matches_enumerated_minibatches():
  """zo_rate.batch_scaling predicts E|g_B|^2 at other batch sizes from one measurement. On 5
  per-example gradients, minibatches drawn with replacement: the measurement at batch 1 and
  every ordered minibatch of 2 and 3 enumerated give the same E|g_B|^2; the gain a step
  makes at its best lr is |g|^4 / (2 E|g_B|^2 tr H), so per forward pass it scales as
  1 / E|g_B|^2 and per example as 1 / (B E|g_B|^2)."""
  import itertools

  from experiments.choose import zo_rate

  rng = np.random.default_rng(0)
  per_example = rng.normal(size=(5, 7)) + 0.3
  g = per_example.mean(0)

  def exact(b):
    return np.mean([np.sum(per_example[list(ix)].mean(0) ** 2)
                    for ix in itertools.product(range(5), repeat=b)])

  m = {"g2": [np.sum(g[:3] ** 2), np.sum(g[3:] ** 2)],  # two leaves: the sums are over both
       "gb2": [np.sum(per_example[:, :3] ** 2) / 5, np.sum(per_example[:, 3:] ** 2) / 5]}
  rows = zo_rate.batch_scaling(m, 1, (1, 2, 3))
  g2 = np.sum(g ** 2)
  for r in rows:
    np.testing.assert_allclose(r["gb2_over_g2"] * g2, exact(r["batch"]), rtol=1e-12)
    np.testing.assert_allclose(r["per_pass"], exact(1) / exact(r["batch"]), rtol=1e-12)
    np.testing.assert_allclose(r["per_example"], exact(1) / (r["batch"] * exact(r["batch"])),
                               rtol=1e-12)
  assert rows[0]["per_pass"] == rows[0]["per_example"] == 1.0


def test_paired_differences_are_per_seed():
  """Method minus baseline over the seeds both ran, and the standard error of their mean
  from the differences' spread (not from either run's)."""
  from experiments.choose import report

  def res(train, val, acc):
    return {"final": {"train_loss": train, "val_loss": val},
            "test": {"test_accuracy": acc, "test_loss": 1.0 - acc}}

  base = {0: res(0.40, 0.50, 0.80), 1: res(0.30, 0.40, 0.70), 2: res(0.20, 0.30, 0.90)}
  meth = {0: res(0.38, 0.49, 0.81), 1: res(0.29, 0.41, 0.73), 3: res(0.1, 0.1, 0.99)}
  d = report.paired_differences(meth, base)
  assert d["train CE"][0] == [0, 1]  # seed 2 has no method run, seed 3 no baseline
  np.testing.assert_allclose(d["train CE"][1], [-0.02, -0.01], atol=1e-12)
  np.testing.assert_allclose(d["test acc (points)"][1], [1.0, 3.0], atol=1e-9)
  text = report._paired_text("m", d)
  # mean +2.0, standard error std([1, 3], ddof=1) / sqrt(2) = 1.0
  assert "test acc (points) +2.0 ± 1.0 (seeds 0, 1: +1.0, +3.0)" in text
  assert "train CE -0.0150 ± 0.0050" in text and "test CE -0.0200 ± 0.0100" in text
  # a run without a test set (the test functions) and a single pair give no line
  assert report._paired_text("m", report.paired_differences(
      {0: {"final": {"train_loss": 1.0, "val_loss": None}, "test": None}},
      {0: {"final": {"train_loss": 2.0, "val_loss": None}, "test": None}})) == ""


def test_every_table_builds_its_optimizers():
  """Every grid of every table names a task that exists and a method whose options build
  and initialise (a typo in an option would otherwise surface hours into a queue)."""
  import jax.numpy as jnp

  params = {"w": jnp.ones((8, 8), jnp.float32), "b": jnp.zeros((8,), jnp.float32)}
  built = set()
  for name, grids in run.TABLES.items():
    for g in grids:
      assert g.task in tasks.TASKS, (name, g.task)
      assert g.exponents and g.seeds and g.budget > 0, name
      if g.method in (harness.ORACLE, harness.CONTROL):
        continue
      key = (g.method, g.options)
      if key in built:
        continue
      opts = harness.resolve_options(dict(g.options), 64 + 8)
      tx = harness.build_tx(g.method, run.lr_of(g.exponents[0]), opts, seed=0)
      state = tx.init(params)
      assert state is not None, (name, g.method)
      built.add(key)
  assert any(m == "zo_muon" for m, _ in built) and any(m == "sparse_mezo" for m, _ in built)


# Where each of ``hz.presets.MEASURED``'s settings was measured: task -> (the harness's task,
# method -> (table, the grids of that method in the table whose best it is), or several such
# pairs, one per table).
MEASURED_SOURCES = {
    "digits": ("digits", {
        "mezo": ("digits_mezo", ("",)), "fzoo": ("digits_methods", ("_n4", "_n8", "_n16")),
        "forward_gradient": ("digits_methods", ("",)),
        "lozo": ("digits_methods", ("_r2", "_r8")),
        "subzero": ("digits_methods", ("_r2", "_r8")),
        "zo_muon": ("digits_methods", ("_r2", "_r8")),
        "hizoo": ("digits_hizoo", ("_a0.5d", "_a0.001", "_a1e-06")),
        "hizoo_l": ("digits_hizoo_l", ("_a0.5d", "_a0.001", "_a1e-06"))}),
    "sst2_ft": ("sst2_ft_full", {
        "mezo": ("sst2_short_mezo_constant", ("",)),
        "fzoo": ("sst2_short_fzoo_constant", ("_n8",)),
        "sparse_mezo": ("sst2_short_sparse_mezo", ("",)),
        "forward_gradient": ("sst2_short_forward_gradient", ("",)),
        "lozo": ("sst2_short_lozo", ("_r2",)), "subzero": ("sst2_short_subzero", ("_r8",)),
        "zo_muon": (("sst2_short_zo_muon", ("_r64",)), ("sst2_short_ranks", ("_r16",))),
        "hizoo": ("sst2_short_hizoo", ("_a0.5d", "_a0.001", "_a1e-06"))}),
    "sst2_lora": ("sst2_lora_full", {
        "mezo": ("sst2_short_lora_mezo", ("",)),
        "fzoo": ("sst2_short_lora_fzoo", ("_n8",))}),
}


def test_measured_presets_are_the_benchmarks_selection():
  """``hz.presets.MEASURED`` is what the committed results select: per method, the grid
  with the lowest validation loss at its selected (constant) rate, that rate to the three
  digits the preset spells, and the options the runs were made with."""
  import math

  import jax.numpy as jnp

  import hizoo_jax as hz
  from experiments.choose import report
  from experiments.prompted import report as prompted

  results = os.path.join(os.path.dirname(run.__file__), "results")
  # the prompted-LLM table's tasks: experiments/tests/test_prompted.py
  assert set(hz.presets.MEASURED) == {*MEASURED_SOURCES, prompted.measured_task(16),
                                      prompted.measured_task(512)}
  params = {"w": jnp.ones((8, 8), jnp.float32), "b": jnp.zeros((8,), jnp.float32)}
  for task in MEASURED_SOURCES:
    methods = hz.presets.MEASURED[task]
    harness_task, sources = MEASURED_SOURCES[task]
    assert set(methods) == set(sources), task
    for method, preset in methods.items():
      # one (table, tags) pair, or several: a key option measured later in a table of its own
      tables = sources[method] if isinstance(sources[method][0], tuple) else (sources[method],)
      best = {}
      for table, tags in tables:
        found = set()
        for g in run.TABLES[table]:
          if g.task == harness_task and g.method == method and g.tag in tags:
            exps = report.grid_exponents(g, "constant", results)
            e, means = run.select(g, "constant", exps, results)
            assert e is not None, (task, method, g.tag)
            assert e not in (min(exps), max(exps)), (task, method, g.tag)  # interior
            best[table, g.tag] = (means[e], e, g)
            found.add(g.tag)
        assert found == set(tags), (task, method, table, found)
      _, e, g = min(best.values(), key=lambda b: b[0])
      # the preset spells the rate to three significant digits: rounding there moves it by
      # at most half a unit of the third digit, 0.005 of a leading 1.00
      assert math.isclose(preset["learning_rate"], run.lr_of(e), rel_tol=5e-3), (task, method)
      ran = run.load(g.config(e, "constant", g.seeds[0]), results)
      for k, v in ran["resolved_options"].items():
        assert preset[k] == v, (task, method, k)
      tx = hz.presets.measured(method, task, seed=3)
      assert tx.init(params) is not None
  with pytest.raises(ValueError, match="measured tasks"):
    hz.presets.measured("mezo", "imagenet")
  with pytest.raises(ValueError, match="measured there"):
    hz.presets.measured("sparse_mezo", "digits")


# The "At a glance" tables of docs/results/choosing.md (every row changes one thing), by the
# first cells of their header:
# each row's (passes, method) cells -> (table, the baseline table, the seeds besides the
# grid's, the report's label of the row, task).
GLANCE = {
    "| passes | method, setting |": {
        ("20,000", "FZOO-8, every parameter, constant 1.78·10⁻⁴"): (
            "sst2_long_ft_fzoo", "sst2_long_ft_cosine", (1, 2), "fzoo_n8 constant",
            "sst2_ft_full"),
        ("20,000", "ZO-Muon, rank 16, 4 probes, constant 3.16·10⁻³"): (
            "sst2_long_ft_zo_muon", "sst2_long_ft_cosine", (), "zo_muon_r16 constant",
            "sst2_ft_full"),
        ("4,000", "ZO-Muon, rank 64, 4 probes, 3.16·10⁻³"): (
            "sst2_short_zo_muon", "sst2_short_mezo_constant", (1, 2, 3, 4),
            "zo_muon_r64 constant", "sst2_ft_full"),
        ("4,000", "ZO-Muon, rank 16, 4 probes, 10⁻²"): (
            "sst2_short_ranks", "sst2_short_mezo_constant", (1, 2, 3, 4), "zo_muon_r16 constant",
            "sst2_ft_full"),
        ("4,000", "MeZO, layers 1-3, 1.78·10⁻⁵"): (
            "sst2_short_layers", "sst2_short_mezo_constant", (1, 2, 3, 4), "mezo constant",
            "sst2_ftl123_full"),
        ("4,000", "FZOO-8, constant 5.62·10⁻⁴"): (
            "sst2_short_fzoo_constant", "sst2_short_mezo_constant", (1, 2),
            "fzoo_n8 constant", "sst2_ft_full"),
        ("4,000", "Sparse MeZO, 10⁻⁴"): (
            "sst2_short_sparse_mezo", "sst2_short_mezo_constant", (1, 2, 3, 4),
            "sparse_mezo constant", "sst2_ft_full"),
        ("4,000", "SubZero, rank 8, 10⁻⁵"): (
            "sst2_short_subzero", "sst2_short_mezo_constant", (1, 2), "subzero_r8 constant",
            "sst2_ft_full"),
        ("4,000", "curvature oracle: Hutchinson diagonal, cosine 3.16·10⁻⁵"): (
            "sst2_short_oracle", "sst2_short_mezo_constant", (1, 2),
            "oracle_diag_r0_f1 cosine", "sst2_ft_full"),
        ("4,000", "FZOO-16, constant 1.78·10⁻³"): (
            "sst2_short_fzoo_probes", "sst2_short_mezo_constant", (), "fzoo_n16 constant",
            "sst2_ft_full"),
        ("4,000", "HiZOO, α = 0.5/d (the best of three α), 10⁻⁵"): (
            "sst2_short_hizoo", "sst2_short_mezo_constant", (), "hizoo_a0.5d constant",
            "sst2_ft_full"),
        ("4,000", "LOZO, rank 2, 3.16·10⁻⁶"): (
            "sst2_short_lozo", "sst2_short_mezo_constant", (), "lozo_r2 constant",
            "sst2_ft_full"),
        ("4,000", "forward gradient (exact jvp), 10⁻⁵"): (
            "sst2_short_forward_gradient", "sst2_short_mezo_constant", (),
            "forward_gradient constant", "sst2_ft_full"),
        ("4,000, k = 512", "FZOO-8, constant 1.78·10⁻³"): (
            "sst2_short_k512_fzoo", "sst2_short_k512_mezo_cosine", (1, 2), "fzoo_n8 constant",
            "sst2_ft_k512"),
    },
    "| passes | LoRA: method, setting |": {
        ("20,000", "MeZO, constant 1.78·10⁻⁴ (the other schedule)"): (
            "sst2_long_lora_constant", "sst2_long_lora_cosine", (1, 2), "mezo constant",
            "sst2_lora_full"),
        ("20,000", "FZOO-8, constant 5.62·10⁻⁴"): (
            "sst2_long_lora_fzoo", "sst2_long_lora_cosine", (1, 2), "fzoo_n8 constant",
            "sst2_lora_full"),
        ("4,000", "FZOO-8, constant 1.78·10⁻³"): (
            "sst2_short_lora_fzoo", "sst2_short_lora_mezo_cosine", (1, 2),
            "fzoo_n8 constant", "sst2_lora_full"),
        ("4,000", "FZOO-8 and momentum 0.9, constant 1.78·10⁻⁴"): (
            "sst2_short_lora_fzoo_mom", "sst2_short_lora_mezo_cosine", (1, 2),
            "fzoo_n8_mom0.9 constant", "sst2_lora_full"),
        ("4,000", "MeZO, constant 1.78·10⁻⁴ (the other schedule)"): (
            "sst2_short_lora_mezo", "sst2_short_lora_mezo_cosine", (1, 2), "mezo constant",
            "sst2_lora_full"),
        ("4,000", "curvature oracle: Hutchinson diagonal, cosine 5.62·10⁻⁴"): (
            "sst2_short_lora_oracle", "sst2_short_lora_mezo_cosine", (1, 2),
            "oracle_diag_r0_f1 cosine", "sst2_lora_full"),
        ("4,000", "MeZO, layers 1-3 only, head frozen, cosine 1.78·10⁻³"): (
            "sst2_short_lora_layers", "sst2_short_lora_mezo_cosine", (1, 2), "mezo cosine",
            "sst2_loral123nh_full"),
        ("4,000", "MeZO, head frozen, cosine 10⁻³"): (
            "sst2_short_lora_layers", "sst2_short_lora_mezo_cosine", (1, 2), "mezo cosine",
            "sst2_loranh_full"),
        ("4,000", "HiZOO, α = 10⁻¹⁰ (the best of three α), cosine 5.62·10⁻⁴"): (
            "sst2_short_lora_hizoo", "sst2_short_lora_mezo_cosine", (),
            "hizoo_a1e-10 cosine", "sst2_lora_full"),
        ("4,000, k = 512", "FZOO-8, constant 1.78·10⁻³"): (
            "sst2_short_lora_k512_fzoo", "sst2_short_lora_k512_mezo_cosine", (1, 2),
            "fzoo_n8 constant", "sst2_lora_k512"),
        ("4,000, k = 512", "MeZO, constant 1.78·10⁻⁴ (the other schedule)"): (
            "sst2_short_lora_k512_mezo", "sst2_short_lora_k512_mezo_cosine", (1, 2),
            "mezo constant", "sst2_lora_k512"),
    },
    "| passes | digits: method, setting |": {
        ("40,000", "FZOO-8 and momentum 0.95, cosine to 30%, 5.62·10⁻⁴"):
            ("digits_compose_fzoo", "digits_mezo", (), "fzoo_n8_mom0.95 cosine_f0.3", "digits"),
        ("40,000", "FZOO-8 and momentum 0.9, cosine to 30%, 10⁻³"):
            ("digits_compose", "digits_mezo", (), "fzoo_n8_mom0.9 cosine_f0.3", "digits"),
        ("40,000", "FZOO-8, cosine to 30%, 10⁻²"):
            ("digits_methods_sched", "digits_mezo", (), "fzoo_n8 cosine_f0.3", "digits"),
        ("40,000", "FZOO-16, cosine to 30%, 1.78·10⁻²"):
            ("digits_methods_sched", "digits_mezo", (), "fzoo_n16 cosine_f0.3", "digits"),
        ("40,000",
         "oracle: Hutchinson diagonal, refreshed every 2,000 steps, cosine to 30%, 3.16·10⁻³"):
            ("digits_oracle_refresh_sched", "digits_mezo", (),
             "oracle_diag_r2000_f1 cosine_f0.3", "digits"),
        ("40,000", "LOZO, rank 2, cosine to 30%, 10⁻³"):
            ("digits_methods_sched", "digits_mezo", (), "lozo_r2 cosine_f0.3", "digits"),
        ("40,000", "MeZO and Adam, cosine to 30%, 1.78·10⁻³"):
            ("digits_compose", "digits_mezo", (), "mezo_adam cosine_f0.3", "digits"),
        ("40,000", "forward gradient (exact jvp), cosine to 30%, 1.78·10⁻³"):
            ("digits_methods_sched", "digits_mezo", (), "forward_gradient cosine_f0.3", "digits"),
        ("40,000", "ZO-Muon, rank 8, constant 5.62·10⁻²"):
            ("digits_methods", "digits_mezo", (), "zo_muon_r8 constant", "digits"),
        ("40,000", "oracle: Hutchinson diagonal at the start, cosine to 30%, 1.78·10⁻³"):
            ("digits_oracle_sched", "digits_mezo", (), "oracle_diag_r0_f1 cosine_f0.3", "digits"),
        ("40,000", "HiZOO, α = 10⁻⁶ (the best of three α), constant 1.78·10⁻³"):
            ("digits_hizoo", "digits_mezo", (), "hizoo_a1e-06 constant", "digits"),
        ("40,000", "its control: MeZO, lr / mean H(t)"):
            ("digits_hizoo", "digits_mezo", (),
             "  control: MeZO, lr / mean H(t) of hizoo_a1e-06 constant", "digits"),
        ("40,000", "SubZero, rank 8, constant 10⁻³"):
            ("digits_methods", "digits_mezo", (), "subzero_r8 constant", "digits"),
        ("40,000", "Sparse MeZO, constant 3.16·10⁻²"):
            ("digits_methods", "digits_mezo", (), "sparse_mezo constant", "digits"),
    },
}


def test_choosing_at_a_glance_is_the_report():
  """Every row of the results page's summary tables is what the report computes from the
  committed results: the seeds, each seed's interpolated pass ratio, and the paired
  differences (mean and standard error, or the one seed's difference) of training CE,
  test CE and test accuracy, as the report prints them."""
  from experiments.choose import report

  results = os.path.join(os.path.dirname(run.__file__), "results")
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  with open(os.path.join(root, "docs", "results", "choosing.md"), encoding="utf-8") as fh:
    page = fh.read()
  for header, glance in GLANCE.items():
    start = page.index(header)
    rows = []
    for line in page[start:page.index("\n\n", start)].splitlines()[2:]:
      rows.append([c.strip().replace("**", "").replace("−", "-")
                   for c in line.strip("|").split("|")])
    keys = [(cells[0], cells[1]) for cells in rows]
    assert keys == list(glance), header
    for key, cells in zip(keys, rows, strict=True):
      table, baseline, extra, label, task = glance[key]
      _, _, b_runs = report.tuned_baseline(baseline, results, task, extra)
      (runs,) = [rs for lab, _, rs in report.selected_runs(table, results, task, extra)
                 if lab == label]
      seeds = sorted(runs)
      assert cells[2] == str(len(seeds)), key
      ratios = []
      for s in seeds:
        hit = report.fp_to_reach_interpolated(runs[s], b_runs[s]["final"]["train_loss"])
        ratios.append(report._ratio(hit, b_runs[s]))
      assert cells[3].split(":")[0] == ", ".join(ratios), (key, ratios)
      diffs = report.paired_differences(runs, b_runs)
      for cell, measure in zip(cells[4:7], ("train CE", "test CE", "test acc (points)"),
                               strict=True):
        got, d = diffs[measure]
        assert got == seeds, key
        assert cell == report.mean_se_text(measure, d), (key, measure, cell)
