"""LOZO / LOZO-M, SubZero and ZO-Muon against NumPy float64 references of the published
algorithms (the module docstrings of hizoo_jax/_src/methods/{lozo,subzero,zo_muon}.py),
their compositions with Optax, the lean step's memory, and bfloat16 params. (On 8 devices:
tests/multidevice/test_lowrank_mesh.py, run by tests/test_sharding.py.)

The references regenerate the step's Gaussian factors with the library's documented key
schedule (state key -> (noise key, next) = split; probe j's words from
``direction_key(noise_key, j)``; ``lowrank.leaf_factor`` / ``lowrank.resampled``), convert
them to NumPy float64 (exact: they are float32 samples) and do all the algebra there:
``U V^T``, QR, Newton-Schulz, the momentum and its transport, the losses, the update.

Tolerances, from the arithmetic. The library forms the perturbation and the update of a
matrix leaf in float32 even for float64 params (float32 factors, the ``outer`` sum over
``r <= 4`` terms, ``c`` cast to float32, ``mu Z`` in float32; see
test_float64_params_are_perturbed_in_float64). Two consequences, checked separately:

* the losses: ``theta +- mu Z`` is off by ~(r + 1) eps32 |mu Z| per element (eps32 =
  1.2e-7, |mu Z| <= 1e-2), so a loss by at most that times |grad f|_1 (~20 here): ~1.2e-8;
  ``LOSS_ATOL = 1e-7``. A wrong perturbation moves a loss by mu |grad f . Z| ~ 1e-4.
* the update, computed by the reference from the library's measured losses (so that the
  perturbation's rounding, divided by 2 mu, does not enter ``c``: fed its own losses the
  reference's ``c`` differs by up to 3e-5 relative): each element of ``c U V^T`` carries
  ~(r + 2) eps32 = 7e-7 of relative rounding of the terms it sums, measured relative to
  the sum of the leaf's largest updates so far; ``TOL_REL = 5e-6``. ZO-Muon also runs 5
  Newton-Schulz iterations in float32: each adds ~n eps32 (n <= 6) of absolute error to
  entries <= ~1.2, and the quintic's slope is at most 3.45, so later iterations amplify it
  by up to 1 + 3.45 + ... + 3.45^4 ~ 200: ~1e-4 at worst (``TOL_REL_NS``). Measured:
  <= 2.4e-7 (LOZO, SubZero), 7.2e-7 (ZO-Muon), losses <= 2.1e-8.

A wrong step (a factor from another key, no QR sign fix, no momentum transport, another NS
coefficient, the rank not clipped) moves an update by O(1) of itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import chex
import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import optax
import optax.tree_utils as otu
import pytest

import hizoo_jax as hz
from hizoo_jax._src import sampling
from hizoo_jax._src.methods import lowrank
from hizoo_jax.method import ZOCall
from tests import test_engine as engine
from tests.helpers import lean_step_extra, xla_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED = 3
MU = 1e-3
STEPS = 4
RANK = 4  # w1 [5, 6]: rank 4; w3 [2, 6, 3]: clipped to 3
TOL_REL = 5e-6
TOL_REL_NS = 1e-4
LOSS_ATOL = 1e-7
NS = (3.4445, -4.7750, 2.0315)


def problem(xp):
  """A smooth loss over a 1-D bias, a matrix and a stacked [2, 6, 3] leaf."""
  rng = np.random.default_rng(0)
  x = rng.standard_normal((7, 5))
  y = rng.standard_normal(7)
  params = {"b1": rng.standard_normal(6) * 0.1, "w1": rng.standard_normal((5, 6)) * 0.5,
            "w3": rng.standard_normal((2, 6, 3)) * 0.3}

  def f(p):
    h = xp.tanh(x @ p["w1"] + p["b1"])
    u = xp.einsum("nk,bkj->nbj", h, p["w3"]).sum(axis=(1, 2))
    return xp.mean(xp.logaddexp(0.0, u - y)) + 0.05 * xp.sum(p["w1"] ** 2)

  return params, f


NAMES = ("b1", "w1", "w3")  # jax.tree.leaves order: leaf i = NAMES[i]


def noise_keys(seed, steps):
  """The documented key schedule: each step splits the state key into (noise, next)."""
  key, out = jax.random.key(seed), []
  for _ in range(steps):
    noise_key, key = jax.random.split(key)
    out.append(noise_key)
  return out, key


class Factors:
  """One step's factors, regenerated with the library's helpers, as float64 NumPy."""

  def __init__(self, noise_key, params):
    self.noise_key = noise_key
    self.leaves = [jnp.asarray(params[k]) for k in NAMES]

  def words(self, j):
    return sampling.DirectionWords(sampling.direction_key(self.noise_key, j), len(NAMES),
                                   self.leaves)

  def probe(self, j, i, shape):
    return np.asarray(lowrank.leaf_factor(self.words(j), i, self.leaves[i], shape), np.float64)

  def resampled(self, i, shape, salt=0):
    return np.asarray(lowrank.resampled(self.noise_key, i, self.leaves[i], shape, salt),
                      np.float64)

  def vector(self, j, i):
    return np.asarray(self.words(j).noise(hz.fast_gaussian, i, self.leaves[i]), np.float64)


def r_of(shape, rank):
  return min(rank, shape[-2], shape[-1])


def T(a):
  return np.swapaxes(a, -1, -2)


def add(theta, d, s):
  return {k: theta[k] + s * d[k] for k in theta}


def numpy_qr(g):
  q, _ = np.linalg.qr(g)  # LAPACK Householder, the convention of jnp.linalg.qr on CPU
  return q


def haar(g):
  q, r = np.linalg.qr(g)
  d = np.sign(np.diagonal(r, axis1=-2, axis2=-1))
  return q * np.where(d == 0, 1, d)[..., None, :]


def ns5(r):
  a, b, c = NS
  x = r / (np.linalg.norm(r, axis=(-2, -1), keepdims=True) + 1e-7)
  for _ in range(5):
    s = x @ T(x)
    x = a * x + (b * s + c * s @ s) @ x
  return x


# --- the references ------------------------------------------------------------------


class LOZORef:
  """LOZO (beta = 0) and LOZO-M: U fresh each step, V redrawn every nu steps, momentum in
  the [m, r] factor space carried to a new V as M V_old^T V_new / n."""

  def __init__(self, rank, nu, beta):
    self.rank, self.nu, self.beta, self.v, self.m = rank, nu, beta, {}, {}

  def step(self, t, fac, theta, f, lr, measured):
    z, u = {}, {}
    for i, k in enumerate(NAMES):
      shape = theta[k].shape
      if len(shape) < 2:
        z[k] = fac.vector(0, i)
        continue
      r = r_of(shape, self.rank)
      old_v = self.v.get(k)
      if t % self.nu == 0:
        self.v[k] = fac.resampled(i, shape[:-2] + (shape[-1], r))
      u[k] = fac.probe(0, i, shape[:-1] + (r,))
      z[k] = u[k] @ T(self.v[k])
      if self.beta and t > 0 and t % self.nu == 0:  # transport to the new V
        self.m[k] = self.m[k] @ (T(old_v) @ self.v[k]) / shape[-1]
    losses = [f(add(theta, z, MU)), f(add(theta, z, -MU))]
    c = (measured[0] - measured[1]) / (2 * MU)
    g = {}
    for k in NAMES:
      if not self.beta:
        g[k] = c * z[k]
        continue
      new = c * (u[k] if k in u else z[k])
      self.m[k] = new if t == 0 else self.beta * self.m[k] + (1 - self.beta) * new
      g[k] = self.m[k] @ T(self.v[k]) if k in u else self.m[k]
    return {k: theta[k] - lr * g[k] for k in NAMES}, losses, g_max(g, lr)


class SubZeroRef:
  """SubZero: orthonormal U, V (QR of Gaussians) every T steps; Z = sqrt(mn)/r U Z0 V^T."""

  def __init__(self, rank, period, q):
    self.rank, self.period, self.q, self.u, self.v = rank, period, q, {}, {}

  def step(self, t, fac, theta, f, lr, measured):
    g = {k: np.zeros_like(theta[k]) for k in NAMES}
    losses = []
    for i, k in enumerate(NAMES):
      shape = theta[k].shape
      if len(shape) >= 2 and t % self.period == 0:
        r = r_of(shape, self.rank)
        self.u[k] = numpy_qr(fac.resampled(i, shape[:-1] + (r,), salt=0))
        self.v[k] = numpy_qr(fac.resampled(i, shape[:-2] + (shape[-1], r), salt=1))
    for j in range(self.q):
      z = {}
      for i, k in enumerate(NAMES):
        shape = theta[k].shape
        if len(shape) < 2:
          z[k] = fac.vector(j, i)
          continue
        r = r_of(shape, self.rank)
        z0 = fac.probe(j, i, shape[:-2] + (r, r))
        z[k] = np.sqrt(shape[-2] * shape[-1]) / r * self.u[k] @ z0 @ T(self.v[k])
      losses += [f(add(theta, z, MU)), f(add(theta, z, -MU))]
      lp, lm = measured[2 * j], measured[2 * j + 1]
      for k in NAMES:
        g[k] += (lp - lm) / (2 * MU) * z[k] / self.q
    return {k: theta[k] - lr * g[k] for k in NAMES}, losses, g_max(g, lr)


class ZOMuonRef:
  """ZO-Muon: Haar P [m, r] every nu steps; q one-sided probes P u_i; g = P NS5(R)."""

  def __init__(self, rank, nu, q, vector_scale):
    self.rank, self.nu, self.q, self.vs, self.p = rank, nu, q, vector_scale, {}

  def step(self, t, fac, theta, f, lr, measured):
    zs, us = [], []
    for i, k in enumerate(NAMES):
      shape = theta[k].shape
      if len(shape) >= 2 and t % self.nu == 0:
        self.p[k] = haar(fac.resampled(i, shape[:-1] + (r_of(shape, self.rank),)))
    for j in range(self.q):
      z, u = {}, {}
      for i, k in enumerate(NAMES):
        shape = theta[k].shape
        if len(shape) < 2:
          z[k] = fac.vector(j, i)
          continue
        r = r_of(shape, self.rank)
        u[k] = T(fac.probe(j, i, shape[:-2] + (shape[-1], r)))  # u_j [r, n]
        z[k] = self.p[k] @ u[k]
      zs.append(z)
      us.append(u)
    losses = [f(theta)] + [f(add(theta, z, MU)) for z in zs]
    coef = [(lj - measured[0]) / MU / self.q for lj in measured[1:]]
    g = {}
    for k in NAMES:
      if theta[k].ndim < 2:
        g[k] = self.vs * sum(c * z[k] for c, z in zip(coef, zs, strict=True))
      else:
        g[k] = self.p[k] @ ns5(sum(c * u[k] for c, u in zip(coef, us, strict=True)))
    return {k: theta[k] - lr * g[k] for k in NAMES}, losses, g_max(g, lr)


def g_max(g, lr):
  return {k: lr * float(np.max(np.abs(v))) for k, v in g.items()}


CASES = {
    "lozo": dict(make=lambda lr, **kw: hz.lozo(lr, mu=MU, rank=RANK, resample_every=2,
                                              seed=SEED, **kw),
                 ref=lambda: LOZORef(RANK, 2, 0.0), lr=0.05, passes=2, tol=TOL_REL),
    "lozo_m": dict(make=lambda lr, **kw: hz.lozo(lr, mu=MU, rank=RANK, resample_every=2,
                                                momentum=0.9, seed=SEED, **kw),
                   ref=lambda: LOZORef(RANK, 2, 0.9), lr=0.05, passes=2, tol=TOL_REL),
    # SubZero is symmetric in the two sides of a matrix: it takes no layout, and its
    # reference runs on the leaves as they are.
    "subzero": dict(make=lambda lr: hz.subzero(lr, mu=MU, rank=RANK, resample_every=3,
                                               num_directions=2, seed=SEED),
                    ref=lambda: SubZeroRef(RANK, 3, 2), lr=0.01, passes=4, tol=TOL_REL),
    "zo_muon": dict(make=lambda lr, **kw: hz.zo_muon(lr, mu=MU, rank=RANK, num_directions=3,
                                                    resample_every=2, vector_scale=0.5,
                                                    seed=SEED, **kw),
                    ref=lambda: ZOMuonRef(RANK, 2, 3, 0.5), lr=0.02, passes=4,
                    tol=TOL_REL_NS),
}

# (method, layout, path). "flax": the params hold kernels [in, out] and the reference runs
# on their transposes, PyTorch's [out, in]; "torch": the params hold [out, in] already.
# "update": tx.update jitted; "lean": the lean train step. A covering set: every method,
# and both layouts and both paths for lozo.py (LOZO and LOZO-M share its layout code) and
# for zo_muon.py; SubZero takes no layout and runs the lean step, which
# test_compositions_follow_the_plain_path matches to the plain one.
REFERENCE_RUNS = [("lozo", "torch", "update"), ("lozo_m", "flax", "lean"),
                  ("zo_muon", "flax", "update"), ("zo_muon", "torch", "lean"),
                  ("subzero", None, "lean")]


def reference_view(theta, layout):
  """The params as the reference holds them: every matrix leaf transposed for "flax"
  (none of the problem's leaves is an embedding table)."""
  if layout != "flax":
    return dict(theta)
  return {k: T(v) if v.ndim >= 2 else v for k, v in theta.items()}


def assert_close_to_reference(params, theta, scale, tol):
  for k in NAMES:
    err = float(np.max(np.abs(np.asarray(params[k]) - theta[k])))
    assert err <= tol * scale[k], (k, err, scale[k])


@pytest.mark.parametrize("name, layout, path", REFERENCE_RUNS)
def test_matches_numpy_reference(name, layout, path):
  """Each step: the library's losses equal the reference's at its own float64 params (up
  to the float32 rounding of mu Z), and, given those measured losses (so that the
  perturbation's rounding does not enter c twice), the update equals the reference's. The
  reference is written PyTorch's way, on weights [out, in] with the factors over their
  rows: with ``layout="flax"`` it runs on the transposes of the library's kernels. Every
  step keeps the state's dtypes and shapes."""
  case = CASES[name]
  params_np, f_np = problem(np)
  _, f_jnp = problem(jnp)
  params = jax.tree.map(jnp.asarray, params_np)
  tx = case["make"](case["lr"]) if layout is None else case["make"](case["lr"], layout=layout)
  state = initial = tx.init(params)
  if path == "update":
    update = jax.jit(tx.update, static_argnames="value_fn")

    def step(p, s):
      u, s = update(None, s, p, value_fn=f_jnp)
      return optax.apply_updates(p, u), s
  else:
    train = hz.make_train_step(tx, lambda p: f_jnp(p), lean=True, restore="exact")

    def step(p, s):
      return train(p, s)[:2]
  keys, last_key = noise_keys(SEED, STEPS)
  f_ref = lambda th: f_np(reference_view(th, layout))  # noqa: E731
  ref, theta, scale = case["ref"](), reference_view(params_np, layout), dict.fromkeys(NAMES, 0.0)
  for t in range(STEPS):
    params, state = step(params, state)
    chex.assert_trees_all_equal_shapes_and_dtypes(state, initial)
    measured = np.asarray(otu.tree_get(state, "losses"))
    center = float(otu.tree_get(state, "loss"))
    if name == "zo_muon":
      measured = np.concatenate([[center], measured])
    fac = Factors(keys[t], reference_view(theta, layout))  # the library's leaves
    theta, losses, size = ref.step(t, fac, theta, f_ref, case["lr"], measured)
    scale = {k: scale[k] + size[k] for k in NAMES}  # the sum of the largest updates
    assert_close_to_reference(params, reference_view(theta, layout), scale, case["tol"])
    np.testing.assert_allclose(measured, losses, rtol=0, atol=LOSS_ATOL)
  assert int(otu.tree_get(state, "forward_passes")) == case["passes"] * STEPS
  assert int(otu.tree_get(state, "count")) == STEPS
  np.testing.assert_array_equal(otu.tree_get(state, "key"), jax.random.key_data(last_key))


def test_float64_params_are_perturbed_in_float64():
  """In float64 a loss is known to ~1e-16 |l|, and the factors are float64 (the leaf's noise
  dtype), so the losses and ``g = c U V^T`` match the reference to ~1e-13 (losses) and r
  eps64 of the summed terms (g). (Factors formed in float32 would be off by ~3e-5.)"""
  params_np, f_np = problem(np)
  _, f_jnp = problem(jnp)
  params = jax.tree.map(jnp.asarray, params_np)
  tx = hz.scale_by_lozo(mu=MU, rank=RANK, seed=SEED)
  g, state = tx.update(None, tx.init(params), params, value_fn=f_jnp)
  keys, _ = noise_keys(SEED, 1)
  theta0 = reference_view(params_np, "flax")
  f_ref = lambda th: f_np(reference_view(th, "flax"))  # noqa: E731
  losses = LOZORef(RANK, 1, 0.0).step(0, Factors(keys[0], params_np), theta0, f_ref, 1.0,
                                      [0.0, 0.0])[1]
  np.testing.assert_allclose(otu.tree_get(state, "losses"), losses, rtol=1e-13)
  theta = LOZORef(RANK, 1, 0.0).step(0, Factors(keys[0], params_np), theta0, f_ref, 1.0,
                                     losses)[0]
  theta = reference_view(theta, "flax")
  for k in NAMES:
    want = params_np[k] - theta[k]
    np.testing.assert_allclose(g[k], want, rtol=0, atol=1e-12 * np.max(np.abs(want)))


# --- compositions: the lean step equals the plain one ------------------------------------

# A covering set: each method, each Optax wrapper and each of the engine's ways with a
# method's products at least once, not their cross product. Fused products (rank <=
# lowrank.FUSED_RANK; LOZO-M's, SubZero's and ZO-Muon's on the lean step are matched in
# test_matches_numpy_reference): LOZO with MultiSteps' conditional update. Above the
# fused rank the engine orders the leaves (Method.serial_products): one update call per
# group of leaves where the rest of the chain treats each leaf alone (injected
# hyperparameters with SubZero, masked leaves with ZO-Muon), one call where it does not
# (Adam's moments with LOZO-M; a global-norm clip and apply_if_finite's guard, which read
# every leaf's estimate, with ZO-Muon).
COMPOSITIONS = {
    "lozo_multi_steps": lambda: optax.MultiSteps(hz.lozo(1e-2, resample_every=2),
                                                 every_k_schedule=2),
    "lozo_m_r32_then_adam": lambda: optax.chain(
        hz.scale_by_lozo(rank=32, momentum=0.9, resample_every=2), optax.adam(1e-2)),
    "subzero_r32_inject_schedule": lambda: optax.inject_hyperparams(
        hz.subzero, static_args=("rank", "num_directions"))(
        learning_rate=optax.cosine_decay_schedule(1e-2, 10), rank=32, num_directions=2,
        resample_every=2),
    "zo_muon_r32_masked": lambda: optax.masked(
        hz.zo_muon(1e-2, rank=32, num_directions=2, resample_every=2, vector_scale=0.1),
        engine.FROZEN),
    "zo_muon_r32_clipped_if_finite": lambda: optax.apply_if_finite(optax.chain(
        hz.scale_by_zo_muon(rank=32, num_directions=2, resample_every=2),
        optax.clip_by_global_norm(1.0), optax.scale(-1e-2)), 3),
}


# Also traced into a user's jit (tests/test_engine.py says why a subset): fused and ordered
# products, momentum, injected hyperparameters, MultiSteps, the leaves ordered in groups
# and in one call.
IN_A_USER_JIT = ("lozo_multi_steps", "lozo_m_r32_then_adam", "subzero_r32_inject_schedule")
assert set(IN_A_USER_JIT) <= set(COMPOSITIONS)


@pytest.mark.parametrize("name", list(COMPOSITIONS))
def test_compositions_follow_the_plain_path(name):
  """lean (top level, and as a lax.scan body in a user's jit) against the plain step, in
  float64 with restore="exact": the same arithmetic in different XLA programs. The float32
  products of the factors may round differently there (another fusion, FMA): ~eps32 =
  1.2e-7 of an update's scale (~1e-2 per element: an absolute 1e-9; measured 4.3e-9 on an
  Adam moment), relative to small elements more: rtol 1e-5, atol 1e-7. A wrong step moves
  the params by ~lr = 1e-2."""
  make = COMPOSITIONS[name]
  reference = engine.run_plain(make())
  tol = dict(rtol=1e-5, atol=1e-7)
  chex.assert_trees_all_close(engine.run(make()), reference, **tol)
  if name in IN_A_USER_JIT:
    chex.assert_trees_all_close(engine.run_scan(make()), reference, **tol)
  moved = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(
      jax.tree.leaves(reference[0]), jax.tree.leaves(engine.mlp()), strict=True))
  assert moved > 1e-5, moved


