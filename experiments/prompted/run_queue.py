"""Runs the table's queue (``queue.txt``: one ``run.py`` call a line, in order), ``--runs`` of
them at a time, each on one core.

    nohup python -m experiments.prompted.run_queue --runs 2 > experiments/prompted/logs/queue.log &

A line is read when a run slot frees up, so lines appended (or reordered below the running
ones) while it runs are picked up. A run already in the table is skipped by ``run.py`` and an
interrupted one resumes from its last checkpoint, so after any interruption the same command
carries on. Start one queue process at a time: two would run the same lines. Each run's output
is ``logs/<its arguments>.log``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
QUEUE = os.path.join(HERE, "queue.txt")
LOGS = os.path.join(HERE, "logs")
# One core a run: XLA's own thread pool would make two runs fight over both cores.
ONE_CORE = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def lines(path: str) -> list[str]:
  with open(path) as fh:
    return [s.strip() for s in fh if s.strip() and not s.lstrip().startswith("#")]


def log_name(line: str) -> str:
  return re.sub(r"[^A-Za-z0-9.=-]+", "_", line.replace("--", ""))[:150] + ".log"


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--queue", default=QUEUE)
  p.add_argument("--runs", type=int, default=2, help="runs at a time")
  p.add_argument("--script", default=os.path.join(HERE, "run.py"), help=argparse.SUPPRESS)
  p.add_argument("--logs", default=LOGS, help=argparse.SUPPRESS)
  a = p.parse_args(argv)
  os.makedirs(a.logs, exist_ok=True)
  env = dict(os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} {ONE_CORE}".strip())
  started: set[str] = set()
  lock = threading.Lock()

  def next_line() -> str | None:
    with lock:
      todo = [s for s in lines(a.queue) if s not in started]
      if not todo:
        return None
      started.add(todo[0])
      return todo[0]

  def worker(n: int) -> None:
    while (line := next_line()) is not None:
      print(time.strftime("%H:%M:%S"), f"slot {n} start", line, flush=True)
      with open(os.path.join(a.logs, log_name(line)), "a") as log:
        rc = subprocess.call([sys.executable, a.script, *line.split()],
                             stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
      print(time.strftime("%H:%M:%S"), f"slot {n} end (exit {rc})", line, flush=True)

  threads = [threading.Thread(target=worker, args=(n,)) for n in range(a.runs)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()


if __name__ == "__main__":
  main()
