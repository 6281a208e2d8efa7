"""Test configuration: float64 on (every test states its dtypes explicitly)."""

import jax

jax.config.update("jax_enable_x64", True)
