"""FZOO, Sparse MeZO and forward gradients: exact against NumPy, composable, lean, checked.

1. Exactness. Each method runs several steps on a small MLP (a matrix, a bias, a matrix)
   through ``tx.update`` and through :func:`hizoo_jax.make_train_step` (lean,
   ``restore="exact"``), and every step is compared with the float64 NumPy reference of
   tests/reference_methods.py fed the noise the step drew (regenerated from the state
   key: ``noise_key, next = split(state_key)``, probe ``j`` from
   ``sampling.direction_noise(noise_key, j, params, sampler)``). Some steps make chosen
   probes non-finite: the loss is NaN within ``mu / 4`` of a list of "poisoned" points the
   test picks from the probes' perturbed params (for forward gradients the directional
   derivative is infinite along chosen tangents), so the same probes fail in NumPy and in
   JAX whatever rounding does.

   Tolerance (float64): a loss evaluation rounds differently in NumPy and in XLA by a few
   ulp of ``|l| ~ 1``, ~1e-15. The SPSA/FZOO estimates take differences of losses of size
   ``mu |grad . d| ~ 1e-2`` (``mu = 1e-2``): ~1e-13 relative in ``g`` (and in FZOO's
   ``sigma``, a spread of those differences); forward gradients have no cancellation
   (~1e-15). With ``lr = 0.05`` and ``|g| ~ 1`` the params then agree to ~1e-14 absolute
   after a few steps (the next step's losses move with them by ~|grad| 1e-14). The tests
   allow ``rtol 1e-9, atol 1e-12`` on params and ``rtol 1e-12, atol 1e-13`` on recorded
   losses: 100x the expected error, and 1e4x below a wrong step (another noise, mask,
   ``ddof``, or a probe not dropped moves the params by ``lr |g| >= 1e-4``).

2. Composition: the lean step against the plain one (``lean=False``) under optax.chain
   with Adam, inject_hyperparams (schedules of the learning rate and ``mu``), masked,
   MultiSteps, a lax.scan in a user's jit and nnx.jit, as tests/test_engine.py does.

3. Memory, 4. errors, 5. Sparse MeZO's masks.
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
from hizoo_jax._src import sampling
from tests import reference_methods as ref
from tests.helpers import lean_step_extra

LR = 0.05
MU = 1e-2
POISON_TOL = MU / 4  # the probes' points lie ~mu (max norm) from theta and each other
FAR = 1e3  # an unused poisoned slot: far from any params
PARAM_TOL = dict(rtol=1e-9, atol=1e-12)
LOSS_TOL = dict(rtol=1e-12, atol=1e-13)

_rng = np.random.default_rng(0)
X_NP = _rng.standard_normal((16, 5))
Y_NP = _rng.standard_normal((16, 3))
THETA0 = {"w1": _rng.standard_normal((5, 6)) / np.sqrt(5),
          "b1": _rng.standard_normal(6) * 0.1,
          "w2": _rng.standard_normal((6, 3)) / np.sqrt(6)}
X, Y = jnp.asarray(X_NP), jnp.asarray(Y_NP)


def params0():
  return {k: jnp.asarray(v, jnp.float64) for k, v in THETA0.items()}


# ----------------------------------------------------------------------------------------
# The loss, in NumPy and in JAX, with poisoned points.


def base_np(p):
  h = np.tanh(X_NP @ p["w1"] + p["b1"])
  return float(np.mean((h @ p["w2"] - Y_NP) ** 2))


def jvp_np(p, t):
  """``(f(p), grad f(p) . t)`` by forward-mode differentiation written out."""
  h = np.tanh(X_NP @ p["w1"] + p["b1"])
  r = h @ p["w2"] - Y_NP
  dh = (1 - h**2) * (X_NP @ t["w1"] + t["b1"])
  dr = dh @ p["w2"] + h @ t["w2"]
  return float(np.mean(r**2)), float(np.mean(2 * r * dr))


def near_np(p, bad):
  dist = np.max([np.max(np.abs(p[k][None] - bad[k]).reshape(len(bad[k]), -1), axis=1)
                 for k in p], axis=0)
  return bool(np.any(dist < POISON_TOL))


def loss_np(bad):
  return lambda p: float("nan") if near_np(p, bad) else base_np(p)


def fg_jvp_np(bad):
  def f(p, t):
    value, d = jvp_np(p, t)
    return value, float("inf") if near_np(t, bad) else d
  return f


def base_fn(p):
  h = jnp.tanh(X @ p["w1"] + p["b1"])
  return jnp.mean((h @ p["w2"] - Y) ** 2)


def near(p, bad):
  dist = None
  for k in p:
    d = jnp.max(jnp.abs(p[k][None] - bad[k]).reshape(bad[k].shape[0], -1), axis=1)
    dist = d if dist is None else jnp.maximum(dist, d)
  return jnp.any(dist < POISON_TOL)


def loss_fn(p, bad):
  """The MLP's loss, NaN within POISON_TOL of a poisoned point."""
  return jnp.where(near(p, bad), jnp.nan, base_fn(p))


