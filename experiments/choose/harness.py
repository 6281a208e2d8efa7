"""The run engine of the "choosing a method" study: one run = one method on one task for a
budget of forward passes, checkpointed and resumable, one record in its task's results table
(``results/<task>.jsonl.gz``, :mod:`experiments.table`).

What a run is (``RunConfig``): a task (``tasks.TASKS``), a method named by its public name in
``hizoo_jax`` (``"mezo"``, ``"hizoo"``, ``"presets.hizoo"``, and any ``hz.NAME(learning_rate,
**options)`` that lands later, e.g. ``"fzoo"``), its options, a learning rate with a schedule
(``constant``, ``cosine`` or ``linear`` decay to 0 over the budget), a seed and a budget of
forward passes.

Why forward passes, counted as executed: methods spend different numbers of passes per step
(MeZO 2, HiZOO 3 on Hessian steps, FZOO 1 + probes, ...), so comparing them per step favours
the expensive ones. When the optimizer state carries a ``forward_passes`` counter
(``hz.forward_passes(state)``) the harness uses it (and checks its
own count against it at every evaluation); otherwise it counts from the method's known cost
(``METHODS``). Each result says which (``fp_source``).

Pairing: the seed sets the data order (``hizoo_jax.models.data.batch_indices``, a pure function
of ``(seed, step)``), the model/head initialisation (task-specific) and the noise (the
method's ``seed`` option). Two methods run at the same seed see the same batches in the
same order and start from the same parameters.

Resume: at every evaluation the params, the optimizer state (whose PRNG key fixes all future
noise) and the history are saved with Orbax; a restarted run continues from there and ends
bit for bit like an uninterrupted one (``experiments/tests/test_choose.py`` checks it).

The loss tape: a zeroth-order run's whole trajectory follows from its keys and the losses
its forward passes returned, so at every evaluation the harness also writes those losses
(one number a pass, 160 KB for 20,000 passes) and the history to ``traces/`` beside the
results. Where the checkpoint is gone (a new machine; params-sized checkpoints are not
kept in git) but the tape is there, the run replays it: the same compiled step with a loss
function that hands back the recorded values in order, so every perturbation, restore and
update runs with the same arithmetic and no forward pass (a step costs its passes over the
params, about a tenth of a forward pass each on MiniLM), then checks the replayed params
against the recorded evaluation before it goes on; where the check fails the run starts
again from step 0. Bit for bit on digits (``experiments/tests/test_choose.py``, MeZO and FZOO), for
MeZO on MiniLM full fine-tuning (100 steps) and for MiniLM FZOO-8 (889 steps, 8,001 passes,
hizoo_jax 820a538, replayed by the queue in 337 s). The same run's first 223 steps, replayed
earlier by a hand-built check, came to within 2e-6 of the recorded CEs but not bit for bit;
not reproduced, cause unknown (the evaluation alone gives the same CEs bit for bit with and
without the queue's single-threaded ``XLA_FLAGS``). A replay that is not exact goes on
where it lies within ``REPLAY_TOLERANCE`` of the recorded evaluation (its continuation is
then a run of the same method, keys and batches from params that differ by rounding, not
the uninterrupted run bit for bit), and the result's ``replays`` says so (``exact``,
``off_by``). The curvature oracle, which installs autodiff curvature from the params, is
not taped.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import platform
import re
import shutil
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import io_callback

import hizoo_jax as hz
from experiments import table

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
CKPTS = os.path.join(HERE, "ckpt")
TRACES = os.path.join(HERE, "traces")
BLOW_UP = 100.0  # a run whose train loss exceeds this times the initial one has diverged
# How far a replayed evaluation (train and val CE, absolute) may lie from the recorded one
# for the run to go on from the replayed params. The replay feeds the recorded losses back,
# so its params can differ from the recorded run's only by the rounding of the updates
# (XLA may fuse the step differently once the forward passes are gone, and a fused
# multiply-add rounds once where a multiply and an add round twice): ~1 ulp of each
# parameter a step, a random walk that does not feed back into the losses, since the
# losses come from the tape. Measured: a MiniLM FZOO-8 tape of 223 steps replayed by a
# hand-built check came back 2e-6 off (the queue's replay of 889 steps of the same run
# was exact). A wrong or shifted tape moves the CE
# by far more (an evaluation apart is 1e-3 to 4e-3 on SST-2), and 1e-4 is a tenth of the
# smallest such movement.
REPLAY_TOLERANCE = 1e-4
SCHEDULES = ("constant", "cosine", "linear")


# ----------------------------------------------------------------------------------------
# Methods.


def _n(options: dict) -> int:
  return int(options.get("num_directions", 1))


def _hizoo_cost(options: dict, step: int) -> int:
  every = int(options.get("hessian_update_every", 1))
  return 2 * _n(options) + (1 if step % every == 0 else 0)


@dataclasses.dataclass(frozen=True)
class Method:
  """A method of the library, built by its public name.

  Attributes:
    name: the attribute path in ``hizoo_jax`` (``"mezo"``, ``"presets.hizoo"``).
    cost: forward passes of step ``t`` (0-based) for the given options, or None when only
      the optimizer state's counter can tell (then the state must have one).
  """

  name: str
  cost: Callable[[dict, int], int] | None = None


# Known costs (what the method's update executes). A method that is not listed here still
# runs if ``hz.<name>`` exists and its state counts its own forward passes.
METHODS: dict[str, Method] = {
    "mezo": Method("mezo", lambda o, t: 2 * _n(o)),
    "hizoo": Method("hizoo", _hizoo_cost),
    "hizoo_l": Method("hizoo_l", _hizoo_cost),
    "presets.hizoo": Method("presets.hizoo", _hizoo_cost),
    "presets.hizoo_l": Method("presets.hizoo_l", _hizoo_cost),
    # MeZO with the learning rate divided by the mean H(t) of a HiZOO run (the step-size
    # control of the HiZOO rows: how much of HiZOO is its Hessian's scale alone).
    "mezo_hctl": Method("mezo", lambda o, t: 2 * _n(o)),
}
CONTROL = "mezo_hctl"
# MeZO preconditioned by the true curvature (autodiff + Hutchinson, experiments/choose/
# oracle.py): HiZOO's update with its estimate off; l0 is measured on step 0 only.
ORACLE = "oracle"
METHODS[ORACLE] = Method("hizoo", lambda o, t: 2 * _n(o) + (1 if t == 0 else 0))
TRACE_STRIDE = 10  # steps between the samples of mean H(t) kept for the control
# Methods whose step differentiates the loss (a jvp): their trajectory depends on the
# directional derivative as well as the loss, which the tape does not hold, and a host
# callback cannot be differentiated. They run without a tape; an interrupted run resumes
# from its checkpoint (a lost checkpoint starts it again).
TAPELESS = frozenset({"forward_gradient"})


def method_of(name: str) -> Method:
  """The registered method, or an unregistered public name (cost from the state's counter)."""
  return METHODS.get(name, Method(name, None))


def control_schedule(lr: float, source: dict, kind: str, horizon: int) -> optax.Schedule:
  """``lr * schedule(t) / mean H(t)`` of the HiZOO run ``source`` (its ``mean_h_trace``,
  sampled every ``TRACE_STRIDE`` steps, held between samples and after the last)."""
  trace = np.asarray(source["mean_h_trace"]["values"], np.float32)
  stride = int(source["mean_h_trace"]["stride"])
  inv = jnp.asarray(1.0 / np.maximum(trace, 1e-30), jnp.float32)
  base = make_schedule(kind, lr, horizon)
  last = len(trace) - 1
  return lambda t: base(t) * inv[jnp.minimum(t // stride, last)]


def public(name: str) -> Callable[..., Any]:
  """``hz.<name>`` (dots allowed: ``"presets.hizoo"``); a clear error if it does not exist."""
  obj: Any = hz
  for part in name.split("."):
    if not hasattr(obj, part):
      raise ValueError(f"hizoo_jax has no public {name!r} (not landed yet?)")
    obj = getattr(obj, part)
  return obj


_PER_D = re.compile(r"^\s*([0-9.eE+-]+)\s*/\s*d\s*$")


def resolve_options(options: dict, num_params: int) -> dict:
  """Options with ``"<c>/d"`` strings replaced by ``c / d`` (``d``: trainable scalars), so a
  table can ask for HiZOO's ``alpha = 0.5 / d`` without knowing the model's size."""
  out = {}
  for k, v in options.items():
    m = _PER_D.match(v) if isinstance(v, str) else None
    out[k] = float(m.group(1)) / num_params if m else v
  return out


def make_schedule(kind: str, lr: float, horizon: int) -> optax.Schedule:
  """``constant``, or ``cosine`` / ``linear`` decay from ``lr`` to 0 over ``horizon`` steps;
  ``cosine_f<x>`` / ``linear_f<x>`` decay to the floor ``x * lr`` instead of 0 (on digits,
  HiZOO's step-size control, a decay that stops partway, beat decay to 0)."""
  m = re.fullmatch(r"(cosine|linear)_f([0-9.]+)", kind)
  floor = float(m.group(2)) if m else 0.0
  kind = m.group(1) if m else kind
  if kind == "constant":
    return optax.constant_schedule(lr)
  if kind == "cosine":
    return optax.cosine_decay_schedule(lr, max(horizon, 1), alpha=floor)
  if kind == "linear":
    return optax.linear_schedule(lr, floor * lr, max(horizon, 1))
  raise ValueError(f"schedule must be one of {SCHEDULES} or cosine_f<x> / linear_f<x>, "
                   f"got {kind!r}")


# Optax stages a table can put between a method's estimate and its learning rate (option
# ``then``, with the stage's own arguments beside it), composed the way a user would:
# ``optax.chain(hz.scale_by_zo(mu=1e-3), optax.scale_by_adam(), optax.scale_by_learning_rate
# (lr))``. ``trace`` is heavy-ball momentum (``decay``, ``nesterov``), ``adam`` Adam's moments
# (``b1``, ``b2``, ``eps``), each with params-sized state (one and two buffers);
# ``global_rms`` the library's scalar second moment (``decay``, ``eps``; two scalars).
THEN: dict[str, tuple[Callable[..., optax.GradientTransformation], tuple[str, ...]]] = {
    "trace": (optax.trace, ("decay", "nesterov")),
    "adam": (optax.scale_by_adam, ("b1", "b2", "eps")),
    "global_rms": (hz.scale_by_global_rms, ("decay", "eps")),
}
# The estimate behind an alias (``hz.mezo`` is ``hz.scale_by_zo`` then the learning rate).
ESTIMATES = {"mezo": "scale_by_zo"}


def build_tx(method: str, learning_rate: Any, options: dict, seed: int):
  """``hz.<method>(learning_rate, **options)`` with the run's noise seed when it takes one;
  with ``options["then"]``, ``optax.chain(hz.scale_by_<method>(...), <stage>,
  optax.scale_by_learning_rate(learning_rate))`` (``THEN``)."""
  if "then" in options:
    kw = dict(options)
    stage = kw.pop("then")
    if stage not in THEN:
      raise ValueError(f"then must be one of {sorted(THEN)}, got {stage!r}")
    make, names = THEN[stage]
    stage_kw = {k: kw.pop(k) for k in names if k in kw}
    estimate = build_tx(ESTIMATES.get(method, f"scale_by_{method}"), None, kw, seed)
    return optax.chain(estimate, make(**stage_kw),
                       optax.scale_by_learning_rate(learning_rate))
  fn = public(method)
  try:
    params = inspect.signature(fn).parameters
    takes_seed = "seed" in params or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
  except (TypeError, ValueError):
    takes_seed = True
  kw = dict(options)
  if takes_seed and "seed" not in kw:
    kw["seed"] = seed
  return fn(**kw) if learning_rate is None else fn(learning_rate, **kw)


def read_counter(opt_state) -> int | None:
  """The state's executed-forward-pass counter, or None when the method has none."""
  count = getattr(hz, "forward_passes", None)
  if count is None:  # the hizoo_jax of a snapshot from before hz.forward_passes (queue.sh)
    try:
      value = optax.tree_utils.tree_get(opt_state, "forward_passes")
    except (KeyError, ValueError):
      return None
  else:
    value = count(opt_state)
  return None if value is None else int(np.sum(np.asarray(value)))


def state_bytes(opt_state) -> int:
  """Bytes of the optimizer state's arrays (what a method costs in memory beyond params)."""
  return int(sum(np.asarray(x).nbytes if not hasattr(x, "nbytes") else x.nbytes
                 for x in jax.tree.leaves(opt_state)))


def mean_hessian(opt_state) -> float | None:
  """Mean of HiZOO's diagonal-Hessian estimate, or None for methods without one."""
  try:
    h = hz.get_hessian(opt_state)
  except (ValueError, TypeError, KeyError):
    return None
  leaves = [jnp.ravel(jnp.asarray(x)) for x in jax.tree.leaves(h)]
  if not leaves:
    return None
  return float(jnp.mean(jnp.concatenate(leaves)))


def code_version() -> str:
  """The hizoo_jax the run uses: ``$CHOOSE_HIZOO_COMMIT`` (set by ``queue.sh``, which runs
  from a snapshot of that commit) or the package's path."""
  return os.environ.get("CHOOSE_HIZOO_COMMIT") or os.path.dirname(hz.__file__)


# ----------------------------------------------------------------------------------------
# Runs.


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """One run. ``budget`` and ``eval_every`` count forward passes."""

  task: str
  method: str
  lr: float
  schedule: str = "constant"
  options: tuple = ()  # sorted (key, value) pairs: hashable, stable in the run id
  seed: int = 0
  budget: int = 10_000
  eval_every: int = 1_000
  tag: str = ""  # distinguishes option sets in the run id when options differ

  @property
  def opts(self) -> dict:
    return dict(self.options)

  @property
  def run_id(self) -> str:
    """A file name: task, method+tag, schedule, lr, seed, budget."""
    m = self.method.replace(".", "-")
    return (f"{m}{self.tag}_{self.schedule}_lr{self.lr:.3g}_s{self.seed}_fp{self.budget}")

  def to_json(self) -> dict:
    return {**dataclasses.asdict(self), "options": self.opts, "run_id": self.run_id}


def make_config(task, method, lr, *, schedule="constant", options=None, seed=0, budget=10_000,
                eval_every=1_000, tag="") -> RunConfig:
  """A :class:`RunConfig` with the options dict frozen into sorted pairs."""
  return RunConfig(task, method, float(lr), schedule, tuple(sorted((options or {}).items())),
                   int(seed), int(budget), int(eval_every), tag)


def table_file(task: str, results: str = RESULTS) -> str:
  """The results table of ``task`` (one record per finished run, keyed by its run id)."""
  return table.path(results, task)


def load_result(task: str, run_id: str, results: str = RESULTS) -> dict | None:
  """The result of run ``run_id`` of ``task``, or None where it has not finished."""
  return table.find(table_file(task, results), run_id)


def machine() -> str:
  """The machine a result was measured on: host, CPU count, JAX's devices."""
  return (f"{platform.node()} ({os.cpu_count()} CPUs, {platform.machine()}; "
          f"{', '.join(sorted({d.device_kind for d in jax.devices()}))})")


def ckpt_dir(cfg: RunConfig, ckpts: str = CKPTS) -> str:
  return os.path.join(ckpts, cfg.task, cfg.run_id)


def _mean_cost(method: Method, options: dict) -> float | None:
  if method.cost is None:
    return None
  return float(np.mean([method.cost(options, t) for t in range(1024)]))


def _atomic_json(path: str, obj: Any) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = path + ".tmp"
  with open(tmp, "w") as fh:
    json.dump(obj, fh)
  os.replace(tmp, path)


def _finite(x: float) -> float | None:
  return float(x) if np.isfinite(x) else None


class _Tape:
  """The loss of every forward pass of a run, in the order the step computed them.

  ``record(loss_fn)`` wraps a loss function so that each of its values is appended here (an
  ordered host callback: the values arrive in program order); ``replay()`` is a loss
  function that ignores its arguments and returns the next recorded value, so that the same
  step built around it reruns the run's arithmetic without its forward passes.
  """

  def __init__(self, values=(), dtype: str = "float32"):
    self.values = [float(v) for v in values]  # float64 holds any float32/bfloat16 exactly
    self.dtype = jnp.dtype(dtype)
    self._next = 0

  def _append(self, x):
    self.values.append(float(x))

  def _pop(self):
    # past the tape's end (a step that evaluates more than the run did): NaN, and the
    # count tells the replay's check
    v = self.values[self._next] if self._next < len(self.values) else math.nan
    self._next += 1
    return np.asarray(v, self.dtype)

  def record(self, loss_fn):
    def taped(*args):
      loss = loss_fn(*args)
      self.dtype = jnp.dtype(loss.dtype)
      io_callback(self._append, None, loss, ordered=True)
      return loss
    return taped

  def replay(self):
    self._next = 0

    def recorded(*args):
      del args
      return io_callback(self._pop, jax.ShapeDtypeStruct((), self.dtype), ordered=True)
    return recorded

  @property
  def replayed(self) -> int:
    return self._next


def trace_dir(cfg: RunConfig, traces: str = TRACES) -> str:
  return os.path.join(traces, cfg.task, cfg.run_id)


def _save_tape(tdir: str, tape: _Tape, hist: dict) -> None:
  jax.effects_barrier()  # every callback of the steps so far has run
  os.makedirs(tdir, exist_ok=True)
  hist = {**hist, "tape_len": len(tape.values), "tape_dtype": tape.dtype.name}
  tmp = os.path.join(tdir, "losses.tmp.npy")
  np.save(tmp, np.asarray(tape.values, np.float64))
  os.replace(tmp, os.path.join(tdir, "losses.npy"))
  _atomic_json(os.path.join(tdir, "history.json"), hist)


def _load_tape(tdir: str) -> tuple[dict, _Tape] | None:
  try:
    with open(os.path.join(tdir, "history.json")) as fh:
      hist = json.load(fh)
    values = np.load(os.path.join(tdir, "losses.npy"))
  except (OSError, ValueError):
    return None
  if len(values) != hist.get("tape_len"):
    return None
  return hist, _Tape(values, hist.get("tape_dtype", "float32"))


def run(cfg: RunConfig, task, *, results: str = RESULTS, ckpts: str = CKPTS,
        traces: str = TRACES, stop_after: int | None = None,
        log: Callable[[str], None] = print) -> dict | None:
  """Runs (or resumes) ``cfg`` on ``task``, appends its result to the task's table and
  returns it.

  Args:
    cfg: the run.
    task: a ``tasks.Task`` (``setup(seed, restoring)``).
    results, ckpts: directories of the results tables and of the checkpoints.
    traces: directory of loss tapes (module docstring), the checkpoints that survive a new
      machine.
    stop_after: stop (as an interruption would) after the first evaluation at or past this
      many forward passes, returning None: the resume test.
    log: progress printer.
  """
  t_start = time.perf_counter()
  method = method_of(cfg.method)
  cdir = ckpt_dir(cfg, ckpts)
  tdir = trace_dir(cfg, traces)
  restoring = os.path.isfile(os.path.join(cdir, "history.json"))
  taped = (None if restoring or cfg.method == ORACLE or cfg.method in TAPELESS
           else _load_tape(tdir))
  if taped is not None and taped[0].get("code") != code_version():
    log(f"  {cfg.run_id}: its loss tape was recorded with {taped[0].get('code')}, this is "
        f"{code_version()}; a replay needs the same hizoo_jax, so it starts again")
    taped = None
  # a replay starts where the run started: the setup's own params (the SST-2 probe fitted)
  inst = task.setup(cfg.seed, restoring=restoring)
  d = int(sum(np.prod(np.shape(x)) for x in jax.tree.leaves(inst.params)))
  options = resolve_options(cfg.opts, d)
  mean_cost = _mean_cost(method, options)
  step = None
  if mean_cost is None:
    # No known cost: one step of a constant-lr copy reads the state's counter.
    tx0 = build_tx(cfg.method, cfg.lr, options, cfg.seed)
    s0 = tx0.init(inst.params)
    step0 = hz.make_train_step(tx0, inst.loss_fn)
    _, s1, _ = step0(jax.tree.map(jnp.copy, inst.params), s0, *inst.extra, *inst.batch(0))
    mean_cost = read_counter(s1)
    if not mean_cost:
      raise ValueError(f"{cfg.method}: no known cost and no forward_passes counter in its "
                       "state; add it to harness.METHODS")
  horizon = int(math.ceil(cfg.budget / mean_cost))
  if cfg.method == CONTROL:
    source_id = options.pop("hctl_of")
    source = load_result(cfg.task, source_id, results)
    if source is None:
      raise ValueError(f"{cfg.run_id}: the HiZOO run it controls ({source_id}) has no result "
                       f"in {table_file(cfg.task, results)}; run it first")
    lr = control_schedule(cfg.lr, source, cfg.schedule, horizon)
    tx = build_tx(method.name, lr, options, cfg.seed)
  elif cfg.method == ORACLE:
    from experiments.choose import oracle

    ora, hz_opts = oracle.split_options(options)
    tx = build_tx(method.name, make_schedule(cfg.schedule, cfg.lr, horizon), hz_opts, cfg.seed)
  else:
    tx = build_tx(cfg.method, make_schedule(cfg.schedule, cfg.lr, horizon), options, cfg.seed)
  params = inst.params
  opt_state = tx.init(params)
  has_counter = read_counter(opt_state) is not None
  tape = _Tape()
  trace_fn = None
  if mean_hessian(opt_state) is not None:
    trace_fn = jax.jit(lambda st: jnp.mean(jnp.concatenate(
        [jnp.ravel(x).astype(jnp.float32) for x in jax.tree.leaves(hz.get_hessian(st))])))

  from hizoo_jax.models import checkpoint

  ckpt = checkpoint.Checkpointer(cdir, max_to_keep=2)
  hist: dict[str, Any] = {"t": 0, "fp": 0, "train_seconds": 0.0, "evals": [], "windows": [],
                          "code": code_version(), "mean_h_trace": [],
                          "tape": cfg.method not in TAPELESS and cfg.method != ORACLE}
  if taped is not None:
    params, opt_state, hist, tape = _replay(tx, inst, params, opt_state, *taped, cfg, log)
    if hist is None:  # the replay did not reproduce the recorded evaluation
      shutil.rmtree(tdir, ignore_errors=True)
      return run(cfg, task, results=results, ckpts=ckpts, traces=traces,
                 stop_after=stop_after, log=log)
  elif restoring:
    with open(os.path.join(cdir, "history.json")) as fh:
      hist = json.load(fh)
    if hist.get("code") != code_version():
      log(f"  WARNING {cfg.run_id}: started with {hist.get('code')}, resumed with "
          f"{code_version()}; bit-for-bit resume needs the same hizoo_jax")
    tree = ckpt.restore({"params": params, "opt_state": opt_state}, step=hist["t"])
    params, opt_state = tree["params"], tree["opt_state"]
    log(f"  {cfg.run_id}: resumed at step {hist['t']}, {hist['fp']} forward passes")
    if hist.get("tape"):
      loaded = _load_tape(tdir)
      if loaded is not None and loaded[0]["t"] == hist["t"]:
        tape = loaded[1]
      else:  # the tape and the checkpoint disagree: go on without a tape
        hist["tape"] = False
  else:
    ev = inst.evaluate(params)
    hist["evals"].append({"step": 0, "fp": 0, **ev, "seconds": 0.0, "mean_h": None})
    # where the run starts (the SST-2 probe): reported beside the end, never selected on
    hist["test_at_start"] = inst.test(params)
    hist["task_info"] = inst.info  # a resumed run's setup skips what it restores
  step = hz.make_train_step(tx, tape.record(inst.loss_fn) if hist.get("tape") else
                            inst.loss_fn)
  t, fp = int(hist["t"]), int(hist["fp"])
  initial_train = hist["evals"][0]["train_loss"]
  next_eval = (fp // cfg.eval_every + 1) * cfg.eval_every
  diverged = hist.get("diverged")
  losses: list = []
  traced: list = []
  t0 = time.perf_counter()
  fp_window = 0
  while fp < cfg.budget and diverged is None:
    if cfg.method == ORACLE and oracle.due(ora, t):
      t1 = time.perf_counter()
      opt_state, summary = oracle.install(opt_state, params, inst, ora, t, cfg.seed)
      spent = time.perf_counter() - t1
      hist.setdefault("oracle", []).append({**summary, "seconds": spent})
      t0 += spent  # the oracle's autodiff is not the method's time
    params, opt_state, loss = step(params, opt_state, *inst.extra, *inst.batch(t))
    losses.append(loss)
    if trace_fn is not None and t % TRACE_STRIDE == 0:
      traced.append(trace_fn(opt_state))  # after step t: the H that step t + 1 uses
    if method.cost is not None:
      fp += method.cost(options, t)
    else:
      fp = read_counter(opt_state)
    t += 1
    if fp >= next_eval or fp >= cfg.budget:
      window = np.asarray(jnp.stack(losses), np.float64)
      seconds = time.perf_counter() - t0
      fp_window = fp - hist["fp"]
      if has_counter:
        counted = read_counter(opt_state)
        if counted != fp:
          raise RuntimeError(f"{cfg.run_id}: state counter {counted} != harness count {fp}")
      ev = inst.evaluate(params)
      hist["train_seconds"] += seconds
      hist["windows"].append({"step": t, "fp": fp, "fp_in_window": fp_window,
                              "seconds": seconds, "minibatch_loss": _finite(window.mean())})
      hist["evals"].append({"step": t, "fp": fp, **ev, "seconds": hist["train_seconds"],
                            "mean_h": mean_hessian(opt_state)})
      hist["t"], hist["fp"] = t, fp
      hist["mean_h_trace"] += [float(x) for x in traced]
      traced = []
      if not (np.all(np.isfinite(window)) and np.isfinite(ev["train_loss"])
              and ev["train_loss"] <= BLOW_UP * initial_train):
        diverged = hist["diverged"] = t
      log(f"  {cfg.run_id} step {t} fp {fp}: minibatch {window.mean():.4f} train "
          f"{ev['train_loss']:.4f} val {ev['val_loss']:.4f} ({fp_window / seconds:.1f} fp/s, "
          f"{time.strftime('%H:%M:%S')})")
      ckpt.save(t, {"params": params, "opt_state": opt_state})
      _atomic_json(os.path.join(cdir, "history.json"), hist)
      if hist.get("tape"):
        _save_tape(tdir, tape, hist)
      next_eval = (fp // cfg.eval_every + 1) * cfg.eval_every
      losses = []
      if stop_after is not None and fp >= stop_after and fp < cfg.budget:
        ckpt.close()
        return None
      t0 = time.perf_counter()
  ckpt.close()
  last = hist["evals"][-1]
  test = inst.test(params) if diverged is None else None
  # seconds per forward pass: the median window after the first (which compiles)
  rates = [w["seconds"] / w["fp_in_window"] for w in hist["windows"][1:] if w["fp_in_window"]]
  if not rates:
    rates = [w["seconds"] / w["fp_in_window"] for w in hist["windows"] if w["fp_in_window"]]
  out = {
      "config": cfg.to_json(),
      "resolved_options": {k: v for k, v in options.items()},
      "task_info": hist.get("task_info", inst.info),
      "num_params": d,
      "fp_source": ("state counter (forward_passes), checked against the harness count"
                    if has_counter and method.cost is not None
                    else "state counter (forward_passes)" if has_counter
                    else "harness count from the method's cost"),
      "fp_per_step_mean": mean_cost,
      "schedule_horizon_steps": horizon,
      "steps": hist["t"],
      "forward_passes": hist["fp"],
      "diverged_at_step": diverged,
      "curve": hist["evals"],
      "mean_h_trace": ({"stride": TRACE_STRIDE, "values": hist["mean_h_trace"]}
                       if hist.get("mean_h_trace") else None),
      "windows": hist["windows"],
      "final": {"train_loss": last["train_loss"] if diverged is None else None,
                "val_loss": last["val_loss"] if diverged is None else None},
      "test": test,
      "test_at_start": hist.get("test_at_start"),
      "oracle": hist.get("oracle"),
      "replays": hist.get("replays"),  # resumed from the loss tape (step, seconds)
      "sec_per_fp": float(np.median(rates)) if rates else None,
      "train_seconds": hist["train_seconds"],
      "state_bytes": state_bytes(opt_state),
      "params_bytes": state_bytes(params),
      "wall_seconds_this_session": time.perf_counter() - t_start,
      "jax": jax.__version__,
      "code": hist.get("code"),
      "machine": machine(),
      "date": time.strftime("%Y-%m-%d %H:%M"),
  }
  table.append(table_file(cfg.task, results), {"key": cfg.run_id, **out})
  shutil.rmtree(cdir, ignore_errors=True)  # finished: its record is all that is kept
  shutil.rmtree(tdir, ignore_errors=True)
  return out


def _replay(tx, inst, params, opt_state, hist, tape, cfg, log):
  """Reruns a taped run's steps up to its last evaluation without forward passes.

  Returns ``(params, opt_state, hist, tape)``, or ``hist = None`` where the replayed params
  do not give the recorded evaluation (then the tape is useless and the run starts again).
  """
  t1 = time.perf_counter()
  replay_step = hz.make_train_step(tx, tape.replay())
  for t in range(int(hist["t"])):
    params, opt_state, _ = replay_step(params, opt_state, *inst.extra, *inst.batch(t))
  jax.block_until_ready(params)
  jax.effects_barrier()
  spent = time.perf_counter() - t1
  ev = inst.evaluate(params)
  want = hist["evals"][-1]
  whole = tape.replayed == len(tape.values)
  diff = max(abs(ev[k] - want[k]) for k in ("train_loss", "val_loss"))
  exact = whole and diff == 0.0
  close = whole and diff <= REPLAY_TOLERANCE
  verdict = ("the same" if exact else
             f"within {REPLAY_TOLERANCE:g} (off by {diff:.2e}, not bit for bit), going on"
             if close else "DIFFERENT, starting again")
  log(f"  {cfg.run_id}: replayed {hist['t']} steps ({tape.replayed} of {len(tape.values)} "
      f"taped losses) in {spent:.0f} s: train {ev['train_loss']:.6f} val "
      f"{ev['val_loss']:.6f} against the recorded {want['train_loss']:.6f} "
      f"{want['val_loss']:.6f}: {verdict}")
  if not close:
    return params, opt_state, None, tape
  hist.setdefault("replays", []).append(
      {"step": hist["t"], "seconds": spent, "exact": exact,
       "train_loss": ev["train_loss"], "val_loss": ev["val_loss"], "off_by": diff})
  return params, opt_state, hist, tape
