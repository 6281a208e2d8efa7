"""One-off: the per-run result files of the experiments and examples into tables.

Run once from the repository root (``python -m experiments.convert_results``); it reads

* ``experiments/choose/results/<task>/<run>.json`` -> ``experiments/choose/results/<task>.jsonl.gz``
  (key: the run id), and ``results/zo_rate_*.json`` -> ``results/zo_rate.jsonl.gz`` (key: the
  file's name without ``zo_rate_``);
* ``experiments/sst2/results/<run>.json`` -> ``experiments/sst2/results.jsonl.gz``;
* ``examples/results/<dir>/`` (``results.json`` and its text files: the prediction written
  before the run, the summaries, the log) -> ``experiments/examples.jsonl.gz`` (key: the
  directory under ``examples/results``);

checks that every record reads back equal to its file up to the tables' 8 significant digits,
and prints the sizes. The curves are kept whole. One field is thinned: a run's ``mean_h_trace``
(HiZOO's mean ``H`` every 10 steps, for the step-size control rows) keeps at most 256 values,
every ``ceil(n / 256)``-th, its ``stride`` multiplied to match. The per-run files are then
removed from git by hand (``git rm -r``). An existing table is never overwritten.
"""

from __future__ import annotations

import glob
import json
import math
import os

from experiments import table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACE_MAX = 256


def thin_trace(tr: dict | None) -> dict | None:
  if not tr or len(tr["values"]) <= TRACE_MAX:
    return tr
  k = math.ceil(len(tr["values"]) / TRACE_MAX)
  return {"stride": tr["stride"] * k, "values": tr["values"][::k]}


def _same(a, b) -> bool:
  if isinstance(a, float) and isinstance(b, float):
    return (a == b or (math.isnan(a) and math.isnan(b))
            or abs(a - b) <= 1e-7 * max(abs(a), abs(b)))
  if isinstance(a, dict) and isinstance(b, dict):
    return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
  if isinstance(a, list) and isinstance(b, list):
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
  return a == b


def _load(p: str) -> dict:
  with open(p) as fh:
    return json.load(fh)


def convert(tables: dict[str, list[dict]]) -> None:
  for file, recs in tables.items():
    if os.path.exists(file) or not recs:  # converted already: a table is never overwritten
      print(f"{os.path.relpath(file, ROOT)}: exists or nothing to convert, left alone")
      continue
    n = table.write(file, recs)
    back = table.index(file)
    for r in recs:
      if not _same(back[r["key"]], r):
        raise AssertionError(f"{file}: {r['key']} does not read back")
    print(f"{os.path.relpath(file, ROOT)}: {n} runs, {os.path.getsize(file):,} bytes")


def choose() -> dict[str, list[dict]]:
  res = os.path.join(ROOT, "experiments", "choose", "results")
  out: dict[str, list[dict]] = {}
  for d in sorted(glob.glob(os.path.join(res, "*", ""))):
    recs = []
    for p in sorted(glob.glob(os.path.join(d, "*.json"))):
      r = _load(p)
      r = {"key": os.path.basename(p)[:-5], **r, "mean_h_trace": thin_trace(r.get("mean_h_trace"))}
      recs.append(r)
    out[table.path(res, os.path.basename(os.path.dirname(d)))] = recs
  out[table.path(res, "zo_rate")] = [
      {"key": os.path.basename(p)[len("zo_rate_"):-5], **_load(p)}
      for p in sorted(glob.glob(os.path.join(res, "zo_rate_*.json")))]
  return out


def sst2() -> dict[str, list[dict]]:
  d = os.path.join(ROOT, "experiments", "sst2")
  return {os.path.join(d, "results" + table.SUFFIX): [
      {"key": os.path.basename(p)[:-5], **_load(p)}
      for p in sorted(glob.glob(os.path.join(d, "results", "*.json")))]}


def examples() -> dict[str, list[dict]]:
  base = os.path.join(ROOT, "examples", "results")
  recs = []
  for p in sorted(glob.glob(os.path.join(base, "**", "results.json"), recursive=True)):
    d = os.path.dirname(p)
    texts = {}
    for q in sorted(glob.glob(os.path.join(d, "*"))):
      if q.endswith((".md", ".log", ".txt")):
        with open(q, encoding="utf-8") as fh:
          texts[os.path.basename(q)] = fh.read()
    parent = os.path.dirname(d)  # a prediction written for all seeds of a default
    if parent != base and os.path.isfile(os.path.join(parent, "PREDICTION.md")):
      with open(os.path.join(parent, "PREDICTION.md"), encoding="utf-8") as fh:
        texts.setdefault("../PREDICTION.md", fh.read())
    recs.append({"key": os.path.relpath(d, base), "results": _load(p), "files": texts})
  return {os.path.join(ROOT, "experiments", "examples" + table.SUFFIX): recs}


def main() -> None:
  convert({**choose(), **sst2(), **examples()})


if __name__ == "__main__":
  main()
