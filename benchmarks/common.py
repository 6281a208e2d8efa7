"""Shared pieces of the benchmarks: the MLPs, their params, timing and memory helpers."""

from __future__ import annotations

import ctypes
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import hizoo_jax as hz

# The two models of the performance issue.
MEMORY_SIZES = [4096] * 5                        # 4 layers of 4096 x 4096 (64M params, 256 MiB)
SPEED_SIZES = [1024, 2048, 2048, 2048, 1024]     # 12.6M params


def mlp_params(sizes, dtype=jnp.float32, seed=0):
  """Params of an MLP, drawn leaf by leaf with the fused sampler (no temporaries)."""
  params, key = {}, jax.random.key(seed)
  for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
    key, k = jax.random.split(key)
    w = jax.jit(lambda k, a=a, b=b: hz.fast_gaussian(k, (a, b)) / np.sqrt(a))(k)
    params[f"l{i}"] = {"w": w.astype(dtype), "b": jnp.zeros((b,), dtype)}
  return params


def mlp_loss(params, x, y):
  h = x
  n = len(params)
  for i in range(n):
    h = h @ params[f"l{i}"]["w"] + params[f"l{i}"]["b"]
    if i < n - 1:
      h = jax.nn.relu(h)
  return jnp.mean((h.astype(jnp.float32) - y) ** 2)


def batch(sizes, rows, dtype=jnp.float32, seed=1):
  kx, ky = jax.random.split(jax.random.key(seed))
  x = jax.random.normal(kx, (rows, sizes[0]), dtype)
  y = jax.random.normal(ky, (rows, sizes[-1]), jnp.float32)
  return x, y


def nbytes(tree):
  return sum(x.nbytes for x in jax.tree.leaves(tree))


def time_calls(fn, *, repeats=7, warmup=2):
  """Median wall time of ``fn()`` (which must block) over ``repeats`` after ``warmup``."""
  for _ in range(warmup):
    fn()
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return statistics.median(times), times


def time_paired(fn, ref, *, repeats=7, warmup=2):
  """``fn()`` timed against ``ref()`` called alternately, so that both see the same machine.

  Returns ``(t_fn, t_ref, ratios)``: the medians of each over ``repeats`` after ``warmup``, and
  the per-pair ratios ``t_fn / t_ref`` (report their median and quartiles). On a shared machine
  whose speed drifts over minutes, the paired ratio is steadier than a ratio to one forward
  timing taken earlier.
  """
  for _ in range(warmup):
    ref()
    fn()
  tf, tr = [], []
  for _ in range(repeats):
    t = time.perf_counter()
    ref()
    tr.append(time.perf_counter() - t)
    t = time.perf_counter()
    fn()
    tf.append(time.perf_counter() - t)
  ratios = [a / b for a, b in zip(tf, tr, strict=True)]
  return statistics.median(tf), statistics.median(tr), ratios


def quartiles(xs):
  """(25th percentile, median, 75th percentile) of ``xs``."""
  q = np.percentile(np.asarray(xs, np.float64), [25, 50, 75])
  return float(q[0]), float(q[1]), float(q[2])


def compiled_peak(compiled):
  """Bytes the executable holds at its peak: arguments + outputs - aliased + temporaries."""
  m = compiled.memory_analysis()
  return (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
          + m.temp_size_in_bytes)


def peak_rss_bytes():
  """Peak resident set size since the last :func:`reset_peak_rss` (or process start)."""
  try:
    with open("/proc/self/status") as fh:
      for line in fh:
        if line.startswith("VmHWM:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss():
  """Returns freed heap to the OS and resets the peak RSS (Linux); False if unsupported."""
  try:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as fh:
      fh.write("5")
    return True
  except OSError:
    return False


def run_child(script, *args):
  """Runs ``python script args`` in a fresh process; returns its last stdout line as JSON."""
  out = subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                       check=True, env=dict(os.environ))
  return json.loads(out.stdout.strip().splitlines()[-1])


def cpu_model() -> str:
  """The CPU's model name (``/proc/cpuinfo``), else the platform's processor string: rows
  measured on an Intel Xeon and on an AMD EPYC differ, and "x86_64" does not say which."""
  try:
    with open("/proc/cpuinfo") as fh:
      for line in fh:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def machine():
  dev = jax.devices()[0]
  return dict(backend=jax.default_backend(), device=str(dev.device_kind),
              devices=jax.device_count(), cpu=cpu_model(), cores=os.cpu_count(),
              jax=jax.__version__, python=platform.python_version())


def git_commit(where: str = os.path.dirname(os.path.abspath(__file__))) -> str:
  """The short commit of the checkout holding ``where``, with ``-dirty`` when any tracked
  Python file of the checkout (code or test, anywhere in it) differs from that commit or
  cannot be compared with it (results files, written while runs go, do not count), or
  ``"unknown"`` outside git."""
  try:
    head = subprocess.run(["git", "-C", where, "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # ":(top)" reads the pattern from the checkout's root, not from ``where``
    changed = subprocess.run(["git", "-C", where, "diff", "--quiet", "HEAD", "--",
                              ":(top)*.py"], capture_output=True).returncode
  except (OSError, subprocess.CalledProcessError):
    return "unknown"
  return head + ("-dirty" if changed != 0 else "")


def write_json(path, obj):
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  with open(path, "w") as fh:
    json.dump(obj, fh, indent=1, default=float)