def test_an_estimate_of_some_leaves_equals_the_full_estimate_there():
  """``ZOCall.leaves`` (the lean engine's call per group of leaves when it orders ZO-Muon's
  products): the estimate of the named leaves as in the full call, zeros elsewhere, and the
  whole new state."""
  tx = hz.zo_muon(1e-2, rank=32, num_directions=2, resample_every=2, vector_scale=0.5)
  params = engine.mlp()
  state = tx.init(params)
  losses = (jnp.asarray(1.0), jnp.asarray([1.1, 0.95]))

  @jax.jit
  def calls(state):
    return (tx.update(None, state, params, zo_call=ZOCall(losses=losses)),
            tx.update(None, state, params, zo_call=ZOCall(losses=losses, leaves=(0, 3))))

  for _ in range(2):  # a step that redraws the projectors, then one that keeps them
    (full, full_state), (some, some_state) = calls(state)
    for i, (a, b) in enumerate(zip(jax.tree.leaves(full), jax.tree.leaves(some),
                                   strict=True)):
      np.testing.assert_array_equal(b, a if i in (0, 3) else np.zeros_like(a))
    chex.assert_trees_all_equal(some_state, full_state)
    assert float(jnp.max(jnp.abs(jax.tree.leaves(full)[0]))) > 0
    state = full_state


