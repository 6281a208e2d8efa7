"""The transforms inside Optax chains, wrappers, jit/scan loops and Flax NNX."""

from __future__ import annotations

import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.tree_utils as otu
import pytest

import hizoo_jax as hz

RNG = np.random.default_rng(0)
A = RNG.standard_normal((6, 6))
A = jnp.asarray(A @ A.T / 6 + np.eye(6), jnp.float64)
# float64: trajectories of differently compiled programs are compared for equality, and a
# ZO estimate amplifies float32 rounding of the loss by 1 / mu.
PARAMS = {"w": jnp.asarray(RNG.standard_normal((2, 3)), jnp.float64),
          "b": jnp.asarray(RNG.standard_normal(3), jnp.float64)}


def loss(p):
  x = jnp.concatenate([p["w"].ravel(), p["b"][:0]])
  return 0.5 * x @ A @ x + jnp.sum((p["b"] - 0.5) ** 2)


def run(tx, steps=5, params=PARAMS, f=loss):
  state = tx.init(params)
  upd = jax.jit(tx.update, static_argnames="value_fn")
  out = []
  for _ in range(steps):
    u, state = upd(None, state, params, value_fn=f)
    params = optax.apply_updates(params, u)
    out.append(params)
  return params, state, out


def zo_grads(tx_zo, steps, params_seq):
  """The g's a scale_by_* transform emits along a given params sequence."""
  state = tx_zo.init(params_seq[0])
  gs = []
  for p in params_seq[:steps]:
    g, state = tx_zo.update(None, state, p, value_fn=loss)
    gs.append(g)
  return gs


def test_zo_adam_is_adam_on_the_zo_estimate():
  lr = 1e-2
  zo_adam = optax.chain(hz.scale_by_zo(mu=1e-3, seed=4), optax.scale_by_adam(), optax.scale(-lr))
  _, _, traj = run(zo_adam, 4)
  # Replay: the same g's fed to optax.adam give the same params.
  params, adam, zo = PARAMS, optax.adam(lr), hz.scale_by_zo(mu=1e-3, seed=4)
  s_adam, s_zo = adam.init(params), zo.init(params)
  for t in range(4):
    g, s_zo = zo.update(None, s_zo, params, value_fn=loss)
    u, s_adam = adam.update(g, s_adam, params)
    params = optax.apply_updates(params, u)
    chex.assert_trees_all_close(params, traj[t], rtol=1e-6)


# Each tail once and each kind of estimate once: several directions (scale_by_zo), HiZOO's
# preconditioned one (Adam on scale_by_zo's estimate: test_zo_adam_is_adam_on_the_zo_estimate).
@pytest.mark.parametrize(
    "name, head, tail",
    [
        ("zo_sgd_mmt", lambda: hz.scale_by_zo(mu=1e-3, num_directions=2),
         lambda: optax.sgd(1e-2, momentum=0.9)),
        ("hizoo_sign", lambda: hz.scale_by_hizoo(mu=1e-3),
         lambda: optax.chain(optax.scale_by_sign(), optax.scale(-1e-2))),
        ("hizoo_adam", lambda: hz.scale_by_hizoo(mu=1e-3), lambda: optax.adam(1e-2)),
    ],
)
def test_zo_chains_reduce_the_loss(name, head, tail):
  params, _, _ = run(optax.chain(head(), tail()), 150)
  assert loss(params) < 0.5 * loss(PARAMS), name


def test_gradient_accumulation_with_multisteps():
  k, lr = 3, 0.05
  tx = optax.chain(hz.scale_by_zo(mu=1e-3, seed=2), optax.MultiSteps(optax.sgd(lr), k))
  _, state, traj = run(tx, 2 * k)
  assert int(hz.forward_passes(state)) == 2 * 2 * k  # every micro-step's passes counted
  # params move only every k-th step, by -lr * mean of the k estimates
  chex.assert_trees_all_close(traj[0], PARAMS)
  chex.assert_trees_all_close(traj[1], PARAMS)
  gs = zo_grads(hz.scale_by_zo(mu=1e-3, seed=2), k, [PARAMS] * k)
  mean_g = jax.tree.map(lambda *x: sum(x) / k, *gs)
  chex.assert_trees_all_close(traj[k - 1], jax.tree.map(lambda p, g: p - lr * g, PARAMS, mean_g),
                              rtol=1e-5, atol=1e-6)


