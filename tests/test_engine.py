"""The lean step engine on every composition, at top level and traced into a user's program.

Every test compares against the plain path (one jitted ``tx.update``) in float64 with
``restore="exact"``, where the two run the same arithmetic on the same perturbed params
but in different XLA programs. The noise is the same bits in every program
(tests/test_sampling.py); the perturbation ``theta + mu s z`` and the losses may round
differently in the last bit (FMA contraction, fusion): ~1e-16 relative. The estimate
divides a loss difference by 2 mu (1e3) and, for HiZOO, a second difference by 2 mu^2
(c ~ 1-10: 1e-16 |l| / 1e-6 ~ 1e-10 relative in c and in H): after a few steps params and
states agree to ~1e-12 relative; the tests allow rtol 1e-8 and atol 1e-12. A wrong step
(another noise, a missing restore, the wrong mu) moves params by ~lr |g| ~ 1e-3.
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
from tests.helpers import lean_step_extra, tanh_mlp, tanh_mlp_loss

TOL = dict(rtol=1e-8, atol=1e-12)


def mlp(sizes=(8, 16, 16, 4), dtype=jnp.float64, seed=0):
  return tanh_mlp(sizes, dtype, seed)


loss_fn = tanh_mlp_loss


X = jax.random.normal(jax.random.key(1), (32, 8), jnp.float64)
Y = jax.random.normal(jax.random.key(2), (32, 4), jnp.float64)
# One linear layer, for the tests whose property does not depend on the model (XLA's
# compile time grows with the number of leaves).
SMALL = (8, 4)
FROZEN = {"l0": {"w": True, "b": False}, "l1": False, "l2": {"w": True, "b": True}}
LABELS = {"l0": {"w": "a", "b": "frozen"}, "l1": "frozen", "l2": {"w": "a", "b": "b"}}

# Each composition kind at least once, nested where two kinds combine so that one program
# (one compile per path) exercises several wrappers at once: a wrapper that the engine
# mishandled would change the nested run. The bare methods and their variants (several
# directions, estimators, samplers, both restores) are tests/test_train_step.py's.
COMPOSITIONS = {
    # the preset's per-params wrapper around HiZOO-L's factored blocks, as one group of
    # multi_transform, next to a zeroed group and a frozen one (prefix labels)
    "preset_in_group": lambda: optax.multi_transform(
        {"a": hz.presets.hizoo_l(1e-2, min_dim_size_to_factor=4), "b": optax.set_to_zero(),
         "frozen": optax.set_to_zero()},
        {"l0": {"w": "a", "b": "a"}, "l1": "b", "l2": "frozen"}),
    # Adam reads HiZOO's estimate twice (its two moments are two fusions): a params-shaped
    # state after the estimate, in one group of a first-order multi_transform
    "hizoo_adam_groups": lambda: optax.chain(
        hz.scale_by_hizoo(hessian_smoothing=0.1),
        optax.multi_transform({"a": optax.chain(optax.scale_by_adam(), optax.scale(-1e-2)),
                               "b": optax.sgd(1e-3), "frozen": optax.set_to_zero()}, LABELS)),
    # apply_if_finite's guard around masked leaves of HiZOO's ordered curvature, its
    # learning rate and mu injected and scheduled
    "inject_masked_if_finite": lambda: optax.apply_if_finite(optax.masked(
        optax.inject_hyperparams(hz.hizoo)(
            learning_rate=optax.cosine_decay_schedule(1e-2, 10),
            mu=optax.linear_schedule(1e-2, 1e-3, 4), hessian_smoothing=0.1), FROZEN), 3),
    # MultiSteps' conditional update around several directions
    "multi_steps": lambda: optax.MultiSteps(hz.mezo(1e-2, num_directions=2),
                                            every_k_schedule=2),
    # compiled memory only: masked leaves under apply_if_finite's guard (without the
    # injected hyperparameters, whose guard's memory is tests/test_guard.py's)
    "masked_if_finite": lambda: optax.apply_if_finite(
        optax.masked(hz.hizoo(1e-2, hessian_smoothing=0.1), FROZEN), 3),
    # compiled memory only: several directions replaying HiZOO-L's blocks and HiZOO's H
    "hizoo_l_multi": lambda: hz.hizoo_l(1e-2, hessian_smoothing=0.1, num_directions=3,
                                        min_dim_size_to_factor=4),
    "hizoo_multi_adam": lambda: optax.chain(
        hz.scale_by_hizoo(hessian_smoothing=0.1, num_directions=2), optax.scale_by_adam(),
        optax.scale(-1e-2)),
}
MEMORY_ONLY = ("masked_if_finite", "hizoo_l_multi", "hizoo_multi_adam")


def run_plain(tx, steps=4):
  params = mlp()
  state = tx.init(params)
  step = hz.make_train_step(tx, loss_fn, lean=False)
  losses = []
  for _ in range(steps):
    params, state, loss = step(params, state, X, Y)
    losses.append(loss)
  return params, state, jnp.stack(losses)


def run(tx, steps=4, **kw):
  params = mlp()
  state = tx.init(params)
  step = hz.make_train_step(tx, loss_fn, restore="exact", **kw)
  losses = []
  for _ in range(steps):
    params, state, loss = step(params, state, X, Y)
    losses.append(loss)
  return params, state, jnp.stack(losses)


def run_scan(tx, steps=4):
  """The step traced inside a user's jit, as the body of a lax.scan over batches."""
  step = hz.make_train_step(tx, loss_fn, restore="exact")

  @jax.jit
  def train(params, state):
    def body(carry, _):
      p, s = carry
      p, s, loss = step(p, s, X, Y)
      return (p, s), loss
    (params, state), losses = jax.lax.scan(body, (params, state), None, length=steps)
    return params, state, losses

  params = mlp()
  return train(params, tx.init(params))


