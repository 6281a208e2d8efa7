"""LOZO-M, SubZero and ZO-Muon with FSDP-sharded matrices on 8 (virtual CPU) devices.

What crosses devices: the factors (U, V, Z0, P, u_i) are drawn from the step's keys, which
every device holds, so each device draws the same small factors and needs no transfer; the
QR of SubZero's / ZO-Muon's Gaussians and ZO-Muon's Newton-Schulz on the r x n estimate run
on those replicated factors, replicated computations. Each device forms its rows of
``U V^T`` (LOZO, SubZero) or ``P u`` (ZO-Muon) inside its shard's elementwise pass. Only
the loss (a scalar, reduced by the loss function itself) and whatever the state's
shardings ask for (a factor sharded like its leaf's rows is resharded where the algebra
needs it whole: at most one factor, m r floats) cross devices.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import hizoo_jax as hz
from tests.multidevice.test_mesh import (
  X,
  Y,
  collective_sizes,
  elementwise_loss,
  fsdp_shardings,
  loss_fn,
  mlp,
)

SIZES = [16, 256, 256, 8]
METHODS = {
    "lozo_m": lambda: hz.lozo(1e-2, rank=4, momentum=0.9, resample_every=2),
    "subzero": lambda: hz.subzero(1e-2, rank=8, resample_every=2, num_directions=2),
    # above the fused rank: matmul products, the leaves ordered (Method.serial_products)
    "zo_muon_r32": lambda: hz.zo_muon(1e-2, rank=32, num_directions=2, resample_every=2,
                                      vector_scale=0.1),
}
RANKS = {"lozo_m": 4, "subzero": 8, "zo_muon_r32": 32}
# The sharded program forms mu Z in float32 with another fusion, so its perturbation rounds
# differently (~eps32 |mu Z| per element), a loss by ~eps32 |mu Z| |grad f|_1 and c by up
# to ~5e-5 relative (tests/test_lowrank.py measures 3e-5 against float64; here 1.5e-5);
# the sharded losses' other summation order adds only ~1e-13 / 2 mu = 5e-11. Updates are
# ~lr |g| ~ 1e-2 per element: rtol 1e-4, atol 1e-6. A wrong shard of a factor moves the
# params by ~lr = 1e-2.
TOL = dict(rtol=1e-4, atol=1e-6)


def run(make, steps, params_sh=None, lean=True):
  tx = make()
  params = mlp(SIZES)
  state = tx.init(params)
  if params_sh is not None:
    params = jax.device_put(params, params_sh)
    state = jax.device_put(state, hz.state_shardings(state, params, params_sh))
  step = hz.make_train_step(tx, loss_fn, param_shardings=params_sh, lean=lean,
                            restore="exact")
  for _ in range(steps):
    params, state, _ = step(params, state, X, Y)
  return params, state


# A covering set: each method's state sharded (LOZO-M's momentum on the plain step, which
# runs the update of the lean one), the lean step's passes with fused products (SubZero)
# and with matmul products, the leaves ordered (ZO-Muon).
@pytest.mark.parametrize("name,lean", [("lozo_m", False), ("subzero", True),
                                       ("zo_muon_r32", True)])
def test_fsdp_equals_one_device(name, lean):
  mesh = Mesh(np.array(jax.devices()), ("fsdp",))
  params_sh = fsdp_shardings(mlp(SIZES), mesh)
  want = run(METHODS[name], 3, lean=lean)
  got = run(METHODS[name], 3, params_sh=params_sh, lean=lean)
  chex.assert_trees_all_close(got, want, **TOL)
  for p, s in zip(jax.tree.leaves(got[0]), jax.tree.leaves(params_sh), strict=True):
    assert p.sharding.is_equivalent_to(s, p.ndim)
  moved = max(float(jnp.max(jnp.abs(a - b)))
              for a, b in zip(jax.tree.leaves(got[0]), jax.tree.leaves(mlp(SIZES)), strict=True))
  assert moved > 1e-4, moved


# Fused products formed in the passes (LOZO-M, SubZero) and matmul products with the
# leaves ordered (ZO-Muon, its projectors and Newton-Schulz replicated at any rank).
@pytest.mark.parametrize("name", list(METHODS))
def test_fsdp_moves_no_leaf_sized_array(name):
  """With a loss that reads the params elementwise (no gather of its own), the step's
  collectives are the loss (scalars) and at most factor-sized arrays, never a leaf."""
  mesh = Mesh(np.array(jax.devices()), ("fsdp",))
  big = [16, 512, 512, 8]
  tx = METHODS[name]()
  params = mlp(big)
  params_sh = fsdp_shardings(params, mesh)
  params = jax.device_put(params, params_sh)
  state = jax.device_put(tx.init(params), hz.state_shardings(tx.init(params), params,
                                                             params_sh))
  step = hz.make_train_step(tx, elementwise_loss, param_shardings=params_sh)
  text = step.lower(params, state, X, Y).compile().as_text()
  sizes = [n for _, n in collective_sizes(text)]
  assert sizes
  assert max(sizes) <= 512 * RANKS[name], sorted(sizes)[-5:]  # one factor [512, r]
  assert "[512,512]" not in text  # never the full leaf on one device