def test_inject_hyperparams_with_schedules_matches_the_plain_optimizer():
  lr = optax.linear_schedule(0.05, 0.01, 10)
  alpha = optax.exponential_decay(0.3, 5, 0.5)
  plain = hz.hizoo(lr, mu=1e-3, hessian_smoothing=alpha, num_directions=2, seed=1,
                   weight_decay=0.01)
  injected = optax.inject_hyperparams(hz.hizoo, static_args=("num_directions",))(
      learning_rate=lr, mu=1e-3, hessian_smoothing=alpha, num_directions=2, seed=1,
      weight_decay=0.01)
  p1, s1, _ = run(plain, 6)
  p2, s2, _ = run(injected, 6)
  chex.assert_trees_all_close(p1, p2, rtol=1e-6)
  chex.assert_trees_all_close(hz.get_hessian(s1), hz.get_hessian(s2), rtol=1e-6)
  np.testing.assert_allclose(s2.hyperparams["learning_rate"], lr(5), rtol=1e-6)


def test_inject_hyperparams_array_values_and_manual_changes():
  tx = optax.inject_hyperparams(hz.hizoo, static_args=("num_directions",))(
      learning_rate=0.01, mu=1e-3, hessian_smoothing=0.1)
  state = tx.init(PARAMS)
  state.hyperparams["mu"] = jnp.asarray(2e-3)
  state.hyperparams["learning_rate"] = jnp.asarray(0.0)
  u, state = jax.jit(tx.update, static_argnames="value_fn")(None, state, PARAMS, value_fn=loss)
  assert all(bool(jnp.all(x == 0)) for x in jax.tree.leaves(u))
  # the perturbation used the new mu: l+ - l- scales with mu for a smooth loss
  assert np.isfinite(otu.tree_get(state, "loss"))