# Every composition of the first test also runs traced into a user's jit (a lax.scan body).
# The traced step is the engine's same code without its own jit and donation; what a
# composition changes is the state it carries and how the update reads the estimate: one probe and
# several, HiZOO's ordered curvature and HiZOO-L's factored blocks, injected
# hyperparameters, masked and grouped leaves, MultiSteps' conditional update,
# apply_if_finite's guard, a params-shaped transform after the estimate.
IN_A_USER_JIT = ("preset_in_group", "hizoo_adam_groups", "inject_masked_if_finite",
                 "multi_steps")
assert set(IN_A_USER_JIT) <= set(COMPOSITIONS)


@pytest.mark.parametrize("name", [n for n in COMPOSITIONS if n not in MEMORY_ONLY])
def test_every_composition_follows_the_plain_path(name):
  make = COMPOSITIONS[name]
  reference = run_plain(make())
  runs = [run] + ([run_scan] if name in IN_A_USER_JIT else [])
  if name == "hizoo_adam_groups":
    # HiZOO's curvature is a second difference of losses, ~mu^2 = 1e-6 of them, so the
    # lean path's rounding-level loss differences (1e-16 relative) reach H and the
    # estimate at ~1e-10 relative. Adam's first moment sums estimates of both signs: an
    # entry that cancels to near zero keeps the absolute error of its largest terms,
    # ~1e-10 of the leaf's largest entry. 1e-8 of it leaves a factor of 100.
    for got in (r(make()) for r in runs):
      for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(reference), strict=True):
        b = np.asarray(b)
        np.testing.assert_allclose(a, b, rtol=TOL["rtol"],
                                   atol=max(TOL["atol"], 1e-8 * float(np.max(np.abs(b)))))
  else:
    for r in runs:
      chex.assert_trees_all_close(r(make()), reference, **TOL)
  # and it trained: the lean path is not a no-op
  params = reference[0]
  assert max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(
      jax.tree.leaves(params), jax.tree.leaves(mlp()), strict=True)) > 1e-5


def test_the_in_place_restore_drifts_by_rounding_only():
  """Through a chain with Adam after the estimate (the bare methods in place:
  tests/test_train_step.py)."""
  tx = optax.chain(hz.scale_by_zo(), optax.scale_by_adam(), optax.scale(-1e-2))
  reference = run_plain(tx)
  params = mlp()
  state = tx.init(params)
  step = hz.make_train_step(tx, loss_fn, restore="inplace")
  for _ in range(4):
    params, state, _ = step(params, state, X, Y)
  # theta + mu s z - 2 mu s z + mu s z: a few ulp per step (2e-16 |theta| each)
  chex.assert_trees_all_close(params, reference[0], rtol=1e-9, atol=1e-11)


