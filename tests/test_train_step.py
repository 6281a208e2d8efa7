"""The lean (in-place, multi-call) train step against the plain transform."""

from __future__ import annotations

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.tree_utils as otu
import pytest

import hizoo_jax as hz
from tests.helpers import tanh_mlp, tanh_mlp_loss


def mlp(sizes, dtype=jnp.float64, seed=0):
  return tanh_mlp(sizes, dtype, seed)


loss_fn = tanh_mlp_loss


X = jax.random.normal(jax.random.key(1), (32, 8), jnp.float64)
Y = jax.random.normal(jax.random.key(2), (32, 4), jnp.float64)

# The methods and their variants; the Optax compositions around them are
# tests/test_engine.py's. One HiZOO carries every variant of the update at once (the
# unbiased estimator, a Hessian step every 3rd, scheduled lr and alpha) and threefry's
# noise, which the lean engine materialises in every pass.
OPTIMIZERS = {
    "mezo_wd": lambda: hz.mezo(1e-2, weight_decay=0.1),
    "hizoo": lambda: hz.hizoo(1e-2, hessian_smoothing=0.1),
    "hizoo_l": lambda: hz.hizoo_l(1e-2, hessian_smoothing=0.1, min_dim_size_to_factor=4),
    "hizoo_variants": lambda: hz.hizoo(optax.linear_schedule(2e-2, 1e-3, 5),
                                       hessian_smoothing=optax.linear_schedule(0.3, 0.01, 5),
                                       estimator="unbiased", hessian_update_every=3,
                                       sampler=hz.gaussian),
}


def start():
  """The params every ``run`` starts from."""
  return mlp([8, 16, 16, 4])


def run(make, steps=6, **kw):
  tx = make()
  params = start()
  state = tx.init(params)
  step = hz.make_train_step(tx, loss_fn, **kw)
  losses = []
  for _ in range(steps):
    params, state, loss = step(params, state, X, Y)
    losses.append(float(loss))
  return params, state, np.array(losses)


_PLAIN = {}


def plain_run(name):
  """``run(OPTIMIZERS[name], lean=False)``, computed once per module: the reference of
  several tests, one compile."""
  if name not in _PLAIN:
    _PLAIN[name] = run(OPTIMIZERS[name], lean=False)
  return _PLAIN[name]


MU = 1e-3  # the perturbation scale of every optimizer above (their default)
ULPS = 1024  # slack: last-bit differences over 6 steps, several probes, reductions


def amplification(name: str, losses) -> float:
  """How much one rounding of a loss moves the run, relative to the loss's last bit.

  The estimate divides a difference of losses by ``mu``; HiZOO's curvature divides a second
  difference by ``mu ** 2``. So a last-bit difference in a loss of size ``|L|`` (two XLA
  programs of the same operations may fuse, vectorise or contract a float64 expression
  differently: a different vector width, an FMA) comes back ``|L| / mu`` or ``|L| / mu**2``
  times larger, relative to the step, in the params."""
  return float(np.max(np.abs(losses))) / (MU ** 2 if "hizoo" in name else MU)


def assert_same_run(p, p_ref, name, losses):
  """``p`` and ``p_ref``: the same run computed by two programs. They may part by the
  rounding of the loss, amplified (``amplification``), relative to how far the params
  moved; any real difference (a wrong restore, another probe) is of the size of the step
  itself, ~1e4 times or more above this bound."""
  moved = max(float(np.max(np.abs(a - b)))
              for a, b in zip(jax.tree.leaves(p_ref), jax.tree.leaves(start()), strict=True))
  atol = ULPS * np.finfo(np.float64).eps * amplification(name, losses) * moved
  chex.assert_trees_all_close(p, p_ref, rtol=0, atol=atol)
  return atol / moved  # the relative bound, for what the run computes from params