# --- compile: the subspace refresh is traced once a step ----------------------------------


def _count(jaxpr, primitive: str) -> int:
  """Equations of ``primitive`` in ``jaxpr`` and in the jaxprs inside its equations
  (loop bodies, branches of a cond, custom rules)."""
  def inner(eqn):
    for v in eqn.params.values():
      for x in v if isinstance(v, (tuple, list)) else (v,):
        if isinstance(x, jax.extend.core.ClosedJaxpr):
          yield x.jaxpr
        elif isinstance(x, jax.extend.core.Jaxpr):
          yield x
  return sum((e.primitive.name == primitive) + sum(_count(j, primitive) for j in inner(e))
             for e in jaxpr.eqns)


@pytest.mark.parametrize("name", ["zo_muon", "zo_muon_serial"])
def test_the_subspace_refresh_is_traced_once_a_step(name):
  # The redrawn subspaces (Gaussians and a QR per matrix) are the method's state as the
  # step reads it (Method.prepare): drawn where each pass read them, they were traced into
  # every pass and into the update, 55 QRs for 5 matrices in ZO-Muon's lean step with
  # ordered leaves, and its first call on MiniLM-L6 took 9x a jitted Adam step's.
  tx = {"zo_muon": lambda: hz.zo_muon(1e-2, rank=4),
        "zo_muon_serial": lambda: hz.zo_muon(1e-2, rank=64)}[name]()  # above FUSED_RANK
  params = {f"l{i}": {"kernel": jnp.full((8, 8), 0.1), "bias": jnp.zeros(8)} for i in range(5)}

  def loss(p, x):
    for i in range(5):
      x = jnp.tanh(x @ p[f"l{i}"]["kernel"] + p[f"l{i}"]["bias"])
    return jnp.mean(x ** 2)

  x, state = jnp.ones((4, 8)), tx.init(params)
  lean = jax.make_jaxpr(hz.make_train_step(tx, loss))(params, state, x).jaxpr
  plain = jax.make_jaxpr(lambda p, s: tx.update(None, s, p, value_fn=lambda q: loss(q, x)))(
      params, state).jaxpr
  assert _count(lean, "qr") == _count(plain, "qr") == 5


