"""hz.accumulate: a zeroth-order step measured on several micro-batches is the step on the
micro-batches together, counted, logged and lean like the step it wraps."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import hizoo_jax as hz
from tests.helpers import lean_step_extra

RNG = np.random.default_rng(0)
X = jnp.asarray(RNG.standard_normal((12, 5)), jnp.float64)
Y = jnp.asarray(RNG.standard_normal(12), jnp.float64)
PARAMS = {"w": jnp.asarray(RNG.standard_normal((5, 3)), jnp.float64),
          "v": jnp.asarray(RNG.standard_normal(3), jnp.float64)}
K = 3  # micro-batches of 4 rows


def loss(p, x, y):  # a mean over the rows: the micro-batches' mean is the whole batch's
  return jnp.mean((jnp.tanh(x @ p["w"]) @ p["v"] - y) ** 2)


# One of each kind: two-sided, l0 and a curvature state, one-sided probes with a spread
# (FZOO), several directions, a stateful stage after the estimate.
MAKERS = {
    "mezo": lambda: hz.mezo(0.05, mu=1e-3, seed=1),
    "hizoo": lambda: hz.hizoo(0.05, mu=1e-3, hessian_smoothing=0.1, seed=1),
    "fzoo": lambda: hz.fzoo(0.05, mu=1e-3, num_directions=4, seed=1),
    "mezo_2_directions": lambda: hz.mezo(0.05, mu=1e-3, num_directions=2, seed=1),
    "zo_adam": lambda: optax.chain(hz.scale_by_zo(mu=1e-3, seed=1), optax.adam(0.01)),
}
PASSES = {"mezo": 2, "hizoo": 3, "fzoo": 5, "mezo_2_directions": 4, "zo_adam": 2}


# Each kind once, each path at least once: the engine's (the default) for all but MeZO,
# which takes the plain step.
@pytest.mark.parametrize("name, lean", [
    ("fzoo", None), ("hizoo", None), ("mezo", False), ("mezo_2_directions", None),
    ("zo_adam", None)], ids=["fzoo-engine", "hizoo-engine", "mezo-plain",
                             "mezo_2_directions-engine", "zo_adam-engine"])
def test_k_micro_batches_make_the_whole_batch_step(name, lean):
  """Two steps of ``tx`` on the 12 rows against 2 x 3 calls of ``accumulate(tx, 3)`` on
  4 rows each. In float64 the only difference is the order of the sums (the whole batch's
  mean against the mean of three means), ~1e-16 relative in a loss; the estimate divides
  loss differences by 2 mu (MeZO, FZOO) or mu^2 (HiZOO's curvature), so params agree to
  ~1e-13 and ~1e-10 (measured 1e-13 and 1.2e-11), where a step moves them by 0.02-0.8."""
  tx, acc = MAKERS[name](), hz.accumulate(MAKERS[name](), K)
  p, s = jax.tree.map(jnp.copy, PARAMS), tx.init(PARAMS)
  q, sa = jax.tree.map(jnp.copy, PARAMS), acc.init(PARAMS)
  step, step_acc = hz.make_train_step(tx, loss, lean=lean), hz.make_train_step(acc, loss,
                                                                               lean=lean)
  for _ in range(2):
    p, s, whole = step(p, s, X, Y)
    for i in range(K):
      before = jax.tree.map(jnp.copy, q)
      q, sa, part = step_acc(q, sa, X[4 * i:4 * i + 4], Y[4 * i:4 * i + 4])
      if i < K - 1:  # the micro-batches before the k-th leave the params alone ...
        if lean is False:
          chex.assert_trees_all_equal(q, before)
        else:  # up to the in-place restore's rounding: three moves of |theta| <= 3
          chex.assert_trees_all_close(q, before, atol=4e-15, rtol=0)
        # ... and the state logs their own loss, and counts their passes
        np.testing.assert_allclose(part, _alone_loss(MAKERS[name](), sa, before, i),
                                   rtol=1e-12)
    np.testing.assert_allclose(part, whole, rtol=1e-9)  # the step logs the whole batch's
  tol = 1e-9 if name == "hizoo" else 1e-11
  chex.assert_trees_all_close(q, p, atol=tol, rtol=0)
  assert max(float(jnp.max(jnp.abs(a - b)))
             for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(PARAMS), strict=True)) > 0.01
  assert int(hz.forward_passes(s)) == 2 * PASSES[name]
  assert int(hz.forward_passes(sa)) == 2 * K * PASSES[name]
  assert int(_zo(sa).count) == 2 and int(sa.mini_step) == 0


def _zo(state):
  """The (one) zeroth-order state in ``state``."""
  is_zo = lambda x: isinstance(x, hz.ZOState)  # noqa: E731
  return next(x for x in jax.tree.leaves(state, is_leaf=is_zo) if is_zo(x))


def _alone_loss(tx, acc_state, params, i):
  """The loss ``tx`` records for micro-batch ``i`` measured alone from the held state."""
  _, state = tx.update(None, acc_state.inner, params,
                       value_fn=lambda p: loss(p, X[4 * i:4 * i + 4], Y[4 * i:4 * i + 4]))
  return _zo(state).loss


def test_one_micro_batch_is_the_step_itself():
  tx, acc = MAKERS["hizoo"](), hz.accumulate(MAKERS["hizoo"](), 1)
  p, s = jax.tree.map(jnp.copy, PARAMS), tx.init(PARAMS)
  q, sa = jax.tree.map(jnp.copy, PARAMS), acc.init(PARAMS)
  step, step_acc = hz.make_train_step(tx, loss), hz.make_train_step(acc, loss)
  for _ in range(3):
    p, s, _ = step(p, s, X, Y)
    q, sa, _ = step_acc(q, sa, X, Y)
  chex.assert_trees_all_equal(q, p)
  chex.assert_trees_all_equal(sa.inner, s)


def test_a_non_finite_micro_batch_drops_the_steps_direction():
  """A direction whose loss is not finite on any micro-batch is dropped for the whole step
  (its mean is not finite), and params and state stay finite."""
  acc = hz.accumulate(hz.mezo(0.05, mu=1e-3, seed=1), 2)
  q, sa = jax.tree.map(jnp.copy, PARAMS), acc.init(PARAMS)
  step = hz.make_train_step(acc, loss, restore="exact")  # bit for bit on a dropped step
  bad = Y[:4].at[0].set(jnp.nan)
  q, sa, _ = step(q, sa, X[:4], bad)
  q, sa, _ = step(q, sa, X[4:8], Y[4:8])
  chex.assert_trees_all_equal(q, PARAMS)
  assert int(_zo(sa).skipped_directions) == 1
  # the sums start again from zero; (the state's loss fields log the NaN, as without
  # accumulation)
  assert float(sa.center) == 0 and not np.any(np.asarray(sa.losses))
  q, sa, _ = step(q, sa, X[:4], Y[:4])  # and the next step is taken
  q, sa, _ = step(q, sa, X[4:8], Y[4:8])
  assert max(float(jnp.max(jnp.abs(a - b)))
             for a, b in zip(jax.tree.leaves(q), jax.tree.leaves(PARAMS), strict=True)) > 0.01


def test_bad_arguments_are_refused():
  for k in (0, -1, 1.5, True, "2"):
    with pytest.raises(ValueError, match="every_k"):
      hz.accumulate(hz.mezo(1e-3), k)
  with pytest.raises(ValueError, match="exactly one zeroth-order transform"):
    hz.accumulate(optax.adam(1e-3), 2).init(PARAMS)
  two = optax.chain(hz.scale_by_zo(), hz.scale_by_zo(), optax.sgd(1e-3))
  with pytest.raises(ValueError, match="exactly one zeroth-order transform"):
    hz.accumulate(two, 2).init(PARAMS)


# Params-sized state leaves that the step rewrites and then reads in its update: each may
# get one buffer of its own under accumulate (the docstring's bound). One of each kind: a
# stateless method (FZOO), a rewritten state of the method (HiZOO's H) and of a stage after
# the estimate (Adam's moments; a momentum's one trace is the same rule).
REWRITTEN = {"fzoo": 0, "hizoo": 1, "adam": 2}


@pytest.mark.parametrize("name", list(REWRITTEN))
def test_the_step_stays_lean(name):
  """Compiled temporaries over a forward pass, in param bytes, on a 4M-param MLP (float32):
  the accumulated step keeps its update a select, so a stateless method stays at what it
  costs alone (~0.00; FZOO, MeZO measured the same). A step whose update reads state it has
  just rewritten (HiZOO's H, a momentum or Adam after the estimate) needs the new state
  while the held one may be kept, so each such params-sized leaf may get a buffer of its
  own: HiZOO measured 1.0 (a momentum the same), Adam 1.5 of its bound 2."""
  rng = np.random.default_rng(1)
  params = {"w1": jnp.asarray(rng.standard_normal((512, 2048)) * 0.02, jnp.float32),
            "w2": jnp.asarray(rng.standard_normal((2048, 512)) * 0.02, jnp.float32)}
  x = jnp.asarray(rng.standard_normal((16, 512)), jnp.float32)
  f = lambda p, x: jnp.mean(jnp.tanh(x @ p["w1"]) @ p["w2"] ** 2)  # noqa: E731
  tx = {"fzoo": lambda: hz.fzoo(1e-3), "hizoo": lambda: hz.hizoo(1e-3),
        "adam": lambda: optax.chain(hz.scale_by_zo(), optax.adam(1e-3))}[name]()
  extra = lean_step_extra(hz.accumulate(tx, 4), f, params, x, in_a_user_jit=False)
  alone = lean_step_extra(tx, f, params, x, in_a_user_jit=False)
  assert alone["top level"] < 0.05, alone  # the bare step is lean
  more = extra["top level"] - alone["top level"]
  if name == "hizoo":  # the one the docs give as measured
    assert abs(more - 1.0) < 0.05, (extra, alone)
  else:
    assert more < REWRITTEN[name] + 0.05, (extra, alone)