def assert_leaves_close(tree, ref, rel):
  """Float leaves within ``rel`` of their reference leaf's largest magnitude; integer leaves
  (keys, counters) equal."""
  unkey = lambda x: jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x
  leaves = jax.tree.leaves(jax.tree.map(unkey, tree))
  for a, b in zip(leaves, jax.tree.leaves(jax.tree.map(unkey, ref)), strict=True):
    a, b = np.asarray(a), np.asarray(b)
    if not np.issubdtype(b.dtype, np.inexact):
      np.testing.assert_array_equal(a, b)  # keys, counters
      continue
    np.testing.assert_allclose(a, b, rtol=0, atol=rel * float(np.max(np.abs(b), initial=0)))


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_lean_step_follows_the_plain_transform(name):
  p0, s0, l0 = plain_run(name)
  p1, s1, l1 = run(OPTIMIZERS[name], lean=True, restore="exact")
  p2, s2, l2 = run(OPTIMIZERS[name], lean=True, restore="inplace")
  # exact restore: the same floating-point operations as the plain update, in another
  # program (which may round a float64 expression differently in its last bit)
  rel = assert_same_run(p1, p0, name, l0)
  np.testing.assert_allclose(l1, l0, rtol=rel)
  # the state (the Hessian, keys, counters, the losses it keeps) follows the same bound,
  # relative to each leaf's scale (a Hessian entry far below the largest carries the same
  # absolute rounding). The options in effect are float32 values of schedules whose terms
  # are at most 1 in size (a smoothing in [0, 1]): two programs may round each of their few
  # operations differently, a few float32 eps in all (hizoo_variants' alpha: 4.7e-9 apart
  # under the tests' XLA flags, equal under the default ones).
  hyper0 = hz.zo_states(s0)[0].hyper
  chex.assert_trees_all_close(hz.zo_states(s1)[0].hyper, hyper0, rtol=0,
                              atol=4 * float(np.finfo(np.float32).eps))
  assert_leaves_close(otu.tree_set(s1, hyper=hyper0), s0, rel)
  # in place: theta + mu s z - 2 mu s z + mu s z drifts by float64 rounding only
  rel = assert_same_run(p2, p0, name, l0)
  if "hizoo" in name:
    assert_leaves_close(hz.get_hessian(s2), hz.get_hessian(s0), rel)
  np.testing.assert_allclose(l2, l0, rtol=rel)


def test_a_sampler_that_does_not_fuse_gets_the_plain_step_by_default():
  """threefry's noise is materialised in every pass; the default picks the leaner plain step."""
  make = OPTIMIZERS["hizoo_variants"]  # threefry
  p0, s0, l0 = plain_run("hizoo_variants")
  p1, s1, l1 = run(make)
  chex.assert_trees_all_equal(p1, p0)
  np.testing.assert_array_equal(l1, l0)
  tx = make()
  params = start()
  state = tx.init(params)
  temp = lambda **kw: hz.make_train_step(tx, loss_fn, **kw).lower(
      params, state, X, Y).compile().memory_analysis().temp_size_in_bytes
  assert temp() == temp(lean=False)
  # the fused default sampler keeps the lean engine
  tx = hz.hizoo(1e-2, hessian_smoothing=0.1)
  state = tx.init(params)
  assert temp() != temp(lean=False)


@pytest.mark.parametrize("make", [
    lambda: hz.hizoo(1e-2, hessian_smoothing=0.1, num_directions=3),
    lambda: hz.hizoo_l(1e-2, hessian_smoothing=0.1, num_directions=2, min_dim_size_to_factor=8),
    lambda: hz.mezo(1e-2, num_directions=4),
], ids=["hizoo-multi", "hizoo-l-multi", "mezo-k4"])
def test_several_directions_run_lean(make, request):
  # The engine runs every probe in place in one program, replaying HiZOO's Hessian updates
  # for the later probes; with an exact restore it perturbs theta itself, so it computes
  # what the plain step computes (two programs may round a float64 product differently
  # in the last bit, which the estimate amplifies: ``assert_same_run``).
  p0, _, l0 = run(make, lean=False)
  p1, _, _ = run(make, lean=True, restore="exact")
  assert_same_run(p1, p0, request.node.callspec.id, l0)


def test_build_time_errors():
  with pytest.raises(ValueError, match="zeroth-order transform"):
    hz.make_train_step(optax.adam(1e-3), loss_fn)
  with pytest.raises(ValueError, match="zeroth-order transform"):
    hz.make_train_step(optax.chain(optax.clip(1.0), optax.sgd(1e-3)), loss_fn)
  with pytest.raises(ValueError, match="restore"):
    hz.make_train_step(hz.mezo(1e-3), loss_fn, restore="copy")
  # two ZO transforms (one per group): the plain step; lean=True refuses
  two = optax.multi_transform({"a": hz.mezo(1e-3), "b": hz.mezo(1e-3, seed=1)},
                              {"l0": "a", "l1": "b"})
  params = mlp([8, 16, 4])
  with pytest.raises(ValueError, match="lean=True"):
    hz.make_train_step(two, loss_fn, lean=True)(params, two.init(params), X, Y)
  p0, s0 = params, two.init(params)
  p, s, loss = hz.make_train_step(two, loss_fn, donate=False)(p0, s0, X, Y)
  # jitted like the step; two programs may still round the float64 perturbation and
  # losses differently in the last bit (FMA contraction): ~1e-16, amplified by 1 / mu
  u, s1 = jax.jit(lambda p, s: two.update(jax.tree.map(jnp.zeros_like, p), s, p,
                                          value_fn=lambda q: loss_fn(q, X, Y),
                                          value_params=p))(p0, s0)
  chex.assert_trees_all_close(p, optax.apply_updates(p0, u), rtol=1e-12, atol=1e-14)
  np.testing.assert_allclose(float(loss), float(s1.inner_states["a"].inner_state[0].loss),
                             rtol=1e-12)


