"""Flax Linen: ``apply_zo`` / ``ZOTrainState.apply_zo`` against the functional ``tx.update``."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax.training import train_state

import hizoo_jax as hz
from hizoo_jax.models import linen as hzl

STEPS = 6


class MLP(nn.Module):
  """A real Linen model: Dense -> gelu -> Dense, float64 params (x64 is on in the tests)."""

  @nn.compact
  def __call__(self, x):
    x = nn.gelu(nn.Dense(16, param_dtype=jnp.float64, dtype=jnp.float64)(x))
    return nn.Dense(2, param_dtype=jnp.float64, dtype=jnp.float64)(x)


def _problem():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((32, 4)))
  y = jnp.asarray(rng.standard_normal((32, 2)))
  model = MLP()
  params = model.init(jax.random.key(0), x)["params"]
  assert {p.dtype for p in jax.tree.leaves(params)} == {jnp.dtype(jnp.float64)}

  def loss_fn(params, x, y):
    return jnp.mean((model.apply({"params": params}, x) - y) ** 2)

  return model, params, loss_fn, x, y


def _engine(tx, params, loss_fn, x, y, steps=STEPS):
  """The reference: ``hz.make_train_step``'s own top-level step; the params after
  ``steps`` steps and after the first, and the state after ``steps``."""
  state = tx.init(params)
  step = hz.make_train_step(tx, loss_fn, donate=False)
  for i in range(steps):
    params, state, _ = step(params, state, x, y)
    if i == 0:
      first = params
  return params, state, first


def HIZOO():  # noqa: N802 (a constructor, like the others)
  return hz.hizoo(2e-2, hessian_smoothing=0.1, seed=3)


MASK = {"Dense_0": True, "Dense_1": False}
# Each Optax wrapper the engine takes at least once, nested where two combine (one compile
# for both): a chain with a params-shaped stage after the estimate, optax.masked around
# HiZOO's curvature, multi_transform with MeZO in a group, MultiSteps' conditional update
# around apply_if_finite's guard (MeZO). How the engine follows the plain update for each
# composition is tests/test_engine.py's; here, that apply_zo hands the engine the
# TrainState's params and opt_state and takes its outputs back.
TXS = {
    "zo_adam": lambda: optax.chain(hz.scale_by_zo(seed=3), optax.adam(1e-2)),
    "masked": lambda: optax.masked(HIZOO(), MASK),
    "multi_transform": lambda: optax.multi_transform(
        {"zo": hz.mezo(2e-2, seed=3), "frozen": optax.set_to_zero()},
        {"Dense_0": "zo", "Dense_1": "frozen"}),
    "multi_steps_if_finite": lambda: optax.MultiSteps(
        optax.apply_if_finite(hz.mezo(2e-2, seed=3), 3), 2),
}


@pytest.mark.parametrize("name", list(TXS))
def test_apply_zo_is_the_engine_step_in_a_user_jit(name):
  """``apply_zo`` runs make_train_step's engine, traced into the user's jit, for each kind
  of composition the engine takes (every Optax wrapper of TXS). The two are the same traced
  function in two XLA programs, which may fuse and round differently in the last bit: a
  float64 loss (|l| ~ 1) by ~1e-16 relative, the projection (l+ - l-) / 2 mu by ~1e-13,
  the curvature (l+ + l- - 2 l0) / 2 mu^2 by ~1e-10 relative; over 6 steps params and
  states agree to ~1e-12 (rtol 1e-8, atol 1e-12 allowed). A wrong step (another noise, a
  missed mask, a skipped accumulation) moves params by ~lr |g| ~ 1e-3."""
  model, params, loss_fn, x, y = _problem()
  tx = TXS[name]()
  ref_params, ref_state, one_params = _engine(tx, params, loss_fn, x, y)

  traces = []

  @jax.jit
  def step(state, x, y):
    traces.append(1)
    return hzl.apply_zo(state, loss_fn, x, y)

  state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)
  for _ in range(STEPS):
    state = step(state, x, y)
  assert len(traces) == 1 and int(state.step) == STEPS
  chex.assert_trees_all_close(state.params, ref_params, rtol=1e-8, atol=1e-12)
  chex.assert_trees_all_close(state.opt_state, ref_state, rtol=1e-8, atol=1e-12)
  moved = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(
      jax.tree.leaves(ref_params), jax.tree.leaves(params), strict=True))
  assert moved > 1e-3
  if name in ("masked", "multi_transform"):  # the frozen layer stays as it was
    chex.assert_trees_all_equal(state.params["Dense_1"], params["Dense_1"])

  eager = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)
  eager = hzl.apply_zo(eager, loss_fn, x, y)  # outside jit: the engine's own jitted step
  chex.assert_trees_all_close(eager.params, one_params, rtol=1e-8, atol=1e-12)
  assert int(eager.step) == 1


def test_nnx_and_linen_adapters_are_one_path(monkeypatch):
  """Both adapters run the engine through the same function."""
  from hizoo_jax.models import _adapter, peft

  calls = []
  real = _adapter.engine_step
  monkeypatch.setattr(hzl, "engine_step", lambda *a, **k: calls.append("linen") or real(*a, **k))
  monkeypatch.setattr(peft, "engine_step", lambda *a, **k: calls.append("nnx") or real(*a, **k))
  model, params, loss_fn, x, y = _problem()
  hzl.apply_zo(train_state.TrainState.create(apply_fn=model.apply, params=params,
                                             tx=hz.mezo(1e-2)), loss_fn, x, y)
  nnx = pytest.importorskip("flax.nnx")
  lin = nnx.Linear(4, 2, rngs=nnx.Rngs(0))
  opt = nnx.Optimizer(lin, hz.mezo(1e-2), wrt=nnx.Param)
  peft.nnx_zo_step(opt, lin, lambda m: jnp.mean((m(x.astype(jnp.float32)) - 1.0) ** 2))
  assert calls == ["linen", "nnx"]


def test_zo_train_state_method_equals_the_function_and_trains():
  model, params, loss_fn, x, y = _problem()
  tx = hz.hizoo(2e-2, hessian_smoothing=0.1, seed=1)
  a = hzl.ZOTrainState.create(apply_fn=model.apply, params=params, tx=tx)
  b = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)
  step = jax.jit(lambda s: s.apply_zo(loss_fn, x, y))
  first = float(loss_fn(params, x, y))
  for _ in range(100):
    a = step(a)
  step_b = jax.jit(lambda s: hzl.apply_zo(s, loss_fn, x, y))
  for _ in range(100):
    b = step_b(b)
  assert isinstance(a, hzl.ZOTrainState) and int(a.step) == 100
  chex.assert_trees_all_equal(a.params, b.params)  # the same program, jitted the same way
  assert float(loss_fn(a.params, x, y)) < 0.9 * first


def test_apply_gradients_cannot_do_it():
  """Why the helper exists: ``apply_gradients`` has no way to pass ``value_fn``."""
  model, params, loss_fn, x, y = _problem()
  state = train_state.TrainState.create(apply_fn=model.apply, params=params,
                                        tx=hz.hizoo(1e-2))
  with pytest.raises((TypeError, ValueError)):
    state.apply_gradients(grads=jax.tree.map(jnp.zeros_like, params))
