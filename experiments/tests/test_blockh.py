"""The per-tensor curvature estimator of experiments/sst2/blockh.py as a library Method.

1. Exactness. Several steps (a warmup of 2 and a refresh of the scales every 2 steps, so
   three refreshes) through ``tx.update`` and through the lean engine
   (``restore="exact"``), each compared with a float64 NumPy reference of the formulas of
   blockh.py's docstring fed the noise the step drew (regenerated from the state key by
   the documented key schedule, as tests/test_methods.py does). The reductions
   ``||z_b||^2 - n_b`` run in row blocks (``BLOCK_ELEMENTS`` set to 12: several blocks per
   matrix, the last one overlapping the one before), so the blocked draws are checked
   against the whole-leaf noise; with ``hz.gaussian`` (no row blocks) they are whole.

   Tolerance (float64): a loss rounds differently in NumPy and in XLA by a few ulp of
   ``|l| ~ 1`` (~1e-15); ``delta = (l+ + l- - 2 l0) / mu^2`` with ``mu = 1e-2`` divides
   that by 1e-4: ~1e-11 absolute on ``delta`` (of size ~1), which ``r_mean``, ``c`` and
   ``c_sq`` inherit (their updates are affine in ``delta`` with coefficients <= 1, and
   the scales' refresh multiplies them by a ratio of at most ``max_change``);
   ``proj = (l+ - l-) / (2 mu)`` ~1e-13. The params inherit the error of
   ``g = proj sqrt(s) z``: ``proj``'s, and after a refresh the scales' relative error
   (that of ``c``, ~1e-10 where ``c ~ 0.1``), times ``lr``. Measured: at most 2e-11 on the
   curvature state and 1e-12 on the params after 7 steps. The tests allow ``rtol 1e-10,
   atol 1e-9`` on the curvature state and ``rtol 1e-9, atol 1e-12`` on the params (as
   tests/test_methods.py): 50x the measured error or more, and far below a wrong formula
   (another noise, feature or rescaling moves ``c`` by ``beta * O(1)`` and the params by
   ``lr |g| ~ 1e-3``).

2. The lean engine against the plain ``tx.update`` step for step (params, losses and the
   whole state), and the in-place restore within its rounding drift.

3. Memory: the lean step keeps no params-sized temporary.

4. Compositions: optax.chain with optax.scale / optax.sgd (momentum), inject_hyperparams.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.tree_utils as otu
import pytest

import hizoo_jax as hz
from experiments.sst2 import blockh
from tests.helpers import lean_step_extra, step_noise

# The problem of tests/test_methods.py (the same draws): a 5-6-3 tanh MLP on 16 rows.
_rng = np.random.default_rng(0)
X_NP = _rng.standard_normal((16, 5))
Y_NP = _rng.standard_normal((16, 3))
THETA0 = {"w1": _rng.standard_normal((5, 6)) / np.sqrt(5),
          "b1": _rng.standard_normal(6) * 0.1,
          "w2": _rng.standard_normal((6, 3)) / np.sqrt(6)}
X, Y = jnp.asarray(X_NP), jnp.asarray(Y_NP)


def params0():
  return {k: jnp.asarray(v, jnp.float64) for k, v in THETA0.items()}


LR = 0.05
MU = 1e-2
OPTS = dict(mu=MU, beta=0.3, warmup=2, refresh=2, kappa=3.0, max_change=1.5, center=0.4)
STEPS = 7  # refreshes after steps 2, 4 and 6
CURV_TOL = dict(rtol=1e-10, atol=1e-9)
PARAM_TOL = dict(rtol=1e-9, atol=1e-12)
LOSS_TOL = dict(rtol=1e-12, atol=1e-13)

def loss_np(p):
  h = np.tanh(X_NP @ p["w1"] + p["b1"])
  return float(np.mean((h @ p["w2"] - Y_NP) ** 2))


def loss_fn(p):
  h = jnp.tanh(X @ p["w1"] + p["b1"])
  return jnp.mean((h @ p["w2"] - Y) ** 2)


# ----------------------------------------------------------------------------------------
# 1. Exactness against a NumPy reference.


def reference_step(theta, st, z, opts, power):
  """One step of the estimator in float64 NumPy: ``(g, new state, l0)``; ``st`` holds
  ``steps, c, c_sq, s`` (dicts of floats by leaf) and ``r_mean, delta``."""
  mu, beta, rate = opts["mu"], opts["beta"], opts["center"]
  u = {k: np.sqrt(st["s"][k]) * z[k] for k in theta}
  l0 = loss_np(theta)
  lp = loss_np({k: theta[k] + mu * u[k] for k in theta})
  lm = loss_np({k: theta[k] - mu * u[k] for k in theta})
  proj = (lp - lm) / (2 * mu)
  delta = (lp + lm - 2 * l0) / mu**2
  g = {k: proj * u[k] for k in theta}
  n = {k: float(theta[k].size) for k in theta}
  q = {k: float(np.sum(z[k] ** 2)) - n[k] for k in theta}
  r_mean = (1 - rate) * st["r_mean"] + rate * delta
  resid = delta - r_mean - sum(st["c"][k] * q[k] for k in theta)
  est = {k: st["c"][k] + resid * q[k] / (2 * n[k]) for k in theta}
  c = {k: (1 - beta) * st["c"][k] + beta * est[k] for k in theta}
  c_sq = {k: (1 - beta) * st["c_sq"][k] + beta * est[k] ** 2 for k in theta}
  s = dict(st["s"])
  steps = st["steps"] + 1
  if steps >= opts["warmup"] and steps % opts["refresh"] == 0:
    h = {k: max(c[k], 0.0) / s[k] for k in theta}
    wmean = sum(n[k] * h[k] for k in theta) / sum(n.values())
    if wmean > 0:
      new = {}
      for k in theta:
        target = np.clip((wmean / max(h[k], 1e-30)) ** power, 1 / opts["kappa"],
                         opts["kappa"])
        new[k] = float(np.clip(target, s[k] / opts["max_change"], s[k] * opts["max_change"]))
      c = {k: c[k] * new[k] / s[k] for k in theta}
      c_sq = {k: c_sq[k] * (new[k] / s[k]) ** 2 for k in theta}
      s = new
  return g, dict(steps=steps, c=c, c_sq=c_sq, s=s, r_mean=r_mean, delta=delta), l0


def library_step(path, tx):
  if path == "update":
    @jax.jit
    def update(params, state):
      g, state = tx.update(None, state, params, value_fn=loss_fn)
      return optax.apply_updates(params, g), state
    return update
  step = hz.make_train_step(tx, lambda p: loss_fn(p), lean=True, restore="exact")
  return lambda params, state: step(params, state)[:2]


@pytest.mark.parametrize("path, sampler, power", [
    ("update", hz.fast_gaussian, 1.0), ("engine", hz.fast_gaussian, 0.5),
    ("update", hz.gaussian, 0.5)])
def test_matches_the_numpy_reference(path, sampler, power, monkeypatch):
  monkeypatch.setattr(blockh, "BLOCK_ELEMENTS", 12)
  tx = blockh.block_curvature(LR, **OPTS, power=power, sampler=sampler, seed=3)
  params = params0()
  state = tx.init(params)
  theta = {k: v.copy() for k, v in THETA0.items()}
  ones = lambda v: {k: v for k in theta}
  ref = dict(steps=0, c=ones(0.0), c_sq=ones(0.0), s=ones(1.0), r_mean=0.0, delta=0.0)
  step = library_step(path, tx)
  for t in range(STEPS):
    (z,) = step_noise(state, params, 1, sampler)
    g, ref, l0 = reference_step(theta, ref, z, OPTS, power)
    theta = {k: theta[k] - LR * g[k] for k in theta}
    params, state = step(params, state)
    chex.assert_trees_all_close(params, theta, **PARAM_TOL)
    got = blockh.method_state(state)
    assert int(got.steps) == ref["steps"] == t + 1
    for name in ("c", "c_sq", "s"):
      chex.assert_trees_all_close(got._asdict()[name], ref[name], **CURV_TOL)
    for name in ("r_mean", "delta"):
      np.testing.assert_allclose(got._asdict()[name], ref[name], **CURV_TOL)
    np.testing.assert_allclose(otu.tree_get(state, "loss"), l0, **LOSS_TOL)  # l0 each step
    assert int(otu.tree_get(state, "forward_passes")) == 3 * (t + 1)
    if t + 1 < OPTS["warmup"]:
      assert all(float(v) == 1.0 for v in jax.tree.leaves(got.s))
  # the refreshes happened and moved every scale (by at most max_change each)
  assert all(abs(v - 1.0) > 0.1 for v in ref["s"].values()), ref["s"]
  assert float(np.std(list(ref["c"].values()))) > 1e-3  # the blocks differ


# ----------------------------------------------------------------------------------------
# 2. The lean engine against the plain update, step for step.


def run_plain(tx, steps=STEPS):
  @jax.jit
  def update(params, state):
    g, state = tx.update(None, state, params, value_fn=loss_fn)
    return optax.apply_updates(params, g), state, otu.tree_get(state, "loss")

  params = params0()
  state = tx.init(params)
  out = []
  for _ in range(steps):
    params, state, loss = update(params, state)
    out.append((params, state, loss))
  return out


def run_engine(tx, steps=STEPS, **kw):
  step = hz.make_train_step(tx, lambda p: loss_fn(p), lean=True, **kw)
  params = params0()
  state = tx.init(params)
  out = []
  for _ in range(steps):
    params, state, loss = step(params, state)
    out.append(jax.tree.map(jnp.copy, (params, state, loss)))  # copies: donated
  return out


def test_the_lean_engine_follows_the_plain_update_step_for_step():
  """Both run the same float64 arithmetic on the same perturbed params (``restore =
  "exact"``) in different XLA programs: losses may differ in the last bit (~1e-16), which
  ``proj`` divides by ``mu |grad . u| ~ 1e-2`` and ``delta`` by ``mu^2``: rtol 1e-8 with
  atol 1e-12 on params and losses as tests/test_engine.py, atol 1e-9 on the curvature
  state (section 1)."""
  make = lambda: blockh.block_curvature(LR, **OPTS)
  plain = run_plain(make())
  for (p, s, loss), (pp, ps, pl) in zip(run_engine(make(), restore="exact"), plain,
                                     strict=True):
    chex.assert_trees_all_close(p, pp, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(loss, pl, rtol=1e-8, atol=1e-12)
    chex.assert_trees_all_close(s, ps, rtol=1e-8, atol=1e-9)
  assert max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(
      jax.tree.leaves(plain[-1][0]), jax.tree.leaves(params0()), strict=True)) > 1e-3
  # The in-place restore (the default for float params): theta + mu u - 2 mu u + mu u is
  # theta within a few ulp per step (test_engine.py's bound).
  p, s, _ = run_engine(make())[-1]
  chex.assert_trees_all_close(p, plain[-1][0], rtol=1e-9, atol=1e-11)
  chex.assert_trees_all_close(blockh.method_state(s), blockh.method_state(plain[-1][1]),
                              rtol=1e-6, atol=1e-7)


# ----------------------------------------------------------------------------------------
# 3. Memory.


def mlp_loss(p, x, y):
  h = jnp.tanh(x @ p["w1"] + p["b1"])
  return jnp.mean((h @ p["w2"] - y) ** 2)


def test_the_lean_step_keeps_no_params_sized_temporary(monkeypatch):
  """As tests/test_engine.py: memory of the step beyond its arguments minus the forward
  pass's own, in param bytes, at top level and in a user's donating jit.

  XLA:CPU does not fuse the noise's hash into a reduction, so the features
  ``||z_b||^2 - n_b`` are reduced in row blocks of at most ``blockh.BLOCK_ELEMENTS``
  (default 2**20, 4 MB of float32; whole leaves of this small MLP, where the two matrices'
  noise then counts 0.97). Here 8192 elements (32 KB), as test_engine.py sets HiZOO-L's
  blocks: measured 0.037 at top level and in a user's jit (MeZO: 0.004 and 0.02)."""
  monkeypatch.setattr(blockh, "BLOCK_ELEMENTS", 8192)
  tx = blockh.block_curvature(1e-2)
  params = {"w1": jnp.zeros((256, 256), jnp.float32), "b1": jnp.zeros((256,), jnp.float32),
            "w2": jnp.zeros((256, 256), jnp.float32)}
  x = jnp.zeros((8, 256), jnp.float32)
  y = jnp.zeros((8, 256), jnp.float32)
  for where, extra in lean_step_extra(tx, mlp_loss, params, x, y, lean=True).items():
    assert extra <= 0.05, (where, extra)