@jax.custom_jvp
def spike(p, bad):
  del bad
  return jnp.zeros((), p["w1"].dtype)


@spike.defjvp
def _spike_jvp(primals, tangents):
  p, bad = primals
  t, _ = tangents
  return spike(p, bad), jnp.where(near(t, bad), jnp.inf, 0.0).astype(p["w1"].dtype)


def fg_loss_fn(p, bad):
  """The MLP's loss, whose derivative is infinite along a poisoned tangent."""
  return base_fn(p) + spike(p, bad)


def poison(points, slots):
  """The poisoned points as arrays with a leading axis of ``slots`` (unused slots far)."""
  out = {k: np.full((slots,) + v.shape, FAR) for k, v in THETA0.items()}
  for i, q in enumerate(points):
    for k in out:
      out[k][i] = q[k]
  return out


@functools.partial(jax.jit, static_argnums=(2, 3))
def _noise(key_data, params, n, sampler):
  noise_key, _ = sampling.split_state_key(jax.random.wrap_key_data(key_data))
  return [sampling.direction_noise(noise_key, j, params, sampler) for j in range(n)]


def step_noise(state, params, n, sampler):
  """The noise ``[z_1 .. z_n]`` the next update of ``state`` draws (NumPy dicts): the
  documented key schedule, as tests/helpers.py's ``step_noise``, jitted."""
  return jax.tree.map(np.asarray, _noise(otu.tree_get(state, "key"), params, n, sampler))


def moved(theta, d, step):
  return {k: theta[k] + step * d[k] for k in theta}


# ----------------------------------------------------------------------------------------
# 1. Exactness against the NumPy reference.


def fzoo_case():
  n = 4

  def scenario(t, theta, us, masks):
    probe = lambda j: moved(theta, us[j], MU)
    return [[], [probe(1), probe(3)],  # 2 finite probes (the fewest that run a step)
            [probe(j) for j in range(1, n)],  # 1 finite probe: skipped
            [theta],  # l0 not finite: skipped
            []][t]

  return dict(
      tx=hz.fzoo(LR, mu=MU, num_directions=n, seed=3), sampler=hz.fast_rademacher, n=n,
      loss=loss_fn, scenario=scenario, skipped=[0, 2, n, n, 0], passes_per_step=n + 1,
      reference=lambda theta, zs, bad, h: ref.fzoo_step(theta, loss_np(bad), zs, MU))


def fzoo_unnormalised_case():
  n = 4

  def scenario(t, theta, us, masks):
    probe = lambda j: moved(theta, us[j], MU)
    return [[], [probe(1), probe(3)],  # 2 finite probes
            [probe(j) for j in range(1, n)],  # 1 finite probe: enough without sigma
            [theta],  # l0 not finite: skipped
            [probe(j) for j in range(n)],  # no finite probe: skipped
            []][t]

  return dict(
      tx=hz.fzoo(LR, mu=MU, num_directions=n, normalize=False, seed=3),
      sampler=hz.fast_rademacher, n=n, loss=loss_fn, scenario=scenario,
      skipped=[0, 2, n - 1, n, n, 0], passes_per_step=n + 1,
      reference=lambda theta, zs, bad, h: ref.fzoo_step(theta, loss_np(bad), zs, MU,
                                                        normalize=False))


