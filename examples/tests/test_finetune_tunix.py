"""``examples/finetune_tunix.py``: Tunix's trainer with the library's zeroth-order step, run
as a user runs it. Skipped where Tunix (extra ``tunix``) is not installed."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("tunix", reason="the tunix extra is not installed")
pytest.importorskip("qwix", reason="the tunix extra is not installed")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# a Llama 3 layout: GQA, llama3 RoPE scaling (the library's tests' fixture)
LLAMA = os.path.join(ROOT, "tests", "data", "tiny_llama")


def _loss_line(stdout: str) -> tuple[float, float]:
  last = stdout.strip().splitlines()[-1]
  assert last.startswith("loss ") and " -> " in last, last
  a, b = last[len("loss "):].split(" -> ")
  return float(a), float(b)


@pytest.mark.slow
def test_example_smoke_learns():
  """``finetune_tunix.py --smoke``: a tiny random Qwen 3 of Tunix's class, qwix LoRA, HiZOO
  through ZOPeftTrainer; 100 steps take the loss of its 32 training prompts from 0.73 to
  0.56 (measured; MeZO: 0.64). Asserted: a drop of at least 10%."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "finetune_tunix.py"),
                        "--smoke"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  before, after = _loss_line(out.stdout)
  assert after < 0.9 * before, (before, after)


def test_example_reads_a_checkpoint_and_refuses_a_rope_tunix_misreads(tmp_path, capsys):
  """``--model DIR`` on a Hugging Face Llama checkpoint: read into Tunix's Llama 3 when its
  RoPE is the one Tunix computes, refused otherwise (the fixture: llama3 scaling). The run
  is FZOO's, which counts its passes from the state (9 a step: 8 probes and the centre)."""
  from examples import finetune_tunix as example
  with pytest.raises(ValueError, match="RoPE"):
    example.load_checkpoint(LLAMA, jnp.float32)
  with open(os.path.join(LLAMA, "config.json")) as fh:
    cfg = json.load(fh)
  os.symlink(os.path.join(LLAMA, "model.safetensors"), tmp_path / "model.safetensors")
  with open(tmp_path / "config.json", "w") as fh:
    json.dump(dict(cfg, rope_parameters={"rope_theta": 1e6, "rope_type": "default"}), fh)
  example.main(["--model", str(tmp_path), "--smoke", "--steps", "20", "--optimizer", "fzoo"])
  printed = capsys.readouterr().out
  before, after = _loss_line(printed)
  assert np.isfinite(before) and np.isfinite(after) and after != before
  assert "180 forward passes in 20 steps" in printed


def test_example_gpu_table_formats_its_rows(tmp_path, monkeypatch):
  """``--gpu-table`` (run on a GPU only): one process per row, read back into a table with
  the forward passes each zeroth-order run executed (backprop for Adam). The processes are
  replaced by rows written as ``run`` writes them."""
  from examples import finetune_tunix as example
  passes = {"adam": None, "mezo": 20, "hizoo": 30, "hizoo_l": 30}

  def fake_run(cmd, check):
    name = cmd[cmd.index("--optimizer") + 1]
    row = dict(optimizer=name, device="fake", dtype="bfloat16", params=10, lora_params=2,
               steps=10, batch_size=16, max_length=64, forward_passes=passes[name],
               sec_per_step=0.5, peak_bytes=2**30, loss_before=0.7, loss_after=0.6)
    with open(cmd[cmd.index("--json") + 1], "w") as fh:
      json.dump(row, fh)

  monkeypatch.setattr(example.subprocess, "run", fake_run)
  args = argparse.Namespace(out=str(tmp_path), steps=10, data=None)
  example.gpu_table(args)
  table = (tmp_path / "gpu_table.md").read_text()
  assert "| PeftTrainer / adam | 0.5000 | backprop | 1.00 | 0.7000 -> 0.6000 |" in table
  assert "| ZOPeftTrainer / hizoo | 0.5000 | 30 | 1.00 | 0.7000 -> 0.6000 |" in table
  assert table.count("\n|") == 6  # header, rule, four rows


@pytest.mark.slow
def test_example_smoke_runs_zo_muon(capsys):
  """``finetune_tunix.py --smoke --steps 20 --optimizer zo_muon`` (in this process): runs
  ZO-Muon and counts its passes (5 a step). FZOO, the other method with its own --smoke
  rate: the checkpoint test above."""
  from examples import finetune_tunix as example
  example.main(["--smoke", "--steps", "20", "--optimizer", "zo_muon"])
  printed = capsys.readouterr().out
  assert f"{20 * 5:,} forward passes in 20 steps" in printed, printed[-2000:]
  before, after = _loss_line(printed)
  assert np.isfinite(after), (before, after)