def test_lean_step_donates_and_can_keep_inputs():
  tx = hz.hizoo(1e-2)
  params = mlp([8, 16, 4], jnp.float32)
  state = tx.init(params)
  new_p, new_s, _ = hz.make_train_step(tx, loss_fn)(params, state, X, Y)
  assert params["l0"]["w"].is_deleted()
  assert otu.tree_get(state, "hessian")["l0"]["w"].is_deleted()
  kept_p, kept_s = mlp([8, 16, 4], jnp.float32), tx.init(mlp([8, 16, 4], jnp.float32))
  hz.make_train_step(tx, loss_fn, donate=False)(kept_p, kept_s, X, Y)
  assert not kept_p["l0"]["w"].is_deleted()
  assert not otu.tree_get(kept_s, "hessian")["l0"]["w"].is_deleted()


def test_auto_restore_is_exact_for_16_bit_params_and_in_place_otherwise():
  """With lr = 0 an exact step leaves theta unchanged; the in-place one drifts by rounding."""
  for dtype, drifts in ((jnp.bfloat16, False), (jnp.float32, True)):
    params0 = mlp([8, 16, 4], dtype)
    tx = hz.hizoo(0.0, mu=1e-2)
    step = hz.make_train_step(tx, loss_fn, donate=False)
    params, state = params0, tx.init(params0)
    for _ in range(5):
      params, state, _ = step(params, state, X.astype(dtype), Y)
    same = all(bool(jnp.all(a == b)) for a, b in
               zip(jax.tree.leaves(params), jax.tree.leaves(params0), strict=True))
    assert same != drifts, dtype
    # and the explicit modes do what they say
    exact = hz.make_train_step(tx, loss_fn, donate=False, restore="exact")
    p, s = params0, tx.init(params0)
    p, s, _ = exact(p, s, X.astype(dtype), Y)
    chex.assert_trees_all_equal(p, params0)


@pytest.mark.parametrize("estimator", ["paper", "unbiased"])
def test_blocked_factored_update_equals_the_whole_leaf_update(monkeypatch, estimator):
  """Row blocks (with an overlapping last block and leading dims) give the same H."""
  from hizoo_jax._src import curvature

  monkeypatch.setattr(curvature, "BLOCK_ELEMENTS", 40)  # several blocks on small leaves
  params = {"w": jax.random.normal(jax.random.key(0), (3, 13, 7), jnp.float64),
            "v": jax.random.normal(jax.random.key(1), (11, 9), jnp.float64)}
  f = lambda p: jnp.sum(jnp.tanh(p["w"]) ** 2) + jnp.sum(p["v"] ** 4)
  no_rows = lambda key, shape, dtype: hz.fast_gaussian(key, shape, dtype)  # no .rows
  outs = []
  for sampler in (hz.fast_gaussian, no_rows):
    tx = hz.hizoo_l(0.01, hessian_smoothing=0.3, min_dim_size_to_factor=5, sampler=sampler,
                    estimator=estimator)
    p, s = params, tx.init(params)
    for _ in range(2):  # the second step perturbs along the first's blocked H
      u, s = tx.update(None, s, p, value_fn=f)
      p = optax.apply_updates(p, u)
    outs.append((p, hz.get_hessian(s)))
  assert hz.FactoredHessian is type(otu.tree_get(s, "hessian")["w"])
  chex.assert_trees_all_close(outs[0], outs[1], rtol=1e-12, atol=1e-14)


def _distinct_kernels(compiled_text: str) -> int:
  """The number of distinct fused computations of a compiled program (names and metadata
  stripped): XLA compiles one machine-code kernel per distinct one and reuses it."""
  bodies, body = set(), None
  for line in compiled_text.splitlines():
    if line.startswith(("%fused", "%wrapped")):
      body = []
    elif body is not None and line.startswith("}"):
      bodies.add("\n".join(body))
      body = None
    elif body is not None:
      line = re.sub(r", metadata=\{.*?\}", "", line)
      body.append(re.sub(r"%[\w.\-]+", "%", line).strip())
  return len(bodies)


