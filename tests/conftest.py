"""Test configuration: float64 on (every test states its dtypes explicitly).

The repository root goes on ``sys.path`` so that tests import ``experiments`` (the research
code behind the notebooks and the demo), which is not part of the installed package.
"""

import os
import sys

import jax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

jax.config.update("jax_enable_x64", True)

# tests/multidevice needs 8 devices; tests/test_sharding.py runs it in a subprocess.
collect_ignore = ["multidevice"]
