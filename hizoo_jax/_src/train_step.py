"""``make_train_step``: the zeroth-order step engine, as lean as an in-place PyTorch step.

The plain ``tx.update`` must keep the caller's params alive while it evaluates
``f(theta +- mu H^{-1/2} z)``, and XLA will not reuse an entry parameter's buffer for an
intermediate, so inside one plain update a perturbed copy of the params always exists
(plus, for HiZOO, the estimate). The engine instead perturbs the params themselves, like
the reference trainer's ``param.data`` updates::

    l0    = f(theta)                      (HiZOO, on Hessian steps)
    theta = theta + mu H^{-1/2} z         (in place; z regenerated from the state's key)
    l+    = f(theta)
    theta = theta - 2 mu H^{-1/2} z       (in place)
    l-    = f(theta)
    theta = theta + mu H^{-1/2} z         (in place: theta again, up to rounding)
    updates, state = tx.update(zeros, state, theta, zo_call=ZOCall(losses=(l0, l+, l-)))
    theta = theta + updates

The last call runs the whole optimizer's own ``update`` with the measured losses, so the
estimator, the Hessian EMA and any Optax chain or wrapper around the ZO transform are the
same code as the plain path; only the perturbed params differ (``restore``).

**The exact restore** (the default for 16-bit params) never moves theta: each measuring
pass evaluates ``f(theta + c mu H^{-1/2} z)`` with the sum formed inside the evaluation,
leaf by leaf, and no conditional around it (XLA materialises a conditional's operands
whole). XLA then forms each perturbed leaf where the forward pass reads it (fused into
the read where it can, e.g. the upcast of a bfloat16 weight for the CPU's dot), so no
perturbed copy of the params exists and the losses and the update are the plain
``tx.update``'s, bit for bit. What XLA holds beyond the forward pass is the perturbed
leaves it forms ahead of their reader: 0.001 params-worth on the 1.1B bfloat16 decoder
(benchmarks/RESULTS.md); on a forward pass that XLA:CPU fuses whole (YNNPACK's fusion of a
small MLP's dots) or schedules for concurrency, up to about a params-worth.

**Passes over the params.** Each move regenerates the noise of every parameter and reads
and writes all of them; with the small batches of zeroth-order fine-tuning these passes
cost as much as the forward passes. So the restoring move runs in the update's own pass
(XLA fuses ``theta - mu z + updates`` into one loop per leaf: MeZO makes 3 passes, not 4),
except for a method whose restore reads a state the update rewrites in place (HiZOO's
dense ``H``: one pass would keep a copy of the old ``H``; SubZero, ZO-Muon: one more
low-rank product). With one-sided probes (FZOO) each probe's restore joins the next
probe's move: ``N`` passes for ``N`` probes, not ``2N`` (:func:`_schedule`). The
trajectories are those of separate passes, bit for bit: every move is still rounded to
the params' dtype in the same order.

**Finding the ZO transform.** ``tx`` may be a bare ``scale_by_*``, an alias, a preset, a
chain, ``optax.inject_hyperparams``, ``optax.MultiSteps``, ``optax.masked`` or
``optax.multi_transform`` around one. The engine traces
``tx.update(..., zo_call=ZOCall(probe=p))``: the ZO transform records its static spec
(sampler, clip, the mask of the params it sees) in ``p`` and returns its state with the
hyperparameters in effect (``mu``, possibly injected or scheduled), which every wrapper
passes through. The engine picks that state out of the result by its type. XLA drops the
rest of the probe as dead code.

**One program.** At top level the step is one jitted executable with the params and the
optimizer state donated; called inside a user's ``jit``, ``lax.scan`` or ``nnx.jit`` the
same function traces into the caller's program. Either way the passes run in a
``lax.fori_loop`` with the params in the loop carry, which XLA rewrites in place: the step
allocates no params-sized temporary beyond what the forward pass itself needs (measured
for every composition above, at top level and inside a user's ``jit``:
benchmarks/RESULTS.md). ``lean=False``, several directions per step, or several ZO
transforms run the plain jitted ``tx.update`` instead.

**Compile time.** A step touches every leaf four times (l0 aside), so a model with
hundreds of tensors would compile hundreds of copies of the noise's ops. The noise is
drawn per group of leaves of one shape (:class:`hizoo_jax._src.sampling.DirectionWords`),
and the leaves' key words are run-time data, so the program holds the noise once per leaf
shape and XLA compiles one kernel per shape (200 tensors: from 11x to about 3x the first
call of a first-order Adam step, benchmarks/RESULTS.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.extend.core
import jax.numpy as jnp
import optax

from hizoo_jax._src import sharding as shard_lib
from hizoo_jax._src.engine import locate, passes

RESTORE_MODES = ("auto", "inplace", "exact")
"""The values of :func:`hizoo_jax.make_train_step`'s ``restore`` option."""


