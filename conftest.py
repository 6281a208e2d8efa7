"""Test configuration of the three suites: the library's (``tests``), the examples' and
notebooks' (``examples/tests``) and the research code's (``experiments/tests``). Float64 on
(every test states its dtypes explicitly), one XLA compilation cache per session, XLA's
cheaper code generation, slow tests first, ``-n auto`` as one worker per usable CPU.
pytest puts the repository root on the path for this file, so ``tests``, ``examples`` and
``experiments`` import as packages."""

import atexit
import os
import shutil
import tempfile

import pytest

from tests.xla_flags import TEST_XLA_FLAGS

# One XLA compilation cache for the whole test session: this process, the pytest-xdist
# workers it starts and the subprocesses the tests start (the examples, the notebooks, the
# 8-device suites) all inherit the environment. Many tests compile the same programs (the
# plain reference paths, the examples' MiniLM forward), and on two CPU cores compiling is
# a large part of the suite's time: measured, 1,498 s of test time without the cache and
# about 150 s less with it. The cache lives for one session (removed at exit by the process that
# made it); a JAX_COMPILATION_CACHE_DIR of the user's is used and left alone.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _cache = tempfile.mkdtemp(prefix="hizoo-jax-tests-xla-cache-")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
  atexit.register(shutil.rmtree, _cache, ignore_errors=True)
# JAX caches programs that took 1 s to compile by default; most of the suite's take less.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")

# The suite compiles several hundred small programs and runs each for a few steps, so XLA's
# compile time is most of its time: about 3 s of HLO passes and 3 s of LLVM code generation
# for a 3,500-line train step. LLVM's optimisation level does not change what the tests check:
# the HLO (fusion, buffer assignment and so the compiled memory the lean-step tests bound, the
# collectives the sharding tests read) comes from the HLO passes, which keep their defaults,
# and XLA keeps IEEE semantics at every LLVM level (no fast math), so the tolerances, derived
# from the arithmetic, hold as before. Measured on 2 CPU cores with the first flag alone:
# tests/test_reference.py with tests/test_train_step.py 157 s -> 123 s, the notebooks and
# fine-tuning examples 281 s -> 253 s (the second flag made no difference above the noise
# on single compiles); the whole clean-clone CI with both: 31 min 7 s -> 25 min 38 s. The
# subprocesses the tests start inherit it.
# The third flag lowers fusions with XLA's older elemental emitters instead of the MLIR
# fusion emitters, which compile each fusion on a thread pool: as much wall time on an idle
# machine, a third more CPU, and the suite's two workers keep both cores busy. It leaves
# the HLO passes and the buffer assignment alone (the largest compositions of
# tests/test_engine.py: the same temp, argument and output bytes; XLA only stops wrapping
# lone ops in fusions for the emitters). Measured on 2 cores: the HiZOO+Adam composition's
# tests 47-50 -> 35-36 CPU s; the whole suite's test CPU 2,625 -> 1,727 core-s. Two
# different programs of the same operations may round differently in the last bit under
# any flags; tests/test_tunix.py's trainer comparisons therefore run in float64 with a
# tolerance instead of asking for equal bits. HIZOO_TEST_FULL_XLA_OPT=1 keeps XLA's default
# code generation (and so the programs a user compiles).
if os.environ.get("HIZOO_TEST_FULL_XLA_OPT") != "1" and TEST_XLA_FLAGS not in os.environ.get(
    "XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

def pytest_collection_modifyitems(config, items):
  """Tests marked ``slow`` (half a minute or more each: the 8-device suites, the examples, the
  notebooks) run first. pytest-xdist hands tests out in collection order, so a long test
  collected late can run alone at the end while the other worker has nothing left to do."""
  del config
  items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable


def usable_cpus() -> int:
  """The CPUs this process may run on: its affinity mask, capped by a cgroup CPU quota (a
  container's ``--cpus``), which the mask does not show."""
  n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  n = n or 1
  for path, read in (("/sys/fs/cgroup/cpu.max", lambda s: s.split()),  # cgroup v2
                     ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", None)):  # cgroup v1
    try:
      with open(path) as fh:
        text = fh.read()
      if read is not None:
        quota, period = read(text)
      else:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as fh:
          quota, period = text.strip(), fh.read().strip()
      if quota not in ("max", "-1") and int(period) > 0:
        n = min(n, max(1, -(-int(quota) // int(period))))
      break
    except (OSError, ValueError):
      continue
  return n


@pytest.hookimpl(optionalhook=True)  # an xdist hook: pytest without xdist must still load
def pytest_xdist_auto_num_workers(config):
  """``-n auto``: one worker per usable CPU. pytest-xdist's own count is psutil's physical
  cores where psutil is installed (the test extras pull it in): a VM whose 2 vCPUs are the 2
  hyperthreads of one core reads 1 and would run the suite on one worker, and a container
  limited to 2 CPUs of a large host reads the host's cores and would start dozens, each
  compiling on its own. ``PYTEST_XDIST_AUTO_NUM_WORKERS`` and ``-n logical`` keep their
  meaning."""
  if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS") or config.option.numprocesses != "auto":
    return None
  return usable_cpus()
