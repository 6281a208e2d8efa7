"""Results tables: one gzipped JSON Lines file per benchmark table, one record per run.

A record is the run's whole result (settings, provenance, curve) as one JSON object with a
``key`` (the run's id, unique in its table). Writers append one gzip member per record under
an exclusive lock, so two queues may share a table; gzip readers read the members as one
stream. Readers cache a table by its size and modification time.

Measured floats are stored with 8 significant digits (:func:`compact`): losses are float32
values or means of them, whose eighth digit is already below their rounding, and the stored
curves keep every evaluation. Settings (the fields named in ``EXACT``, at any depth) keep
every digit, so that a run's options read back equal. Gzip takes the numbers to about a
seventh of their text.
"""

from __future__ import annotations

import fcntl
import gzip
import json
import os
from collections.abc import Iterable, Iterator
from typing import Any

SUFFIX = ".jsonl.gz"
DIGITS = 8
EXACT = frozenset({"key", "config", "options", "resolved_options", "task_info", "args"})

_CACHE: dict[str, tuple[tuple[int, int], dict[str, dict]]] = {}


def path(directory: str, name: str) -> str:
  """The file of table ``name`` in ``directory``."""
  return os.path.join(directory, name + SUFFIX)


def compact(obj: Any, digits: int = DIGITS) -> Any:
  """``obj`` with every float rounded to ``digits`` significant digits, except under the keys
  of ``EXACT`` (NaN and infinities kept; JSON writes them as ``NaN`` and ``Infinity``, which
  Python's reader reads back)."""
  if isinstance(obj, float):
    return float(f"{obj:.{digits}g}")
  if isinstance(obj, dict):
    return {k: v if k in EXACT else compact(v, digits) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [compact(v, digits) for v in obj]
  return obj


def _line(record: dict) -> bytes:
  return (json.dumps(compact(record), separators=(",", ":")) + "\n").encode()


def append(file: str, record: dict) -> None:
  """Appends ``record`` (which must hold a ``key``) to the table ``file``."""
  if "key" not in record:
    raise ValueError("a table record needs a 'key' (the run's id); add record['key'] = run_id")
  os.makedirs(os.path.dirname(file) or ".", exist_ok=True)
  data = gzip.compress(_line(record), 9, mtime=0)
  with open(file, "ab") as fh:
    fcntl.flock(fh, fcntl.LOCK_EX)
    try:
      fh.write(data)
      fh.flush()
      os.fsync(fh.fileno())
    finally:
      fcntl.flock(fh, fcntl.LOCK_UN)


def write(file: str, records: Iterable[dict]) -> int:
  """Writes the table ``file`` anew from ``records`` (sorted by key); returns their number."""
  rows = sorted(records, key=lambda r: r["key"])
  os.makedirs(os.path.dirname(file) or ".", exist_ok=True)
  tmp = file + ".tmp"
  with gzip.GzipFile(tmp, "wb", 9, mtime=0) as fh:
    for r in rows:
      fh.write(_line(r))
  os.replace(tmp, file)
  return len(rows)


def index(file: str) -> dict[str, dict]:
  """The table ``file`` as ``{key: record}`` (the last record of a key wins); empty where
  the file does not exist."""
  try:
    st = os.stat(file)
  except FileNotFoundError:
    return {}
  stamp = (st.st_size, st.st_mtime_ns)
  hit = _CACHE.get(file)
  if hit is not None and hit[0] == stamp:
    return hit[1]
  rows: dict[str, dict] = {}
  with gzip.open(file, "rt", encoding="utf-8") as fh:
    for line in fh:
      if line.strip():
        r = json.loads(line)
        rows[r["key"]] = r
  _CACHE[file] = (stamp, rows)
  return rows


def read(file: str) -> Iterator[dict]:
  """The records of table ``file``, in key order."""
  rows = index(file)
  return (rows[k] for k in sorted(rows))


def find(file: str, key: str) -> dict | None:
  """The record ``key`` of table ``file``, or None."""
  return index(file).get(key)