def test_masked_leaves_are_seen_by_the_loss_and_never_perturbed_or_updated():
  tx = optax.masked(hz.hizoo(1e-2, hessian_smoothing=0.1), FROZEN)
  params = mlp()
  state = tx.init(params)
  seen = []

  def loss(p, x, y):  # depends on the frozen leaves too
    seen.append(jax.tree.structure(p))
    return loss_fn(p, x, y) + jnp.sum(p["l1"]["w"] ** 2) * 1e-3

  step = hz.make_train_step(tx, loss, donate=False)
  new, new_state, _ = step(params, state, X, Y)
  assert all(s == jax.tree.structure(params) for s in seen)
  chex.assert_trees_all_equal(new["l0"]["b"], params["l0"]["b"])
  chex.assert_trees_all_equal(new["l1"], params["l1"])
  assert float(jnp.max(jnp.abs(new["l0"]["w"] - params["l0"]["w"]))) > 1e-6
  h = otu.tree_get(new_state, "hessian")
  assert isinstance(h["l1"], optax.MaskedNode) and isinstance(h["l0"]["b"], optax.MaskedNode)
  assert h["l0"]["w"].shape == params["l0"]["w"].shape
  # the plain call: value_fn needs the full params, and says how to give them
  with pytest.raises(ValueError, match="value_params"):
    tx.update(jax.tree.map(jnp.zeros_like, params), state, params,
              value_fn=lambda p: loss(p, X, Y))


def test_has_aux_returns_the_mean_of_the_perturbed_evaluations():
  tx = hz.hizoo(1e-2, hessian_smoothing=0.1)

  def loss_aux(p, x, y):
    loss = loss_fn(p, x, y)
    return loss, {"loss": loss, "count": jnp.asarray(1, jnp.int32)}

  params = mlp(SMALL)
  state = tx.init(params)
  step = hz.make_train_step(tx, loss_aux, has_aux=True)
  params, state, loss, aux = step(params, state, X, Y)
  lp, lm = otu.tree_get(state, "losses")
  np.testing.assert_allclose(aux["loss"], (lp + lm) / 2, rtol=1e-15)
  assert int(aux["count"]) == 1
  # without it, a (loss, aux) function is refused with the same message in every path
  for kw in (dict(), dict(lean=False)):
    params = mlp(SMALL)
    with pytest.raises(ValueError, match="has_aux"):
      hz.make_train_step(tx, loss_aux, **kw)(params, tx.init(params), X, Y)
  # several probes run lean too: aux is the mean over every perturbed evaluation
  tx2 = hz.hizoo(1e-2, num_directions=2)
  _, state, _, aux = hz.make_train_step(tx2, loss_aux, has_aux=True)(
      mlp(SMALL), tx2.init(mlp(SMALL)), X, Y)
  np.testing.assert_allclose(aux["loss"], np.mean(otu.tree_get(state, "losses")), rtol=1e-15)


@pytest.mark.parametrize("kw", [dict(), dict(lean=False)], ids=["lean", "plain"])
def test_loss_checks_are_the_same_in_every_path(kw):
  tx = hz.mezo(1e-2)
  params = mlp()
  with pytest.raises(ValueError, match=r"scalar loss, got shape \(1,\)"):
    hz.make_train_step(tx, lambda p, x, y: loss_fn(p, x, y)[None], **kw)(
        params, tx.init(params), X, Y)


def test_traced_hyperparameters_are_sanitised_in_jit():
  """A schedule alpha of 2 is clamped to 1; an injected mu <= 0 skips the step."""
  params = mlp(SMALL)
  tx = hz.hizoo(1e-2, hessian_smoothing=lambda count: 2.0)
  ref = hz.hizoo(1e-2, hessian_smoothing=1.0)
  for t in (tx, ref):
    state = t.init(params)
    out = hz.make_train_step(t, loss_fn, restore="exact", donate=False)(params, state, X, Y)
    if t is tx:
      clamped = out
  chex.assert_trees_all_close(clamped, out, rtol=0, atol=0)

  tx = optax.inject_hyperparams(hz.mezo)(learning_rate=1e-2, mu=1e-3)
  state = tx.init(params)
  state.hyperparams["mu"] = jnp.asarray(-1.0)
  p, s, _ = hz.make_train_step(tx, loss_fn, donate=False)(params, state, X, Y)
  chex.assert_trees_all_equal(p, params)
  assert int(otu.tree_get(s, "skipped_directions")) == 1