# ----------------------------------------------------------------------------------------
# 4. Compositions.


COMPOSITIONS = {
    "scale": lambda: optax.chain(blockh.scale_by_block_curvature(**OPTS), optax.scale(-LR)),
    "sgd_momentum": lambda: optax.chain(blockh.scale_by_block_curvature(**OPTS),
                                        optax.sgd(LR, momentum=0.9)),
    "inject_hyperparams": lambda: optax.inject_hyperparams(blockh.block_curvature)(
        lr=optax.linear_schedule(LR, LR / 5, STEPS),
        **{**OPTS, "mu": optax.linear_schedule(2 * MU, MU / 2, STEPS)}),
}


@pytest.mark.parametrize("name", list(COMPOSITIONS))
def test_compositions_run_lean_like_the_plain_update(name):
  plain = run_plain(COMPOSITIONS[name](), steps=4)
  lean = run_engine(COMPOSITIONS[name](), steps=4, restore="exact")
  for (p, s, loss), (pp, ps, pl) in zip(lean, plain, strict=True):
    chex.assert_trees_all_close(p, pp, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(loss, pl, rtol=1e-8, atol=1e-12)
    chex.assert_trees_all_close(s, ps, rtol=1e-8, atol=1e-9)
  report = blockh.curvature_report(lean[-1][1], OPTS["beta"])
  assert report["steps"] == 4 and len(report["h"]) == 3
  assert report["scales"] != [1.0, 1.0, 1.0]  # refreshed after steps 2 and 4
  if name == "scale":  # block_curvature is this chain: the same steps, bit for bit
    same = run_plain(blockh.block_curvature(LR, **OPTS), steps=4)
    chex.assert_trees_all_equal([o[0] for o in same], [o[0] for o in plain])
  if name == "inject_hyperparams":
    # the schedules' values at the last step, count 3 (float32 hyperparameters)
    np.testing.assert_allclose(otu.tree_get(lean[-1][1], "hyperparams")["lr"],
                               LR - 3 * (LR - LR / 5) / STEPS, rtol=1e-6)
    np.testing.assert_allclose(otu.tree_get(lean[-1][1], "hyper")["mu"],
                               2 * MU - 3 * (2 * MU - MU / 2) / STEPS, rtol=1e-6)


@pytest.mark.parametrize("option, value", [
    ("mu", 0.0), ("beta", 0.0), ("beta", 1.5), ("center", -0.1), ("warmup", -1),
    ("refresh", 0), ("kappa", 0.5), ("max_change", 0.9), ("power", -1.0)])
def test_bad_options_raise_a_value_error_naming_them(option, value):
  with pytest.raises(ValueError, match=f"^{option} must"):
    blockh.scale_by_block_curvature(**{option: value})


def test_non_gaussian_noise_is_refused():
  with pytest.raises(ValueError, match="Gaussian"):
    blockh.scale_by_block_curvature(sampler=hz.fast_rademacher)
