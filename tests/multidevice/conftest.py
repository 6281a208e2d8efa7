"""Tests that need 8 devices. tests/test_sharding.py (test_mesh.py) and tests/test_lowrank.py
(test_lowrank_mesh.py) run them in subprocesses with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (set before JAX is imported)."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

if jax.device_count() < 8:
  raise RuntimeError(
      "tests/multidevice needs 8 devices: run it through tests/test_sharding.py and "
      "tests/test_lowrank.py (or set "
      "XLA_FLAGS=--xla_force_host_platform_device_count=8 before starting Python)"
  )