def sparse_case():
  n, sparsity = 3, 0.6

  def scenario(t, theta, zs, masks):
    d = lambda j: {k: masks[k] * zs[j][k] for k in theta}
    return [[], [moved(theta, d(1), MU)],  # probe 1's l+ not finite: 2 valid probes
            [moved(theta, d(j), -MU) for j in range(n)],  # every l- not finite: skipped
            []][t]

  return dict(
      tx=hz.sparse_mezo(LR, mu=MU, sparsity=sparsity, num_directions=n, seed=3),
      sampler=hz.fast_gaussian, n=n, loss=loss_fn, scenario=scenario, sparsity=sparsity,
      skipped=[0, 1, n, 0], passes_per_step=2 * n,
      reference=lambda theta, zs, bad, h: ref.sparse_mezo_step(theta, loss_np(bad), zs, h,
                                                                MU))


def forward_gradient_case():
  n = 3

  def scenario(t, theta, zs, masks):
    return [[], [zs[0]],  # d_0 infinite: 2 valid directions
            list(zs),  # every d_j infinite: skipped
            []][t]

  return dict(
      tx=hz.forward_gradient(LR, num_directions=n, seed=3), sampler=hz.fast_gaussian, n=n,
      loss=fg_loss_fn, scenario=scenario, skipped=[0, 1, n, 0],
      passes_per_step=2 * n,  # a jvp counts as two forward passes; no l0
      reference=lambda theta, zs, bad, h: ref.forward_gradient_step(theta, fg_jvp_np(bad),
                                                                    zs))


CASES = {"fzoo": fzoo_case, "fzoo_unnormalised": fzoo_unnormalised_case,
         "sparse_mezo": sparse_case,
         "forward_gradient": forward_gradient_case}


def library_step(path, tx, loss):
  """``(params, state, bad) -> (params, state)`` through ``tx.update`` or the lean engine."""
  if path == "update":
    @jax.jit
    def update(params, state, bad):
      g, state = tx.update(None, state, params, value_fn=lambda p: loss(p, bad))
      return optax.apply_updates(params, g), state
    return update
  step = hz.make_train_step(tx, loss, lean=True, restore="exact")
  return lambda params, state, bad: step(params, state, bad)[:2]


def thresholds(sparsity):
  return {k: ref.sparse_threshold(v, sparsity) if v.ndim >= 2 else np.inf
          for k, v in THETA0.items()}


@pytest.mark.parametrize("path", ["update", "engine"])
@pytest.mark.parametrize("name", list(CASES))
def test_matches_the_numpy_reference(name, path):
  c = CASES[name]()
  tx = c["tx"]
  params = params0()
  state = tx.init(params)
  theta = {k: v.copy() for k, v in THETA0.items()}
  h = thresholds(c["sparsity"]) if "sparsity" in c else None
  step = library_step(path, tx, c["loss"])
  skipped = 0
  for t, want_skipped in enumerate(c["skipped"]):
    zs = step_noise(state, params, c["n"], c["sampler"])
    masks = ref.sparse_masks(theta, h) if h is not None else None
    bad = poison(c["scenario"](t, theta, zs, masks), c["n"])
    g, info = c["reference"](theta, zs, bad, h)
    assert info["skipped"] == want_skipped  # the scenario happened as intended
    theta = {k: theta[k] - LR * g[k] for k in theta}
    before = jax.tree.map(np.array, params)  # a copy: the step donates params
    params, state = step(params, state, jax.tree.map(jnp.asarray, bad))
    chex.assert_trees_all_close(params, theta, **PARAM_TOL)
    if want_skipped == c["n"]:  # a skipped step leaves the params bit-identical
      chex.assert_trees_all_equal(params, before)
    else:
      assert max(np.max(np.abs(params[k] - before[k])) for k in theta) > 1e-4
    np.testing.assert_allclose(otu.tree_get(state, "loss"), info["loss"], **LOSS_TOL)
    np.testing.assert_allclose(otu.tree_get(state, "losses"), info["losses"], **LOSS_TOL)
    skipped += want_skipped
    assert int(otu.tree_get(state, "skipped_directions")) == skipped
    assert int(hz.forward_passes(state)) == (t + 1) * c["passes_per_step"]
    assert int(otu.tree_get(state, "forward_passes")) == int(hz.forward_passes(state))
    assert int(otu.tree_get(state, "count")) == t + 1


