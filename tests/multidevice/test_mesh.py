"""Zeroth-order training on a mesh of 8 (virtual CPU) devices: data parallel and FSDP."""

from __future__ import annotations

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax.tree_utils as otu
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import hizoo_jax as hz
from tests.helpers import tanh_mlp, tanh_mlp_loss

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute",
               "all-to-all")


def collective_sizes(hlo_text: str) -> list[tuple[str, int]]:
  """(op, elements) of every operand of every collective in an optimized HLO module
  (XLA combines several small collectives into one over a tuple)."""
  out = []
  hlo_text = re.sub(r"/\*index=\d+\*/", "", hlo_text)  # the tuple-type comments hold '='
  pattern = r"= ([^=]*?) (" + "|".join(COLLECTIVES) + r")(?:-start)?\("
  for m in re.finditer(pattern, hlo_text):
    for dims in re.findall(r"\w+\[([\d,]*)\]", m.group(1)):
      out.append((m.group(2), int(np.prod([int(d) for d in dims.split(",") if d]))))
  return out


def mlp(sizes, seed=0):
  return tanh_mlp(sizes, seed=seed)


loss_fn = tanh_mlp_loss


SIZES = [16, 256, 256, 8]
X = jax.random.normal(jax.random.key(1), (64, 16))
Y = jax.random.normal(jax.random.key(2), (64, 8))
OPTIMIZERS = {
    "mezo": lambda: hz.mezo(1e-2, weight_decay=0.01),
    "hizoo": lambda: hz.hizoo(1e-2, hessian_smoothing=0.1),
    "hizoo_l": lambda: hz.hizoo_l(1e-2, hessian_smoothing=0.1, min_dim_size_to_factor=8),
    # two micro-batches a step (the same batch twice here): its sums of losses and the
    # held state sharded like the rest
    "mezo_accumulate": lambda: hz.accumulate(hz.mezo(1e-2, weight_decay=0.01), 2),
}


def sharded_tolerance(name):
  """How far a sharded run may drift from the single-device one, from the arithmetic.

  Sharded losses (data parallel or FSDP) sum in another order: each loss differs by
  ~n eps |l| (n ~ 512 terms, eps = 2.2e-16, |l| ~ 1): ~1e-13. MeZO divides l+ - l-
  by 2 mu: ~1e-10 absolute in its projection, ~1e-9 relative to it per step. HiZOO also
  divides the second difference l+ + l- - 2 l0 (~2e-5 on this problem: c ~ 10,
  mu = 1e-3) by 2 mu^2, so c, and all of H through the EMA, moves by ~1e-13 / 2e-5 =
  5e-9 relative per step (measured: 3.5e-9 after 4 steps). A parameter that is a sum of
  updates of either sign can lose ~100x of that relative to its own size, hence the
  absolute floor (the updates are ~lr |g| ~ 1e-4; 1e-9 is ~1e-5 of one).
  """
  if name.startswith("mezo"):
    return dict(rtol=1e-9, atol=1e-10)  # lr |g| 1e-9 per step over 4 steps: ~4e-11
  return dict(rtol=5e-7, atol=1e-9)


def fsdp_shardings(params, mesh, axis="fsdp"):
  """2-D leaves split on their first dim; 1-D leaves split if divisible, else replicated."""
  n = mesh.shape[axis]
  def spec(x):
    return NamedSharding(mesh, P(axis) if x.shape[0] % n == 0 else P())
  return jax.tree.map(spec, params)


ENGINES = {"lean": dict(lean=True), "plain": dict(lean=False)}


def run(make, steps, *, params_sh=None, batch_sh=None, lean="lean"):
  tx = make()
  params = mlp(SIZES)
  state = tx.init(params)
  if params_sh is not None:
    params = jax.device_put(params, params_sh)
    state = jax.device_put(state, hz.state_shardings(state, params, params_sh))
  step = hz.make_train_step(tx, loss_fn, param_shardings=params_sh,
                            batch_sharding=batch_sh, **ENGINES[lean])
  for _ in range(steps):
    params, state, loss = step(params, state, X, Y)
  return params, state, step


