"""Step-for-step comparison with the NumPy reference of spec section 1 (float64)."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.tree_utils as otu
import pytest

import hizoo_jax as hz
from hizoo_jax._src import curvature as hess
from tests import reference
from tests.helpers import explicit_sampler, problem, step_noise

STEPS = 4
LR = 0.05
MU = 1e-2

CASES = {
    "mezo": dict(kind="mezo", n=1),
    "mezo_multi_wd": dict(kind="mezo", n=3, weight_decay=0.1),
    "hizoo_paper": dict(kind="hizoo", n=1, alpha=0.3),
    "hizoo_unbiased": dict(kind="hizoo", n=1, alpha=0.05, estimator="unbiased"),
    "hizoo_multi": dict(kind="hizoo", n=3, alpha=0.2),
    "hizoo_multi_unbiased": dict(kind="hizoo", n=2, alpha=0.05, estimator="unbiased"),
    "hizoo_l": dict(kind="hizoo", n=1, alpha=0.3, factored=True),
    "hizoo_l_multi_unbiased": dict(
        kind="hizoo", n=2, alpha=0.05, factored=True, estimator="unbiased"
    ),
    "hizoo_every_2_wd": dict(kind="hizoo", n=2, alpha=0.2, every=2, weight_decay=0.1),
    "hizoo_tight_clip": dict(kind="hizoo", n=1, alpha=0.5, clip=(0.5, 3.0)),
}


def _make_tx(c):
  common = dict(mu=MU, num_directions=c["n"], sampler=explicit_sampler, seed=3,
                weight_decay=c.get("weight_decay", 0.0))
  if c["kind"] == "mezo":
    return hz.mezo(LR, **common)
  return hz.hizoo(
      LR,
      hessian_smoothing=c["alpha"],
      estimator=c.get("estimator", "paper"),
      factored=c.get("factored", False),
      min_dim_size_to_factor=5,
      hessian_update_every=c.get("every", 1),
      hessian_clip=c.get("clip", (1e-8, 1e8)),
      **common,
  )


def _ref_hessian(state):
  h = otu.tree_get(state, "hessian")
  return {
      k: (np.asarray(v.row), np.asarray(v.col)) if hess.is_factored(v) else np.asarray(v)
      for k, v in h.items()
  }


# Every case under jit; op by op (no jit) a covering set of single-direction cases: every
# state layout (none: mezo; dense and factored leaves: hizoo_l) and every curvature
# estimator (paper: hizoo_l; unbiased: hizoo_unbiased) runs op by op at least once. The
# update has no branch on whether it is traced (the options are checked when the transform
# is built), so op by op runs the same functions as under jit, which covers every case; the
# several-direction cases cost 7-19 s each op by op on two CPU cores.
EAGER = ("mezo", "hizoo_unbiased", "hizoo_l")


@pytest.mark.parametrize(
    "name, use_jit",
    [pytest.param(n, True, id=f"{n}-jit") for n in CASES]
    + [pytest.param(n, False, id=f"{n}-eager") for n in EAGER],
)
def test_matches_numpy_reference(name, use_jit):
  c = CASES[name]
  params_np, f_np = problem(np)
  _, f_jnp = problem(jnp)
  params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), params_np)
  tx = _make_tx(c)
  state = tx.init(params)
  update = jax.jit(tx.update, static_argnames="value_fn") if use_jit else tx.update
  theta = dict(params_np)
  H = None if c["kind"] == "mezo" else _ref_hessian(state)
  clip = c.get("clip", (1e-8, 1e8))
  for t in range(STEPS):
    zs = step_noise(state, params, c["n"], explicit_sampler)
    theta, H, info = reference.ref_step(
        theta, f_np, zs, H, mu=MU, lr=LR, alpha=c.get("alpha", 0.0),
        estimator=c.get("estimator", "paper"), clip=clip,
        weight_decay=c.get("weight_decay", 0.0),
        hessian_step=(t % c.get("every", 1) == 0),
    )
    updates, state = update(None, state, params, value_fn=f_jnp)
    params = optax.apply_updates(params, updates)
    chex.assert_trees_all_close(params, theta, rtol=1e-10, atol=1e-12)
    for field in ("loss", "skipped_directions"):
      np.testing.assert_allclose(otu.tree_get(state, field), info[field], rtol=1e-10)
    losses = otu.tree_get(state, "losses")  # l+_1, l-_1, l+_2, ...
    np.testing.assert_allclose(losses[0::2], info["loss_plus"], rtol=1e-10)
    np.testing.assert_allclose(losses[1::2], info["loss_minus"], rtol=1e-10)
    if H is not None:
      chex.assert_trees_all_close(
          hz.get_hessian(state), reference.dense_hessian(H, clip), rtol=1e-10, atol=1e-12
      )
      chex.assert_trees_all_close(_ref_hessian(state), H, rtol=1e-10, atol=1e-12)
  assert int(otu.tree_get(state, "count")) == STEPS
  if c.get("factored"):
    h = otu.tree_get(state, "hessian")
    assert hess.is_factored(h["w1"]) and hess.is_factored(h["w3"])
    assert h["w3"].row.shape == (2, 5) and h["w3"].col.shape == (2, 6)
    assert not hess.is_factored(h["b1"])


def test_scale_by_transforms_emit_the_estimate():
  """scale_by_zo / scale_by_hizoo emit g itself (no learning rate, no sign flip)."""
  params_np, f_np = problem(np)
  _, f_jnp = problem(jnp)
  params = jax.tree.map(jnp.asarray, params_np)
  for tx, H in [
      (hz.scale_by_zo(mu=MU, sampler=explicit_sampler, seed=1), None),
      (hz.scale_by_hizoo(mu=MU, hessian_smoothing=0.1, sampler=explicit_sampler, seed=1),
       {k: np.ones_like(v) for k, v in params_np.items()}),
  ]:
    state = tx.init(params)
    zs = step_noise(state, params, 1, explicit_sampler)
    _, _, info = reference.ref_step(params_np, f_np, zs, H, mu=MU, lr=1.0, alpha=0.1)
    g, _ = tx.update(None, state, params, value_fn=f_jnp)
    chex.assert_trees_all_close(g, info["g"], rtol=1e-10, atol=1e-13)
