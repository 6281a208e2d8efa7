"""The engine's steps: the passes over the params that measure the losses.

* :func:`lean_step_fn`: the lean step, the passes in a ``lax.fori_loop`` over the params
  (in place, or exact: each pass measuring at ``theta + c mu D`` formed where the forward
  pass reads it), by :func:`schedule`; a directional-derivative method through ``jax.jvp``;
  with ``batch_probes``, every measured point in one ``jax.vmap``-ed forward pass.
* :func:`plain_fn`: one jitted ``tx.update`` with ``value_fn``, where the lean step does
  not apply or does not pay.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.extend.core
import jax.numpy as jnp
import optax

from hizoo_jax._src import method as m
from hizoo_jax._src import numerics, sampling, transform
from hizoo_jax._src.engine import locate, update


class Loss:
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
    return numerics.check_loss(loss, "loss_fn").astype(self.dtype), aux

  def zeros(self, params, *batch):
    """A zero loss and aux of the right shapes (the not-taken branch of a cond)."""
    shapes = jax.eval_shape(self, params, *batch)
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def _mean_aux(stacked):
  """The mean of the measured evaluations' aux (slots 1..): floating leaves averaged,
  others taken from the first measured evaluation."""
  def one(x):
    if jnp.issubdtype(jnp.result_type(x), jnp.inexact):
      return (x[1] + x[2]) / 2 if x.shape[0] == 3 else jnp.mean(x[1:], axis=0)
    return x[1]
  return jax.tree.map(one, stacked)



def _logged_loss(opt_state):
  """The loss the (first) ZO state recorded for the step."""
  return transform.zo_states(opt_state)[0].loss


def outputs(params, opt_state, aux, has_aux, loss=None):
  # A copy: the state's own field is donated with the state at the next step.
  loss = jnp.copy(_logged_loss(opt_state)) if loss is None else loss
  return (params, opt_state, loss, aux) if has_aux else (params, opt_state, loss)



def lean_step_fn(tx, loss_fn, has_aux, restore, fused_noise_only=False,
                 batch_probes=False):
  """The lean step as one traceable function (one executable when jitted); the plain step
  where it does not apply, or, with ``fused_noise_only``, where it does not pay."""

  def step(params, opt_state, *batch):
    loc = locate.locate(tx, params, opt_state)
    if batch_probes:
      if loc is None:
        raise ValueError("batch_probes=True needs one zeroth-order transform in tx")
      return _batched_step(tx, loc, Loss(loss_fn, has_aux, numerics.loss_dtype(params)),
                           has_aux, params, opt_state, batch)
    if loc is None or (fused_noise_only and not isinstance(loc.method.sampler,
                                                           sampling.FastGaussian)):
      # A sampler that does not fuse into the elementwise passes (threefry) materialises
      # the noise in each of them, and in one program XLA keeps those buffers apart: the
      # lean step would hold more than the plain one (MeZO 4.0 vs 2.5, HiZOO 5.5 vs 4.5
      # param bytes over a forward pass, benchmarks/RESULTS.md).
      return plain_fn(tx, loss_fn, has_aux)(params, opt_state, *batch)
    f = Loss(loss_fn, has_aux, numerics.loss_dtype(params))
    if loc.method.measure == "jvp":
      return _jvp_step(tx, loc, f, has_aux, params, opt_state, batch)
    return _loop_step(tx, loc, f, has_aux, inplace_restore(restore, params), params,
                      opt_state, batch)

  return step


def _loop_step(tx, loc, f, has_aux, inplace, params, opt_state, batch):
  """The method's passes in a ``lax.fori_loop``: the params move by ``coef * mu * D_probe``
  at each and the loss is measured where slot > 0 (slot 0 holds l0, measured first at
  theta where the method asks for it). In place, the coefficients of each probe sum to 0
  and the last pass restores theta with no evaluation; with an exact restore, each
  measuring pass evaluates the loss at ``theta + offset mu D`` formed inside the
  evaluation (theta stays in the carry, unwritten, until the update).

  What makes XLA keep no params-sized temporary (each measured on the 403 MB benchmark
  model, benchmarks/RESULTS.md):

  - the losses, l0 included, ride in the carry and pass the barrier with the params, so
    the loop's in-place writes come after l0's read of theta (else: a copy);
  - every evaluation in the loop reads the pass's output, not the carried params;
  - the optimizer state rides in the carry and the noise and the method's state are tied
    to the loop index (else XLA hoists the loop-invariant mu D out of the loop into a
    params-sized buffer: 1.0 and 2.2 param bytes for MeZO and HiZOO);
  - the final update comes after a second barrier, not interleaved with the loop.
  """
  zero = f.zeros(params, *batch)
  rows, tail = schedule(loc.method, inplace)
  body = _loop_body(loc, f, batch, rows, inplace, zero)
  n_slots = 1 + loc.method.num_measured
  l0 = jax.lax.cond(loc.state.hyper["center"], lambda: f(params, *batch), lambda: zero)
  outs = jax.tree.map(lambda z: jnp.zeros((n_slots,) + z.shape, z.dtype).at[0].set(z), l0)
  stored = loc.state.method
  opt_state, prepared = loc.prepare(params, opt_state)
  params, opt_state, outs, prepared = jax.lax.optimization_barrier(
      (params, opt_state, outs, prepared))
  if inplace:
    _, params, opt_state, outs, prepared = jax.lax.fori_loop(
        0, len(rows), body, ((), params, opt_state, outs, prepared))
  else:
    params, _, opt_state, outs, prepared = jax.lax.fori_loop(
        0, len(rows), body, (params, (), opt_state, outs, prepared))
  losses = outs[0]
  params, opt_state, prepared = jax.lax.optimization_barrier((params, opt_state, prepared))
  if tail:
    # The restoring moves, outside the loop: XLA fuses them into the update's pass over
    # the params (one noise regeneration and one read-write of the params fewer).
    params = loc.rebind(opt_state).perturb(
        params, [c for _, c in tail], [j for j, _ in tail],
        m.Measured(losses[0], losses[1:]), prepared)
  opt_state, prepared = loc.for_update(opt_state, stored, prepared)
  params, opt_state = update.final_update(tx, params, opt_state,
                                          (losses[0], losses[1:], prepared), loc)
  aux = _mean_aux(outs[1]) if has_aux else None
  return outputs(params, opt_state, aux, has_aux)


def _loop_body(loc, f, batch, rows, inplace, zero):
  """One row of :func:`schedule` a loop iteration: the carry is ``(theta, work, state,
  outs, prepared)``, ``work`` the params moved in place (``()`` with an exact restore)."""
  probes = jnp.asarray([[j for j, _ in moves] for moves, _ in rows], jnp.int32)
  coefs = jnp.asarray([[c for _, c in moves] for moves, _ in rows], jnp.float32)
  slots = jnp.asarray([k for _, k in rows], jnp.int32)

  def body(i, carry):
    p, work, s, outs, prepared = carry
    here = loc.rebind(s)
    measured = m.Measured(outs[0][0], outs[0][1:])
    k = slots[i]
    if not inplace:
      # Every pass measures, at theta + offset mu D: the perturbed leaves are temporaries
      # of the evaluation, no buffer of the carry, and no conditional (whose operands XLA
      # would materialise whole before it runs). The batch is tied to the loop index: else
      # XLA hoists what the forward pass computes from the batch alone (LoRA's frozen
      # projections) out of the loop and keeps it alive across the passes (measured: 22.5
      # LoRA-params-worth on the tiny Llama). Leaves are not ordered one after the other
      # (serial_products): that order is the params', not the forward pass's, so every
      # perturbed leaf would wait for its reader. ZO-Muon on the tiny Llama, params-worth
      # beyond the forward pass's: 0.14 unordered under XLA:CPU's memory-minimising
      # scheduler; under its default (concurrency) one, which forms every leaf's product
      # before the forward pass reads any, 1.64 unordered and 0.94 ordered.
      here_batch, _ = jax.lax.optimization_barrier((batch, i))
      out = f(here.perturb(p, list(coefs[i]), list(probes[i]), measured, prepared,
                           after=i, serial=False), *here_batch)
      outs = jax.tree.map(lambda a, o: a.at[k].set(o), outs, out)
      return p, work, s, outs, prepared
    work = here.perturb(work, list(coefs[i]), list(probes[i]), measured, prepared, after=i)
    out = jax.lax.cond(k > 0, lambda: f(work, *batch), lambda: zero)
    outs = jax.tree.map(lambda a, o: a.at[k].set(jnp.where(k > 0, o, a[k])), outs, out)
    return p, work, s, outs, prepared

  return body


Move = tuple[int, float]  # (probe, coefficient): params += coefficient * mu * D_probe


def schedule(method: m.Method, inplace: bool
              ) -> tuple[list[tuple[tuple[Move, ...], int]], tuple[Move, ...]]:
  """``(rows, tail)``: each row of the engine's loop is one pass over the params, making
  its moves and then measuring into its slot (0: no evaluation); ``tail`` is the moves that
  restore theta after the last measurement, which the step folds into the update's pass
  (unless the method says otherwise: :attr:`Method.restore_in_update`).

  In place, a non-measuring pass (a probe's restore) joins the next measuring pass when
  that leaves at most one row with fewer moves than the widest (one-sided probes: ``N``
  passes instead of ``2N``). Rows are padded to one width with zero moves, which cost a
  noise draw and no pass over memory; the two-sided probes' restores stay passes of their
  own, since merging them would pad ``N + 1`` rows of ``2N``. With an exact restore, only
  the measuring passes run, each evaluating the loss at its offset from theta (formed
  from theta where the forward pass reads each leaf), and there is no tail."""
  if not inplace:
    return [(((j, o),), k + 1) for k, (j, o) in enumerate(m.measured_offsets(method.passes))], ()
  merged, pending, k = [], [], 0
  for j, c, measures in method.passes:
    pending.append((j, c))
    if measures:
      k += 1
      merged.append((tuple(pending), k))
      pending = []
  tail = tuple(pending)
  if tail and not method.restore_in_update:
    merged.append((tail, 0))
    tail = ()
  width = max(len(moves) for moves, _ in merged)
  if sum(len(moves) < width for moves, _ in merged) > 1:
    # Unmerged: every pass its own row, the restores measuring nothing.
    merged = [(((mv,), 0) if i < len(moves) - 1 else ((mv,), k))
              for moves, k in merged for i, mv in enumerate(moves)]
    width = 1
  return [(moves + ((0, 0.0),) * (width - len(moves)), k) for moves, k in merged], tail


def _jvp_step(tx, loc, f, has_aux, params, opt_state, batch):
  """The engine for a method that measures directional derivatives (``jax.jvp``): the
  params are not moved; each probe's tangent tree ``D_j`` is built for its jvp (the
  tangent is an input of the forward pass, so it exists as a buffer: one params-worth,
  in the params' dtype, besides what the forward pass itself needs)."""
  n = loc.method.num_measured
  dtype = f.dtype
  values = jnp.zeros([n], dtype)
  center, aux = jnp.zeros((), dtype), None
  for k, (probe, _) in enumerate(m.measured_offsets(loc.method.passes)):
    d = loc.tangents(params, probe, m.Measured(center, values))
    (loss, a), (dloss, _) = jax.jvp(lambda p: f(p, *batch), (params,), (d,))
    values = values.at[k].set(dloss.astype(dtype))
    if k == 0:
      center, aux = loss, a
  params, opt_state = update.final_update(tx, params, opt_state, (center, values), loc)
  return outputs(params, opt_state, aux, has_aux)


def _batched_step(tx, loc, f, has_aux, params, opt_state, batch):
  """Every measured point of the step in one batched forward pass (``jax.vmap`` over the
  probes): the perturbed params ``theta + offset mu D_j`` of all ``N`` measuring passes
  are built side by side (``N`` params-sized copies of the perturbed leaves) and the loss
  is evaluated on all of them at once. On an accelerator, where one small-batch forward
  pass leaves the device mostly idle, ``N`` of them cost little more than one. Only for
  methods whose probes do not depend on each other's losses (not HiZOO with several
  probes, whose later probes use the Hessian updated by the earlier ones)."""
  method = loc.method
  if method.measure != "loss":
    raise ValueError(f"batch_probes=True: {method.name} measures {method.measure!r}, not "
                     "losses at perturbed params")
  if not method.independent_probes:
    raise ValueError(f"batch_probes=True: the probes of {method.name} depend on each "
                     "other's losses (its later probes use the state the earlier ones "
                     "updated); use the sequential step")
  offsets = m.measured_offsets(method.passes)
  probes = jnp.asarray([j for j, _ in offsets], jnp.int32)
  coefs = jnp.asarray([o for _, o in offsets], jnp.float32)
  stored = loc.state.method
  opt_state, prepared = loc.prepare(params, opt_state)
  loc = loc.rebind(opt_state)
  dtype = f.dtype
  nothing = m.Measured(jnp.zeros((), dtype), jnp.zeros([method.num_measured], dtype))
  perturbed = jax.vmap(lambda j, c: loc.perturb(params, [c], [j], nothing, prepared))(
      probes, coefs)
  values, aux = jax.vmap(lambda p: f(p, *batch))(perturbed)
  zero = f.zeros(params, *batch)
  l0, aux0 = jax.lax.cond(loc.state.hyper["center"], lambda: f(params, *batch), lambda: zero)
  opt_state, prepared = loc.for_update(opt_state, stored, prepared)
  params, opt_state = update.final_update(tx, params, opt_state, (l0, values, prepared), loc)
  if has_aux:
    aux = _mean_aux(jax.tree.map(lambda a, s: jnp.concatenate([a[None], s]), aux0, aux))
  return outputs(params, opt_state, aux, has_aux)


def plain_fn(tx, loss_fn, has_aux):
  def step(params, opt_state, *batch):
    if has_aux:
      raise ValueError(
          "has_aux=True needs the lean step (one direction per step and one zeroth-order "
          "transform); this optimizer runs the plain tx.update, which cannot return aux")
    value_fn = lambda p: loss_fn(p, *batch)
    updates, opt_state = tx.update(locate.zeros_like(params), opt_state, params, value_fn=value_fn,
                                   value_params=params)
    params = optax.apply_updates(params, updates)
    return outputs(params, opt_state, None, False)

  return step


def inplace_restore(restore: str, params: Any) -> bool:
  if restore != "auto":
    return restore == "inplace"
  # Only floating leaves are perturbed (a frozen integer leaf under optax.masked is not).
  return all(jnp.finfo(jnp.result_type(x)).bits >= 32 for x in jax.tree.leaves(params)
             if jnp.issubdtype(jnp.result_type(x), jnp.inexact))