# Each kind of state once: HiZOO-L's blocks (the preset, in a group), HiZOO's H read and
# rewritten in place under masking and apply_if_finite's guard, MultiSteps' params-sized
# sum held over several probes, several probes replaying HiZOO-L's blocks, and HiZOO's H
# with Adam's moments (Adam reads the estimate twice).
@pytest.mark.parametrize("name", ["preset_in_group", "masked_if_finite", "multi_steps",
                                  "hizoo_l_multi", "hizoo_multi_adam"])
def test_the_step_keeps_no_params_sized_temporary(name, monkeypatch):
  """Compiled memory of the step beyond its arguments, over a forward pass, in param bytes:
  at top level (params and state donated) and traced into a user's donating ``jit``.

  What it allocates beyond the forward pass's own temporaries: the small per-step
  scalars, and for HiZOO-L the row blocks of one factored leaf (8 blocks of 32 rows
  here). A params-sized buffer (a perturbed copy, the noise, a copy of H) is 1.0."""
  from hizoo_jax._src import curvature

  monkeypatch.setattr(curvature, "BLOCK_ELEMENTS", 8192)  # 256 x 256 leaves: 8 row blocks
  tx = COMPOSITIONS[name]()
  params = mlp((256, 256, 256, 256), jnp.float32)
  x = jnp.zeros((8, 256), jnp.float32)
  y = jnp.zeros((8, 256), jnp.float32)
  # Several probes: HiZOO-L also holds the blocks of its replayed factored updates.
  # HiZOO's final pass reads the stored H for the estimate while it writes the new H in
  # place: without the engine's ordering (Method.state_after_params) XLA keeps a copy of H
  # (0.99).
  bound = {"hizoo_l_multi": 0.1}.get(name, 0.05)
  # Traced into a user's jit too for the kinds of state IN_A_USER_JIT names and
  # masked_if_finite. The others measured there (float32, jaxlib 0.10): 0.014 (HiZOO with
  # Adam), 0.019 (several HiZOO probes), 0.054 (hizoo_l_multi), each 0.01 above its
  # top-level figure.
  traced = name in IN_A_USER_JIT + ("masked_if_finite",)
  for where, extra in lean_step_extra(tx, loss_fn, params, x, y,
                                      in_a_user_jit=traced).items():
    assert extra <= bound, (where, extra)


def test_a_transform_reading_the_alias_twice_stores_h_inv_sqrt():
  """``hz.hizoo``'s update takes ``H^{-1/2}`` as ``sqrt(1/H)``, which XLA stores rather than
  recompute when a transform chained after the alias reads its updates twice (a global
  norm, then the scaling): one params-sized buffer more than the same chain spelled from
  ``scale_by_hizoo``, whose multiply-add form XLA recomputes in both readers. Both hold the
  updates once for the norm (about 1.0)."""
  params = mlp((256, 256, 256, 256), jnp.float32)
  x = jnp.zeros((8, 256), jnp.float32)
  y = jnp.zeros((8, 256), jnp.float32)
  alias = optax.chain(hz.hizoo(1e-3), optax.clip_by_global_norm(1.0))
  spelled = optax.chain(hz.scale_by_hizoo(), optax.clip_by_global_norm(1.0),
                        optax.scale_by_learning_rate(1e-3))
  (a,) = lean_step_extra(alias, loss_fn, params, x, y, in_a_user_jit=False).values()
  (b,) = lean_step_extra(spelled, loss_fn, params, x, y, in_a_user_jit=False).values()
  assert 0.9 < b < 1.1, b
  assert 0.9 < a - b < 1.1, (a, b)


