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
    updates, state = tx.update(zeros, state, theta, zo_losses=(l0, l+, l-))
    theta = theta + updates

The last call runs the whole optimizer's own ``update`` with the measured losses, so the
estimator, the Hessian EMA and any Optax chain or wrapper around the ZO transform are the
same code as the plain path; only the perturbed params differ (``restore``).

**Finding the ZO transform.** ``tx`` may be a bare ``scale_by_*``, an alias, a preset, a
chain, ``optax.inject_hyperparams``, ``optax.MultiSteps``, ``optax.masked`` or
``optax.multi_transform`` around one. The engine traces ``tx.update(..., zo_probe=p)``:
the ZO transform records its static spec (sampler, clip, the mask of the params it sees)
in ``p`` and returns its state with the hyperparameters in effect (``mu``, possibly
injected or scheduled), which every wrapper passes through. The engine picks that state
out of the result by its type. XLA drops the rest of the probe as dead code.

**Three ways to run it.**

* *Several executables* (top level, large models): each pass above is its own donated
  executable, so the params are rewritten in place and no params-sized temporary exists
  (measured: 0.1-0.2 param bytes over a forward pass, benchmarks/RESULTS.md).
* *One executable* (top level, models under ``ONE_EXECUTABLE_BYTES``; and always when the
  step is traced inside a user's ``jit``, ``lax.scan`` or ``nnx.jit``): the passes run in
  a ``lax.fori_loop`` over the coefficients ``(+1, -2, +1)`` with the params in the loop
  carry, which XLA updates in place: about one params-sized buffer of temporaries.
* *Plain* (``lean=False``, several directions per step, or several ZO transforms): one
  jitted ``tx.update``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from hizoo_jax._src import config as cfg
from hizoo_jax._src import estimator as est
from hizoo_jax._src import sampling, transform
from hizoo_jax._src import sharding as shard_lib

RESTORE_MODES = ("auto", "inplace", "exact")
EXECUTABLES = ("auto", "one", "several")

ONE_EXECUTABLE_BYTES = 1 << 21
"""Below this many param bytes (2 MiB) the default top-level step is one executable.

One call per step instead of six or seven: on a 26k-parameter MLP the several-executables
step takes 2.0x (MeZO) and 1.2x (HiZOO) the one-executable step's time. From about 0.5M
float32 params on, the several executables are as fast or faster (measured several / one:
0.98 and 1.13 at 0.5M params, 0.93 and 0.61 at 2.1M, 0.82 and 0.82 at 12.6M; MeZO and HiZOO,
256 rows), and they need no params-sized temporary.
"""


# ----------------------------------------------------------------------------------------
# Finding the ZO transform inside any composition.


class _Probe:
  """Collects the static specs of the ZO transforms an update call reaches."""

  def __init__(self):
    self.found: list[tuple[cfg.ZOSpec, Any, tuple[bool, ...]]] = []

  def record(self, spec: cfg.ZOSpec, params_view: Any) -> None:
    leaves, view_def = jax.tree.flatten(params_view, is_leaf=transform.is_masked_node)
    mask = tuple(not transform.is_masked_node(x) for x in leaves)
    entry = (spec, view_def, mask)
    if entry not in self.found:  # MultiSteps traces its inner update twice
      self.found.append(entry)


class NoZOTransformError(ValueError):
  """``make_train_step`` was given an optimizer without a zeroth-order transform."""


@dataclasses.dataclass(frozen=True)
class _Located:
  """The one ZO transform of ``tx``: its spec, its state now, and its view of the params."""

  spec: cfg.ZOSpec
  state: Any
  view_def: Any
  mask: tuple[bool, ...]

  def view(self, params):
    """The params as the ZO transform sees them (``MaskedNode`` at frozen leaves)."""
    parts = self.view_def.flatten_up_to(params)
    return self.view_def.unflatten(
        [p if keep else optax.MaskedNode() for p, keep in zip(parts, self.mask, strict=True)])

  def merge(self, params, view):
    parts = self.view_def.flatten_up_to(params)
    new = self.view_def.flatten_up_to(view)
    return self.view_def.unflatten(
        [n if keep else p for p, n, keep in zip(parts, new, self.mask, strict=True)])

  @property
  def num_directions(self) -> int:
    return int(self.state.loss_plus.shape[0])

  @property
  def mu(self):
    return self.state.mu

  def hessian_step(self):
    if not self.spec.hizoo:
      return jnp.asarray(False)
    return (self.state.count % self.state.hessian_every) == 0

  def perturb(self, params, coef, after=()):
    """``params`` with the selected leaves moved by ``coef * mu * H^{-1/2} z``.

    ``after``: values the noise is ordered after (see :func:`sampling.tie`); inside a loop,
    the loop index, so that XLA regenerates the noise in each iteration's fused pass
    instead of hoisting the loop-invariant ``mu H^{-1/2} z`` out of the loop into a
    params-sized buffer.
    """
    st = self.state
    key = jax.random.wrap_key_data(st.key, impl=self.spec.key_impl)
    noise_key, _ = sampling.split_state_key(key)
    dkey = sampling.tie(sampling.direction_key(noise_key, 0), after)
    hessian = st.hessian if self.spec.hizoo else None
    if hessian is not None and jax.tree.leaves(after):  # H^{-1/2} is loop-invariant too
      hessian, _ = jax.lax.optimization_barrier((hessian, after))
    step = jnp.asarray(coef, st.mu.dtype) * st.mu
    view = est.perturb(self.spec, self.view(params), hessian, dkey, step)
    return self.merge(params, view)


def _zeros_like(params):
  return jax.tree.map(jnp.zeros_like, params)


def _probe(tx, params, opt_state) -> tuple[list, list]:
  probe = _Probe()
  _, probed = tx.update(_zeros_like(params), opt_state, params, zo_probe=probe)
  states = [x for x in jax.tree.leaves(probed, is_leaf=transform.is_zo_state)
            if transform.is_zo_state(x)]
  return probe.found, states


def _locate(tx, params, opt_state) -> _Located | None:
  """The one ZO transform in ``tx``; None if there are several; raises if there is none."""
  found, states = _probe(tx, params, opt_state)
  if not found:
    raise NoZOTransformError(_NO_ZO)
  if len(found) != 1 or len(states) != 1:
    return None
  spec, view_def, mask = found[0]
  return _Located(spec, states[0], view_def, mask)


_NO_ZO = (
    "make_train_step needs an optimizer containing a zeroth-order transform (hz.hizoo, "
    "hz.hizoo_l, hz.mezo, hz.presets.*, hz.scale_by_hizoo/scale_by_zo, or a chain or "
    "wrapper around one); for first-order optimizers use jax.grad and tx.update")


def _static_info(tx, params, opt_state) -> dict[str, Any]:
  """What the probe finds, without running anything: ``found`` (the specs), ``states``
  (how many ZO states) and ``lean`` (whether the lean engine applies)."""
  info: dict[str, Any] = {}

  def trace(p, s):
    found, states = _probe(tx, p, s)
    info.update(found=found, states=len(states),
                lean=len(found) == 1 and len(states) == 1 and states[0].loss_plus.shape[0] == 1)

  jax.eval_shape(trace, params, opt_state)
  return info


def _check_buildable(tx) -> None:
  """Refuses an optimizer without a ZO transform when it can tell at build time.

  It traces ``init`` and a probe ``update`` on a one-leaf stand-in for the params. An
  optimizer that cannot run on that stand-in (e.g. a mask tree for specific params) is
  checked at its first step instead.
  """
  dummy = {"x": jax.ShapeDtypeStruct((2,), jnp.float32)}
  try:
    state = jax.eval_shape(tx.init, dummy)
    info = _static_info(tx, dummy, state)
  except Exception:  # noqa: BLE001 - the stand-in does not fit this optimizer
    return
  if not info["found"]:
    raise NoZOTransformError(_NO_ZO)


# ----------------------------------------------------------------------------------------
# The losses.


class _Loss:
  """``loss_fn`` evaluated with the checks of ``tx.update``, with or without aux."""

  def __init__(self, loss_fn, has_aux, dtype):
    self.loss_fn, self.has_aux, self.dtype = loss_fn, has_aux, dtype

  def __call__(self, params, *batch):
    out = self.loss_fn(params, *batch)
    if self.has_aux:
      if not (isinstance(out, tuple) and len(out) == 2):
        raise ValueError("has_aux=True: loss_fn must return a (loss, aux) pair")
      loss, aux = out
    else:
      loss, aux = out, None
    return est.check_loss(loss, "loss_fn").astype(self.dtype), aux

  def zeros(self, params, *batch):
    """A zero loss and aux of the right shapes (the not-taken branch of a cond)."""
    shapes = jax.eval_shape(self, params, *batch)
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def _mean_aux(a, b):
  """The mean of two aux trees: floating leaves averaged, others taken from ``a``."""
  def one(x, y):
    if jnp.issubdtype(jnp.result_type(x), jnp.inexact):
      return (x + y) / 2
    return x
  return jax.tree.map(one, a, b)


def _final_update(tx, params, opt_state, losses):
  """``theta + updates`` and the new state, with no params- or state-sized temporary.

  The update of the params reads the old state (e.g. HiZOO's old H, which the perturbation
  used, and the new H, computed inline from it); the state update overwrites the old
  state. Computed in that order, one after the other (the barrier), each can write its
  outputs over its inputs' donated buffers; computed together XLA keeps a copy of the old
  state for the params' update (measured: 1.0 param bytes of temporaries for HiZOO). The
  state update still gets the pre-update ``theta`` (a transform whose state depends on
  the params gets the right ones; when none reads them XLA keeps no copy).
  """
  kw = dict(zo_losses=losses, value_params=params)
  updates, _ = tx.update(_zeros_like(params), opt_state, params, **kw)
  new_params = optax.apply_updates(params, updates)
  opt_state, new_params = jax.lax.optimization_barrier((opt_state, new_params))
  _, new_state = tx.update(_zeros_like(params), opt_state, params, **kw)
  return new_params, new_state


def _state_reads_params(tx, params, opt_state) -> bool:
  """Whether the state ``tx.update`` returns depends on the params' values.

  For ZO transforms and the usual chains after them (moments, schedules, weight decay in
  the updates) it does not, and the state can be updated from any params of the right
  shapes. Found by dead-code elimination of the traced update.
  """
  from jax._src.interpreters import partial_eval as pe  # noqa: PLC0415

  dtype = est.loss_dtype(params)
  zero, one = jnp.zeros((), dtype), jnp.zeros((1,), dtype)
  closed = jax.make_jaxpr(
      lambda p, s: tx.update(_zeros_like(p), s, p, zo_losses=(zero, one, one),
                             value_params=p)[1])(params, opt_state)
  n_params = len(jax.tree.leaves(params))
  _, used = pe.dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars))
  return any(used[:n_params])


