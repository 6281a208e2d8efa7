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


def _functional(tx, params, loss_fn, x, y):
  state = tx.init(params)
  for _ in range(STEPS):
    u, state = tx.update(None, state, params, value_fn=lambda p: loss_fn(p, x, y))
    params = optax.apply_updates(params, u)
  return params, state


def HIZOO():  # noqa: N802 (a constructor, like the others)
  return hz.hizoo(2e-2, hessian_smoothing=0.1, seed=3)


@pytest.mark.parametrize("make", [HIZOO, lambda: hz.mezo(2e-2, seed=3),
                                  lambda: optax.chain(hz.scale_by_zo(seed=3), optax.adam(1e-2))],
                         ids=["hizoo", "mezo", "zo_adam"])
def test_apply_zo_follows_the_functional_path_and_jits(make):
  """Eager: the same operations as the functional loop, so the same bits. Jitted: XLA may
  fuse and order the reductions differently; a float64 loss (|l| ~ 1, n ~ 100 terms) is then
  off by dl <= n u |l| ~ 1e-14 (u = 2^-53), the projected gradient by dl / mu ~ 1e-11
  (mu = 1e-3), a parameter by lr * 1e-11 * max|z| ~ 1e-12 per step (Adam's normalisation
  at most ~1/sqrt(v) ~ 1e2 times that on the first steps), the curvature by 2 dl / mu^2 ~
  3e-8 and H by alpha * 3e-8 * H * z^2 ~ 1e-7 per step: over 6 steps atol 1e-9 (params) and
  1e-6 (H); the params move by ~1e-2 (the comparison can fail)."""
  model, params, loss_fn, x, y = _problem()
  tx = make()
  ref_params, ref_state = _functional(tx, params, loss_fn, x, y)

  state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)
  eager = state
  for _ in range(STEPS):
    eager = hzl.apply_zo(eager, loss_fn, x, y)
  assert int(eager.step) == STEPS
  jax.tree.map(np.testing.assert_array_equal, eager.params, ref_params)
  jax.tree.map(np.testing.assert_array_equal, eager.opt_state, ref_state)

  traces = []

  @jax.jit
  def step(state, x, y):
    traces.append(1)
    return hzl.apply_zo(state, loss_fn, x, y)

  jitted = state
  for _ in range(STEPS):
    jitted = step(jitted, x, y)
  assert len(traces) == 1 and int(jitted.step) == STEPS
  chex.assert_trees_all_close(jitted.params, ref_params, rtol=0, atol=1e-9)
  if make is HIZOO:
    chex.assert_trees_all_close(hz.get_hessian(jitted.opt_state), hz.get_hessian(ref_state),
                                rtol=0, atol=1e-6)
  moved = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(
      jax.tree.leaves(ref_params), jax.tree.leaves(params), strict=True))
  assert moved > 1e-3


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
