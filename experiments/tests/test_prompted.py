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
out = {{k: list(table.read(os.path.join(tmp, k + ".jsonl.gz"))) for k in ("a", "b")}}
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
