"""The results tables (experiments/table.py): append, read back, rounding, settings exact."""

import gzip
import json
import math

import pytest

from experiments import table


def test_append_reads_back_and_the_last_record_of_a_key_wins(tmp_path):
  f = table.path(str(tmp_path / "t"), "digits")
  assert table.index(f) == {} and table.find(f, "a") is None
  table.append(f, {"key": "b", "curve": [{"fp": 0, "val_loss": 2.295400857925415}]})
  table.append(f, {"key": "a", "final": {"val_loss": 0.1}})
  assert [r["key"] for r in table.read(f)] == ["a", "b"]
  assert table.find(f, "b")["curve"][0]["val_loss"] == 2.2954009  # 8 significant digits
  table.append(f, {"key": "a", "final": {"val_loss": 0.2}})  # a rerun replaces it
  assert table.find(f, "a")["final"]["val_loss"] == 0.2
  with gzip.open(f, "rt") as fh:  # one gzip member a record: a plain gzip stream
    assert len(fh.read().splitlines()) == 3


def test_settings_keep_every_digit_and_nonfinite_values_survive(tmp_path):
  f = table.path(str(tmp_path), "t")
  alpha = 0.5 / 22566146
  rec = {"key": "r", "config": {"lr": 1 / 3}, "resolved_options": {"alpha": alpha},
         "final": {"val_loss": math.inf, "train_loss": math.nan}}
  table.write(f, [rec])
  back = table.find(f, "r")
  assert back["config"]["lr"] == 1 / 3 and back["resolved_options"]["alpha"] == alpha
  assert back["final"]["val_loss"] == math.inf and math.isnan(back["final"]["train_loss"])
  assert json.dumps(table.compact({"x": [1 / 3, 2]})) == '{"x": [0.33333333, 2]}'


def test_a_record_needs_a_key(tmp_path):
  with pytest.raises(ValueError, match="key"):
    table.append(str(tmp_path / "t.jsonl.gz"), {"final": {}})
