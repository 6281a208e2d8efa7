"""Bad configuration, non-finite losses, low-precision params and the curvature floor."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.tree_utils as otu
import pytest

import hizoo_jax as hz

P = {"w": jnp.ones((3, 4), jnp.float32), "b": jnp.zeros((4,), jnp.float32)}
F = lambda p: jnp.sum(p["w"] ** 2) + jnp.sum((p["b"] - 1) ** 2)


@pytest.mark.parametrize(
    "make, exc, name",
    [
        (lambda: hz.hizoo(1e-3, mu=0.0), ValueError, "mu"),
        (lambda: hz.mezo(1e-3, mu=-1e-3), ValueError, "mu"),
        (lambda: hz.hizoo(1e-3, mu=float("nan")), ValueError, "mu"),
        (lambda: hz.hizoo(1e-3, hessian_smoothing=1.5), ValueError, "hessian_smoothing"),
        (lambda: hz.hizoo(1e-3, hessian_smoothing=-0.1), ValueError, "hessian_smoothing"),
        (lambda: hz.hizoo(1e-3, num_directions=0), ValueError, "num_directions"),
        (lambda: hz.mezo(1e-3, num_directions=0), ValueError, "num_directions"),
        (lambda: hz.hizoo(1e-3, num_directions=1.5), TypeError, "num_directions"),
        (lambda: hz.hizoo(1e-3, estimator="exact"), ValueError, "estimator"),
        (lambda: hz.hizoo(1e-3, hessian_update_every=0), ValueError, "hessian_update_every"),
        (lambda: hz.hizoo(1e-3, hessian_clip=(0.0, 1.0)), ValueError, "hessian_clip"),
        (lambda: hz.hizoo(1e-3, hessian_clip=(2.0, 1.0)), ValueError, "hessian_clip"),
        (lambda: hz.hizoo(1e-3, hessian_clip=1.0), TypeError, "hessian_clip"),
        (lambda: hz.hizoo(1e-3, hessian_init=0.0), ValueError, "hessian_init"),
        (lambda: hz.hizoo(1e-3, hessian_dtype=jnp.int32), TypeError, "hessian_dtype"),
        (lambda: hz.hizoo(1e-3, curvature_floor=-1.0), ValueError, "curvature_floor"),
        (lambda: hz.hizoo(1e-3, sampler=hz.rademacher), ValueError, "sampler"),
        (lambda: hz.hizoo(1e-3, sampler=jax.random.rademacher), ValueError, "sampler"),
        (lambda: hz.hizoo(1e-3, sampler="normal"), TypeError, "sampler"),
        (lambda: hz.hizoo_l(1e-3, min_dim_size_to_factor=0), ValueError, "min_dim_size_to_factor"),
    ],
)
def test_bad_configuration_names_the_argument(make, exc, name):
  with pytest.raises(exc, match=name):
    make()


def test_bad_seed_names_the_argument():
  with pytest.raises(TypeError, match="seed"):
    hz.hizoo(1e-3, seed=0.5).init(P)


def test_non_float_params_are_refused():
  with pytest.raises(TypeError, match=r"params leaf \['n'\]"):
    hz.mezo(1e-3).init({"n": jnp.arange(3)})


@pytest.mark.parametrize("use_jit", [False, True])
def test_value_fn_errors(use_jit):
  tx = hz.hizoo(1e-3)
  state = tx.init(P)
  upd = jax.jit(tx.update, static_argnames="value_fn") if use_jit else tx.update
  with pytest.raises(TypeError, match="value_fn"):
    upd(None, state, P)
  with pytest.raises(ValueError, match="value_fn must return a scalar"):
    upd(None, state, P, value_fn=lambda p: p["b"])
  with pytest.raises(ValueError, match="value_fn must return a scalar"):
    upd(None, state, P, value_fn=lambda p: (F(p), {}))
  with pytest.raises(TypeError, match="value_fn"):
    upd(None, state, P, value_fn=3.0)


def test_rademacher_is_fine_for_mezo():
  tx = hz.mezo(0.01, sampler=hz.rademacher, num_directions=2)
  state = tx.init(P)
  update = jax.jit(tx.update, static_argnames="value_fn")
  p = P
  for _ in range(30):
    u, state = update(None, state, p, value_fn=F)
    p = optax.apply_updates(p, u)
  assert F(p) < F(P)
  assert set(np.unique(np.abs(np.asarray(hz.rademacher(jax.random.key(0), (100,)))))) == {1.0}


def _all_finite(tree):
  return all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(tree)
             if jnp.issubdtype(jnp.result_type(x), jnp.floating))


@pytest.mark.parametrize("kind", ["mezo", "hizoo", "hizoo_l", "hizoo_multi"])
@pytest.mark.parametrize("bad", [jnp.nan, jnp.inf])
def test_non_finite_losses_leave_params_and_state_finite(kind, bad):
  tx = {
      "mezo": lambda: hz.mezo(0.1),
      "hizoo": lambda: hz.hizoo(0.1, hessian_smoothing=0.5),
      "hizoo_l": lambda: hz.hizoo_l(0.1, hessian_smoothing=0.5, min_dim_size_to_factor=3),
      "hizoo_multi": lambda: hz.hizoo(0.1, hessian_smoothing=0.5, num_directions=3),
  }[kind]()
  n = 3 if kind == "hizoo_multi" else 1
  state = tx.init(P)
  always_bad = lambda p: F(p) + bad
  u, s1 = jax.jit(tx.update, static_argnames="value_fn")(None, state, P, value_fn=always_bad)
  assert all(bool(jnp.all(x == 0)) for x in jax.tree.leaves(u))
  assert _all_finite(optax.apply_updates(P, u))
  assert int(otu.tree_get(s1, "skipped_directions")) == n
  if kind != "mezo":
    assert _all_finite(otu.tree_get(s1, "hessian"))
    jax.tree.map(np.testing.assert_array_equal, hz.get_hessian(s1), hz.get_hessian(state))


def test_one_bad_direction_is_dropped_and_the_others_averaged():
  """With 4 directions, those whose + or - point crosses a wall are skipped."""
  wall = lambda p: jnp.where(p["b"][0] > 0.0, jnp.nan, F(p))  # b starts at exactly 0
  tx = hz.hizoo(0.1, hessian_smoothing=0.5, num_directions=4, seed=1)
  state = tx.init(P)
  u, s = tx.update(None, state, P, value_fn=wall)
  skipped = int(otu.tree_get(s, "skipped_directions"))
  assert skipped == 4  # every direction moves b[0] one way or the other
  # With the wall off the b-axis, nothing is skipped and H moves.
  wall2 = lambda p: jnp.where(p["b"][0] > 10.0, jnp.nan, F(p))
  u, s = tx.update(None, state, P, value_fn=wall2)
  assert int(otu.tree_get(s, "skipped_directions")) == 0
  assert _all_finite(u)


def test_partial_failures_average_over_valid_directions():
  """A direction with a non-finite loss contributes nothing; the mean is over the rest."""
  tx = hz.scale_by_zo(mu=1e-3, num_directions=3, seed=0)
  state = tx.init(P)
  g_all, _ = tx.update(None, state, P, value_fn=F)
  # Poison only direction 1 by making the loss non-finite wherever w[0, 0] moved by
  # more than the others would move it: emulate by a mask on the recorded l+ values.
  lp = otu.tree_get(tx.update(None, state, P, value_fn=F)[1], "losses")[0::2]
  target = lp[1]
  poisoned = lambda p: jnp.where(jnp.abs(F(p) - target) < 1e-6, jnp.inf, F(p))
  g_skip, s = tx.update(None, state, P, value_fn=poisoned)
  assert int(otu.tree_get(s, "skipped_directions")) == 1
  # Rebuild the expected mean from the single-direction estimates 0 and 2.
  from hizoo_jax._src import sampling

  noise_key, _ = sampling.split_state_key(jax.random.wrap_key_data(state.key))
  lm = otu.tree_get(tx.update(None, state, P, value_fn=F)[1], "losses")[1::2]
  gs = []
  for j in (0, 2):
    z = sampling.direction_noise(noise_key, j, P, sampling.DEFAULT_SAMPLER)
    proj = (lp[j] - lm[j]) / 2e-3
    gs.append(jax.tree.map(lambda zl, proj=proj: proj * zl, z))
  expected = jax.tree.map(lambda a, b: (a + b) / 2, *gs)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
               g_skip, expected)
  assert not np.allclose(np.asarray(g_all["w"]), np.asarray(g_skip["w"]))


def test_bf16_params_keep_a_float32_hessian_that_moves_at_tiny_alpha():
  """alpha = 1e-8: a float32 H moves; the reference code's fp16 H provably does not."""
  rng = np.random.default_rng(0)
  params = {"w": jnp.asarray(rng.uniform(-0.05, 0.05, (32, 32)), jnp.bfloat16)}
  loss = lambda p: 100.0 * jnp.sum(p["w"].astype(jnp.float32) ** 2)
  tx = hz.hizoo(1e-4, mu=1e-2, hessian_smoothing=1e-8)
  state = tx.init(params)
  assert otu.tree_get(state, "hessian")["w"].dtype == jnp.float32
  u, state = jax.jit(tx.update, static_argnames="value_fn")(None, state, params, value_fn=loss)
  assert u["w"].dtype == jnp.bfloat16
  H = np.asarray(hz.get_hessian(state)["w"])
  assert H.dtype == np.float32
  assert np.count_nonzero(H != 1.0) > 0.9 * H.size  # nearly every entry moved
  assert int(otu.tree_get(state, "skipped_hessian_updates")) == 0

  # The same EMA with the state in fp16, as the reference trainer keeps it: alpha = 1e-8
  # underflows to 0 and 1 - alpha rounds to 1, so H never moves whatever the estimate.
  est16 = np.minimum(np.asarray(H, np.float64) * 1e8, 6e4).astype(np.float16)
  h16 = np.ones((32, 32), np.float16)
  a16 = np.float16(1e-8)
  assert a16 == 0 and np.float16(1) - a16 == 1
  np.testing.assert_array_equal((np.float16(1) - a16) * h16 + a16 * est16, h16)

  # Asking for a 16-bit Hessian reproduces that failure in part: bf16 can only register
  # the few estimates large enough to move 1.0 by half a bf16 ulp. H stays finite.
  for dtype in ("bfloat16", "float16"):
    tx16 = hz.hizoo(1e-4, mu=1e-2, hessian_smoothing=1e-8, hessian_dtype=dtype)
    _, s16 = tx16.update(None, tx16.init(params), params, value_fn=loss)
    H16 = np.asarray(hz.get_hessian(s16)["w"], np.float32)
    assert np.all(np.isfinite(H16)) and np.all(H16 > 0)
    if dtype == "bfloat16":
      assert np.count_nonzero(H16 != 1.0) < 0.1 * H16.size