@pytest.mark.parametrize("path", ["update", "engine"])
def test_fzoo_skips_a_step_whose_probe_losses_have_no_spread(path):
  """A constant loss: every l_j equals l0, sigma = 0, g = 0 and all N probes counted."""
  n = 4
  tx = hz.fzoo(LR, mu=MU, num_directions=n, seed=3)
  const = lambda p, bad: 1.5 + 0.0 * jnp.sum(p["w1"])
  params = params0()
  state = tx.init(params)
  step = library_step(path, tx, const)
  zs = step_noise(state, params, n, hz.fast_rademacher)
  g, info = ref.fzoo_step(THETA0, lambda p: 1.5, zs, MU)
  assert info["sigma"] == 0 and info["skipped"] == n
  for t in range(2):
    params, state = step(params, state, jax.tree.map(jnp.asarray, poison([], 1)))
    chex.assert_trees_all_equal(params, params0())
    assert int(otu.tree_get(state, "skipped_directions")) == (t + 1) * n
    assert int(otu.tree_get(state, "forward_passes")) == (t + 1) * (n + 1)
    assert float(otu.tree_get(state, "loss")) == 1.5
    np.testing.assert_array_equal(otu.tree_get(state, "losses"), np.full(n, 1.5))


# ----------------------------------------------------------------------------------------
# 2. Compositions: the lean step against the plain one.
#
# Both run the same float64 arithmetic on the same perturbed params (restore="exact") in
# different XLA programs: the losses may differ in the last bit (~1e-16 relative), which
# the estimate divides by loss differences of ~mu |grad . d| (mu = 1e-3: ~1e-13 relative
# in g, also in FZOO's sigma); Adam's m / sqrt(v) keeps that relative error. Over 4 steps
# of lr 1e-2 the params agree to ~1e-14: rtol 1e-8, atol 1e-12, as tests/test_engine.py.
# A wrong step moves some param by lr |g| ~ 1e-3 or more.

TOL = dict(rtol=1e-8, atol=1e-12)
STEPS = 4
NO_POISON = jax.tree.map(jnp.asarray, poison([], 1))
METHODS = {
    "fzoo": (hz.fzoo, hz.scale_by_fzoo, dict(num_directions=3), loss_fn),
    "sparse_mezo": (hz.sparse_mezo, hz.scale_by_sparse_mezo, dict(sparsity=0.5), loss_fn),
    "forward_gradient": (hz.forward_gradient, hz.scale_by_forward_gradient,
                         dict(num_directions=2), fg_loss_fn),
}
FROZEN = {"w1": True, "b1": False, "w2": True}  # optax.masked: b1 is not optimized


def with_mu(name, schedule):
  return {} if name == "forward_gradient" else dict(mu=schedule)


def adam_chain(name):
  _, scale, opts, _ = METHODS[name]
  return optax.chain(scale(**opts, **with_mu(name, 1e-3)), optax.adam(1e-2))


def wrapped(name):
  """MultiSteps(masked(inject_hyperparams(alias)(lr schedule, mu schedule)))."""
  alias, _, opts, _ = METHODS[name]
  inner = optax.inject_hyperparams(alias, static_args=tuple(opts))(
      learning_rate=optax.linear_schedule(5e-2, 1e-2, STEPS), **opts,
      **with_mu(name, optax.linear_schedule(2e-3, 5e-4, STEPS)))
  return optax.MultiSteps(optax.masked(inner, FROZEN), every_k_schedule=2)


def run_steps(tx, loss, lean, steps=STEPS):
  params = params0()
  state = tx.init(params)
  step = hz.make_train_step(tx, loss, lean=lean, restore="exact")
  out = []
  for _ in range(steps):
    params, state, loss_value = step(params, state, NO_POISON)
    out.append((jax.tree.map(np.array, params), np.asarray(loss_value)))  # copies: donated
  return out, state


def run_scan(tx, loss, steps=STEPS):
  """The lean step traced into a user's jit as the body of a lax.scan over steps."""
  step = hz.make_train_step(tx, loss, lean=True, restore="exact")

  @jax.jit
  def train(params, state):
    def body(carry, _):
      p, s, loss_value = step(*carry, NO_POISON)  # the state keeps its dtypes: a scan carry
      return (p, s), (p, loss_value)
    return jax.lax.scan(body, (params, state), None, length=steps)

  params = params0()
  _, (ps, ls) = train(params, tx.init(params))
  return [(jax.tree.map(lambda a, i=i: np.asarray(a[i]), ps), np.asarray(ls[i]))
          for i in range(steps)]


