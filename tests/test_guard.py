"""Bad learning rates and weight decays: refused when built, skipped and counted when traced.

A skipped step must leave the params and the optimizer state exactly as they were (the
comparisons are bitwise), so the exact paths run here: the plain step and the lean step
with ``restore="exact"``. The in-place restore gives the params back up to its usual
rounding (tests/test_engine.py), whatever the learning rate.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.tree_utils as otu
import pytest

import hizoo_jax as hz
from hizoo_jax._src import guard
from tests import test_engine as engine
from tests.helpers import lean_step_extra

NAN, INF = float("nan"), float("inf")


loss_fn = engine.loss_fn


def mlp(sizes=(6, 12, 3), dtype=jnp.float64):
  return engine.mlp(sizes, dtype)


X = jax.random.normal(jax.random.key(1), (16, 6), jnp.float64)
Y = jax.random.normal(jax.random.key(2), (16, 3), jnp.float64)
ALIASES = {"mezo": hz.mezo, "hizoo": hz.hizoo, "hizoo_l": hz.hizoo_l}
# Methods whose subspaces are redrawn on schedule (here every step), also when the step's
# direction is dropped; ZO-Muon's and SubZero's are prepared before the passes and carried
# by the engine in place of the stored ones. A skipped step gives the stored ones back.
REFRESHED = {"zo_muon": functools.partial(hz.zo_muon, rank=2, resample_every=1),
             "subzero": functools.partial(hz.subzero, rank=2, resample_every=1),
             "lozo": functools.partial(hz.lozo, rank=2, resample_every=1, momentum=0.9)}
PATHS = {"plain": dict(lean=False), "lean": dict(lean=True, restore="exact")}
# Each method on the lean path, where the guard sits inside the engine's passes next to
# each method's own state (none, H, HiZOO-L's factors); the plain path (the generic
# guarded chain, the same code for every method) with HiZOO.
COVER = [("mezo", "lean"), ("hizoo", "lean"), ("hizoo_l", "lean"), ("hizoo", "plain")]


@pytest.mark.parametrize("alias", list(ALIASES))
@pytest.mark.parametrize(("kw", "name"), [
    (dict(learning_rate=NAN), "learning_rate"),
    (dict(learning_rate=INF), "learning_rate"),
    (dict(learning_rate=-1e-2), "learning_rate"),
    (dict(learning_rate=np.float32(-INF)), "learning_rate"),
    (dict(learning_rate=jnp.asarray(NAN)), "learning_rate"),
    (dict(learning_rate=1e-2, weight_decay=NAN), "weight_decay"),
    (dict(learning_rate=1e-2, weight_decay=-0.1), "weight_decay"),
])
def test_bad_concrete_values_are_refused_when_built(alias, kw, name):
  with pytest.raises(ValueError, match=rf"{name} must be a finite number >= 0"):
    ALIASES[alias](**kw)


def test_good_and_unusual_values_are_accepted_when_built():
  hz.mezo(0.0)  # a zero learning rate (warm-up) is legal
  hz.hizoo(np.float32(1e-3), weight_decay=0)
  hz.mezo(optax.cosine_decay_schedule(1e-2, 10), weight_decay=lambda c: 0.1)
  with pytest.raises(TypeError, match="learning_rate must be a"):
    hz.mezo("1e-2")
  with pytest.raises(TypeError, match="learning_rate must be a scalar"):
    hz.mezo(jnp.ones(2))


def test_inject_hyperparams_checks_its_concrete_values_at_init():
  tx = optax.inject_hyperparams(hz.mezo)(learning_rate=NAN)
  with pytest.raises(ValueError, match="learning_rate must be a finite number >= 0"):
    tx.init(mlp())


def test_the_state_is_the_chain_tuple_plus_the_guard_counts():
  state = hz.hizoo(1e-2).init(mlp())
  assert isinstance(state[0], hz.ZOState)  # state[0] is still the estimator's
  assert isinstance(state[0].method, hz.HiZOOState)
  assert isinstance(state[-1], guard.GuardState)
  assert int(otu.tree_get(state, "skipped_bad_hyperparams")) == 0


@pytest.mark.parametrize(("alias", "path"),
                         COVER + [(name, path) for name in REFRESHED for path in PATHS])
def test_a_bad_injected_value_leaves_params_and_state_exactly_and_is_counted(alias, path):
  """The injected value arrives traced: the step runs, emits nothing, keeps the state."""
  kw = dict(learning_rate=1e-2, weight_decay=0.1)
  if alias in ("hizoo", "hizoo_l"):
    kw["hessian_smoothing"] = 0.1
  tx = optax.inject_hyperparams({**ALIASES, **REFRESHED}[alias])(**kw)
  step = hz.make_train_step(tx, loss_fn, donate=False, **PATHS[path])
  params = mlp()
  params, state, _ = step(params, tx.init(params), X, Y)  # one good step first
  skipped = 0
  for field, bad in [("learning_rate", NAN), ("learning_rate", INF), ("learning_rate", -1e-2),
                     ("weight_decay", NAN), ("weight_decay", -INF)]:
    good = state.hyperparams[field]
    state.hyperparams[field] = jnp.asarray(bad, good.dtype)
    new_params, new_state, _ = step(params, state, X, Y)
    skipped += 1
    chex.assert_trees_all_equal(new_params, params)
    chex.assert_trees_all_equal(new_state.inner_state[:-1], state.inner_state[:-1])
    assert int(new_state.inner_state[-1].skipped_bad_hyperparams) == skipped
    assert int(new_state.inner_state[-1].schedule_count) == 1
    state = new_state
    state.hyperparams[field] = good
  # good values again: the step that was skipped runs now
  moved, state, _ = step(params, state, X, Y)
  assert int(state.inner_state[-1].schedule_count) == 2
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(moved))
  assert max(float(jnp.max(jnp.abs(a - b))) for a, b in
             zip(jax.tree.leaves(moved), jax.tree.leaves(params), strict=True)) > 1e-5


@pytest.mark.parametrize(("alias", "path"), COVER)
def test_a_schedule_that_turns_nan_skips_from_then_on(alias, path):
  """A schedule NaN from its second step: the first step trains, every later one is
  skipped (the schedule's count stays at 1) and counted; the params stay finite."""
  lr = lambda count: jnp.where(count >= 1, jnp.nan, 1e-2)  # noqa: E731
  tx = ALIASES[alias](lr, weight_decay=lambda count: 0.1)
  step = hz.make_train_step(tx, loss_fn, donate=False, **PATHS[path])
  params = mlp()
  after_one, state, _ = step(params, tx.init(params), X, Y)
  assert not np.allclose(after_one["l0"]["w"], params["l0"]["w"])
  p, s = after_one, state
  for _ in range(3):
    p, s, _ = step(p, s, X, Y)
  chex.assert_trees_all_equal(p, after_one)
  chex.assert_trees_all_equal(s[:-1], state[:-1])
  assert int(s[-1].skipped_bad_hyperparams) == 3 and int(s[-1].schedule_count) == 1


@pytest.mark.parametrize("wrap", ["multi_steps", "apply_if_finite", "masked"])
def test_the_guard_works_inside_optax_wrappers(wrap):
  """Every other step's learning rate is NaN (injected schedule: it counts every call)."""
  lr = lambda count: jnp.where(count % 2 == 1, jnp.nan, 1e-2)  # noqa: E731
  inner = optax.inject_hyperparams(hz.hizoo)(learning_rate=lr, hessian_smoothing=0.1)
  tx = {"multi_steps": lambda: optax.MultiSteps(inner, every_k_schedule=2),
        "apply_if_finite": lambda: optax.apply_if_finite(inner, 3),
        "masked": lambda: optax.masked(inner, {"l0": True, "l1": False})}[wrap]()
  params = mlp()
  state = tx.init(params)
  step = hz.make_train_step(tx, loss_fn, donate=False, restore="exact")
  p = params
  for _ in range(4 if wrap != "multi_steps" else 8):
    p, state, _ = step(p, state, X, Y)
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(p))
  assert int(otu.tree_get(state, "skipped_bad_hyperparams")) == 2
  assert int(otu.tree_get(state, "schedule_count")) == 2
  if wrap == "masked":
    chex.assert_trees_all_equal(p["l1"], params["l1"])