def _logged_loss(opt_state):
  """The loss the (first) ZO state recorded for the step."""
  states = [x for x in jax.tree.leaves(opt_state, is_leaf=transform.is_zo_state)
            if transform.is_zo_state(x)]
  return states[0].loss


def _outputs(params, opt_state, aux, has_aux, loss=None):
  # A copy: the state's own field is donated with the state at the next step.
  loss = jnp.copy(_logged_loss(opt_state)) if loss is None else loss
  return (params, opt_state, loss, aux) if has_aux else (params, opt_state, loss)


# ----------------------------------------------------------------------------------------
# The steps.


def _one_pass_step(tx, loss_fn, has_aux, restore):
  """The lean step as one traceable function (one executable when jitted)."""

  def step(params, opt_state, *batch):
    loc = _locate(tx, params, opt_state)
    if loc is None or loc.num_directions != 1:
      return _plain_fn(tx, loss_fn, has_aux)(params, opt_state, *batch)
    f = _Loss(loss_fn, has_aux, est.loss_dtype(params))
    zero = f.zeros(params, *batch)
    measure_l0 = loc.hessian_step() if loc.spec.hizoo else jnp.asarray(False)
    if _inplace_restore(restore, params):
      # One loop over the coefficients (0, +1, -2, +1): l0 at theta (HiZOO's Hessian
      # steps), l+, l-, then the restore, which evaluates nothing. The params live in the
      # loop carry and are rewritten in place. The optimizer state rides in the carry too
      # and the noise is tied to the loop index: otherwise XLA hoists the loop-invariant
      # mu H^{-1/2} z out of the loop into a params-sized buffer and copies H around the
      # loop (measured: 1.0 and 2.2 param bytes of temporaries for MeZO and HiZOO).
      # MeZO has no l0 and starts at +1.
      start = 0 if loc.spec.hizoo else 1
      coefs = jnp.asarray([0.0, 1.0, -2.0, 1.0], jnp.float32)

      def body(i, carry):
        p, s, l0, plus, minus = carry
        p = _locate(tx, p, s).perturb(p, coefs[i], after=i)
        run = ((i == 0) & measure_l0) | (i == 1) | (i == 2)
        out = jax.lax.cond(run, lambda: f(p, *batch), lambda: zero)
        pick = lambda k, old: jax.tree.map(lambda n, o: jnp.where(i == k, n, o), out, old)  # noqa: E731
        return p, s, pick(0, l0), pick(1, plus), pick(2, minus)

      params, opt_state, l0, plus, minus = jax.lax.fori_loop(
          start, 4, body, (params, opt_state, zero, zero, zero))
      params, opt_state = jax.lax.optimization_barrier((params, opt_state))
      l0 = l0[0]
    else:
      l0 = jax.lax.cond(measure_l0, lambda: f(params, *batch), lambda: zero)[0]
      plus = f(loc.perturb(params, 1.0), *batch)
      minus = f(loc.perturb(params, -1.0), *batch)
    losses = (l0, plus[0][None], minus[0][None])
    params, opt_state = _final_update(tx, params, opt_state, losses)
    aux = _mean_aux(plus[1], minus[1]) if has_aux else None
    return _outputs(params, opt_state, aux, has_aux)

  return step


