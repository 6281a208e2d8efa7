"""Research code behind the notebooks, the demo and the results pages (not installed).

* :mod:`experiments.problems`: the paper's 2-D test functions, a runner, learning-rate by
  seed sweeps and the diagonal-Hessian probes of the curvature study.
* :mod:`experiments.digits`: a Flax NNX MLP on scikit-learn's digits: data, model, training
  loop, step timing (needs ``flax`` and ``scikit-learn``: the ``examples`` extra).
* :mod:`experiments.report`: the tables and plots shared by the notebooks and
  ``examples/demo.py``.

This folder is not part of the ``hizoo_jax`` package. Run from the repository root (the tests
add it to ``sys.path``; the notebooks and the demo insert it themselves).
"""
