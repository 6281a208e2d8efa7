"""Research code behind the notebooks, the demo and the results pages (not installed).

* :mod:`experiments.problems`: the paper's 2-D test functions, a runner, learning-rate by
  seed sweeps and the diagonal-Hessian probes of the curvature study.
* :mod:`experiments.digits`: a Flax NNX MLP on scikit-learn's digits: data, model, training
  loop, step timing (needs ``flax`` and ``scikit-learn``: the ``examples`` extra).
* :mod:`experiments.report`: the tables and plots shared by the notebooks and
  ``examples/demo.py``.

* :mod:`experiments.table`: the results tables (one gzipped JSON Lines file per benchmark).
* :mod:`experiments.figures`: every figure of ``docs/results`` drawn from the tables.
* ``choose/``, ``sst2/``, ``bf16/``: the studies (harness, runner, report, narrative), and
  ``tests/``: their smoke tests.

This folder is not part of the ``hizoo_jax`` package. Run from the repository root (pytest
puts it on the path; the notebooks and the demo insert it themselves).
"""