def _plain_fn(tx, loss_fn, has_aux):
  def step(params, opt_state, *batch):
    if has_aux:
      raise ValueError(
          "has_aux=True needs the lean step (one direction per step and one zeroth-order "
          "transform); this optimizer runs the plain tx.update, which cannot return aux")
    value_fn = lambda p: loss_fn(p, *batch)
    updates, opt_state = tx.update(_zeros_like(params), opt_state, params, value_fn=value_fn,
                                   value_params=params)
    params = optax.apply_updates(params, updates)
    return _outputs(params, opt_state, None, False)

  return step


def _inplace_restore(restore: str, params: Any) -> bool:
  if restore != "auto":
    return restore == "inplace"
  return all(jnp.finfo(jnp.result_type(x)).bits >= 32 for x in jax.tree.leaves(params))


def _param_bytes(params) -> int:
  return sum(int(np.prod(jnp.shape(x))) * jnp.result_type(x).itemsize
             for x in jax.tree.leaves(params))


def _is_traced(tree) -> bool:
  return any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(tree))


def make_train_step(
    tx: optax.GradientTransformationExtraArgs,
    loss_fn: Callable[..., Any],
    *,
    has_aux: bool = False,
    lean: bool | None = None,
    executables: str = "auto",
    restore: str = "auto",
    donate: bool = True,
    param_shardings: Any = None,
    batch_sharding: Any = None,
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
      ZO transform), else the plain step. ``False``: always the plain step, one jitted
      ``tx.update`` (keeps a perturbed copy of the params and the estimate alive).
      ``True``: the lean engine, or an error where it does not apply.
    executables: top-level lean step only. ``"several"``: each pass its own donated
      executable (no params-sized temporary; six or seven calls per step). ``"one"``: one
      executable (about one params-sized temporary; one call). ``"auto"``: one below
      :data:`ONE_EXECUTABLE_BYTES` of params, else several. A traced step is always one.
    restore: ``"inplace"`` restores ``theta`` by adding the perturbation back, like the
      reference code: no extra memory, but ``theta`` drifts by about one ulp (RMS) per
      step, as a random walk. ``"exact"`` keeps ``theta`` and perturbs a separate buffer
      (one more params-worth of memory) and reproduces the plain update. ``"auto"``
      (default): exact if any params leaf is 16-bit, else in place. Measured
      (benchmarks/RESULTS.md): after 300 steps the in-place drift is 1e-6 of RMS(theta) in
      float32 but 7% in bfloat16.
    donate: donate ``params`` and ``opt_state`` to the top-level step.
    param_shardings: a ``NamedSharding`` for all params, or a tree of them shaped like the
      params. The step returns params (and optimizer state, sharded like the params)
      with these shardings. None: whatever the inputs have.
    batch_sharding: a sharding (or a tuple, one per batch argument) the batch is put on
      before the step (e.g. ``NamedSharding(mesh, P("data"))`` for data parallelism).
  """
  if restore not in RESTORE_MODES:
    raise ValueError(f"restore must be one of {RESTORE_MODES}, got {restore!r}")
  if executables not in EXECUTABLES:
    raise ValueError(f"executables must be one of {EXECUTABLES}, got {executables!r}")
  _check_buildable(tx)
  layout = _Layout(param_shardings, batch_sharding)
  donated = (0, 1) if donate else ()
  plain = _plain_fn(tx, loss_fn, has_aux)
  fused = _one_pass_step(tx, loss_fn, has_aux, restore)

  def traced_step(params, opt_state, *batch):
    if lean is False:
      return plain(params, opt_state, *batch)
    if lean is True:
      loc = _locate(tx, params, opt_state)
      if loc is None or loc.num_directions != 1:
        raise ValueError(_NOT_LEAN)
    return fused(params, opt_state, *batch)

  def build(params, opt_state):
    p_sh, s_sh, rep = layout.of(params, opt_state)
    outs = None if p_sh is None else (p_sh, s_sh, rep) + ((None,) if has_aux else ())
    jit_kw = {} if outs is None else dict(out_shardings=outs)
    info = _static_info(tx, params, opt_state)
    if not info["found"]:
      raise NoZOTransformError(_NO_ZO)
    located = info["lean"]
    several = (
        lean is not False and located
        and (executables == "several"
             or (executables == "auto" and _param_bytes(params) >= ONE_EXECUTABLE_BYTES)))
    if several:
      return _Several(tx, loss_fn, has_aux, restore, donate, layout, params, opt_state,
                      hizoo=info["found"][0][0].hizoo)
    if lean is True and not located:
      raise ValueError(_NOT_LEAN)
    return jax.jit(traced_step, donate_argnums=donated, **jit_kw)

  get = _cached(build)

  def step(params, opt_state, *batch):
    if _is_traced((params, opt_state, batch)):
      return traced_step(params, opt_state, *batch)
    return get(params, opt_state)(params, opt_state, *layout.put_batch(batch))

  step.executables = get  # step.executables(params, state): what runs for that structure
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
  """Builds the step once per (params, state) structure."""
  cache = {}

  def get(params, opt_state):
    key = (jax.tree.structure(params), jax.tree.structure(opt_state),
           tuple((jnp.shape(x), jnp.result_type(x)) for x in jax.tree.leaves(params)))
    if key not in cache:
      cache[key] = build(params, opt_state)
    return cache[key]

  return get


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


class _Several:
  """The lean step as several donated executables (top level only)."""

  def __init__(self, tx, loss_fn, has_aux, restore, donate, layout, params, opt_state, hizoo):
    opts = _compiler_options()
    p_sh, s_sh, rep = layout.of(params, opt_state)
    to_params = {} if p_sh is None else dict(out_shardings=p_sh)
    to_both = {} if p_sh is None else dict(out_shardings=(p_sh, s_sh, rep))
    to_state = {} if s_sh is None else dict(out_shardings=(s_sh, rep))
    self.has_aux = has_aux
    self.donate = donate
    self.inplace = _inplace_restore(restore, params)
    f = _Loss(loss_fn, has_aux, est.loss_dtype(params))

    def fwd0(params, opt_state, *batch):
      loc = _locate(tx, params, opt_state)
      zero = f.zeros(params, *batch)
      return jax.lax.cond(loc.hessian_step(), lambda: f(params, *batch), lambda: zero)[0]

    def perturb(params, opt_state, coef):
      return _locate(tx, params, opt_state).perturb(params, coef)

    def perturb_into(buffer, params, opt_state, coef):
      del buffer  # donated only so that its memory holds the result
      return perturb(params, opt_state, coef)

    def update(params, opt_state, l0, lp, lm):
      params, opt_state = _final_update(tx, params, opt_state, (l0, lp[None], lm[None]))
      return params, opt_state, jnp.copy(_logged_loss(opt_state))

    def update_params(params, opt_state, l0, lp, lm, restore_first=False):
      if restore_first:  # params hold theta - mu s z: add it back, fused into this pass
        params = perturb(params, opt_state, 1.0)
      kw = dict(zo_losses=(l0, lp[None], lm[None]), value_params=params)
      updates, _ = tx.update(_zeros_like(params), opt_state, params, **kw)
      return optax.apply_updates(params, updates)

    def update_state(opt_state, params, l0, lp, lm):
      kw = dict(zo_losses=(l0, lp[None], lm[None]), value_params=params)
      new_state = tx.update(_zeros_like(params), opt_state, params, **kw)[1]
      return new_state, jnp.copy(_logged_loss(new_state))

    # The params update reads the old state (HiZOO: the old H, and the new H inline), the
    # state update overwrites it: as two donated executables, each rewrites its own
    # buffers in place. One executable doing both keeps a copy of the old state for the
    # params (measured: 0.5-1.0 param bytes of temporaries for HiZOO), so it is used only
    # when the state depends on the params' values, which the second call could not see.
    self.split_update = not _state_reads_params(tx, params, opt_state)
    self.update = jax.jit(update, donate_argnums=(0, 1) if donate else (),
                          compiler_options=opts, **to_both)
    self.update_params = jax.jit(update_params, donate_argnums=(0,) if donate else (),
                                 static_argnums=(5,), compiler_options=opts, **to_params)
    self.update_state = jax.jit(update_state, donate_argnums=(0,) if donate else (),
                                compiler_options=opts, **to_state)
    self.hizoo = hizoo
    self.fwd = jax.jit(f)
    self.fwd0 = jax.jit(fwd0, **({} if rep is None else dict(out_shardings=rep)))
    self.perturb_new = jax.jit(perturb, compiler_options=opts, **to_params)
    self.perturb_inplace = jax.jit(perturb, donate_argnums=(0,), compiler_options=opts,
                                   **to_params)
    self.perturb_into = jax.jit(perturb_into, donate_argnums=(0,), compiler_options=opts,
                                **to_params)

  def __call__(self, params, opt_state, *batch):
    dtype = est.loss_dtype(params)
    l0 = self.fwd0(params, opt_state, *batch) if self.hizoo else jnp.zeros((), dtype)
    if self.inplace:
      if not self.donate:
        params = jax.tree.map(jnp.copy, params)
      params = self.perturb_inplace(params, opt_state, 1.0)
      lp, aux_p = self.fwd(params, *batch)
      params = self.perturb_inplace(params, opt_state, -2.0)
      lm, aux_m = self.fwd(params, *batch)
      if not self.split_update:
        params = self.perturb_inplace(params, opt_state, 1.0)
    else:
      work = self.perturb_new(params, opt_state, 1.0)
      lp, aux_p = self.fwd(work, *batch)
      work = self.perturb_into(work, params, opt_state, -1.0)
      lm, aux_m = self.fwd(work, *batch)
      del work
    if self.split_update:
      # the state does not read the params: it may see the updated ones
      params = self.update_params(params, opt_state, l0, lp, lm, self.inplace)
      opt_state, loss = self.update_state(opt_state, params, l0, lp, lm)
    else:
      params, opt_state, loss = self.update(params, opt_state, l0, lp, lm)
    aux = _mean_aux(aux_p, aux_m) if self.has_aux else None
    return _outputs(params, opt_state, aux, self.has_aux, loss)