# --- memory: the lean step keeps no params-sized temporary --------------------------------

# LOZO-M covers LOZO: the same U V^T in the passes, and a momentum on top.
MEMORY = {
    "lozo_m_r2": lambda: hz.lozo(1e-2, rank=2, momentum=0.9),
    "subzero_r8": lambda: hz.subzero(1e-2, rank=8),
    "zo_muon_r64": lambda: hz.zo_muon(1e-2, rank=64),
}


@pytest.mark.parametrize("name", list(MEMORY))
def test_the_step_keeps_no_params_sized_temporary(name):
  """Compiled temporaries of the lean step beyond a forward pass, in param bytes, at top
  level and traced into a user's donating jit (as tests/test_engine.py measures them), on
  an MLP of four 256 x 256 float32 matrices. What a step may hold beyond the forward pass:
  per matrix its small factors (fresh V [256, r], U [256, r], ZO-Muon's P [256, 64] and R
  [64, 256] = 1/4 of a leaf, the QR's workspace) and scalars. A params-sized buffer (U V^T
  materialised, a perturbed copy) is 1.0; one leaf-sized one 0.25."""
  tx = MEMORY[name]()
  params = engine.mlp((256,) * 5, jnp.float32)
  x = jnp.zeros((8, 256), jnp.float32)
  y = jnp.zeros((8, 256), jnp.float32)
  extra = lean_step_extra(tx, engine.loss_fn, params, x, y)
  # LOZO-M: U V^T is formed inside the passes (0.02-0.03 measured). SubZero's fused
  # rank-8 products (0.17) are all alive at once under XLA:CPU's default scheduler (see the
  # next test and docs/guides/lowrank.md). ZO-Muon at rank 64 forms matmul products (above
  # lowrank.FUSED_RANK, 6x faster on MiniLM) and the engine orders its leaves
  # (Method.serial_products): one leaf's product (0.25) and the factors, 0.55 measured
  # (1.37 with every product alive at once). The bounds pin today's numbers so a
  # regression shows (a QR in every pass, or a restore fused into the update's pass:
  # 0.18-0.23 for SubZero).
  bound = {"subzero_r8": 0.2, "zo_muon_r64": 0.65}.get(name, 0.1)
  assert max(extra.values()) <= bound, extra