def _is_traced(tree) -> bool:
  return any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(tree))


def make_train_step(
    tx: optax.GradientTransformationExtraArgs,
    loss_fn: Callable[..., Any],
    *,
    has_aux: bool = False,
    lean: bool | None = None,
    restore: str = "auto",
    donate: bool = True,
    param_shardings: Any = None,
    batch_sharding: Any = None,
    batch_probes: bool = False,
) -> Callable[..., tuple]:
  """Builds ``step(params, opt_state, *batch) -> (params, opt_state, loss)``.

  ``loss_fn(params, *batch)`` returns the scalar loss of a batch. At top level the step is
  jit-compiled with ``params`` and ``opt_state`` donated (their buffers are reused for the
  outputs: do not touch the arguments after the call). Called inside a user's ``jax.jit``,
  ``lax.scan`` or ``nnx.jit`` it traces into the caller's program as one lean pass. The
  returned ``loss`` is the one the optimizer recorded for the step (``l0`` on HiZOO
  Hessian steps, else the mean of ``(l+ + l-) / 2``).

  Args:
    tx: any optimizer containing one zeroth-order transform: ``hz.hizoo``, ``hz.hizoo_l``,
      ``hz.mezo``, ``hz.presets.*``, a bare ``hz.scale_by_*``, or a chain,
      ``optax.inject_hyperparams``, ``optax.MultiSteps``, ``optax.masked``,
      ``optax.multi_transform`` or ``optax.apply_if_finite`` around one. An optimizer
      without one raises ValueError (at build time when a one-leaf stand-in can tell).
    loss_fn: ``loss_fn(params, *batch) -> scalar`` (``-> (scalar, aux)`` with ``has_aux``).
    has_aux: ``loss_fn`` returns ``(loss, aux)``; the step then returns ``(params,
      opt_state, loss, aux)`` with ``aux`` the mean of the two perturbed evaluations'
      ``aux`` (floating leaves; other leaves from ``theta + mu z``), like the logged loss of
      MeZO. Needs the lean step (one direction per step).
    lean: None (default): the lean engine whenever it applies (one direction per step, one
      ZO transform) and pays, else the plain step. It does not pay with a sampler that
      does not fuse into the elementwise passes (anything but ``hz.fast_gaussian``, e.g.
      ``hz.gaussian``): that sampler's noise is materialised in every pass, and the plain
      step holds less (unless ``has_aux``, which needs the lean engine). ``False``: always
      the plain step, one jitted ``tx.update`` (keeps a perturbed copy of the params and the
      estimate alive).
      ``True``: the lean engine, or an error where it does not apply.
    restore: ``"exact"`` never writes a perturbed value into ``theta``: each measuring
      pass forms ``theta + c mu D`` leaf by leaf where the forward pass reads it, so the
      step is the plain update bit for bit and holds no perturbed copy of the params (a
      perturbed leaf at a time, or the few leaves XLA forms ahead of their reader; on
      the 1.1B bfloat16 decoder 0.001 params-worth beyond the forward pass's, compiled).
      ``"inplace"`` moves ``theta`` itself and adds the perturbation back, like the
      reference code: nothing leaf-sized beyond the forward pass's, but ``theta`` drifts
      by about one ulp (RMS) per step, as a random walk. ``"auto"`` (default): exact if
      any params leaf is 16-bit, else in place. Measured (benchmarks/RESULTS.md): after
      300 steps the in-place drift is 1e-6 of RMS(theta) in float32 but 7% in bfloat16.
    donate: donate ``params`` and ``opt_state`` to the top-level step.
    param_shardings: a ``NamedSharding`` for all params, or a tree of them shaped like the
      params. The step returns params (and optimizer state, sharded like the params)
      with these shardings. None: whatever the inputs have.
    batch_sharding: a sharding (or a tuple, one per batch argument) the batch is put on
      before the step (e.g. ``NamedSharding(mesh, P("data"))`` for data parallelism).
    batch_probes: evaluate every perturbed point of the step in one batched forward pass
      (``jax.vmap`` over the probes) instead of one after the other. For methods with
      several independent probes (FZOO, ZO-Muon, MeZO with ``num_directions``) on an
      accelerator, where a small-batch forward pass leaves the device mostly idle. It
      holds ``N`` perturbed copies of the trainable params (``N``: the measuring passes
      of a step; cheap for LoRA, ``N`` params-worth for full fine-tuning), and the
      losses are those of ``restore="exact"`` (each point is built from ``theta``).
  """
  if restore not in RESTORE_MODES:
    raise ValueError(f"restore must be one of {RESTORE_MODES}, got {restore!r}")
  locate.check_buildable(tx)
  layout = _Layout(param_shardings, batch_sharding)
  donated = (0, 1) if donate else ()
  plain = passes.plain_fn(tx, loss_fn, has_aux)
  if batch_probes and lean is False:
    raise ValueError("batch_probes=True runs the lean engine; it cannot be combined with "
                     "lean=False")
  fused = passes.lean_step_fn(tx, loss_fn, has_aux, restore,
                         fused_noise_only=lean is None and not has_aux and not batch_probes,
                         batch_probes=batch_probes)

  def traced_step(params, opt_state, *batch):
    locate.warn_multisteps_around_zo(opt_state)  # at trace time: once per compiled step
    if lean is False:
      return plain(params, opt_state, *batch)
    if lean is True:
      if locate.locate(tx, params, opt_state) is None:
        raise ValueError(_NOT_LEAN)
    return fused(params, opt_state, *batch)

  def build(params, opt_state):
    p_sh, s_sh, rep = layout.of(params, opt_state)
    outs = None if p_sh is None else (p_sh, s_sh, rep) + ((None,) if has_aux else ())
    jit_kw = {} if outs is None else dict(out_shardings=outs)
    info = locate.static_info(tx, params, opt_state)
    if not info["found"]:
      raise locate.NoZOTransformError(locate.NO_ZO)
    if lean is True and not info["lean"]:
      raise ValueError(_NOT_LEAN)
    return jax.jit(traced_step, donate_argnums=donated, **jit_kw)

  get = _cached(build)

  def step(params, opt_state, *batch):
    if _is_traced((params, opt_state, batch)):
      return traced_step(params, opt_state, *batch)
    return get(params, opt_state)(params, opt_state, *layout.put_batch(batch))

  def lower(params, opt_state, *batch):
    """The top-level step lowered for these arguments (``.compile().memory_analysis()``,
    ``.as_text()``), as ``jax.jit(...).lower``."""
    return get(params, opt_state).lower(params, opt_state, *layout.put_batch(batch))

  step.lower = lower
  return step