def moved_by(a, b):
  return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


@pytest.mark.parametrize("name", list(METHODS))
def test_adam_chain_lean_at_top_level_and_in_a_scan_follows_the_plain_step(name):
  """optax.chain(scale_by_*, optax.adam): the lean step at top level and traced into a
  user's jit as the body of a lax.scan. The steps return a state of the same dtypes as init
  (float64 on: conftest.py), as lax.scan and a donating jit need: the plain step's state
  comes from ``tx.update`` (the scale_by_* transform's and Adam's), the lean step's from
  the engine."""
  loss = METHODS[name][3]
  plain, plain_state = run_steps(adam_chain(name), loss, lean=False)
  lean, lean_state = run_steps(adam_chain(name), loss, lean=True)
  init_dtypes = jax.tree.map(jnp.result_type, adam_chain(name).init(params0()))
  assert jax.tree.map(jnp.result_type, plain_state) == init_dtypes
  assert jax.tree.map(jnp.result_type, lean_state) == init_dtypes
  chex.assert_trees_all_close(lean, plain, **TOL)
  chex.assert_trees_all_close(lean_state, plain_state, **TOL)
  chex.assert_trees_all_close(run_scan(adam_chain(name), loss), plain, **TOL)
  assert moved_by(plain[-1][0], THETA0) > 1e-3  # it trained (Adam: ~lr per step)


@pytest.mark.parametrize("name", list(METHODS))
def test_multisteps_masked_inject_hyperparams_lean_follows_the_plain_step(name):
  loss = METHODS[name][3]
  plain, plain_state = run_steps(wrapped(name), loss, lean=False)
  lean, lean_state = run_steps(wrapped(name), loss, lean=True)
  chex.assert_trees_all_close(lean, plain, **TOL)
  chex.assert_trees_all_close(lean_state, plain_state, **TOL)
  for out in (plain, lean):
    # MultiSteps: the first step of every two only accumulates
    chex.assert_trees_all_equal(out[0][0], THETA0)
    chex.assert_trees_all_equal(out[2][0], out[1][0])
    assert moved_by(out[1][0], THETA0) > 1e-4 and moved_by(out[3][0], out[2][0]) > 1e-4
    for params, _ in out:  # optax.masked: the frozen leaf stays bit-identical
      np.testing.assert_array_equal(params["b1"], THETA0["b1"])
  # inject_hyperparams: the schedules count the inner steps (2 of 4 calls); the state
  # holds the values of the last, at count 1 (float32 hyperparameters: rtol 1e-6)
  hyper = otu.tree_get(lean_state, "hyperparams")
  np.testing.assert_allclose(hyper["learning_rate"], 5e-2 - 4e-2 / STEPS, rtol=1e-6)
  if name != "forward_gradient":
    np.testing.assert_allclose(otu.tree_get(lean_state, "hyper")["mu"],
                               2e-3 - 1.5e-3 / STEPS, rtol=1e-6)


@pytest.mark.parametrize("name", list(METHODS))
def test_nnx_jit_runs_the_lean_step_like_the_plain_one(name):
  nnx = pytest.importorskip("flax.nnx")
  from hizoo_jax.models import peft

  class MLP(nnx.Module):
    def __init__(self, rngs):
      self.l0 = nnx.Linear(5, 6, rngs=rngs, param_dtype=jnp.float64)
      self.l1 = nnx.Linear(6, 3, rngs=rngs, param_dtype=jnp.float64)

    def __call__(self, x):
      return self.l1(jnp.tanh(self.l0(x)))

  alias, _, opts, _ = METHODS[name]
  tx = alias(1e-2, **opts)
  model = MLP(nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  loss = lambda m: jnp.mean((m(X) - Y) ** 2)

  @nnx.jit
  def train_step(model, optimizer):
    return peft.nnx_zo_step(optimizer, model, loss, restore="exact")

  graphdef, params = nnx.split(MLP(nnx.Rngs(0)), nnx.Param)
  params = nnx.as_pure(params)
  start = params
  state = tx.init(params)
  plain = hz.make_train_step(tx, lambda p: loss(nnx.merge(graphdef, p)), lean=False,
                             donate=False)
  for _ in range(3):
    got = train_step(model, optimizer)
    params, state, want = plain(params, state)
    np.testing.assert_allclose(got, want, rtol=1e-12)
  chex.assert_trees_all_close(nnx.as_pure(nnx.state(model, nnx.Param)), params, **TOL)
  assert int(optimizer.step[...]) == 3
  assert max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(
      jax.tree.leaves(params), jax.tree.leaves(start), strict=True)) > 1e-5