@pytest.mark.parametrize("tx", [
    hz.hizoo(0.05, hessian_smoothing=0.2, num_directions=2, hessian_update_every=2),
    hz.hizoo_l(0.05, hessian_smoothing=0.2, min_dim_size_to_factor=2),
    hz.mezo(0.05),
], ids=["hizoo_multi_every2", "hizoo_l", "mezo"])
def test_lax_scan_over_steps_matches_the_python_loop(tx):
  p_loop, s_loop, _ = run(tx, 7)

  def body(carry, _):
    p, s = carry
    u, s = tx.update(None, s, p, value_fn=loss)
    return (optax.apply_updates(p, u), s), otu.tree_get(s, "loss")

  (p_scan, s_scan), losses = jax.jit(
      lambda p: jax.lax.scan(body, (p, tx.init(p)), None, length=7))(PARAMS)
  chex.assert_trees_all_close(p_scan, p_loop, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_equal_shapes_and_dtypes(s_scan, s_loop)
  assert losses.shape == (7,)


def test_make_train_step_matches_the_manual_loop():
  def loss_fn(p, x, y):
    return jnp.mean((x @ p["w"] + p["b"] - y) ** 2)

  x = jnp.asarray(RNG.standard_normal((16, 2)))
  y = jnp.asarray(RNG.standard_normal((16, 3)))
  # HiZOO, whose reported loss is l0; make_train_step against the plain update for every
  # method: tests/test_train_step.py
  tx = hz.hizoo(0.05, hessian_smoothing=0.1)
  step = hz.make_train_step(tx, loss_fn)
  params = jax.tree.map(jnp.copy, PARAMS)
  state = tx.init(params)
  p_ref, s_ref = PARAMS, tx.init(PARAMS)
  for _ in range(3):
    l_before = loss_fn(p_ref, x, y)
    u, s_ref = tx.update(None, s_ref, p_ref, value_fn=lambda p: loss_fn(p, x, y))
    p_ref = optax.apply_updates(p_ref, u)
    params, state, reported = step(params, state, x, y)
    chex.assert_trees_all_close(params, p_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(reported, l_before, rtol=1e-5)  # l0 of the old params


def test_keys_advance_and_explicit_keys_override():
  tx = hz.scale_by_zo(mu=1e-3, seed=0)
  s0 = tx.init(PARAMS)
  g1, s1 = tx.update(None, s0, PARAMS, value_fn=loss)
  g2, s2 = tx.update(None, s1, PARAMS, value_fn=loss)
  assert not np.allclose(g1["w"], g2["w"])  # the key advanced
  assert not np.array_equal(s0.key, s1.key)
  k = jax.random.key(42)
  ga, sa = tx.update(None, s0, PARAMS, value_fn=loss, key=k)
  gb, sb = tx.update(None, s1, PARAMS, value_fn=loss, key=k)
  chex.assert_trees_all_close(ga, gb)  # noise from the explicit key only
  np.testing.assert_array_equal(sa.key, s1.key)  # the state key still advances
  gc, _ = tx.update(None, s0, PARAMS, value_fn=loss, key=jax.random.PRNGKey(42))
  chex.assert_trees_all_close(ga, gc)  # raw and typed keys are the same key
  # An int seed and the same typed key give the same run; another seed does not.
  g_typed, _ = hz.scale_by_zo(seed=jax.random.key(0)).update(
      None, hz.scale_by_zo(seed=jax.random.key(0)).init(PARAMS), PARAMS, value_fn=loss)
  chex.assert_trees_all_close(g_typed, g1)
  g_other, _ = tx.update(None, hz.scale_by_zo(seed=1).init(PARAMS), PARAMS, value_fn=loss)
  assert not np.allclose(g_other["w"], g1["w"])


def test_other_prng_impls_work():
  key = jax.random.key(3, impl="rbg")
  tx = hz.hizoo(0.05, hessian_smoothing=0.1, seed=key)
  state = tx.init(PARAMS)
  assert state[0].key.shape == jax.random.key_data(key).shape
  params, state, _ = run(tx, 40)
  assert loss(params) < loss(PARAMS)


def test_state_holds_no_noise():
  """Nothing param-sized beyond H lives in the state: the noise is regenerated."""
  big = {"w": jnp.zeros((256, 256), jnp.float32)}
  for tx, allowed in ((hz.mezo(1e-3), 0), (hz.hizoo(1e-3), 256 * 256),
                      (hz.hizoo_l(1e-3), 2 * 256)):
    s = tx.init(big)
    s = tx.update(None, s, big, value_fn=lambda p: jnp.sum(p["w"] ** 2))[1]
    sizes = [x.size for x in jax.tree.leaves(s)]
    assert sum(sizes) <= allowed + 64, (tx, sizes)


def test_flax_nnx_optimizer():
  from flax import nnx

  model = nnx.Linear(4, 2, param_dtype=jnp.float64, dtype=jnp.float64, rngs=nnx.Rngs(0))
  x = jnp.asarray(RNG.standard_normal((32, 4)))
  y = jnp.asarray(RNG.standard_normal((32, 2)))
  graphdef, params0 = nnx.split(model, nnx.Param)
  params_init = nnx.as_pure(params0)  # split shares Variables with the live model: copy now

  def value_fn(params):  # a pure function of the params pytree
    return jnp.mean((nnx.merge(graphdef, params)(x) - y) ** 2)

  tx = hz.hizoo(0.05, hessian_smoothing=0.1, seed=5)
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  first = value_fn(nnx.state(model, nnx.Param))

  @nnx.jit
  def train_step(model, optimizer):
    optimizer.update(model, nnx.state(model, nnx.Param), value_fn=value_fn)

  for _ in range(60):
    train_step(model, optimizer)
  assert value_fn(nnx.state(model, nnx.Param)) < 0.8 * first
  # The same run, functionally, lands on the same params.
  params = params_init
  state = tx.init(params)
  update = jax.jit(tx.update, static_argnames="value_fn")
  for _ in range(60):
    u, state = update(None, state, params, value_fn=value_fn)
    params = optax.apply_updates(params, u)
  chex.assert_trees_all_close(nnx.as_pure(nnx.state(model, nnx.Param)), params,
                              rtol=1e-6, atol=1e-9)  # 60 steps of two programs' rounding
  assert hz.get_hessian(nnx.as_pure(optimizer.opt_state))["kernel"].shape == (4, 2)


def test_forward_passes_reads_the_count_through_wrappers_jit_and_vmap():
  """hz.forward_passes: the executed count of any state holding a zeroth-order transform."""
  wrapped = {
      "chain": optax.chain(hz.scale_by_hizoo(mu=1e-3, seed=1), optax.sgd(1e-3)),
      "inject": optax.inject_hyperparams(hz.mezo)(learning_rate=1e-3),
      "multi_steps": optax.MultiSteps(hz.mezo(1e-3), every_k_schedule=1),
      "fzoo in adam": optax.chain(hz.scale_by_fzoo(mu=1e-3, num_directions=4), optax.adam(1e-3)),
  }
  per_step = {"chain": 3, "inject": 2, "multi_steps": 2, "fzoo in adam": 5}
  for name, tx in wrapped.items():
    step, params = hz.make_train_step(tx, loss), jax.tree.map(jnp.copy, PARAMS)
    state = tx.init(params)
    for _ in range(3):
      params, state, _ = step(params, state)
    assert int(hz.forward_passes(state)) == 3 * per_step[name], name
    assert int(jax.jit(hz.forward_passes)(state)) == 3 * per_step[name], name
  assert hz.forward_passes(optax.adam(1e-3).init(PARAMS)) is None  # first order: no count
  assert hz.forward_passes(hz.mezo(1e-3).init(PARAMS)) == 0
  # Two zeroth-order states in one tree add up; an int32 count stops at its maximum.
  _, a, _ = run(hz.scale_by_zo(mu=1e-3), 2)  # a ZOState itself
  _, b, _ = run(hz.hizoo(1e-3), 1)
  assert int(hz.forward_passes((a, {"other": b}))) == 4 + 3
  top = np.iinfo(np.int32).max
  full = a._replace(forward_passes=jnp.int32(top - 1))
  assert int(hz.forward_passes((full, b))) == top
  # States stacked over seeds (jax.vmap) give one count per member.
  init = jax.vmap(lambda s: hz.mezo(1e-3, seed=s).init(PARAMS))(jnp.arange(3))
  np.testing.assert_array_equal(hz.forward_passes(init), np.zeros(3, np.int32))
  stacked = jax.tree.map(lambda *x: jnp.stack(x), a, a)
  np.testing.assert_array_equal(hz.forward_passes(stacked), [4, 4])


def test_multisteps_around_a_zo_transform_warns_that_it_discards_micro_steps():
  """optax.MultiSteps(hz.mezo(...), k) holds the ZO state (its direction) until it emits:
  each micro-step runs its passes along the same direction, and all but the last are
  discarded, uncounted. The engine says so when it traces such a step; MultiSteps after
  the estimate (accumulation proper) is silent."""
  calls = []

  def counted_loss(p):
    jax.debug.callback(lambda: calls.append(1))
    return loss(p)

  around = optax.MultiSteps(hz.mezo(1e-3), every_k_schedule=2)
  after = optax.chain(hz.scale_by_zo(mu=1e-3), optax.MultiSteps(optax.sgd(1e-3), 2))
  for tx, warns in ((around, True), (after, False)):
    calls.clear()
    params, state = jax.tree.map(jnp.copy, PARAMS), tx.init(PARAMS)
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      step = hz.make_train_step(tx, counted_loss)
      for _ in range(4):
        params, state, _ = step(params, state)
    jax.effects_barrier()
    hit = [w for w in caught if "MultiSteps wraps a zeroth-order" in str(w.message)]
    assert len(hit) == (1 if warns else 0)
    assert len(calls) == 8  # 2 passes in each of the 4 micro-steps, either way
    assert int(hz.forward_passes(state)) == (4 if warns else 8)