@pytest.fixture(scope="module")
def single_device():
  return {name: run(make, 4)[:2] for name, make in OPTIMIZERS.items()}


# each optimizer on one engine, each engine twice; FSDP below runs each optimizer on the
# other engine, so every optimizer meets both engines on a sharded mesh
DATA_PARALLEL_CASES = [("mezo", "lean"), ("hizoo", "plain"), ("hizoo_l", "lean"),
                       ("mezo_accumulate", "plain")]
FSDP_CASES = [(name, {"lean": "plain", "plain": "lean"}[lean])
              for name, lean in DATA_PARALLEL_CASES]


@pytest.mark.parametrize("name,lean", DATA_PARALLEL_CASES)
def test_data_parallel_equals_one_device_and_only_scalars_cross(name, lean, single_device):
  mesh = Mesh(np.array(jax.devices()), ("data",))
  replicated = NamedSharding(mesh, P())
  params, state, step = run(OPTIMIZERS[name], 4, params_sh=replicated,
                            batch_sh=NamedSharding(mesh, P("data")), lean=lean)
  chex.assert_trees_all_close((params, state), single_device[name], **sharded_tolerance(name))
  assert all(x.sharding.is_fully_replicated for x in jax.tree.leaves((params, state)))
  # the compiled programs exchange scalars only (the losses)
  x = jax.device_put(X, NamedSharding(mesh, P("data")))
  y = jax.device_put(Y, NamedSharding(mesh, P("data")))
  sizes = collective_sizes(step.lower(params, state, x, y).compile().as_text())
  assert sizes, "the loss must be all-reduced across the data axis"
  assert max(n for _, n in sizes) == 1, sizes  # every operand a scalar


@pytest.mark.parametrize("name,lean", FSDP_CASES)
def test_fsdp_equals_one_device_and_keeps_shardings(name, lean, single_device):
  mesh = Mesh(np.array(jax.devices()), ("fsdp",))
  params_sh = fsdp_shardings(mlp(SIZES), mesh)
  params, state, _ = run(OPTIMIZERS[name], 4, params_sh=params_sh, lean=lean)
  chex.assert_trees_all_close((params, state), single_device[name], **sharded_tolerance(name))
  for p, s in zip(jax.tree.leaves(params), jax.tree.leaves(params_sh), strict=True):
    assert p.sharding.is_equivalent_to(s, p.ndim)
  h = otu.tree_get(state, "hessian")
  if h is not None:
    w = h["l1"]["w"]
    if hz.FactoredHessian is type(w):  # rows split like the param's rows, columns whole
      assert w.row.sharding.spec == P("fsdp") and w.col.sharding.is_fully_replicated
    else:
      assert w.sharding.spec == P("fsdp")


def elementwise_loss(p, x, y):
  """A loss that reads every param elementwise (no matmul): sharded, it needs no gather of
  the params, so any full-leaf array or large collective in the step is the optimizer's."""
  del x, y
  return sum(jnp.sum(jnp.tanh(w)) for w in jax.tree.leaves(p))


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_fsdp_noise_is_drawn_per_shard_and_memory_is_one_eighth(name):
  """The default step with two 512 x 512 layers, on one device and FSDP on 8 (compiled,
  not run): per device, the sharded program holds the single-device figure over 8, bar what
  is replicated. Its passes form no array of a sharded leaf's full shape, and exchange
  nothing but the losses and the factored Hessian's own sums."""
  mesh = Mesh(np.array(jax.devices()), ("fsdp",))
  big = [16, 512, 512, 8]  # every leaf's first dim divisible by 8: all of them sharded
  tx = OPTIMIZERS[name]()
  p1 = mlp(big)
  s1 = tx.init(p1)
  sh = fsdp_shardings(p1, mesh)
  p8 = jax.device_put(p1, sh)
  s8 = jax.device_put(s1, hz.state_shardings(s1, p1, sh))

  def compiled(p, s, **kw):
    return hz.make_train_step(tx, elementwise_loss, **kw).lower(p, s, X, Y).compile()

  def peak(c):
    m = c.memory_analysis()
    return m.argument_size_in_bytes + m.temp_size_in_bytes

  sharded = compiled(p8, s8, param_shardings=sh)
  ratio = peak(compiled(p1, s1)) / peak(sharded)
  assert ratio > 6.0, ratio  # 8 minus what is replicated (biases, scalars, keys)
  text = sharded.as_text()
  # the losses (scalars); HiZOO-L: also its factored state's reductions across the row
  # shards, sum(row) (a scalar) and the column sums (at most 512 floats): never noise or
  # params.
  sizes = [n for _, n in collective_sizes(text)]
  assert sizes
  assert all(n <= (512 if name == "hizoo_l" else 1) for n in sizes), sizes
  assert "[512,512]" not in text  # never the full leaf on one device
  assert "[64,512]" in text  # each device works on its [64, 512] shard