def test_nnx_optimizer_gets_the_lean_step_inside_nnx_jit():
  nnx = pytest.importorskip("flax.nnx")
  from hizoo_jax.models import peft

  class MLP(nnx.Module):
    def __init__(self, rngs):
      self.l0 = nnx.Linear(8, 16, rngs=rngs, param_dtype=jnp.float64)
      self.l1 = nnx.Linear(16, 4, rngs=rngs, param_dtype=jnp.float64)

    def __call__(self, x):
      return self.l1(jnp.tanh(self.l0(x)))

  tx = hz.hizoo(1e-2, hessian_smoothing=0.1)
  model = MLP(nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  loss = lambda m: jnp.mean((m(X) - Y) ** 2)  # noqa: E731

  @nnx.jit
  def train_step(model, optimizer):
    return peft.nnx_zo_step(optimizer, model, loss, restore="exact")

  graphdef, params = nnx.split(MLP(nnx.Rngs(0)), nnx.Param)
  params = nnx.as_pure(params)
  state = tx.init(params)
  plain = hz.make_train_step(tx, lambda p: loss(nnx.merge(graphdef, p)), lean=False)
  for _ in range(3):
    got = train_step(model, optimizer)
    params, state, want = plain(params, state)
    np.testing.assert_allclose(got, want, rtol=1e-12)
  chex.assert_trees_all_close(nnx.as_pure(nnx.state(model, nnx.Param)), params, **TOL)
  assert int(optimizer.step[...]) == 3


def test_the_in_place_schedule_folds_the_restore_and_merges_one_sided_probes():
  """Passes over the params per step: MeZO 3 (+mu z, -2 mu z, then the restore inside the
  update's own pass), FZOO with N probes N (each probe's restore joins the next probe's
  move), HiZOO 4 (its restore reads the old H, so it stays a pass). Each such pass
  regenerates the noise of every parameter, which on a small batch costs as much as the
  forward passes (benchmarks/RESULTS.md)."""
  from hizoo_jax._src.engine import passes
  from hizoo_jax._src.methods import fzoo, hizoo, spsa

  rows, tail = passes.schedule(spsa.SPSA(), inplace=True)
  assert [k for _, k in rows] == [1, 2] and tail == ((0, 1.0),)
  rows, tail = passes.schedule(fzoo.FZOO(num_probes=4), inplace=True)
  assert [k for _, k in rows] == [1, 2, 3, 4] and tail == ((3, -1.0),)
  assert rows[1][0] == ((0, -1.0), (1, 1.0)) and rows[0][0] == ((0, 1.0), (0, 0.0))
  rows, tail = passes.schedule(hizoo.HiZOO(), inplace=True)
  assert [k for _, k in rows] == [1, 2, 0] and tail == ()
  # Two-sided with several probes: merging would pad most rows, so every pass is a row.
  rows, tail = passes.schedule(spsa.SPSA(num_probes=2), inplace=True)
  assert [len(mv) for mv, _ in rows] == [1] * 5 and tail == ((1, 1.0),)
  # An exact restore measures at offsets from theta and has nothing to restore.
  rows, tail = passes.schedule(spsa.SPSA(), inplace=False)
  assert rows == [(((0, 1.0),), 1), (((0, -1.0),), 2)] and tail == ()


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64, jnp.bfloat16])
def test_rsqrt_from_multiplies_and_adds_is_within_rounding(dtype):
  """HiZOO's ``H^{-1/2}`` (curvature.rsqrt): within 3 ulp of the exact value. The bound:
  after the last Newton step the method's own error is far below the dtype's (3.4% squared
  three or four times); what is left is the rounding of that step's five operations, each
  at most half an ulp of its result, about 2.5 ulp in all (3 with float32's upcast of a
  bfloat16 input, then its single rounding to bfloat16: 0.5 ulp of bfloat16)."""
  from hizoo_jax._src import curvature

  wide = dtype == jnp.float64  # conftest enables x64
  lo, hi = (-300, 300) if wide else (-30, 30)
  x = np.concatenate([np.logspace(lo, hi, 20001),
                      np.random.default_rng(0).uniform(1e-8, 1e8, 20000)])
  x = np.asarray(jnp.asarray(x, dtype).astype(jnp.float64 if wide else jnp.float32))
  got = np.asarray(jax.jit(curvature.rsqrt)(jnp.asarray(x, dtype)).astype(
      jnp.float64 if wide else jnp.float32)).astype(np.longdouble)
  exact = 1 / np.sqrt(x.astype(np.longdouble))
  ulp = np.spacing(exact.astype(np.dtype(dtype) if dtype != jnp.bfloat16 else np.float32))
  if dtype == jnp.bfloat16:
    ulp = ulp * 2.0 ** 16  # bfloat16 keeps 8 of float32's 24 significand bits
  assert np.max(np.abs(got - exact) / ulp.astype(np.longdouble)) <= 3.0
  assert np.isnan(np.asarray(curvature.rsqrt(jnp.asarray([np.nan], dtype)), np.float32)).all()