def test_curvature_below_rounding_is_skipped_not_fed_to_the_ema():
  """float32 loss ~1e8: l+ + l- - 2 l0 is rounding noise; H must not move."""
  params = {"x": jnp.array([0.3, 3.0], jnp.float32)}
  loss = lambda p: 1e8 + 10000 * p["x"][0] ** 2 + p["x"][1] ** 2
  tx = hz.scale_by_hizoo(mu=1e-3, hessian_smoothing=0.5)
  state = tx.init(params)
  for _ in range(5):
    _, state = tx.update(None, state, params, value_fn=loss)
  assert int(otu.tree_get(state, "skipped_hessian_updates")) == 5
  np.testing.assert_array_equal(hz.get_hessian(state)["x"], np.ones(2, np.float32))
  # Without the floor the EMA swallows the rounding noise.
  tx0 = hz.scale_by_hizoo(mu=1e-3, hessian_smoothing=0.5, curvature_floor=0.0)
  s0 = tx0.init(params)
  for _ in range(5):
    _, s0 = tx0.update(None, s0, params, value_fn=loss)
  assert int(otu.tree_get(s0, "skipped_hessian_updates")) == 0
  assert not np.allclose(hz.get_hessian(s0)["x"], 1.0)


def test_seed_beyond_32_bits_is_its_own_key_and_bad_seeds_name_seed():
  params = {"w": jnp.ones(3)}
  k0 = hz.mezo(1e-3, seed=0).init(params)[0].key
  k40 = hz.mezo(1e-3, seed=2**40).init(params)[0].key
  assert not np.array_equal(np.asarray(k0), np.asarray(k40))  # jax.random.key(2**40) == key(0)
  with pytest.raises(ValueError, match="seed"):
    hz.mezo(1e-3, seed=2**70)
  with pytest.raises(TypeError, match="seed"):
    hz.mezo(1e-3, seed=1.5)


