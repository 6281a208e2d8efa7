"""benchmarks/gpu.py end to end on the tiny Llama (CI has no GPU: the CPU runs the same table)."""

import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The script's rows are one code path for every method: a zeroth-order one and Adam (whose
# compiled memory the test compares), then a variant row appended by a second call.
METHODS = ("mezo", "adam")


@pytest.mark.slow
def test_gpu_benchmark_tiny_table(tmp_path):
  out = tmp_path / "gpu.json"
  # A subprocess: the script's float32 model, not the float64 of conftest.py.
  proc = subprocess.run(
      [sys.executable, os.path.join(ROOT, "benchmarks", "gpu.py"), "--models", "tiny",
       "--methods", *METHODS, "--repeats", "2", "--out", str(out)],
      capture_output=True, text=True, timeout=600, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-3000:]
  res = json.loads(out.read_text())
  assert {"backend", "device", "cores", "jax"} <= set(res["machine"])
  assert res["models"]["tiny"]["compiled_forward_bytes"] > 0
  rows = {r["method"]: r for r in res["rows"]}
  assert sorted(rows) == sorted(METHODS)
  for r in rows.values():
    assert "error" not in r, r
    assert len(r["ratios"]) == 2
    q1, med, q3 = r["ratio"]
    assert math.isfinite(med) and med > 0 and q1 <= med <= q3
    assert r["step_ms"] > 0 and r["forward_ms"] > 0
    assert math.isfinite(r["loss"])
    assert r["compiled_ratio"] > 0
  # MeZO holds about the forward pass; Adam holds gradients and two moments besides.
  assert rows["mezo"]["compiled_ratio"] < rows["adam"]["compiled_ratio"]
  # the printed table has one row per method
  table = [line for line in proc.stdout.splitlines() if line.startswith("| tiny |")]
  assert len(table) == len(METHODS)
  # --append: a second call with other methods keeps the first call's rows and replaces
  # the rows it measures again.
  proc = subprocess.run(
      [sys.executable, os.path.join(ROOT, "benchmarks", "gpu.py"), "--models", "tiny",
       "--methods", "zo_muon_r16", "mezo", "--repeats", "2", "--out", str(out),
       "--append"],
      capture_output=True, text=True, timeout=600, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-3000:]
  merged = json.loads(out.read_text())
  methods = [r["method"] for r in merged["rows"]]
  assert sorted(methods) == sorted(set(METHODS) | {"zo_muon_r16"})  # mezo once
  # a variant row is its method at the options it names (ZO-Muon at the presets' rank 16)
  variant = next(r for r in merged["rows"] if r["method"] == "zo_muon_r16")
  assert variant["opts"] == {"rank": 16} and "error" not in variant, variant
  assert "The whole table" in proc.stdout


def test_bfloat16_step_memory_holds_no_perturbed_copy(tmp_path):
  # benchmarks/llama1b_memory.py on the tiny Llama in bfloat16 (abstract params, compiled
  # only): the default for 16-bit params, restore="exact", forms theta + c mu D where the
  # forward pass reads each leaf: beyond the forward pass's temporaries it holds at most
  # 0.1 params-worth plus the largest leaf (a perturbed copy would be 1.0), as does
  # "inplace". Bounds: XLA's other temporaries move by a few KiB.
  out = tmp_path / "mem.json"
  proc = subprocess.run(
      [sys.executable, os.path.join(ROOT, "benchmarks", "llama1b_memory.py"), "--model",
       "tiny", "--methods", "mezo", "--out", str(out)],
      capture_output=True, text=True, timeout=600, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(out.read_text())
  rows = {r["restore"]: r for r in result["rows"]}
  assert 0 < result["largest_leaf"] < 0.5
  assert -0.01 < rows["exact"]["extra_temp_params"] <= 0.1 + result["largest_leaf"]
  assert abs(rows["inplace"]["extra_temp_params"]) < 0.1
