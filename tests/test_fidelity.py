"""Fidelity to the authors' code and what a new user hits: the weight-decay convention,
ZO-Muon's vector decay, Sparse MeZO on leaves with no spread, ``optax.inject_hyperparams``
with only a learning rate, bfloat16 hyperparameters and a foreign optimizer state."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.tree_utils as otu
import pytest

import hizoo_jax as hz

METHODS = ("mezo", "hizoo", "hizoo_l", "fzoo", "forward_gradient", "sparse_mezo", "lozo",
           "subzero", "zo_muon")

# A kernel [in, out], its bias, a norm scale and a stacked [2, 3, 4] leaf.
PARAMS = {"kernel": jnp.linspace(-1.0, 1.0, 12).reshape(3, 4), "bias": jnp.full((4,), 0.5),
          "scale": jnp.ones((4,)), "stack": jnp.linspace(0.5, 1.5, 24).reshape(2, 3, 4)}


def loss(p):
  h = jnp.tanh(jnp.arange(3.0) @ p["kernel"] + p["bias"]) * p["scale"]
  return jnp.sum(h ** 2) + jnp.sum(p["stack"] ** 2) / 10


def one_step(tx, params=PARAMS, value_fn=loss):
  state = tx.init(params)
  updates, state = tx.update(None, state, params, value_fn=value_fn)
  return optax.apply_updates(params, updates), state


# --- weight decay: one convention --------------------------------------------------------


@pytest.mark.parametrize("name", METHODS)
def test_weight_decay_leaves_vectors_alone_by_default(name):
  """Every alias decays the leaves of ndim >= 2 only (as the reference trainers skip
  ``bias``/``layer_norm`` names): the step with weight decay minus the step without it is
  ``-lr wd theta`` on the matrices and exactly 0 on the vectors, on the same noise."""
  lr, wd = 1e-2, 0.5
  make = getattr(hz, name)
  with_wd, _ = one_step(make(lr, weight_decay=wd))
  without, _ = one_step(make(lr))
  for k, theta in PARAMS.items():
    diff = np.asarray(with_wd[k]) - np.asarray(without[k])
    if theta.ndim >= 2:
      np.testing.assert_allclose(diff, -lr * wd * np.asarray(theta), rtol=1e-5, atol=1e-7)
    else:
      np.testing.assert_array_equal(diff, 0.0)


@pytest.mark.parametrize("name", ["mezo", "lozo"])
def test_weight_decay_mask_overrides_the_default(name):
  """``weight_decay_mask`` replaces the default: all leaves (a callable), or a tree of bools
  that decays the bias alone."""
  lr, wd = 1e-2, 0.5
  make = getattr(hz, name)
  without, _ = one_step(make(lr))
  every, _ = one_step(make(lr, weight_decay=wd,
                           weight_decay_mask=lambda p: jax.tree.map(lambda _: True, p)))
  only_bias = {k: k == "bias" for k in PARAMS}
  bias, _ = one_step(make(lr, weight_decay=wd, weight_decay_mask=only_bias))
  for k, theta in PARAMS.items():
    np.testing.assert_allclose(np.asarray(every[k]) - np.asarray(without[k]),
                               -lr * wd * np.asarray(theta), rtol=1e-5, atol=1e-7)
    want = -lr * wd * np.asarray(theta) if k == "bias" else 0.0
    np.testing.assert_allclose(np.asarray(bias[k]) - np.asarray(without[k]), want,
                               rtol=1e-5, atol=1e-7)


def test_zo_muon_decays_selected_vectors_at_the_vector_rate():
  """ZO-Muon's vectors step at ``vector_scale`` times the learning rate, their weight decay
  too (the reference's ``1e-7 * wd`` next to the matrices' ``lr * wd``)."""
  lr, wd, vs = 1e-2, 0.5, 1e-3
  every = lambda p: jax.tree.map(lambda _: True, p)
  without, _ = one_step(hz.zo_muon(lr, rank=2, vector_scale=vs))
  with_wd, _ = one_step(hz.zo_muon(lr, rank=2, vector_scale=vs, weight_decay=wd,
                                   weight_decay_mask=every))
  for k, theta in PARAMS.items():
    rate = lr * wd * (1.0 if theta.ndim >= 2 else vs)
    np.testing.assert_allclose(np.asarray(with_wd[k]) - np.asarray(without[k]),
                               -rate * np.asarray(theta), rtol=1e-4, atol=1e-9)


# --- optimizer states and hyperparameters ------------------------------------------------


@pytest.mark.parametrize("name", ["mezo", "hizoo", "zo_muon", "chain"])
def test_a_foreign_optimizer_state_is_refused_by_name(name):
  """An Adam state handed to a zeroth-order optimizer's update: a TypeError naming the
  fix, not an AttributeError from inside the chain."""
  if name == "chain":
    tx = optax.chain(hz.scale_by_zo(), optax.sgd(1e-3))
  else:
    tx = getattr(hz, name)(1e-3)
  with pytest.raises(TypeError, match=r"tx\.init\(params\)"):
    tx.update(None, optax.adam(1e-3).init(PARAMS), PARAMS, value_fn=loss)


def test_bfloat16_params_under_inject_hyperparams():
  """``optax.inject_hyperparams`` hands the alias its hyperparameters in the params' dtype
  (bfloat16 here): accepted, and the zeroth-order options in effect stay float32."""
  params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), PARAMS)
  tx = optax.inject_hyperparams(hz.mezo)(learning_rate=1e-3)
  state = tx.init(params)
  assert state.hyperparams["learning_rate"].dtype == jnp.bfloat16
  updates, state = jax.jit(lambda s, p: tx.update(None, s, p, value_fn=loss))(state, params)
  assert otu.tree_get(state, "hyper")["mu"].dtype == jnp.float32
  assert all(u.dtype == jnp.bfloat16 for u in jax.tree.leaves(updates))
  assert any(bool(jnp.any(u != 0)) for u in jax.tree.leaves(updates))


INJECTED = {name: {} for name in METHODS}
INJECTED.update(lozo_m=dict(momentum=0.9, rank=3), zo_muon_rank=dict(rank=2, vector_scale=1e-3),
                subzero_rank=dict(rank=2))
# The compiled steps below take a kernel, a vector and a stacked leaf: the leaf kinds whose
# state an option shapes (a second vector, the norm scale, would only add to the compiles).
INJECT_PARAMS = {k: PARAMS[k] for k in ("kernel", "bias", "stack")}


def inject_loss(p):
  """``loss`` with the norm scale held at its value in ``PARAMS`` (ones)."""
  return loss(dict(p, scale=PARAMS["scale"]))


def _inject_case(case):
  """The alias, its keyword options and the injected optimizer of an ``INJECTED`` case."""
  make = getattr(hz, case.split("_rank")[0].replace("lozo_m", "lozo"))
  kw = INJECTED[case]
  return make, kw, optax.inject_hyperparams(make)(learning_rate=1e-2, **kw)


@functools.cache
def _plain_params(case, steps=2):
  """The params after each of ``steps`` jitted steps of ``hz.X`` itself, from
  ``INJECT_PARAMS`` (shared by the tests that compare an injected optimizer with it)."""
  make, kw, _ = _inject_case(case)
  plain = make(1e-2, **kw)
  p, s = INJECT_PARAMS, plain.init(INJECT_PARAMS)
  step = jax.jit(lambda s, p: plain.update(None, s, p, value_fn=inject_loss))
  out = []
  for _ in range(steps):
    u, s = step(s, p)
    p = optax.apply_updates(p, u)
    out.append(p)
  return out


@pytest.mark.parametrize("case", list(INJECTED))
def test_inject_hyperparams_with_only_a_learning_rate(case):
  """``optax.inject_hyperparams(hz.X)(learning_rate=...)`` (and with a rank, a momentum or a
  vector scale passed as numbers) steps under ``jit`` exactly as ``hz.X``: options that
  shape the state come back from the state, float options are injected."""
  _, _, injected = _inject_case(case)
  plain = _plain_params(case)
  p, s = INJECT_PARAMS, injected.init(INJECT_PARAMS)
  step = jax.jit(lambda s, p: injected.update(None, s, p, value_fn=inject_loss))
  for want in plain:
    u, s = step(s, p)
    p = optax.apply_updates(p, u)
    for k in INJECT_PARAMS:
      np.testing.assert_allclose(np.asarray(p[k]), np.asarray(want[k]), rtol=1e-6, atol=1e-7)
  assert any(not np.array_equal(plain[-1][k], INJECT_PARAMS[k]) for k in INJECT_PARAMS)


def test_injected_rank_runs_in_the_lean_engine():
  """The rank recovered from the state also serves ``make_train_step``: its first step is
  the plain alias's (``hz.zo_muon(1e-2, rank=2, vector_scale=1e-3)``) under ``jit``."""
  _, _, tx = _inject_case("zo_muon_rank")
  step = hz.make_train_step(tx, inject_loss)
  fresh = lambda: jax.tree.map(jnp.array, INJECT_PARAMS)  # the step donates its params
  p, _ = step(fresh(), tx.init(fresh()))[:2]
  q = _plain_params("zo_muon_rank")[0]
  for k in INJECT_PARAMS:
    np.testing.assert_allclose(np.asarray(p[k]), np.asarray(q[k]), rtol=1e-6, atol=1e-7)


