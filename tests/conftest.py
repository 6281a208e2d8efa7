"""Test configuration: float64 on (every test states its dtypes explicitly).

The repository root goes on ``sys.path`` so that tests import ``experiments`` (the research
code behind the notebooks and the demo), which is not part of the installed package.
"""

import atexit
import os
import shutil
import sys
import tempfile

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

import jax  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

jax.config.update("jax_enable_x64", True)

# tests/multidevice needs 8 devices; tests/test_sharding.py and tests/test_lowrank.py run
# its two files in subprocesses.
collect_ignore = ["multidevice"]