def test_python_float_leaves_and_mu_resolution_checks():
  params = {"w": jnp.ones(3), "s": 0.5}
  tx = hz.hizoo(1e-2)
  state = tx.init(params)
  updates, state = tx.update(None, state, params, value_fn=lambda p: jnp.sum(p["w"]) * p["s"])
  assert hz.get_hessian(state)["s"].shape == ()
  with pytest.raises(ValueError, match="mu_resolution"):
    hz.hizoo(1e-2, mu_resolution=-1.0)


# ----------------------------------------------------------------------------------------
# Params and states that do not fit: a clear error naming the leaf, not a shape error.


def test_empty_params_and_none_leaves_are_refused():
  with pytest.raises(ValueError, match="no array leaves"):
    hz.mezo(1e-2).init({})
  with pytest.raises(ValueError, match=r"\['b'\] is None"):
    hz.hizoo(1e-2).init({"w": jnp.ones(2), "b": None})


@pytest.mark.parametrize("build, params_of_state", [
    (lambda: hz.hizoo(1e-2), {"w": jnp.ones(8)}),      # another model: other shapes
    (lambda: hz.hizoo(1e-2), {"v": jnp.ones(4)}),      # another model: other names
    (lambda: hz.sparse_mezo(1e-2), {"w": jnp.ones((2, 4)), "b": jnp.ones(3)}),
], ids=["shapes", "names", "sparse-leaves"])
def test_a_state_of_another_model_is_refused_by_name(build, params_of_state):
  tx = build()
  params = {"w": jnp.ones(4)}
  with pytest.raises(ValueError, match="tx.init"):
    tx.update(None, tx.init(params_of_state), params, value_fn=lambda p: jnp.sum(p["w"] ** 2))