# ----------------------------------------------------------------------------------------
# 3. Memory: the lean step's compiled temporaries over a forward pass, in param bytes.


MEMORY = {
    "fzoo_8": (lambda: hz.fzoo(1e-2, num_directions=8), 0.1),
    "sparse_mezo_4": (lambda: hz.sparse_mezo(1e-2, num_directions=4), 0.1),
    "mezo_4": (lambda: hz.mezo(1e-2, num_directions=4), 0.1),
    # Forward gradients hold one params-sized tangent by design: z_j enters jax.jvp as an
    # input of the forward pass, so the tangent tree exists as a buffer (in the params'
    # dtype) while the pass runs (hizoo_jax/_src/methods/forward_gradient.py); the
    # zeroth-order methods perturb in place and regenerate their noise instead.
    "forward_gradient": (lambda: hz.forward_gradient(1e-2), 1.1),
}


def mlp_loss(p, x, y):
  h = jnp.tanh(x @ p["w1"] + p["b1"])
  return jnp.mean((h @ p["w2"] - y) ** 2)


@pytest.mark.parametrize("name", list(MEMORY))
def test_the_lean_step_keeps_no_params_sized_temporary(name):
  """As tests/test_engine.py::test_the_step_keeps_no_params_sized_temporary: memory of the
  step beyond its arguments minus the forward pass's own, at top level (params and state
  donated) and traced into a user's donating jit. A params-sized buffer (a perturbed copy,
  the noise, the estimate) is 1.0; Sparse MeZO's packed masks are 1/32."""
  make, bound = MEMORY[name]
  tx = make()
  params = {"w1": jnp.zeros((256, 256), jnp.float32), "b1": jnp.zeros((256,), jnp.float32),
            "w2": jnp.zeros((256, 256), jnp.float32)}
  x = jnp.zeros((8, 256), jnp.float32)
  y = jnp.zeros((8, 256), jnp.float32)
  for where, extra in lean_step_extra(tx, mlp_loss, params, x, y, lean=True).items():
    assert extra <= bound, (where, extra)


# ----------------------------------------------------------------------------------------
# 4. Clear errors for bad options.


@pytest.mark.parametrize("make, match", [
    (lambda: hz.fzoo(1e-2, num_directions=1), "num_directions"),
    (lambda: hz.scale_by_fzoo(num_directions=1), "num_directions"),
    (lambda: hz.forward_gradient(1e-2, num_directions=0), "num_directions"),
    (lambda: hz.sparse_mezo(1e-2, sparsity=1.0), "sparsity"),
    (lambda: hz.scale_by_sparse_mezo(sparsity=-0.1), "sparsity"),
    (lambda: hz.fzoo(1e-2, mu=0.0), "^mu must"),
    (lambda: hz.scale_by_fzoo(mu=-1e-3), "^mu must"),
    (lambda: hz.sparse_mezo(1e-2, mu=0.0), "^mu must"),
    (lambda: hz.scale_by_sparse_mezo(mu=-1e-3), "^mu must"),
], ids=["fzoo_n1", "scale_by_fzoo_n1", "forward_gradient_n0", "sparsity_1", "sparsity_neg",
        "fzoo_mu0", "scale_by_fzoo_mu_neg", "sparse_mu0", "scale_by_sparse_mu_neg"])
def test_bad_options_raise_a_value_error_naming_them(make, match):
  with pytest.raises(ValueError, match=match):
    make()


# ----------------------------------------------------------------------------------------
# 5. Sparse MeZO's masks.


def sparse_problem():
  rng = np.random.default_rng(1)
  theta = {"a": rng.standard_normal((40, 50)), "b": rng.standard_normal((30, 20)),
           "c": rng.standard_normal(50)}
  target = {k: rng.standard_normal(v.shape) for k, v in theta.items()}
  loss = lambda p: sum(jnp.sum((p[k] - target[k]) ** 2) for k in p)
  return theta, loss