_NOT_LEAN = ("lean=True needs one zeroth-order transform with one direction per step; use "
             "lean=None (falls back to the plain step) or lean=False")


class _Layout:
  """Shardings of params, optimizer state and batch (all None without a mesh)."""

  def __init__(self, param_shardings, batch_sharding):
    self.param_shardings = param_shardings
    self.batch_sharding = batch_sharding

  def of(self, params, opt_state):
    """``(param shardings tree, state shardings tree, replicated)`` or Nones."""
    if self.param_shardings is None:
      return None, None, None
    p = shard_lib.as_tree(self.param_shardings, params)
    mesh = shard_lib.mesh_of(p)
    return p, shard_lib.state_shardings(opt_state, params, p), \
        jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

  def put_batch(self, batch):
    if self.batch_sharding is None:
      return batch
    s = self.batch_sharding
    shardings = s if isinstance(s, tuple | list) else (s,) * len(batch)
    return tuple(jax.device_put(b, sh) for b, sh in zip(batch, shardings, strict=True))


def _cached(build):
  """Builds the step once per (params, state) structure."""
  cache = {}

  def get(params, opt_state):
    key = (jax.tree.structure(params), jax.tree.structure(opt_state),
           tuple((jnp.shape(x), jnp.result_type(x)) for x in jax.tree.leaves(params)))
    if key not in cache:
      cache[key] = build(params, opt_state)
    return cache[key]

  return get