# --- Sparse MeZO on leaves with no spread ------------------------------------------------


def lora_problem():
  """LoRA's trainable params of two projections (``lora_b`` starts at zeros) and a loss."""
  from flax import nnx  # noqa: PLC0415

  from hizoo_jax.models import peft  # noqa: PLC0415

  class Block(nnx.Module):
    lora_targets = ("query", "value")

    def __init__(self, rngs):
      self.query = nnx.Linear(6, 5, rngs=rngs)
      self.value = nnx.Linear(6, 5, rngs=rngs)

  model = peft.apply_lora(Block(nnx.Rngs(0)), rank=4, rngs=nnx.Rngs(1))
  graphdef, trainable, frozen = peft.split_trainable(model, "lora")
  x = jnp.linspace(-1.0, 1.0, 18).reshape(3, 6)
  y = jnp.linspace(0.5, -0.5, 15).reshape(3, 5)

  def loss_of(p):
    m = nnx.merge(graphdef, p, frozen)
    return jnp.mean((m.query(x) + m.value(x) - y) ** 2)

  return trainable, loss_of


def test_sparse_mezo_trains_a_zero_initialised_lora_b():
  """``lora_b`` is all zeros at init: its quantile threshold would be 0, which masks it to
  its exact zeros, out of the step after its first move. A matrix with no spread is
  perturbed whole instead (threshold ``inf``) and keeps training at every step, while
  ``lora_a`` keeps its quantile mask (the ``1 - sparsity`` share of its entries)."""
  params, loss_of = lora_problem()
  sparsity = 0.5
  tx = hz.sparse_mezo(1e-2, mu=1e-3, sparsity=sparsity)
  state = tx.init(params)
  names = [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
  is_a = np.array(["lora_a" in n for n in names])
  is_b = np.array(["lora_b" in n for n in names])
  assert is_a.any() and is_b.any()
  h = np.asarray(otu.tree_get(state, "thresholds"))
  assert np.all(np.isinf(h[is_b])) and np.all(np.isfinite(h[is_a]) & (h[is_a] > 0))
  step = jax.jit(lambda s, p: tx.update(None, s, p, value_fn=loss_of))
  for _ in range(3):
    updates, state = step(state, params)
    moved = [float(np.mean(np.asarray(u) != 0)) for u in jax.tree.leaves(updates)]
    params = optax.apply_updates(params, updates)
    for k in np.flatnonzero(is_b):
      assert moved[k] == 1.0, (names[k], moved[k])
    for k in np.flatnonzero(is_a):  # the entries at or below the initial median
      assert 0.2 <= moved[k] <= 0.8, (names[k], moved[k])


# --- the low-rank factors on the reference's side ----------------------------------------


def test_low_rank_factors_lie_on_the_references_rows():
  """LOZO's fresh ``U`` and ZO-Muon's subspace ``P`` lie along PyTorch's ``out`` axis: the
  last axis of a Flax kernel ``[in, out]``, axis -2 of an embedding table (``[num,
  features]``, PyTorch's layout) and of every matrix with ``layout="torch"``; LOZO's lazy
  ``V`` along the other. (The float64 references of tests/test_lowrank.py check the
  values.)"""
  params = {"dense": {"kernel": jnp.ones((4, 6))}, "embed": {"embedding": jnp.ones((7, 4))},
            "bias": jnp.ones((6,))}
  order = [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
  kernel, table = order.index("['dense']['kernel']"), order.index("['embed']['embedding']")
  for layout, kernel_rows, kernel_cols in (("flax", 6, 4), ("torch", 4, 6)):
    v = hz.lozo(1e-3, rank=2, momentum=0.9, layout=layout).init(params)[0].method
    assert v.v[kernel].shape == (kernel_cols, 2)  # V over the columns
    assert v.momentum[kernel].shape == (kernel_rows, 2)  # M lives with U, over the rows
    assert v.v[table].shape == (4, 2) and v.momentum[table].shape == (7, 2)
    p = hz.zo_muon(1e-3, rank=2, layout=layout).init(params)[0].method.p
    assert p[kernel].shape == (kernel_rows, 2) and p[table].shape == (7, 2)
  with pytest.raises(ValueError, match="layout"):
    hz.lozo(1e-3, layout="jax")