@pytest.mark.parametrize("sparsity", [0.5, 0.8])
def test_sparse_mezo_moves_exactly_the_small_weights_of_each_matrix(sparsity):
  """Every step moves the elements with |theta| <= h of each matrix (h: np.quantile of the
  initial |theta|, in float64) and every element of the 1-D leaf (where z != 0); nothing
  else, bit for
  bit, also in the lean step with its default in-place restore (a masked-out element is
  moved by +0 and back). The mask follows the params: some elements cross h."""
  theta0, loss = sparse_problem()
  h = {k: ref.sparse_threshold(v, sparsity) if v.ndim == 2 else np.inf
       for k, v in theta0.items()}
  tx = hz.sparse_mezo(1e-4, mu=1e-3, sparsity=sparsity)  # moves of ~1e-2
  for lean in (False, True):
    params = {k: jnp.asarray(v) for k, v in theta0.items()}
    state = tx.init(params)
    step = hz.make_train_step(tx, lambda p: loss(p), lean=lean)
    crossed = 0
    for t in range(4):
      before = jax.tree.map(np.array, params)  # a copy: the step donates params
      (z,) = step_noise(state, params, 1, hz.fast_gaussian)
      params, state, _ = step(params, state)
      masks = ref.sparse_masks(before, h)
      for k in theta0:
        moved_ = np.asarray(params[k]) != before[k]
        # fast_gaussian draws z = 0 with probability ~1/260: such an element stays
        np.testing.assert_array_equal(moved_, masks[k] & (z[k] != 0),
                                      err_msg=f"{k} at step {t}")
        if k != "c":
          frac = masks[k].mean()
          # about (1 - s) of each matrix: exactly floor((n - 1)(1 - s)) + 1 elements at
          # step 0 (distinct values, linear interpolation), then those crossing h
          assert abs(frac - (1 - sparsity)) < 0.02, (k, t, frac)
          if t == 0:
            n = masks[k].size
            assert masks[k].sum() == int(np.floor((n - 1) * (1 - sparsity))) + 1
          crossed += int(np.sum(masks[k] != ref.sparse_masks(theta0, h)[k]))
    assert crossed > 0  # the mask is recomputed from the current params


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sparse_mezo_thresholds_are_the_quantiles_of_the_initial_weights(dtype):
  """h of each matrix is np.quantile(|theta_init|, 1 - sparsity) (linear), inf for 1-D
  leaves, computed and stored in the params' dtype (at least float32): it agrees with the
  float64 quantile to that dtype's rounding of the interpolation, a few eps relative."""
  theta0, _ = sparse_problem()
  params = {k: jnp.asarray(v, dtype) for k, v in theta0.items()}
  for sparsity in (0.0, 0.3, 0.8, 0.95):
    state = hz.scale_by_sparse_mezo(sparsity=sparsity).init(params)
    got = otu.tree_get(state, "thresholds")
    leaves = jax.tree.leaves(params)  # the state's order: the params' leaves
    for i, leaf in enumerate(leaves):
      if leaf.ndim < 2:
        assert np.isinf(got[i])
      else:
        want = np.quantile(np.abs(np.asarray(leaf, np.float64)), 1 - sparsity)
        eps = float(jnp.finfo(jnp.promote_types(dtype, jnp.float32)).eps)
        np.testing.assert_allclose(got[i], want, rtol=4 * eps, atol=0)
    if sparsity == 0.0:  # h = max |theta|, exactly: every element moves
      np.testing.assert_array_equal(
          got[:2], [np.max(np.abs(np.asarray(leaf))) for leaf in leaves[:2]])


def test_sparse_mezo_mask_is_exact_for_float64_params():
  params = {"w": jnp.asarray([[0.5, 1.0, 1.0 + 1e-12, 2.0, 3.0]], jnp.float64)}
  assert ref.sparse_threshold(np.asarray(params["w"]), 0.75) == 1.0
  tx = hz.scale_by_sparse_mezo(mu=1e-3, sparsity=0.75)
  g, _ = tx.update(None, tx.init(params), params, value_fn=lambda p: jnp.sum(p["w"] ** 3))
  np.testing.assert_array_equal(np.asarray(g["w"]) != 0, [[True, True, False, False, False]])


