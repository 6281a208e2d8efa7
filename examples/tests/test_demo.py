"""The README's demo and the sharded example, run as a user runs them (subprocesses, CPU)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import xla_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_demo_quick(tmp_path):
  out = subprocess.run([sys.executable, "examples/demo.py", "--quick", "--out", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=900,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.returncode == 0, out.stderr
  assert "| HiZOO |" in out.stdout and "| HiZOO-L |" in out.stdout
  assert "Digits MLP" in out.stdout and "| Adam (first order) |" in out.stdout
  # matched by forward passes (the states' counts): MeZO 2 a step, HiZOO 3; Adam in steps
  assert "f_a: forward passes (reached, stayed)" in out.stdout
  assert "| MeZO | 0.002 | 600 (300) |" in out.stdout, out.stdout
  assert "| HiZOO | 0.005 | 600 (200) |" in out.stdout
  assert "| Adam (first order) | 0.003 | 200 steps (backprop) |" in out.stdout
  # the methods of 0.4 at their measured digits settings: FZOO 16 probes (17 passes a
  # step), ZO-Muon 4 probes (5); FZOO on the test functions too
  assert "| FZOO | 0.01 | 612 (36) |" in out.stdout
  assert "| ZO-Muon | 0.0562 | 600 (120) |" in out.stdout
  assert out.stdout.count("| FZOO |") == 2
  for name in ("test_functions.png", "digits.png", "results.md", "results.json"):
    assert (tmp_path / name).stat().st_size > 0


@pytest.mark.slow
def test_sharded_example_smoke_on_8_virtual_devices():
  env = xla_env("--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
  # The default, --mode both with HiZOO, runs in tests/test_multihost.py (its one-process
  # reference on 8 devices).
  for args in (["--mode", "fsdp", "--optimizer", "hizoo_l"],
               ["--mode", "dp", "--optimizer", "mezo"]):
    out = subprocess.run([sys.executable, "examples/sharded_training.py", "--smoke", *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "8 cpu device(s)" in out.stdout and "step   19" in out.stdout, out.stdout
    losses = [float(v) for v in re.findall(r"loss ([0-9.]+)", out.stdout)]
    assert losses and all(np.isfinite(losses)), out.stdout