def test_a_state_of_another_method_is_refused_by_name():
  params = {"w": jnp.ones(4)}
  with pytest.raises(ValueError, match="another optimizer"):
    hz.hizoo(1e-2).update(None, hz.mezo(1e-2).init(params), params,
                          value_fn=lambda p: jnp.sum(p["w"] ** 2))


def test_a_frozen_integer_leaf_trains_in_the_engine():
  params = {"w": jnp.ones(4, jnp.float32), "n": jnp.asarray(3, jnp.int32)}
  tx = optax.masked(hz.mezo(1e-2), {"w": True, "n": False})
  step = hz.make_train_step(tx, lambda p: jnp.sum(p["w"] ** 2) + 0 * p["n"])
  new, _, loss = step(params, tx.init(params))
  assert int(new["n"]) == 3 and np.isfinite(float(loss))
  assert not np.array_equal(np.asarray(new["w"]), np.ones(4))


@pytest.mark.parametrize("factory, option, value", [(hz.zo_muon, "vector_scale", 0.1),
                                                    (hz.lozo, "momentum", 0.5)])
def test_a_float_option_of_a_low_rank_method_may_be_injected(factory, option, value):
  """ZO-Muon's vector_scale and LOZO-M's momentum are numeric options: traced by
  ``optax.inject_hyperparams`` they step exactly as when listed in ``static_args`` (whether
  LOZO has a momentum at all is read from the state that init built)."""
  tx = optax.inject_hyperparams(factory, static_args=("rank",))(
      learning_rate=1e-2, **{option: value})
  fixed = optax.inject_hyperparams(factory, static_args=("rank", option))(
      learning_rate=1e-2, **{option: value})
  got, _ = jax.jit(lambda s: tx.update(None, s, P, value_fn=F))(tx.init(P))
  want, _ = jax.jit(lambda s: fixed.update(None, s, P, value_fn=F))(fixed.init(P))
  chex.assert_trees_all_close(got, want, rtol=1e-6, atol=1e-9)
  assert any(bool(jnp.any(u != 0)) for u in jax.tree.leaves(got))
