"""The public method interface (``hizoo_jax.method``): the guide's worked example runs as
written, and the method it defines is exact against NumPy in both execution paths."""

from __future__ import annotations

import os
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.tree_utils as otu
import pytest

import hizoo_jax as hz
from hizoo_jax._src import sampling

GUIDE = os.path.join(os.path.dirname(__file__), "..", "docs", "guides", "methods.md")


def _guide_namespace():
  code = re.findall(r"```python\n(.*?)```", open(GUIDE).read(), re.S)
  assert len(code) == 1, "the guide has one worked example"
  ns: dict = {}
  exec(compile(code[0], GUIDE, "exec"), ns)  # noqa: S102 - our own documentation
  return ns


def test_the_guides_example_trains_and_counts_its_forward_passes():
  ns = _guide_namespace()
  # 100 steps of 2 one-sided probes and l0: 300 forward passes; the quadratic is solved
  assert int(otu.tree_get(ns["state"], "forward_passes")) == 300
  assert float(ns["loss"]) < 1e-3 * float(ns["loss_fn"]({"w": jnp.ones(4)}, jnp.zeros(4)))


def test_a_user_method_is_exact_in_both_paths():
  ns = _guide_namespace()
  method = ns["ForwardDifference"](num_probes=3)
  mu, lr = 1e-3, 0.02
  loss_fn = lambda p, x: jnp.sum(jnp.tanh(p["w"] @ x) ** 2) + jnp.sum(p["b"] ** 2)
  x = jnp.linspace(-1.0, 1.0, 6)
  params0 = {"b": jnp.linspace(0.5, 1.0, 3), "w": jnp.ones((3, 6)) * 0.3}

  def numpy_reference(steps):
    p = jax.tree.map(np.asarray, params0)
    key = jax.random.wrap_key_data(hz.scale_by_zo(seed=5).init(params0).key)
    f = lambda q: float(loss_fn(jax.tree.map(jnp.asarray, q), x))
    for _ in range(steps):
      noise_key, key = sampling.split_state_key(key)
      zs = [jax.tree.map(np.asarray, sampling.direction_noise(noise_key, j, params0))
            for j in range(3)]
      l0 = f(p)
      g = jax.tree.map(np.zeros_like, p)
      for z in zs:
        lj = f(jax.tree.map(lambda a, b: a + mu * b, p, z))
        g = jax.tree.map(lambda a, b, lj=lj, l0=l0: a + (lj - l0) / mu / 3 * b, g, z)
      p = jax.tree.map(lambda a, b: a - lr * b, p, g)
    return p

  want = numpy_reference(4)
  for lean in (False, True):
    tx = optax.chain(hz.method.zo_transform(method, {"mu": mu}, seed=5), optax.sgd(lr))
    step = hz.make_train_step(tx, loss_fn, lean=lean, restore="exact")
    p = jax.tree.map(jnp.copy, params0)  # the step donates its arguments
    s = tx.init(p)
    for _ in range(4):
      p, s, _ = step(p, s, x)
    # float64: the losses agree to ~1e-16 relative, the difference l_j - l0 ~ mu |g| keeps
    # ~1e-16 / 1e-3 of it, and 4 steps of lr 0.02 keep that near 1e-13 relative.
    for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(want), strict=True):
      np.testing.assert_allclose(np.asarray(a), b, rtol=1e-9, atol=1e-12)
    assert int(otu.tree_get(s, "forward_passes")) == 16


def test_zo_call_hands_the_transform_the_callers_losses():
  """``tx.update(..., zo_call=ZOCall(losses=...))``: the transform estimates from the given
  losses without calling ``value_fn``, as from the same losses measured through it; a probe
  updates nothing; anything but a ZOCall is refused by name."""
  from hizoo_jax.method import ZOCall

  params = {"w": jnp.arange(3.0), "b": jnp.ones(2)}
  loss = lambda p: jnp.sum(p["w"] ** 2) + jnp.sum(p["b"])  # noqa: E731
  tx = hz.mezo(1e-2, mu=1e-3)
  state = tx.init(params)
  measured, measured_state = tx.update(None, state, params, value_fn=loss)
  losses = otu.tree_get(measured_state, "losses")
  given, given_state = tx.update(None, state, params, zo_call=ZOCall(losses=(0.0, losses)))
  chex.assert_trees_all_equal(given, measured)
  np.testing.assert_array_equal(otu.tree_get(given_state, "losses"), losses)

  class Probe:
    def __init__(self):
      self.found = []

    def record(self, method, view):
      self.found.append(method)

  probe = Probe()
  updates, _ = tx.update(None, state, params, zo_call=ZOCall(probe=probe))
  assert len(probe.found) == 1 and all(float(jnp.abs(u).max()) == 0
                                       for u in jax.tree.leaves(updates))
  with pytest.raises(TypeError, match="ZOCall"):
    tx.update(None, state, params, zo_call=(0.0, losses))