def test_two_dimensional_mesh_data_and_fsdp(single_device):
  mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "fsdp"))
  params_sh = fsdp_shardings(mlp(SIZES), mesh)
  params, state, _ = run(OPTIMIZERS["hizoo"], 4, params_sh=params_sh,
                         batch_sh=NamedSharding(mesh, P("data")))
  chex.assert_trees_all_close((params, state), single_device["hizoo"], **sharded_tolerance("hizoo"))


def gathering_loss_fn(p, x, y):
  """``loss_fn`` as an FSDP model writes it for a mesh with Explicit axes: each sharded
  weight gathered for the forward pass (the arithmetic is loss_fn's)."""
  return loss_fn(jax.tree.map(lambda w: jax.sharding.reshard(w, P()), p), x, y)


# HiZOO-L (the state whose factored update carries its row and column sums through a loop
# and selects within sharded blocks, both of which must carry the mesh's Explicit axes) on
# every layout, the three meeting both engines; on FSDP with several row blocks per leaf.
# (Every optimizer with both engines on data-parallel and FSDP meshes with Auto axes: the
# tests above.)
EXPLICIT_AXES_CASES = [
    pytest.param(name, mode, lean, id=f"{name}-{mode}-{lean}")
    for name, mode, lean in [("hizoo_l", "data_parallel", "lean"), ("hizoo_l", "fsdp", "lean"),
                             ("hizoo_l", "data_and_fsdp", "plain")]]


@pytest.mark.parametrize("name,mode,lean", EXPLICIT_AXES_CASES)
def test_explicit_axes_mesh_equals_one_device(name, mode, lean, single_device, monkeypatch):
  """``jax.make_mesh`` builds Explicit axes (shardings in the types), under which every
  intermediate of a step must carry a sharding consistent with the mesh: HiZOO-L's
  factored update (a loop carry, a select of a sharded block with a mask) traces, compiles
  and matches one device with replicated params, FSDP-sharded ones and both axes. On FSDP
  its blocked row sums run several blocks per leaf (16 on the 256 x 256 leaf), against the
  single-device step's one block."""
  if mode == "fsdp":
    from hizoo_jax._src import curvature

    monkeypatch.setattr(curvature, "BLOCK_ELEMENTS", 4096)
  shape = {"data_parallel": (8, 1), "fsdp": (1, 8), "data_and_fsdp": (2, 4)}[mode]
  mesh = jax.make_mesh(shape, ("data", "fsdp"))
  assert all(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types)
  with jax.set_mesh(mesh):
    sh = (jax.tree.map(lambda _: NamedSharding(mesh, P()), mlp(SIZES))
          if mode == "data_parallel" else fsdp_shardings(mlp(SIZES), mesh))
    tx = OPTIMIZERS[name]()
    params = jax.device_put(mlp(SIZES), sh)
    state = hz.shard_state(tx.init(params), params, sh)
    step = hz.make_train_step(tx, gathering_loss_fn, param_shardings=sh,
                              batch_sharding=NamedSharding(mesh, P("data")), **ENGINES[lean])
    for _ in range(4):
      params, state, _ = step(params, state, X, Y)
  chex.assert_trees_all_close((params, state), single_device[name], **sharded_tolerance(name))
  for p, s in zip(jax.tree.leaves(params), jax.tree.leaves(sh), strict=True):
    assert p.sharding.is_equivalent_to(s, p.ndim)