# The same measurement in a process whose XLA:CPU uses its memory-minimising scheduler, at
# top level (the scheduler acts on each program alike; the step in a user's jit is bounded
# above under the default one).
_SCHEDULER_CHILD = """
import json, sys
sys.path.insert(0, {root!r})
import jax.numpy as jnp
import hizoo_jax as hz
from tests import test_engine as engine
from tests.helpers import lean_step_extra
params = engine.mlp((256,) * 5, jnp.float32)
x = jnp.zeros((8, 256), jnp.float32)
out = {{name: lean_step_extra(tx, engine.loss_fn, params, x, x,
                              in_a_user_jit=False)["top level"]
        for name, tx in (("subzero_r8", hz.subzero(1e-2, rank=8)),
                         ("zo_muon_r64", hz.zo_muon(1e-2, rank=64)))}}
print(json.dumps(out))
"""


@pytest.mark.slow
def test_cpu_memory_scheduler_keeps_one_product_at_a_time():
  """XLA:CPU's default scheduler is concurrency-optimised: it runs each operation for every
  leaf before the next one, so all the leaves' products are alive together (the numbers
  pinned above). Its memory-minimising scheduler
  (``XLA_FLAGS=--xla_cpu_enable_concurrency_optimized_scheduler=false``; the per-program
  ``compiler_options`` of ``jax.jit`` do not reach it in jaxlib 0.10) consumes each product
  before it forms the next: SubZero then holds its factors only (0.03 measured) and ZO-Muon
  one leaf's product (0.25 here: four leaves) plus its factors (0.37 measured)."""
  env = xla_env("--xla_cpu_enable_concurrency_optimized_scheduler=false", JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", _SCHEDULER_CHILD.format(root=ROOT)], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  extra = json.loads(out.stdout.strip().splitlines()[-1])
  assert extra["subzero_r8"] <= 0.1, extra
  assert extra["zo_muon_r64"] <= 0.45, extra


# --- bfloat16 params ----------------------------------------------------------------------

BF16 = {
    "lozo_m": lambda s: hz.lozo(2e-2, rank=2, momentum=0.9, resample_every=10,
                                mu_resolution=4, seed=s),
    "subzero": lambda s: hz.subzero(2e-2, rank=2, resample_every=10, mu_resolution=4,
                                    seed=s),
    "zo_muon": lambda s: hz.zo_muon(5e-2, rank=2, num_directions=2, resample_every=10,
                                    mu_resolution=4, vector_scale=0.1, seed=s),
}


@pytest.mark.parametrize("name", list(BF16))
def test_bfloat16_params_train_like_float32(name):
  """The task of tests/test_numerics.py (MLP 4-32-2, the loss reduced in float32).

  The factors, their QR / Newton-Schulz and the momentum are float32 state whatever the
  params' dtype. With ``mu_resolution=4`` the applied perturbation is at least 4 ulp of a
  typical param, so rounding it into bfloat16 changes it by at most 1/8 per element and the
  projection ``c`` by ~1/8 / sqrt(elements) (a sum over ~200 elements): the bf16 run follows
  float32's closely (measured: final loss 0.98x-1.03x over 2 seeds). The criterion is the
  project's numerics rule (docs/guides/numerics.md): final loss <= 1.25x float32's, with
  float32 having trained (final <= 0.5x initial) so that the bound is not vacuous."""
  from tests import test_numerics as tn

  x, y = tn.data()
  final = {}
  for dtype in (jnp.float32, jnp.bfloat16):
    params = tn.init(1, dtype)
    tx = BF16[name](1)
    state = tx.init(params)
    for leaf in jax.tree.leaves(otu.tree_get(state, "method")):
      assert leaf.dtype == jnp.float32, leaf.dtype
    step = hz.make_train_step(tx, tn.loss_fn)
    for _ in range(100):
      params, state, _ = step(params, state, x, y)
    assert all(p.dtype == dtype for p in jax.tree.leaves(params))
    for leaf in jax.tree.leaves(otu.tree_get(state, "method")):
      assert leaf.dtype == jnp.float32, leaf.dtype
    final[dtype] = float(tn.loss_fn(jax.tree.map(lambda a: a.astype(jnp.float32), params),
                                    x, y))
  initial = float(tn.loss_fn(tn.init(1, jnp.float32), x, y))
  assert final[jnp.float32] <= 0.5 * initial, (final, initial)
  assert final[jnp.bfloat16] <= 1.25 * final[jnp.float32], final
