"""Test configuration: float64 on (every test states its dtypes explicitly)."""

import jax

jax.config.update("jax_enable_x64", True)

# tests/multidevice needs 8 devices; tests/test_sharding.py runs it in a subprocess.
collect_ignore = ["multidevice"]
