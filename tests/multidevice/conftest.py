"""Tests that need 8 devices. tests/test_sharding.py runs both files (test_mesh.py and
test_lowrank_mesh.py) in one subprocess with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (set before JAX is imported)."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

if jax.device_count() < 8:
  raise RuntimeError(
      "tests/multidevice needs 8 devices: run it through tests/test_sharding.py (or set "
      "XLA_FLAGS=--xla_force_host_platform_device_count=8 before starting Python)"
  )