def test_the_step_compiles_one_kernel_per_leaf_shape_not_per_leaf():
  # What keeps the compile time of a model with many same-shape tensors a constant
  # multiple of a first-order step's: each leaf's noise reads its key word and row as
  # run-time data, so the passes of all leaves of one shape are one kernel. With the
  # leaves' rows as constants, the count grows with the layers (MeZO 56, 80, 128 kernels
  # at 6, 12, 24 layers). HiZOO's step runs every pass MeZO's does (noise, moves, update)
  # and its curvature's. Two layers against four: per-leaf kernels would double.
  def count(layers):
    params = {f"l{i:03d}": {"w": jnp.eye(16) * 0.9, "b": jnp.zeros(16)}
              for i in range(layers)}

    def chain(p, x):
      h = x
      for k in sorted(p):
        h = jnp.tanh(h @ p[k]["w"] + p[k]["b"])
      return jnp.mean(h ** 2)

    tx = hz.hizoo(1e-3)
    step = hz.make_train_step(tx, chain)
    return _distinct_kernels(step.lower(params, tx.init(params), jnp.ones((8, 16)))
                             .compile().as_text())

  few = count(2)
  assert few > 0, "no fused computations found: has XLA's text format changed?"
  assert count(4) == few


def _chain_step_hlo(tx) -> str:
  """The compiled text of ``tx``'s default step on three float32 16 x 16 tanh layers."""
  params = {f"l{i}": jnp.eye(16, dtype=jnp.float32) * 0.9 for i in range(3)}

  def chain(p, x):
    h = x
    for k in sorted(p):
      h = jnp.tanh(h @ p[k])
    return jnp.mean(h ** 2)

  x = jnp.ones((8, 16), jnp.float32)
  return hz.make_train_step(tx, chain).lower(params, tx.init(params), x).compile().as_text()


@pytest.mark.parametrize("name", ["mezo", "hizoo", "fzoo", "sparse_mezo", "lozo", "subzero",
                                  "zo_muon", "forward_gradient"])
def test_the_step_coefficients_are_computed_once_not_in_every_leaf_pass(name):
  # The scalar logic that turns the losses into the step's coefficients (is the loss
  # finite, the projected gradient, HiZOO's curvature scalar) runs once: copied into every
  # leaf's fused pass it was a fifth of HiZOO's instructions on a 200-tensor model, and
  # compile time grows with the instructions.
  hlo = _chain_step_hlo(getattr(hz, name)(1e-3))
  passes = [c for c in re.split(r"\n(?=\S)", hlo)
            if c.startswith("%fused_computation") and "f32[16,16]" in c]
  assert passes, "no fused pass over a leaf found: has XLA's text format changed?"
  assert not [c for c in passes if "is-finite(" in c]


def test_hizoo_alias_update_takes_the_short_inverse_square_root():
  # hz.hizoo's estimate is read by one fused pass (its weight decay and learning rate), so
  # its update takes H^{-1/2} as sqrt(1/H); the multiply-add form (a bit-level first guess,
  # then Newton steps), which XLA recomputes in every reader instead of storing, stays for
  # scale_by_hizoo, whose estimate a chained optimizer may read twice. On 200 tensors the
  # multiply-add form cost 16% of the compile.
  assert "shift-right-arithmetic(" not in _chain_step_hlo(hz.hizoo(1e-3))
  assert "shift-right-arithmetic(" not in _chain_step_hlo(hz.hizoo_l(1e-3))
  chained = optax.chain(hz.scale_by_hizoo(), optax.scale_by_adam(), optax.scale(-1e-3))
  assert "shift-right-arithmetic(" in _chain_step_hlo(chained)


@pytest.mark.parametrize("name", ["mezo", "hizoo", "fzoo", "zo_muon"])
def test_a_step_can_be_differentiated_through(name):
  # The coefficients are computed once through a loop on the CPU, which reverse mode
  # cannot enter; their tangents pass through it unchanged (a learned-optimizer or
  # meta-learning user differentiates the loss after a step with respect to the params).
  tx = getattr(hz, name)(1e-2)
  params = {"w": jnp.eye(4, dtype=jnp.float32) * 0.5}

  def after_one_step(p):
    updates, _ = tx.update(None, tx.init(p), p, value_fn=lambda q: jnp.sum(jnp.tanh(q["w"])))
    return jnp.sum(jnp.tanh(optax.apply_updates(p, updates)["w"]))

  g = jax.grad(after_one_step)(params)["w"]
  assert bool(jnp.all(jnp.isfinite(g))) and float(jnp.max(jnp.abs(g))) > 0
