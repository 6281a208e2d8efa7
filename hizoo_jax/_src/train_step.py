"""``make_train_step``: a zeroth-order training step as lean as an in-place PyTorch step.

The plain ``tx.update`` must keep the caller's params alive while it evaluates
``f(theta +- mu H^{-1/2} z)``, and XLA will not reuse an entry parameter's buffer for an
intermediate, so inside one executable a perturbed copy of the params always exists.
The lean step instead runs a few small donated executables, each updating the params'
buffers in place, like the reference trainer's ``param.data`` updates::

    l0    = f(theta)                      (HiZOO, on Hessian steps)
    theta = theta + mu H^{-1/2} z         (in place; z regenerated from the key)
    l+    = f(theta)
    theta = theta - 2 mu H^{-1/2} z       (in place)
    l-    = f(theta)
    theta = theta + mu H^{-1/2} z;  updates, state = tx.update(..., zo_losses=(l0, l+, l-))
    theta = theta + updates               (one donated executable: restore, H, g, update)

The last call runs the transformation's own update with the measured losses, so the
estimator, the Hessian EMA and any Optax chain after it are the same code as the plain
path. Only the perturbed params differ: ``theta + mu s z - 2 mu s z + mu s z`` is
``theta`` up to float rounding (see ``restore``).

On a device mesh, pass the params' shardings: every executable then keeps the params and
the optimizer state (sharded like the params, see :func:`hizoo_jax.state_shardings`) on
their shardings, and each device draws the noise of its own shard only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
import optax.tree_utils as otu

from hizoo_jax._src import sharding as shard_lib
from hizoo_jax._src import transform

RESTORE_MODES = ("auto", "inplace", "exact")


def make_train_step(
    tx: optax.GradientTransformationExtraArgs,
    loss_fn: Callable[..., jax.Array],
    *,
    lean: bool | None = None,
    restore: str = "auto",
    donate: bool = True,
    param_shardings: Any = None,
    batch_sharding: Any = None,
) -> Callable[..., tuple[Any, Any, jax.Array]]:
  """Builds ``step(params, opt_state, *batch) -> (params, opt_state, loss)``.

  ``loss_fn(params, *batch)`` returns the scalar loss of a batch. ``params`` and
  ``opt_state`` are donated: their buffers are reused for the outputs, so do not touch the
  arguments after the call. The returned ``loss`` is the one the optimizer recorded for
  the step (``l0`` on HiZOO Hessian steps, else the mean of ``(l+ + l-) / 2``).

  Args:
    tx: a zeroth-order optimizer: ``hz.hizoo``, ``hz.hizoo_l``, ``hz.mezo``, a bare
      ``hz.scale_by_*`` (these support the lean path), or any chain containing one
      (plain path).
    loss_fn: ``loss_fn(params, *batch) -> scalar``.
    lean: use the in-place multi-call step (default: whenever ``tx`` supports it, i.e.
      exposes :class:`hizoo_jax.ZOHooks`, and uses one direction per step; with more
      directions the default falls back to the plain step). ``False``: one jitted
      ``tx.update`` (can be traced into a larger program, but keeps a perturbed copy of
      the params and the estimate alive).
    restore: lean path only. ``"inplace"`` restores ``theta`` by adding the perturbation
      back, like the reference code: no extra memory, but ``theta`` drifts by about one
      ulp (RMS) per step, as a random walk. ``"exact"`` keeps ``theta`` and perturbs into
      one separate buffer (one more params-worth of memory) and reproduces the plain
      update. ``"auto"`` (default): exact if any params leaf is 16-bit, else in place.
      Measured (benchmarks/RESULTS.md): after 300 steps the in-place drift is 1e-6 of
      RMS(theta) in float32 (one update at lr 1e-4 is 4e4 ulp) but 7% in bfloat16 (where
      such an update is 0.6 ulp).
    donate: donate ``params`` and ``opt_state`` to the step.
    param_shardings: a ``NamedSharding`` for all params, or a tree of them shaped like the
      params. The step returns params (and optimizer state, sharded like the params)
      with these shardings. None: whatever the inputs have.
    batch_sharding: a sharding (or a tuple, one per batch argument) the batch is put on
      before the step (e.g. ``NamedSharding(mesh, P("data"))`` for data parallelism).
  """
  if restore not in RESTORE_MODES:
    raise ValueError(f"restore must be one of {RESTORE_MODES}, got {restore!r}")
  hooks = transform.zo_hooks(tx)
  explicit_lean = lean is True
  if lean is None:
    lean = hooks is not None
  if lean and hooks is None:
    raise ValueError(
        "lean=True needs a transformation built by hz.hizoo/hz.hizoo_l/hz.mezo or "
        "hz.scale_by_hizoo/hz.scale_by_zo (they expose tx.update.zo_hooks); use lean=False "
        "for other chains"
    )
  layout = _Layout(param_shardings, batch_sharding)
  if not lean:
    return _plain_step(tx, loss_fn, donate, layout)
  return _lean_step(tx, hooks, loss_fn, restore, donate, layout, explicit=explicit_lean)


class _Layout:
  """Shardings of params, optimizer state and batch (all None without a mesh)."""

  def __init__(self, param_shardings, batch_sharding):
    self.param_shardings = param_shardings
    self.batch_sharding = batch_sharding

  def of(self, params, opt_state):
    """``(param shardings tree, state shardings tree, replicated)`` or Nones."""
    if self.param_shardings is None:
      return None, None, None
    p = shard_lib._as_tree(self.param_shardings, params)
    mesh = shard_lib._mesh_of(p)
    return p, shard_lib.state_shardings(opt_state, params, p), \
        jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

  def put_batch(self, batch):
    if self.batch_sharding is None:
      return batch
    s = self.batch_sharding
    shardings = s if isinstance(s, tuple | list) else (s,) * len(batch)
    return tuple(jax.device_put(b, sh) for b, sh in zip(batch, shardings, strict=True))


def _cached(build):
  """Builds the executables once per (params, state) structure."""
  cache = {}

  def get(params, opt_state):
    key = (jax.tree.structure(params), jax.tree.structure(opt_state))
    if key not in cache:
      cache[key] = build(params, opt_state)
    return cache[key]

  return get


def _plain_step(tx, loss_fn, donate, layout):
  def step(params, opt_state, *batch):
    value_fn = lambda p: loss_fn(p, *batch)
    updates, opt_state = tx.update(None, opt_state, params, value_fn=value_fn)
    params = optax.apply_updates(params, updates)
    return params, opt_state, otu.tree_get(opt_state, "loss")

  donated = (0, 1) if donate else ()

  def build(params, opt_state):
    p_sh, s_sh, rep = layout.of(params, opt_state)
    if p_sh is None:
      return jax.jit(step, donate_argnums=donated)
    return jax.jit(step, donate_argnums=donated, out_shardings=(p_sh, s_sh, rep))

  get = _cached(build)

  def run(params, opt_state, *batch):
    return get(params, opt_state)(params, opt_state, *layout.put_batch(batch))

  run.executable = get
  return run


def _compiler_options() -> dict[str, str]:
  """Per-executable XLA options of the update passes (not the user's forward pass).

  XLA:CPU hands reductions to YNNPACK, whose fusions take materialised operands: for a
  factored (HiZOO-L) leaf that stores the dense H, the noise and the estimate
  (measured: 3x params of temporaries). Keeping YNNPACK for matmuls only lets XLA fuse
  those elementwise producers into the reductions.
  """
  if jax.default_backend() == "cpu":
    return {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"}
  return {}


def _inplace_restore(restore: str, params: Any) -> bool:
  if restore != "auto":
    return restore == "inplace"
  return all(jnp.finfo(jnp.result_type(x)).bits >= 32 for x in jax.tree.leaves(params))


class _LeanExecutables:
  """The jitted passes of the lean step, for one (params, state) structure."""

  def __init__(self, tx, hooks, loss_fn, donate, layout, params, opt_state):
    opts = _compiler_options()
    p_sh, s_sh, rep = layout.of(params, opt_state)
    to_params = {} if p_sh is None else dict(out_shardings=p_sh)
    to_state = {} if s_sh is None else dict(out_shardings=s_sh)
    to_scalar = {} if rep is None else dict(out_shardings=rep)
    donated = (0,) if donate else ()

    def loss(params, *batch):
      return jnp.asarray(loss_fn(params, *batch)).astype(hooks.loss_dtype(params))

    def fwd0(params, opt_state, *batch):
      step = hooks.hessian_step(hooks.locate(opt_state))
      if step is True:
        return loss(params, *batch)
      zero = jnp.zeros((), hooks.loss_dtype(params))
      return jax.lax.cond(step, lambda: loss(params, *batch), lambda: zero)

    def perturb(params, opt_state, coef):
      return hooks.perturb(params, hooks.locate(opt_state), coef)

    def perturb_into(buffer, params, opt_state, coef):
      del buffer  # donated only so that its memory holds the result
      return perturb(params, opt_state, coef)

    def update_params(params, opt_state, l0, lp, lm, inplace):
      if inplace:  # params holds theta - mu s z: add the perturbation back
        params = perturb(params, opt_state, 1.0)
      updates, _ = tx.update(None, opt_state, params, zo_losses=(l0, lp[None], lm[None]))
      return optax.apply_updates(params, updates)

    def update_state(opt_state, params, l0, lp, lm):
      return tx.update(None, opt_state, params, zo_losses=(l0, lp[None], lm[None]))[1]

    self.fwd = jax.jit(loss, **to_scalar)
    self.fwd0 = jax.jit(fwd0, **to_scalar)
    self.perturb_new = jax.jit(perturb, compiler_options=opts, **to_params)
    self.perturb_inplace = jax.jit(perturb, donate_argnums=(0,), compiler_options=opts,
                                   **to_params)
    self.perturb_into = jax.jit(perturb_into, donate_argnums=(0,), compiler_options=opts,
                                **to_params)
    # Two executables, so that each rewrites its own buffers in place: the params update
    # reads the old H (the restore needs it; the new H is an inline value there), then
    # the state update turns the old H into the new one. One executable doing both has to
    # copy the old H first (measured: +1x params of temporaries for HiZOO).
    self.update_params = jax.jit(update_params, donate_argnums=donated, static_argnums=(5,),
                                 compiler_options=opts, **to_params)
    self.update_state = jax.jit(update_state, donate_argnums=donated, compiler_options=opts,
                                **to_state)


def _lean_step(tx, hooks, loss_fn, restore, donate, layout, explicit):
  get = _cached(lambda p, s: _LeanExecutables(tx, hooks, loss_fn, donate, layout, p, s))
  plain = _plain_step(tx, loss_fn, donate, layout)

  def step(params, opt_state, *batch):
    if otu.tree_get(hooks.locate(opt_state), "loss_plus").shape[0] != 1:
      if explicit:
        raise ValueError("the lean step runs one direction per step; use lean=False for more")
      return plain(params, opt_state, *batch)  # HiZOO-multi: one executable
    ex = get(params, opt_state)
    batch = layout.put_batch(batch)
    l0 = ex.fwd0(params, opt_state, *batch) if hooks.hizoo else jnp.zeros((), jnp.float32)
    inplace = _inplace_restore(restore, params)
    if inplace:
      if not donate:
        params = jax.tree.map(jnp.copy, params)
      params = ex.perturb_inplace(params, opt_state, 1.0)
      lp = ex.fwd(params, *batch)
      params = ex.perturb_inplace(params, opt_state, -2.0)
      lm = ex.fwd(params, *batch)
    else:
      work = ex.perturb_new(params, opt_state, 1.0)
      lp = ex.fwd(work, *batch)
      work = ex.perturb_into(work, params, opt_state, -1.0)
      lm = ex.fwd(work, *batch)
      del work
    params = ex.update_params(params, opt_state, l0, lp, lm, inplace)
    opt_state = ex.update_state(opt_state, params, l0, lp, lm)
    return params, opt_state, otu.tree_get(opt_state, "loss")

  step.executables = get  # step.executables(params, state): the jitted passes, to inspect
  return step
