"""The paper's test functions (Appendix C), float64: HiZOO converges where MeZO cannot."""

from __future__ import annotations

import numpy as np
import optax
import pytest

import hizoo_jax as hz
from hizoo_jax import problems as P


def test_functions_and_minima():
  for name, f in P.FUNCTIONS.items():
    assert float(f(np.array(P.MINIMUM[name]))) == pytest.approx(0.0, abs=1e-12)
    assert float(f(np.array(P.START[name]))) > 1.0


HIZOO_VARIANTS = {
    "hizoo": (hz.hizoo, [dict(hessian_smoothing=0.3)]),
    "hizoo_unbiased": (hz.hizoo, [dict(hessian_smoothing=a, estimator="unbiased")
                                  for a in (0.1, 0.3)]),
    "hizoo_l": (hz.hizoo_l, [dict(hessian_smoothing=0.3, matrix=True, min_dim_size_to_factor=1)]),
}


@pytest.mark.parametrize("name", list(P.FUNCTIONS))
def test_hizoo_reaches_0_1_on_every_test_function(name):
  """Median over 5 seeds of the steps to f < 0.1, best lr of a small grid, <= 3000 steps."""
  results = P.compare(HIZOO_VARIANTS, functions=(name,), steps=3000,
                      learning_rates=np.array([0.01, 0.03, 0.1, 0.3]), seeds=5)
  for r in results:
    assert np.isfinite(r.steps), (r.method, name)
    reached = np.isfinite(r.sweep.steps_to(0.1)[r.lr_index]).sum()
    assert reached >= 3, (r.method, name, reached)


def test_mezo_cannot_on_the_ill_conditioned_one_but_hizoo_can():
  lrs = 10.0 ** np.arange(-5, 0.01, 0.5)
  mezo = P.sweep(hz.mezo, P.f_c, P.START["f_c"], 1500, lrs, seeds=3)
  assert not np.isfinite(mezo.steps_to(0.1)).any()
  hizoo = P.sweep(hz.hizoo, P.f_c, P.START["f_c"], 1500, lrs, seeds=3, hessian_smoothing=0.3)
  assert np.isfinite(hizoo.best()[1])


def test_sweep_matches_single_runs():
  sw = P.sweep(hz.hizoo, P.f_a, P.START["f_a"], 200, np.array([0.1]), seeds=2,
               hessian_smoothing=0.3)
  for seed in range(2):
    traj = P.optimize(hz.hizoo(0.1, hessian_smoothing=0.3, seed=seed), P.f_a, P.START["f_a"], 200)
    # same program up to batching: equal to rounding, amplified by 1/mu along the run
    np.testing.assert_allclose(sw.xs[0, seed], traj.xs, rtol=1e-6, atol=1e-9)


def test_compare_picks_the_best_setting():
  res = P.compare({"adam": (optax.adam, [dict(first_order=True)]),
                   "hizoo": (hz.hizoo, [dict(hessian_smoothing=a) for a in (0.01, 0.3)])},
                  functions=("f_c",), steps=600, learning_rates=np.array([0.03, 0.1, 0.3]),
                  seeds=3)
  by = {r.method: r for r in res}
  assert by["adam"].steps < 100
  assert by["hizoo"].options == {"hessian_smoothing": 0.3}
  assert np.isfinite(by["hizoo"].steps)
