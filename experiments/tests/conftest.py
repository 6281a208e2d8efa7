"""Test configuration of the research code's tests (``experiments/``, ``benchmarks/``):
float64 on, as in the library's tests, whose problems some of these reuse. Run from the
repository root (``python -m pytest experiments/tests``): pytest puts the root on the path,
``experiments`` and ``experiments/tests`` being packages."""

import jax

jax.config.update("jax_enable_x64", True)