@pytest.mark.parametrize("alias", list(ALIASES))
def test_the_guard_adds_no_params_sized_temporary(alias, monkeypatch):
  """A traced learning rate: the lean step's compiled memory beyond its arguments, over a
  forward pass, in param bytes, stays at the scalars' (a select of ``H`` after the chain,
  instead of inside the transform, would hold the old and the new ``H``: ~1.0)."""
  from hizoo_jax._src import curvature

  monkeypatch.setattr(curvature, "BLOCK_ELEMENTS", 8192)
  kw = {} if alias == "mezo" else dict(hessian_smoothing=0.1)
  if alias == "hizoo_l":
    kw["min_dim_size_to_factor"] = 4
  tx = optax.inject_hyperparams(ALIASES[alias])(learning_rate=1e-2, **kw)
  params = mlp((256, 256, 256, 256), jnp.float32)
  x = jnp.zeros((8, 256), jnp.float32)
  y = jnp.zeros((8, 256), jnp.float32)
  for where, extra in lean_step_extra(tx, loss_fn, params, x, y).items():
    assert extra <= 0.05, (where, extra)


def test_guarded_chain_on_a_first_order_chain():
  """The guard is generic: every state leaf is kept when a value is bad."""
  lr = lambda count: jnp.where(count == 1, jnp.nan, 0.1)  # noqa: E731
  tx = guard.guarded_chain([optax.scale_by_adam(), optax.scale_by_learning_rate(lr)],
                           {"learning_rate": lr})
  params = {"w": jnp.ones(3)}
  state = tx.init(params)
  g = {"w": jnp.asarray([1.0, -2.0, 3.0])}
  u1, s1 = tx.update(g, state, params)
  u2, s2 = jax.jit(tx.update)(g, s1, params)
  chex.assert_trees_all_equal(u2, {"w": jnp.zeros(3)})
  chex.assert_trees_all_equal(s2[:-1], s1[:-1])
  assert int(s2[-1].skipped_bad_hyperparams) == 1