# --- several probes in one batched forward pass (make_train_step(batch_probes=True)) -------

BATCHED = {
    "mezo_3": lambda: hz.mezo(LR, mu=MU, num_directions=3),
    "hizoo": lambda: hz.hizoo(LR, mu=MU, hessian_smoothing=0.1),
    "fzoo": lambda: hz.fzoo(LR, mu=MU, num_directions=4),
    "sparse_mezo": lambda: hz.sparse_mezo(LR, mu=MU, sparsity=0.5),
    "lozo": lambda: hz.lozo(LR, mu=MU, rank=2),
    "zo_muon": lambda: hz.zo_muon(LR, mu=MU, rank=2, num_directions=3),
    "adam_chain": lambda: optax.chain(hz.scale_by_fzoo(mu=MU, num_directions=3),
                                      optax.adam(LR)),
}


def _aux_loss(p, x, y):
  out = jnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"]
  loss = jnp.mean((out - y) ** 2)
  return loss, {"mse": loss, "first": out[0, 0]}


@pytest.mark.parametrize("name", list(BATCHED))
def test_batched_probes_follow_the_exact_restore_step(name):
  """``batch_probes=True`` builds every perturbed point from theta, as ``restore="exact"``
  does, and evaluates them under one ``jax.vmap``: the same losses up to the rounding of a
  batched forward pass (float64: ~1e-15 in a loss, ~1e-13 in an estimate; a wrong probe,
  offset or order moves the params by ``lr |g| >= 1e-4``). The aux is the mean over the
  measured points, as in the sequential step."""
  x, y = jnp.asarray(X_NP), jnp.asarray(Y_NP)
  outs = {}
  for batched in (False, True):
    tx = BATCHED[name]()
    p = params0()
    s = tx.init(p)
    step = hz.make_train_step(tx, _aux_loss, has_aux=True, restore="exact", donate=False,
                              batch_probes=batched)
    losses = []
    for _ in range(4):
      p, s, loss, aux = step(p, s, x, y)
      losses.append(loss)
    outs[batched] = (p, s, jnp.stack(losses), aux)
  chex.assert_trees_all_close(outs[True][0], outs[False][0], **PARAM_TOL)
  chex.assert_trees_all_close(outs[True][2], outs[False][2], **LOSS_TOL)
  chex.assert_trees_all_close(outs[True][3], outs[False][3], **LOSS_TOL)
  assert int(otu.tree_get(outs[True][1], "forward_passes")) == int(
      otu.tree_get(outs[False][1], "forward_passes"))


def test_batched_probes_refuse_dependent_probes_and_tangents():
  x, y = jnp.asarray(X_NP), jnp.asarray(Y_NP)
  plain = lambda p, x, y: _aux_loss(p, x, y)[0]  # noqa: E731
  for tx, match in ((hz.hizoo(LR, num_directions=2), "depend on each other"),
                    (hz.forward_gradient(LR), "measures 'jvp'")):
    with pytest.raises(ValueError, match=match):
      hz.make_train_step(tx, plain, batch_probes=True)(params0(), tx.init(params0()), x, y)
  with pytest.raises(ValueError, match="lean=False"):
    hz.make_train_step(hz.mezo(LR), plain, batch_probes=True, lean=False)


def test_fzoo_without_normalisation_takes_one_probe_and_mezo_scale():
  """``normalize=False`` lifts the two-probe floor, and its step on a linear loss is the
  one-sided difference quotient: ``g = (l_1 - l0) / mu * u_1 = (c . u_1) u_1``."""
  c = {"w": jnp.arange(1.0, 7.0, dtype=jnp.float64).reshape(2, 3)}
  loss = lambda p: jnp.sum(c["w"] * p["w"])
  tx = hz.scale_by_fzoo(mu=1e-3, num_directions=1, normalize=False, seed=5)
  params = {"w": jnp.zeros((2, 3), jnp.float64)}
  state = tx.init(params)
  u = step_noise(state, params, 1, hz.fast_rademacher)[0]["w"]
  g, state = tx.update(None, state, params, value_fn=loss)
  np.testing.assert_allclose(g["w"], np.sum(np.asarray(c["w"]) * u) * u, rtol=1e-9)
  assert int(otu.tree_get(state, "skipped_directions")) == 0
