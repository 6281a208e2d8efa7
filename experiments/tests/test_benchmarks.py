"""The benchmark scripts' timing helpers (benchmarks/common.py), on a fake clock."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))),
                                "benchmarks"))
import common  # noqa: E402

from tests.helpers import requires_minilm  # noqa: E402


class FakeClock:
  """``perf_counter`` that only moves when a timed function says so."""

  def __init__(self):
    self.now = 0.0
    self.log = []

  def __call__(self):
    return self.now

  def work(self, name, seconds):
    def fn():
      self.log.append(name)
      self.now += seconds()
    return fn


def test_time_paired_alternates_and_pairs_ratios(monkeypatch):
  clock = FakeClock()
  monkeypatch.setattr(common.time, "perf_counter", clock)
  # The machine slows down 3x halfway through: a ratio to one early reference timing would
  # read 2x then 6x; the paired ratio stays 2x.
  speed = iter([1.0] * 6 + [3.0] * 6)
  ref = clock.work("ref", lambda: 0.010 * next(speed))
  fn = clock.work("fn", lambda: 0.020 * next(speed))
  t_fn, t_ref, ratios = common.time_paired(fn, ref, repeats=5, warmup=1)
  assert clock.log == ["ref", "fn"] * 6
  assert ratios == pytest.approx([2.0] * 5)
  assert t_ref == pytest.approx(0.010 * 3.0)  # median of 1,1,3,3,3 (after the warm-up pair)
  assert t_fn == pytest.approx(0.020 * 3.0)


def test_quartiles():
  assert common.quartiles([5.0, 1.0, 4.0, 2.0, 3.0]) == (2.0, 3.0, 4.0)
  assert common.quartiles([1.0, 2.0]) == (1.25, 1.5, 1.75)


@requires_minilm
def test_pack_minilm_stores_the_weights_in_float16_and_loads_as_float32(tmp_path):
  import jax
  import numpy as np
  import pack_minilm
  from flax import nnx
  from safetensors.numpy import load_file

  from hizoo_jax.models import bert

  out = pack_minilm.pack(str(tmp_path))
  assert out == str(tmp_path / bert.MINILM_PACKAGE / "model")
  original = load_file(os.path.join(bert.minilm_path(), "model.safetensors"))
  packed = load_file(os.path.join(out, "model.safetensors"))
  assert sorted(packed) == sorted(original)
  for name, x in original.items():
    if x.dtype == np.float32:
      assert packed[name].dtype == np.float16
      np.testing.assert_array_equal(packed[name], x.astype(np.float16))
    else:  # the position ids
      np.testing.assert_array_equal(packed[name], x)
  assert os.path.getsize(os.path.join(out, "model.safetensors")) < 48 * 2**20
  model = bert.from_pretrained(out)  # the tokenizer and config travel with it
  leaves = jax.tree.leaves(nnx.state(model, nnx.Param))
  assert leaves and all(x.dtype == np.float32 for x in leaves)
  assert bert.load_tokenizer(out).encode("a test").ids[0] == 101  # [CLS]


def test_batch_cost_rows_on_a_tiny_bert(tmp_path, monkeypatch):
  """benchmarks/batch_cost.py: one row per batch size, each a real MeZO step (two forward
  passes counted by its own state), times from the clock the script reads, written out."""
  import json

  import batch_cost

  clock = FakeClock()
  calls = []
  real = batch_cost.time_calls

  def timed(fn, *, repeats, warmup):  # the real timer, on a clock that a row's batch sets
    calls.append((repeats, warmup))
    rows = len(calls)
    def work():
      fn()  # the real step: its state counts its forward passes
      clock.now += 0.5 * rows

    return real(work, repeats=repeats, warmup=warmup)

  monkeypatch.setattr(common.time, "perf_counter", clock)
  monkeypatch.setattr(batch_cost, "time_calls", timed)
  steps = []
  real_row = batch_cost.row

  def row(*args):
    out = real_row(*args)
    steps.append(out[1])
    return out

  monkeypatch.setattr(batch_cost, "row", row)
  out = tmp_path / "b.json"
  rows = batch_cost.main(["--tiny", "--batches", "2", "4", "--repeats", "3", "--length", "8",
                          "--out", str(out)])
  assert calls == [(3, 2), (3, 2)] and steps == [2, 2]
  assert [r["batch"] for r in rows] == [2, 4]
  assert [r["step_s"] for r in rows] == [0.5, 1.0]
  assert [r["s_per_sentence"] for r in rows] == [0.25, 0.25]
  assert json.loads(out.read_text())["rows"][1]["passes_per_step"] == 2


def test_first_call_rows_on_the_tiny_llama(tmp_path, monkeypatch):
  """benchmarks/first_call.py: one fresh process a row, timed, medians against Adam's,
  written with their provenance; a user's compilation cache is not handed to the rows."""
  import json

  import first_call

  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "cache"))
  out = tmp_path / "first_call.json"
  first_call.main(["--model", "tiny", "--methods", "adam", "mezo", "--repeats", "1",
                   "--out", str(out), "--conditions", "a test"])
  result = json.loads(out.read_text())
  assert [r["method"] for r in result["rows"]] == ["adam", "mezo"]
  assert all(r["seconds"] > 0 and len(r["runs"]) == 1 for r in result["rows"])
  assert result["rows"][0]["over_adam"] == 1.0
  assert result["model"] == "tiny" and result["conditions"] == "a test" and result["commit"]
  assert not (tmp_path / "cache").exists()


def test_git_commit_marks_changed_code_not_changed_results(tmp_path):
  """A record's commit says when the code that wrote it was not that commit's: a changed
  tracked Python file marks it ``-dirty``; a results file written by running jobs does not."""
  import subprocess

  def git(*args):
    subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t",
                    *args], check=True, capture_output=True)

  git("init", "-q")
  (tmp_path / "run.py").write_text("x = 1\n")
  (tmp_path / "results.jsonl").write_text("{}\n")
  (tmp_path / "sub").mkdir()
  (tmp_path / "sub" / "caller.py").write_text("")
  git("add", ".")
  git("commit", "-qm", "first")
  head = common.git_commit(str(tmp_path))
  assert head and not head.endswith("-dirty") and head != "unknown"
  (tmp_path / "results.jsonl").write_text("{}\n{}\n")
  assert common.git_commit(str(tmp_path)) == head
  (tmp_path / "run.py").write_text("x = 2\n")
  assert common.git_commit(str(tmp_path)) == head + "-dirty"
  # asked from a folder of the checkout, it still sees a change anywhere in it
  assert common.git_commit(str(tmp_path / "sub")) == head + "-dirty"
