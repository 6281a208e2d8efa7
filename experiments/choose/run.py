"""The queue runner of the "choosing a method" study: one command per table.

    python -m experiments.choose.run --table digits_mezo      # ~30-60 min on 2 shared cores
    python -m experiments.choose.run --table sst2_ft_mezo     # hours a run; resumable
    python -m experiments.choose.run --table smoke            # seconds (what CI runs)
    python -m experiments.choose.run --list                   # tables and their progress

A table is a list of grids (task x method x options x schedules x learning rates x seeds at
one budget of forward passes). The runner goes through them in order, skips runs whose
result is in the task's table, resumes runs that have a checkpoint, and takes a lock file per
run, so two queues (on the same machine, e.g. ``--reverse`` beside a plain one) never run the same
run. Kill it at any time; the same command continues.

Learning rates are written as quarter-decade exponents (``lr_of(e) = 10 ** (e / 4)``); the
grids step by half-decades (even ``e``). After a grid's learning rates are all done for a
schedule, the runner widens it while the best one (lowest mean final validation loss over
the table's seeds; a diverged run counts as infinitely bad) sits at an edge: it adds the
next half-decade beyond that edge and runs it, so every selected learning rate is interior
to its grid. Then (``refine``) it adds the two quarter-decades next to the best and selects
again: the same rule, hence the same resolution, for every method. Test metrics are never
used for selection.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import math
import os
import socket
import sys
import time
import traceback

import numpy as np

if __package__ in (None, ""):
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__)))))

from experiments.choose import harness, tasks  # noqa: E402


def lr_of(e: int) -> float:
  """The learning rate ``10 ** (e / 4)``: ``lr_of(-12) = 1e-3``, ``lr_of(-10) = 3.16e-3``,
  ``lr_of(-11) = 1.78e-3``."""
  return float(10.0 ** (e / 4))


@dataclasses.dataclass(frozen=True)
class Grid:
  """One method's tuning grid on one task at one budget (forward passes)."""

  task: str
  method: str
  exponents: tuple  # learning rates lr_of(e), in the order to run them (even: half-decades)
  schedules: tuple = harness.SCHEDULES
  seeds: tuple = (0, 1, 2)
  budget: int = 20_000
  eval_every: int = 1_000
  options: tuple = ()  # (key, value) pairs
  tag: str = ""
  widen: bool = True
  refine: bool = True
  max_points: int = 14
  control: bool = False  # HiZOO grids: then MeZO with lr / mean H(t) of the selected runs
  # Seeds run only at the selected rate, after the grid is closed on ``seeds``: the paired
  # seeds of a table whose rate is tuned on one seed, in one command.
  confirm_seeds: tuple = ()

  def config(self, e: int, schedule: str, seed: int) -> harness.RunConfig:
    return harness.make_config(self.task, self.method, lr_of(e), schedule=schedule,
                               options=dict(self.options), seed=seed, budget=self.budget,
                               eval_every=self.eval_every, tag=self.tag)

  def control_config(self, e: int, schedule: str, seed: int) -> harness.RunConfig:
    """MeZO (same mu, directions) with ``lr_of(e) / mean H(t)`` of run ``config(e, ...)``."""
    opts = {k: v for k, v in self.options if k in ("mu", "num_directions")}
    opts["hctl_of"] = self.config(e, schedule, seed).run_id
    return harness.make_config(self.task, harness.CONTROL, lr_of(e), schedule=schedule,
                               options=opts, seed=seed, budget=self.budget,
                               eval_every=self.eval_every,
                               tag=f"-{self.method.replace('.', '-')}{self.tag}")


MEZO_MU = (("mu", 1e-3),)
# FZOO with 8 probes and heavy-ball momentum 0.9 chained after it (harness.THEN).
FZOO_MOM = (("decay", 0.9), ("mu", 1e-3), ("num_directions", 8), ("then", "trace"))
TABLES: dict[str, list[Grid]] = {
    # CI: a tiny budget end to end (tests/test_choose.py runs it).
    "smoke": [Grid("digits", "mezo", (-12, -8), ("constant", "cosine"), (0,), 200, 100,
                   widen=False, refine=False)],
    # The baseline on digits: MeZO, 7 half-decades 1e-4 .. 1e-1 (widened if the best is at an
    # edge), three schedules, 3 seeds, 40,000 forward passes (20,000 steps of batch 64, ~15 s
    # a run at ~3,500 forward passes a second on one shared core).
    "digits_mezo": [Grid("digits", "mezo", tuple(range(-16, -3, 2)), harness.SCHEDULES,
                         (0, 1, 2), 40_000, 2_000, MEZO_MU),
                    # Decay to a floor (10%, 30%, 50% of the peak): on digits HiZOO's
                    # step-size control, a decay that stops partway, beat decay to 0.
                    Grid("digits", "mezo", tuple(range(-16, -3, 2)),
                         ("cosine_f0.1", "cosine_f0.3", "cosine_f0.5"), (0, 1, 2), 40_000,
                         2_000, MEZO_MU)],
    # The baseline on MiniLM-L6 SST-2 full fine-tuning (all of train.tsv): MeZO with a cosine
    # schedule at seed 0 first (the grid's middle first, so that early results are
    # informative), then the other schedules. 20,000 forward passes = 10,000 steps of batch
    # 16 (2.4 epochs); at the ~0.43 s a forward pass measured on two shared CPU cores, ~2.5 h
    # a run with its 10 evaluations. The centre 1e-5: the SPSA estimate's variance grows with
    # the 22.7M parameters, so MeZO's RoBERTa-large (350M) rates of 1e-7..1e-6 scale up ~16x.
    "sst2_ft_mezo": [
        Grid("sst2_ft_full", "mezo", (-20, -18, -22, -16, -24), ("cosine",), (0,), 20_000,
             2_000, MEZO_MU),
        Grid("sst2_ft_full", "mezo", (-20, -18, -22, -16, -24), ("constant", "linear"), (0,),
             20_000, 2_000, MEZO_MU),
    ],
}

# HiZOO's key option, alpha (hessian_smoothing): 0.5 / d (hz.presets), 1e-3 (the example's),
# and the reference scripts' 1e-6 (full fine-tuning and prefix) or 1e-10 (LoRA). Each alpha
# is its own grid (tag), with the step-size control after its selection.
HIZOO_ALPHAS = {"ft": ("0.5/d", 1e-3, 1e-6), "lora": ("0.5/d", 1e-3, 1e-10)}


def _alpha_tag(a) -> str:
  return "_a" + (a.replace("/", "") if isinstance(a, str) else f"{a:g}")


def hizoo_grids(task, method, exponents, schedules, seeds, budget, eval_every, alphas,
                mu=1e-3) -> list[Grid]:
  """One grid per alpha, each followed by its step-size control."""
  return [Grid(task, method, exponents, schedules, seeds, budget, eval_every,
               (("hessian_smoothing", a), ("mu", mu)), _alpha_tag(a), control=True)
          for a in alphas]


def oracle_grids(task, exponents, schedules, seeds, budget, eval_every, refresh, mu=1e-3,
                 samples=32, floors=(1e-2, 1.0)) -> list[Grid]:
  """The curvature oracle: per-parameter and per-tensor, fixed and refreshed every
  ``refresh`` steps, each its own lr grid, for each floor of ``H / mean H``: 1e-2 lets the
  flattest directions take 100x the average step, 1 only shortens the steep ones (on
  digits the fixed per-parameter oracle with 1e-2 diverged at every lr >= 1e-4)."""
  def opts(kind, r, floor):
    o = (("mu", mu), ("oracle", kind), ("refresh", r), ("samples", samples))
    return o + ((("floor", floor),) if floor != 1e-2 else ())

  return [Grid(task, "oracle", exponents, schedules, seeds, budget, eval_every,
               opts(kind, r, floor), f"_{kind}_r{r}" + ("" if floor == 1e-2 else f"_f{floor:g}"))
          for floor in floors for kind in ("diag", "tensor") for r in (0, refresh)]


TABLES.update({
    # Queued for later sessions (defined so that one command runs each).
    "digits_hizoo": hizoo_grids("digits", "hizoo", tuple(range(-16, -3, 2)), ("constant",),
                                (0, 1, 2), 40_000, 2_000, HIZOO_ALPHAS["ft"]),
    "digits_hizoo_l": hizoo_grids("digits", "hizoo_l", tuple(range(-16, -3, 2)), ("constant",),
                                  (0, 1, 2), 40_000, 2_000, HIZOO_ALPHAS["ft"]),
    "sst2_ft_hizoo": hizoo_grids("sst2_ft_full", "hizoo", (-20, -18, -22, -16, -24),
                                 ("constant",), (0,), 20_000, 2_000, HIZOO_ALPHAS["ft"]),
    "sst2_lora_mezo": [Grid("sst2_lora_full", "mezo", (-12, -10, -14, -8, -16), ("cosine",),
                            (0,), 20_000, 2_000, MEZO_MU)],
    # LoRA at five times the short budget, 20,000 passes (about 70 min a run on a free
    # core): where the short runs were still falling. The grids start at the short tables'
    # selections (cosine 5.62e-4, constant 1.78e-4) and the half-decade below them, since a
    # longer horizon tends to want a lower rate (the short constant grid already turned
    # unstable at 5.62e-4 after 2,000 passes); the grid widens by half-decades until the best
    # is interior. One table per schedule, so that two queues run side by side; no
    # refinement (an hour a point).
    # Full fine-tuning at 20,000 passes, the way the LoRA tables below ran: each schedule
    # its own table (two queues side by side), starting at the 4,000-pass selection (1e-5
    # for both schedules) and the half-decade below, widened by half-decades until the best
    # is interior, no refinement (2.5 hours a point on a free core), then the selection at
    # seeds 1 and 2. The same interior rule as sst2_ft_mezo, from 2 starting points where
    # that grid has 5 (and a refinement): about 4 runs a schedule instead of 7.
    **{f"sst2_long_ft_{sch}": [Grid("sst2_ft_full", "mezo", (-20, -22), (sch,), (0,),
                                    20_000, 2_000, MEZO_MU, refine=False,
                                    confirm_seeds=(1, 2))] for sch in ("constant", "cosine")},
    # The methods against that baseline, at the same 20,000 passes (queued behind the
    # baseline's grids): FZOO (8 probes, 19,998 passes = 2,222 steps of 9) under the
    # constant schedule, its better one at 4,000 passes (5.62e-4 selected there, interior),
    # and MeZO perturbing layers 1-3 only, which gained 1.6x the baseline's training CE at
    # 4,000 passes (1.78e-5 selected there). Each starts at its 4,000-pass selection and
    # the half-decade below, widened until interior, then seeds 1 and 2.
    "sst2_long_ft_fzoo": [Grid("sst2_ft_full", "fzoo", (-13, -15), ("constant",), (0,),
                               19_998, 2_000, (("mu", 1e-3), ("num_directions", 8)), "_n8",
                               refine=False, confirm_seeds=(1, 2))],
    # FZOO's 20,000-pass paired seeds at either grid point (5.62e-4: ``_s1``, ``_s2``;
    # 1.78e-4: ``_lo_s1``, ``_lo_s2``), one table a seed so that they can run beside each
    # other or beside the grid's widening; the grid above reuses them as its confirmation
    # seeds when validation selects their rate at seed 0. With constant lr a run's first
    # passes do not depend on its budget, so even a run cut short says whether it reaches
    # the baseline's final training CE within half the baseline's passes.
    **{f"sst2_long_ft_fzoo{lo}_s{s}": [Grid("sst2_ft_full", "fzoo", (e,), ("constant",), (s,),
                                            19_998, 2_000,
                                            (("mu", 1e-3), ("num_directions", 8)), "_n8",
                                            widen=False, refine=False)]
       for s in (1, 2) for lo, e in (("", -13), ("_lo", -15))},
    "sst2_long_ftl123": [Grid("sst2_ftl123_full", "mezo", (-19, -21), ("constant",), (0,),
                              20_000, 2_000, MEZO_MU, refine=False, confirm_seeds=(1, 2))],
    # FZOO (8 probes, constant) perturbing layers 1-3 and the head only, against the same
    # 20,000-pass baseline: the two gains measured so far, combined. At 20,000 passes FZOO-8
    # on every parameter reached the baseline's final training CE in 0.45, 0.37, 0.59 of its
    # passes; at 4,000 passes MeZO on layers 1-3 gained 1.6 times the baseline's decrease
    # over five seeds. In the rate model the two act on different factors (probes divide
    # the noise term E|g_B|^2 tr H by n; the subset changes |g_S|^4 / tr H_S), so they
    # should multiply. FZOO normalises its step by the spread of the probe losses, so a
    # subset of a quarter of the scalars takes shorter steps at one rate, and the subset's
    # best rate is the higher (MeZO: 1.78e-5 on layers 1-3 against 1e-5 on every parameter):
    # the grid starts at full FZOO's two points, 5.62e-4 and 1.78e-4, widened until
    # interior, then seeds 1 and 2. Predicted (2026-12-03 14:14, before it started): at
    # seed 0 the better rate passes cosine's 0.3706 at 0.2-0.35 of the baseline's passes and
    # ends at 0.358-0.366 in training CE and 0.374-0.383 in validation CE.
    "sst2_long_ftl123_fzoo": [Grid("sst2_ftl123_full", "fzoo", (-13, -15), ("constant",),
                                   (0,), 19_998, 2_000,
                                   (("mu", 1e-3), ("num_directions", 8)), "_n8",
                                   refine=False, confirm_seeds=(1, 2))],
    # The same with cosine decay to 0: at a constant 5.62e-4 (selected, interior: 1.78e-4
    # slower, 1.78e-3 climbs from 4,005 passes on) the training CE stops falling after
    # 12,000 passes, a noise floor that a decaying rate lowers. The grid starts at 5.62e-4
    # and 1.78e-3 (two queues side by side), widened until interior, then seeds 1 and 2.
    # Predicted (2026-12-03, committed 19:46:27, before either started at 19:46:32): at
    # seed 0, 5.62e-4 cosine ends at 0.348-0.355 in training CE and 0.375-0.381 in
    # validation CE (constant: 0.3531, 0.3790) and crosses the baseline's 0.3706 at 0.1-0.2
    # of its passes; 1.78e-3 cosine climbs as the constant rate did until its rate has
    # fallen by about half and ends above 5.62e-4 in validation CE. Measured: 5.62e-4 ended
    # at 0.3564, 0.3799 and 1.78e-3 at 0.3638, 0.3884, both above the constant 5.62e-4
    # (0.3531, 0.3790). The widening point 1.78e-4 predicted (2026-12-03 21:14, before it
    # started): a cosine rate averages half its peak, so it ends between the constant
    # 1.78e-4 (0.3615, 0.3817) and a constant half of it, at 0.362-0.370 in training CE and
    # 0.382-0.390 in validation CE, above cosine 5.62e-4, which closes the grid with
    # 5.62e-4 interior and leaves the constant rate the selection.
    "sst2_long_ftl123_fzoo_cos": [Grid("sst2_ftl123_full", "fzoo", (-13, -11), ("cosine",),
                                       (0,), 19_998, 2_000,
                                       (("mu", 1e-3), ("num_directions", 8)), "_n8",
                                       refine=False, confirm_seeds=(1, 2))],
    # Its seed-0 first point (5.62e-4) at seeds 1 and 2, one table a seed so that they run
    # beside each other or beside the grid; the grid reuses them as its confirmation seeds
    # if validation keeps 5.62e-4. Started before the grid closed: at 4,005 passes seed 0
    # was already below the baseline's final training CE (0.3656 against 0.3706), so the
    # paired seeds say whether that holds. Predicted (2026-12-03 14:40, before they
    # started): each passes its baseline's final training CE (seed 1 0.3698, seed 2 0.3691)
    # at 0.08-0.3 of the baseline's passes and ends at 0.352-0.362 in training CE, within
    # 0.006 of its baseline's validation CE (0.3672, 0.3781); seed 0 ends at 0.356-0.364 and
    # 0.378-0.386.
    **{f"sst2_long_ftl123_fzoo_s{s}": [Grid("sst2_ftl123_full", "fzoo", (-13,), ("constant",),
                                            (s,), 19_998, 2_000,
                                            (("mu", 1e-3), ("num_directions", 8)), "_n8",
                                            widen=False, refine=False)] for s in (1, 2, 3, 4)},
    # Five paired seeds for the goal's test accuracy: at seeds 0-2 the selected setting
    # (FZOO-8 on layers 1-3, constant 5.62e-4) ends +0.8 points over the tuned cosine MeZO
    # (+1.6, +1.3, -0.3), inside the test set's noise (one point is 9 sentences; the
    # per-seed difference spreads by about a point). Seeds 3 and 4 of the setting above
    # (``sst2_long_ftl123_fzoo_s3``, ``_s4``) and of the baseline (cosine 1e-5, below), two
    # queues side by side. Predicted (2026-12-03, committed 21:02:46, before they started
    # at 21:02:49): FZOO ends at 0.352-0.362 in training CE at each seed, the baseline at
    # 0.366-0.374, FZOO passes the baseline's final training CE at 0.08-0.35 of its passes;
    # validation CE within 0.006 of each other; test accuracy per seed -1.5 to +2.5 points,
    # the five-seed mean +0.3 to +1.3.
    **{f"sst2_long_ft_cosine_s{s}": [Grid("sst2_ft_full", "mezo", (-20,), ("cosine",), (s,),
                                          20_000, 2_000, MEZO_MU, widen=False, refine=False)]
       for s in (3, 4)},
    # Batch 64 against the baseline's 16 (constant MeZO, 4,000 passes of 64 sentences: the
    # sentences of 16,000 passes of 16). Per forward pass the rate model predicts ~3.9x the
    # baseline's gain at a ~3.9x higher best rate, per sentence about the same: the grid
    # starts at 3.16e-5 and 1e-5 (the tuned batch-16 rate), widened until interior, then
    # seeds 1 and 2. Compared per pass with the 20,000-pass batch-16 runs' curves.
    "sst2_short_b64": [Grid("sst2_ft_full_b64", "mezo", (-18, -20), ("constant",), (0,), 4_000,
                            1_000, MEZO_MU, refine=False, confirm_seeds=(1, 2))],
    # The same for LoRA, the example's --data configuration (the rate model: E|g_B|^2 /
    # |g|^2 = 91-95 at batch 16, 3.9x a pass at 64): constant MeZO from 5.62e-4 (about 3.9x
    # the tuned constant batch-16 rate, 1.78e-4) and 1.78e-4, widened until interior.
    "sst2_short_lora_b64": [Grid("sst2_lora_full_b64", "mezo", (-13, -15), ("constant",), (0,),
                                 4_000, 1_000, MEZO_MU, refine=False, confirm_seeds=(1, 2))],
    "sst2_long_lora_cosine": [Grid("sst2_lora_full", "mezo", (-13, -15),
                                   ("cosine",), (0,), 20_000, 2_000, MEZO_MU, refine=False,
                                   confirm_seeds=(1, 2))],
    # Cosine MeZO's seed-0 selection (1.78e-4) at seeds 1 and 2, one table a seed so that
    # both run beside each other (the grid above reuses them as its confirmation seeds): on
    # seed 1 constant MeZO at the same rate falls to its lowest by 10,000 passes and climbs
    # back to its start; does the decay (half the rate by then) keep it falling?
    **{f"sst2_long_lora_cosine_s{s}": [Grid("sst2_lora_full", "mezo", (-15,), ("cosine",),
                                            (s,), 20_000, 2_000, MEZO_MU, widen=False,
                                            refine=False)] for s in (1, 2)},
    # Constant MeZO's selection at seeds 3 (and 4): the best LoRA setting's gain over the
    # linear probe is +1.0, +1.7, +2.5 points at seeds 0-2; more seeds for its mean.
    **{f"sst2_long_lora_constant_s{s}": [Grid("sst2_lora_full", "mezo", (-15,),
                                              ("constant",), (s,), 20_000, 2_000, MEZO_MU,
                                              widen=False, refine=False)] for s in (3, 4)},
    "sst2_long_lora_constant": [Grid("sst2_lora_full", "mezo", (-15, -17),
                                     ("constant",), (0,), 20_000, 2_000, MEZO_MU,
                                     refine=False, confirm_seeds=(1, 2))],
    # FZOO (8 probes, constant) at the same five-times budget, 19,998 passes (2,222 steps of
    # 9), seed 0: the method that ended lowest in training CE at 4,000 passes, against the
    # 20,000-pass constant MeZO (its best so far, 1.78e-4, the 4,000-pass selection too).
    # The grid starts at FZOO's 4,000-pass selection (1.78e-3) and the half-decade below.
    "sst2_long_lora_fzoo": [Grid("sst2_lora_full", "fzoo", (-11, -13), ("constant",), (0,),
                                 19_998, 2_000, (("mu", 1e-3), ("num_directions", 8)), "_n8",
                                 refine=False, confirm_seeds=(1, 2))],
    # Its paired seed 1 at the grid's first rate (1.78e-3, the 4,000-pass selection), run
    # beside the grid's 5.62e-4 point so that both fit in one session. The 5.62e-4 point
    # then did better in validation, so this is a seed of a rate the grid no longer selects.
    "sst2_long_lora_fzoo_s1": [Grid("sst2_lora_full", "fzoo", (-11,), ("constant",), (1,),
                                    19_998, 2_000, (("mu", 1e-3), ("num_directions", 8)),
                                    "_n8", widen=False, refine=False)],
    # FZOO's seed-0 selection at 20,000 passes (5.62e-4) at seed 1, run beside the grid's
    # widening point (1.78e-4) so that the paired seed fits in the same session; the grid
    # reuses it as its first confirmation seed if 5.62e-4 stays selected.
    "sst2_long_lora_fzoo_s1b": [Grid("sst2_lora_full", "fzoo", (-13,), ("constant",), (1,),
                                     19_998, 2_000, (("mu", 1e-3), ("num_directions", 8)),
                                     "_n8", widen=False, refine=False)],
    # Which parameters to perturb (experiments/choose/zo_rate.py): at the probe start the
    # rate |g_S|^4 / (E|g_B,S|^2 tr H_S) of the middle transformer layers is 2.2-2.6 times
    # that of every parameter (two independent measurements), and its best constant rate
    # about 5e-5 (layers 1-3) and 7e-5 (layers 2-3), against 1.1e-5 for every parameter
    # (tuned: 1e-5). Full fine-tuning of those layers only, constant MeZO (the tuned
    # baseline's schedule at 4,000 passes), the grid centred on the predicted rate and
    # widened until interior; then the selected rate at seeds 1 and 2.
    "sst2_short_layers": [
        Grid(f"sst2_ftl{ls}_full", "mezo", exps, ("constant",), (0,), 4_000,
             1_000, MEZO_MU, refine=False, confirm_seeds=(1, 2))
        # layers 2-3 start from two rates: 1.78e-4 diverged for layers 1-3
        for ls, exps in (("123", (-17, -19, -15)), ("23", (-17, -19)))],
    # Layers 1-3 at the rate selected at seed 0, and the tuned constant baseline, at seeds 3
    # and 4: the three goal seeds leave the per-seed ratio to the noise of one run (its
    # train CE moves by about as much as the expected gain), five paired seeds measure the
    # mean gain. A table each, so that two queues can run them side by side.
    "sst2_short_layers_seeds": [Grid("sst2_ftl123_full", "mezo", (-19,), ("constant",), (3, 4),
                                     4_000, 1_000, MEZO_MU, widen=False, refine=False)],
    "sst2_short_constant_seeds_34": [Grid("sst2_ft_full", "mezo", (-20,), ("constant",),
                                          (3, 4), 4_000, 1_000, MEZO_MU, widen=False,
                                          refine=False)],
    # The same for LoRA (zo_rate on sst2_lora_full, two measurements): freezing the probe
    # head alone predicts 1.4-1.5x the rate of every LoRA parameter, the adapters of layers
    # 1-3 alone (head frozen) 2.6-5x. Cosine MeZO, the LoRA baseline's schedule at 4,000
    # passes (5.62e-4), the grid centred on the predicted best constant rate times the
    # baseline's cosine / constant ratio (about 3), widened until interior (two points to
    # start: a grid of two widens on the side of the better one); then seeds 1, 2.
    "sst2_short_lora_layers": [
        Grid("sst2_loral123nh_full", "mezo", (-9, -11), ("cosine",), (0,), 4_000, 1_000,
             MEZO_MU, refine=False, confirm_seeds=(1, 2)),
        Grid("sst2_loranh_full", "mezo", (-12, -10), ("cosine",), (0,), 4_000, 1_000,
             MEZO_MU, refine=False, confirm_seeds=(1, 2))],
    "sst2_ft_k512_mezo": [Grid("sst2_ft_k512", "mezo", (-20, -18, -22, -16, -24),
                               ("cosine",), (0,), 10_000, 1_000, MEZO_MU)],
    # The curvature ceiling (MeZO preconditioned by the autodiff Hessian diagonal).
    "digits_oracle": oracle_grids("digits", tuple(range(-16, -3, 2)), ("constant",),
                                  (0, 1, 2), 40_000, 2_000, refresh=2_000),
    # Its fixed rows only (the oracle measured once, at the start): the refreshed ones cost
    # 10 Hutchinson estimates a run; same run ids as in digits_oracle.
    "digits_oracle_fixed": [g for g in oracle_grids("digits", tuple(range(-16, -3, 2)),
                                                    ("constant",), (0, 1, 2), 40_000, 2_000,
                                                    refresh=2_000) if "_r0" in g.tag],
    # The fixed oracles that do not lengthen any step (floor 1) under the baseline's schedule
    # (cosine decay to 30% of the peak): like for like with the tuned MeZO.
    "digits_oracle_sched": [
        Grid("digits", "oracle", (-12, -10, -14, -8), ("cosine_f0.3",), (0, 1, 2), 40_000,
             2_000, (("mu", 1e-3), ("oracle", kind), ("refresh", 0), ("samples", 32),
                     ("floor", 1.0)), f"_{kind}_r0_f1")
        for kind in ("diag", "tensor")
    ],
    "sst2_ft_oracle": oracle_grids("sst2_ft_full", (-20, -18, -22, -16, -24), ("constant",),
                                   (0,), 20_000, 2_000, refresh=2_000),
    "sst2_lora_oracle": oracle_grids("sst2_lora_full", (-12, -10, -14, -8, -16),
                                     ("constant",), (0,), 20_000, 2_000, refresh=2_000),
    # The methods added to the library in 0.4 (hizoo_jax from commit b7ea8e7 on), each with
    # its key option: FZOO's probes (num_directions), the low-rank methods' rank. Constant
    # lr, as the HiZOO rows; the same half-decade grid as MeZO, widened and refined.
    "digits_methods": [
        *[Grid("digits", "fzoo", tuple(range(-16, -3, 2)), ("constant",), (0, 1, 2), 40_000,
               2_000, (("mu", 1e-3), ("num_directions", n)), f"_n{n}") for n in (4, 8, 16)],
        Grid("digits", "sparse_mezo", tuple(range(-16, -3, 2)), ("constant",), (0, 1, 2),
             40_000, 2_000, MEZO_MU),
        Grid("digits", "forward_gradient", tuple(range(-16, -3, 2)), ("constant",), (0, 1, 2),
             40_000, 2_000),
        *[Grid("digits", m, tuple(range(-16, -3, 2)), ("constant",), (0, 1, 2), 40_000, 2_000,
               (("mu", 1e-3), ("rank", r)), f"_r{r}")
          for m in ("lozo", "subzero", "zo_muon") for r in (2, 8)],
    ],
    # The new methods with the baseline's schedule (cosine decay to 30% of the peak, the
    # best MeZO schedule on digits): like for like with the tuned baseline.
    "digits_methods_sched": [
        *[Grid("digits", "fzoo", tuple(range(-16, -3, 2)), ("cosine_f0.3",), (0, 1, 2),
               40_000, 2_000, (("mu", 1e-3), ("num_directions", n)), f"_n{n}")
          for n in (8, 16)],
        Grid("digits", "forward_gradient", tuple(range(-16, -3, 2)), ("cosine_f0.3",),
             (0, 1, 2), 40_000, 2_000),
        Grid("digits", "lozo", tuple(range(-16, -3, 2)), ("cosine_f0.3",), (0, 1, 2), 40_000,
             2_000, (("mu", 1e-3), ("rank", 2)), "_r2"),
    ],
    # What an Optax chain adds to the estimate (the library's compositions, harness.THEN),
    # and the control FZOO's gain needs: MeZO averaging 8 probes a step, like FZOO's 8, but
    # without its normalisation. All with the baseline's schedule (cosine decay to 30%).
    # Heavy-ball momentum (decay 0.9, no dampening) multiplies the step by up to 10, so its
    # grids sit a decade below their method's tuned rate (MeZO 1.78e-3, FZOO 1e-2); Adam's
    # step per coordinate is about its learning rate, whatever the estimate's scale.
    "digits_compose": [
        Grid("digits", "mezo", tuple(range(-16, -3, 2)), ("cosine_f0.3",), (0, 1, 2), 40_000,
             2_000, (("mu", 1e-3), ("then", "adam")), "_adam"),
        Grid("digits", "mezo", tuple(range(-16, -3, 2)), ("cosine_f0.3",), (0, 1, 2), 40_000,
             2_000, (("mu", 1e-3), ("num_directions", 8)), "_n8"),
        Grid("digits", "mezo", tuple(range(-20, -7, 2)), ("cosine_f0.3",), (0, 1, 2), 40_000,
             2_000, (("decay", 0.9), ("mu", 1e-3), ("then", "trace")), "_mom0.9"),
        Grid("digits", "fzoo", tuple(range(-20, -7, 2)), ("cosine_f0.3",), (0, 1, 2), 40_000,
             2_000, FZOO_MOM, "_n8_mom0.9"),
    ],
    # After FZOO (8 probes, cosine to 30%), the one estimate momentum helped on digits: a
    # longer memory (0.95, a grid half a decade lower), Nesterov's look-ahead at 0.9, Adam
    # (per-coordinate normalisation of an already normalised estimate) and 16 probes with
    # momentum 0.9; does any of them reach the tuned baseline's loss in half its passes?
    "digits_compose_fzoo": [
        Grid("digits", "fzoo", tuple(range(-22, -9, 2)), ("cosine_f0.3",), (0, 1, 2), 40_000,
             2_000, (("decay", 0.95), ("mu", 1e-3), ("num_directions", 8),
                     ("then", "trace")), "_n8_mom0.95"),
        Grid("digits", "fzoo", tuple(range(-20, -7, 2)), ("cosine_f0.3",), (0, 1, 2), 40_000,
             2_000, (("decay", 0.9), ("mu", 1e-3), ("nesterov", True), ("num_directions", 8),
                     ("then", "trace")), "_n8_nest0.9"),
        Grid("digits", "fzoo", tuple(range(-16, -3, 2)), ("cosine_f0.3",), (0, 1, 2), 40_000,
             2_000, (("mu", 1e-3), ("num_directions", 8), ("then", "adam")), "_n8_adam"),
        Grid("digits", "fzoo", tuple(range(-20, -7, 2)), ("cosine_f0.3",), (0, 1, 2), 40_000,
             2_000, (("decay", 0.9), ("mu", 1e-3), ("num_directions", 16), ("then", "trace")),
             "_n16_mom0.9"),
    ],
    # The goal asks for the tuned baseline's final training loss (40,000 passes) in at most
    # half its passes. A run with a 40,000-pass schedule is still at a high rate at 20,000;
    # a user after that loss would schedule the shorter run. So the same methods, tuned
    # again, with budgets of 18,000 passes (0.45 of the baseline's; 2,000 FZOO steps of 9
    # passes): FZOO 8 probes with and without momentum 0.9, and MeZO itself as the control
    # (does a shorter schedule alone get there?).
    "digits_half": [
        Grid("digits", "fzoo", tuple(range(-20, -7, 2)), ("cosine_f0.3",), (0, 1, 2), 18_000,
             1_000, FZOO_MOM, "_n8_mom0.9"),
        Grid("digits", "fzoo", tuple(range(-16, -3, 2)), ("cosine_f0.3",), (0, 1, 2), 18_000,
             1_000, (("mu", 1e-3), ("num_directions", 8)), "_n8"),
        Grid("digits", "mezo", tuple(range(-16, -3, 2)), ("cosine_f0.3",), (0, 1, 2), 18_000,
             1_000, MEZO_MU),
    ],
    # Momentum 0.95 after FZOO beat 0.9 (0.52-0.60 of the baseline's passes against
    # 0.56-0.65): longer memories, 0.98 and 0.99. The selected rates so far keep
    # lr / (1 - decay) near FZOO's tuned 10^-2, which predicts 2e-4 and 1e-4; the grid
    # (1e-6 .. 3.16e-4, widened if its best is at an edge) holds both below its top.
    "digits_compose_fzoo_mom": [
        Grid("digits", "fzoo", tuple(range(-24, -11, 2)), ("cosine_f0.3",), (0, 1, 2), 40_000,
             2_000, (("decay", d), ("mu", 1e-3), ("num_directions", 8), ("then", "trace")),
             f"_n8_mom{d}") for d in (0.98, 0.99)
    ],
    # The schedule search the baseline had, for the best digits row (FZOO 8 probes +
    # momentum 0.9, tuned so far only under the baseline's cosine to 30%): cosine and
    # linear decay to 0, cosine to 10% and to 50% of the peak (its cosine-to-30% runs are
    # digits_compose's, reused).
    "digits_fzoo_sched": [
        Grid("digits", "fzoo", tuple(range(-20, -7, 2)),
             ("cosine_f0.3", "cosine", "linear", "cosine_f0.1", "cosine_f0.5"), (0, 1, 2), 40_000,
             2_000, FZOO_MOM, "_n8_mom0.9"),
    ],
    # Half the baseline's passes exactly (19,998 = 2,222 FZOO steps of 9 passes), tuned for
    # it. At 18,000 FZOO 8 probes (cosine to 30%) ended at train 0.1030, 0.0858, 0.1112
    # against the baseline's 0.0994, 0.0885, 0.1013: the 11% more passes, and perhaps a
    # schedule that decays to 0, are what is left between it and the goal. Predicted before
    # running: cosine to 30% reaches on two seeds of three, cosine to 0 on all three;
    # momentum 0.95 (the best 40,000-pass row) no better than without (0.9 did not help at
    # 18,000). Measured: both wrong (docs/results/choosing.md, "Exactly half the passes").
    "digits_half20": [
        *[Grid("digits", "fzoo", tuple(range(-16, -3, 2)), (s,), (0, 1, 2), 19_998, 1_000,
               (("mu", 1e-3), ("num_directions", 8)), "_n8") for s in ("cosine_f0.3", "cosine")],
        *[Grid("digits", "fzoo", tuple(range(-22, -9, 2)), (s,), (0, 1, 2), 19_998, 1_000,
               (("decay", 0.95), ("mu", 1e-3), ("num_directions", 8), ("then", "trace")),
               "_n8_mom0.95") for s in ("cosine_f0.3", "cosine")],
    ],
    # Adam's normalisation at SGD's memory: the library's global second moment (one scalar
    # for the whole estimate, hz.scale_by_global_rms) after MeZO's estimate. Its own table,
    # so that a second queue runs it beside digits_compose.
    "digits_compose_rms": [
        Grid("digits", "mezo", tuple(range(-16, -3, 2)), ("cosine_f0.3",), (0, 1, 2), 40_000,
             2_000, (("mu", 1e-3), ("then", "global_rms")), "_grms"),
    ],
    # SST-2 full fine-tuning at a budget two cores can run in a session (4,000 forward
    # passes, ~20 min a run): the tuned baseline (MeZO, cosine decay) against the method
    # that beat it on digits (FZOO, 8 probes, same schedule), seed 0. Grid centres from the
    # measured minibatch gradient norm (~5.5 at the start): FZOO's normalised step moves a
    # coordinate by ~lr / sqrt(8), MeZO's by ~lr |g|, so FZOO's matching rate is ~16x MeZO's.
    # Run in this order; the best half-decade was interior for both (MeZO 1e-5, FZOO 1e-3),
    # then one quarter-decade on the side a parabola through the three points favoured
    # (the session's time allowed one run each, so refine=False).
    "sst2_short_mezo": [Grid("sst2_ft_full", "mezo", (-18, -20, -22, -21), ("cosine",), (0,),
                             4_000, 1_000, MEZO_MU, refine=False)],
    "sst2_short_fzoo": [Grid("sst2_ft_full", "fzoo", (-14, -12, -10, -13), ("cosine",), (0,),
                             4_000, 1_000, (("mu", 1e-3), ("num_directions", 8)), "_n8",
                             refine=False)],
    # The same two selected runs at seeds 1 and 2: three paired seeds for the ratio of forward
    # passes (FZOO to MeZO's final training loss at the same seed).
    "sst2_short_seeds": [
        Grid("sst2_ft_full", "mezo", (-20,), ("cosine",), (1, 2), 4_000, 1_000, MEZO_MU,
             widen=False, refine=False),
        Grid("sst2_ft_full", "fzoo", (-13,), ("cosine",), (1, 2), 4_000, 1_000,
             (("mu", 1e-3), ("num_directions", 8)), "_n8", widen=False, refine=False),
    ],
    # The curvature ceiling at the short budget: MeZO (cosine, seed 0) preconditioned by the
    # autodiff Hessian diagonal, per parameter and per tensor, fixed at the start (the
    # refreshed rows are sst2_short_oracle_refresh), floor 1 (normalised H >= 1: the oracle
    # only shortens the steep directions, never lengthens a flat one past MeZO's step, the
    # setting that did not diverge on digits). Its steps are never longer than MeZO's, so
    # the grid starts at MeZO's best rate and goes up.
    "sst2_short_oracle": [
        Grid("sst2_ft_full", "oracle", (-20, -18, -16), ("cosine",), (0,), 4_000, 1_000,
             (("mu", 1e-3), ("oracle", kind), ("refresh", 0), ("samples", 32), ("floor", 1.0)),
             f"_{kind}_r0_f1", widen=False, refine=False)
        for kind in ("diag", "tensor")
    ],
    # sst2_short_oracle at seeds 1 and 2 (the batches and noise of the baseline's seeds 1
    # and 2, sst2_short_seeds and sst2_short_constant_seeds), at the rate both kinds
    # selected at seed 0 (3.16e-5): the ceiling paired over the goal's three seeds.
    "sst2_short_oracle_seeds": [
        Grid("sst2_ft_full", "oracle", (-18,), ("cosine",), (1, 2), 4_000, 1_000,
             (("mu", 1e-3), ("oracle", kind), ("refresh", 0), ("samples", 32), ("floor", 1.0)),
             f"_{kind}_r0_f1", widen=False, refine=False)
        for kind in ("tensor", "diag")
    ],
    # The paper's test functions: float32, one seed per noise draw, 3 seeds.
    "testfn_mezo": [Grid(f, "mezo", tuple(range(-16, -1, 2)), harness.SCHEDULES, (0, 1, 2),
                         6_000, 300, MEZO_MU) for f in ("fa", "fb", "fc")],
    # The rest of the SST-2 baseline's schedule at the short budget: MeZO constant and linear
    # (cosine is sst2_short_mezo), seed 0, the half-decade grid widened until interior. A
    # table each, so that two queues can run them side by side. Constant's average step is
    # twice cosine's at the same peak, so its grid starts at cosine's best and goes down first.
    "sst2_short_mezo_constant": [Grid("sst2_ft_full", "mezo", (-20, -22, -18), ("constant",),
                                      (0,), 4_000, 1_000, MEZO_MU, refine=False)],
    "sst2_short_mezo_linear": [Grid("sst2_ft_full", "mezo", (-20, -18, -22), ("linear",),
                                    (0,), 4_000, 1_000, MEZO_MU, refine=False)],
    # The selected baseline (MeZO, constant, 1e-5: the best schedule at this budget) at seeds
    # 1 and 2: with seed 0 from sst2_short_mezo_constant, three paired seeds.
    "sst2_short_constant_seeds": [Grid("sst2_ft_full", "mezo", (-20,), ("constant",), (1, 2),
                                       4_000, 1_000, MEZO_MU, widen=False, refine=False)],
    # FZOO (8 probes) with the baseline's selected schedule, constant: like for like with it.
    # Constant's average step is twice cosine's at the same peak, so the grid starts half a
    # decade below cosine's best (10^-3.25) and is widened until interior.
    "sst2_short_fzoo_constant": [Grid("sst2_ft_full", "fzoo", (-15, -13, -11), ("constant",),
                                      (0,), 4_000, 1_000,
                                      (("mu", 1e-3), ("num_directions", 8)), "_n8",
                                      refine=False)],
    # FZOO constant at its best rate of seed 0 (5.62e-4, which reached constant MeZO's final
    # training CE in about half the passes there) at seeds 1 and 2: three paired seeds.
    "sst2_short_fzoo_constant_seeds": [Grid("sst2_ft_full", "fzoo", (-13,), ("constant",),
                                            (1, 2), 4_000, 1_000,
                                            (("mu", 1e-3), ("num_directions", 8)), "_n8",
                                            widen=False, refine=False)],
    # LoRA (rank 8 on query/value, the probe-fitted head trained too: 74,498 parameters) at
    # the short budget: MeZO and FZOO (8 probes), constant, the rate tuned on seed 0 (widened
    # until interior), then seeds 1 and 2 at the selected rate. Grid centres from matching
    # the step norm of the FT runs at their best rates (MeZO ~lr |g| sqrt(d): 0.28; FZOO
    # ~lr sqrt(d / 8): 0.94) with LoRA's measured minibatch gradient norm (1.24, FT 5.8) and
    # d: MeZO ~8e-4, FZOO ~1e-2; the grids start just below each (5.62e-4, 5.62e-3).
    "sst2_short_lora_mezo": [Grid("sst2_lora_full", "mezo", (-13, -11, -15), ("constant",),
                                  (0,), 4_000, 1_000, MEZO_MU, refine=False,
                                  confirm_seeds=(1, 2))],
    "sst2_short_lora_fzoo": [Grid("sst2_lora_full", "fzoo", (-9, -7, -11), ("constant",),
                                  (0,), 4_000, 1_000, (("mu", 1e-3), ("num_directions", 8)),
                                  "_n8", refine=False, confirm_seeds=(1, 2))],
    # The LoRA baseline's schedule: MeZO with cosine decay to 0 (seed 0). At constant rates
    # the rate that goes furthest early (5.62e-4) turns back up after 3,000 passes, which is
    # what a decay is for. Two queues can split it (the grid's runs are claimed one by one).
    "sst2_short_lora_mezo_cosine": [Grid("sst2_lora_full", "mezo", (-13, -11, -15),
                                         ("cosine",), (0,), 4_000, 1_000, MEZO_MU,
                                         refine=False)],
    # FZOO with heavy-ball momentum (the one Optax stage that gained on digits) on SST-2
    # LoRA, at the rate equivalent to FZOO's tuned one there (1.78e-3 x (1 - 0.9)), three
    # paired seeds. Not tuned itself (a grid is 3 runs more than a session's cores allowed):
    # a check of whether the digits gain carries over, in favour of the tuned FZOO rows.
    "sst2_short_lora_fzoo_mom": [Grid("sst2_lora_full", "fzoo", (-15,), ("constant",),
                                      (0, 1, 2), 4_000, 1_000, FZOO_MOM, "_n8_mom0.9",
                                      widen=False, refine=False)],
    # The harness on an accelerator: the two tuned SST-2 baselines at seed 0, as run on the
    # CPU (same configs), for seconds per forward pass and the curve on another device.
    "gpu_sst2": [Grid("sst2_ft_full", "mezo", (-20,), ("constant",), (0,), 4_000, 1_000,
                      MEZO_MU, widen=False, refine=False),
                 Grid("sst2_lora_full", "mezo", (-13,), ("cosine",), (0,), 4_000, 1_000,
                      MEZO_MU, widen=False, refine=False)],
    # Its rate at seed 0 (5.62e-4, which beat constant 1.78e-4 there: the decay lets the
    # rate that goes furthest early keep its gains) at seeds 1 and 2.
    "sst2_short_lora_cosine_seeds": [Grid("sst2_lora_full", "mezo", (-13,), ("cosine",), (1, 2),
                                          4_000, 1_000, MEZO_MU, widen=False, refine=False)],
    # The paper's protocol, k = 512 per class (1,024 training sentences drawn by seed, 128 a
    # class held out for validation), full fine-tuning at the short budget: MeZO and FZOO,
    # constant, the grids of the full-data runs (their best rates in the middle), seeds 1
    # and 2 (their own draws of the k-shot split) at the selected rate.
    "sst2_short_k512_mezo": [Grid("sst2_ft_k512", "mezo", (-20, -18, -22), ("constant",),
                                  (0,), 4_000, 1_000, MEZO_MU, refine=False,
                                  confirm_seeds=(1, 2))],
    "sst2_short_k512_fzoo": [Grid("sst2_ft_k512", "fzoo", (-13, -11, -15), ("constant",),
                                  (0,), 4_000, 1_000, (("mu", 1e-3), ("num_directions", 8)),
                                  "_n8", refine=False, confirm_seeds=(1, 2))],
    # The baseline's schedule at k = 512: cosine MeZO, the same grid and seeds (on LoRA cosine
    # won at seed 0 with a 3x higher rate than constant; on all of train constant won).
    "sst2_short_k512_mezo_cosine": [Grid("sst2_ft_k512", "mezo", (-20, -18, -22), ("cosine",),
                                         (0,), 4_000, 1_000, MEZO_MU, refine=False,
                                         confirm_seeds=(1, 2))],
    # sst2_short_oracle with its diagonal re-measured every 500 steps (at 1,000, 2,000 and
    # 3,000 passes), as sst2_short_lora_oracle_refresh for LoRA: the fixed oracles' selected
    # rate first, then the next half-decade up (where on digits the refresh kept a larger
    # step stable) and the one down.
    "sst2_short_oracle_refresh": [
        Grid("sst2_ft_full", "oracle", (-18, -16, -20), ("cosine",), (0,), 4_000, 1_000,
             (("mu", 1e-3), ("oracle", kind), ("refresh", 500), ("samples", 32),
              ("floor", 1.0)), f"_{kind}_r500_f1", widen=False, refine=False)
        for kind in ("diag", "tensor")
    ],
    # The curvature ceiling for LoRA at the short budget, as sst2_short_oracle for full
    # fine-tuning: the LoRA baseline (cosine MeZO, seed 0, the same batches and noise)
    # preconditioned by the autodiff Hessian diagonal of the LoRA factors and the head, per
    # parameter and per tensor, measured at the start, floor 1. The grid starts at the
    # baseline's rate (5.62e-4) and goes up (the oracle's steps are never longer); it is
    # widened down where that rate is the best.
    "sst2_short_lora_oracle": [
        Grid("sst2_lora_full", "oracle", (-13, -11, -9), ("cosine",), (0,), 4_000, 1_000,
             (("mu", 1e-3), ("oracle", kind), ("refresh", 0), ("samples", 32), ("floor", 1.0)),
             f"_{kind}_r0_f1", refine=False)
        for kind in ("diag", "tensor")
    ],
    # Its per-parameter oracle (fixed) at its selected rate at seeds 1 and 2, the batches and
    # noise of sst2_short_lora_cosine_seeds: the LoRA ceiling paired over three seeds.
    "sst2_short_lora_oracle_seeds": [
        Grid("sst2_lora_full", "oracle", (-13,), ("cosine",), (1, 2), 4_000, 1_000,
             (("mu", 1e-3), ("oracle", "diag"), ("refresh", 0), ("samples", 32),
              ("floor", 1.0)), "_diag_r0_f1", widen=False, refine=False)
    ],
    # Its per-parameter oracle re-measured every 500 steps (at 1,000, 2,000 and 3,000
    # passes) at the baseline's rate and the next half-decade up, where the fixed oracle is
    # stable and MeZO is not: on digits the refresh is what made the larger peak pay.
    "sst2_short_lora_oracle_refresh": [
        Grid("sst2_lora_full", "oracle", (-13, -11), ("cosine",), (0,), 4_000, 1_000,
             (("mu", 1e-3), ("oracle", "diag"), ("refresh", 500), ("samples", 32),
              ("floor", 1.0)), "_diag_r500_f1", widen=False, refine=False)
    ],
    # The refreshed oracle on digits under the tuned baseline's schedule: as
    # digits_oracle_sched, with H re-measured every 2,000 steps (10 times a run) at the
    # current params, so that a curvature that changes along the run is followed.
    "digits_oracle_refresh_sched": [
        Grid("digits", "oracle", (-12, -10, -14, -8), ("cosine_f0.3",), (0, 1, 2), 40_000,
             2_000, (("mu", 1e-3), ("oracle", kind), ("refresh", 2_000), ("samples", 32),
                     ("floor", 1.0)), f"_{kind}_r2000_f1")
        for kind in ("diag", "tensor")
    ],
    # HiZOO on the test functions at its preset's mu (1e-2; the grids above use MeZO's 1e-3,
    # at which f_c's y-curvature, 2 mu^2 = 2e-6, is below float32's resolution of f).
    "testfn_hizoo_mu": [
        Grid(f, "hizoo", tuple(range(-16, -1, 2)), ("constant",), (0, 1, 2), 6_000, 300,
             (("hessian_smoothing", "0.5/d"), ("mu", 1e-2)), "_a0.5d_mu0.01", control=True)
        for f in ("fa", "fb", "fc")],
    # The paper's test functions for the other methods: HiZOO at its three alphas (with the
    # step-size control), FZOO with 8 probes; constant and the schedules MeZO has.
    "testfn_methods": [
        *[g for f in ("fa", "fb", "fc")
          for g in hizoo_grids(f, "hizoo", tuple(range(-16, -1, 2)), ("constant",), (0, 1, 2),
                               6_000, 300, HIZOO_ALPHAS["ft"])],
        *[Grid(f, "fzoo", tuple(range(-16, -1, 2)), harness.SCHEDULES, (0, 1, 2), 6_000, 300,
               (("mu", 1e-3), ("num_directions", 8)), "_n8") for f in ("fa", "fb", "fc")],
    ],
    # Every other method of the library on SST-2 full fine-tuning at the short budget (4,000
    # passes, seed 0), constant like the tuned baseline there (constant MeZO 1e-5, the best
    # schedule at this budget; sst2_short_mezo_constant) and like FZOO's rows
    # (sst2_short_fzoo_constant): each method's half-decade grid, started at the rate its
    # estimate's scale predicts and widened until the best is interior. A table each, so two
    # queues can split them (a grid's runs are claimed one by one). Each method at its
    # library default of its key option (Sparse MeZO sparsity 0.8, LOZO rank 2 with V
    # redrawn every 50 steps, SubZero rank 8, ZO-Muon rank 64 with 4 probes); forward
    # gradients are the exact-derivative control of MeZO (one jvp counted as 2 passes).
    # Predicted on 2026-12-04 at 04:27, before any of them started (seed 0; constant MeZO
    # 1e-5 ends at 0.3766 train CE, 0.3948 val CE, 78.6% test; FZOO-8 5.62e-4 at 0.3727,
    # 0.3923):
    # - Sparse MeZO: perturbs 20% of each matrix, so a ~5x smaller effective dimension and a
    #   best rate 3-5x MeZO's (3.16e-5 or 1e-4, interior). The rate model gives it MeZO's
    #   gain a pass if the small weights carry their share of |g|^2 and of tr H: level with
    #   MeZO, train CE 0.373-0.380, val CE 0.390-0.398.
    # - LOZO rank 2: E[g] = r grad (Z = U V^T unscaled), so its best rate is 1/2-1/4 of
    #   MeZO's (3.16e-6); on digits it ended between constant MeZO and the decayed
    #   baselines: level with MeZO here, 0.374-0.380 / 0.391-0.399.
    # - SubZero rank 8: the perturbation's energy is a full Gaussian's, so MeZO's rate
    #   (1e-5); on digits it ended above constant MeZO: 0.376-0.382 / 0.393-0.401.
    # - ZO-Muon rank 64, 4 probes: a step of fixed length per matrix, like FZOO's
    #   normalised one; best rate 1e-3 or 3.16e-4, ending between MeZO and FZOO or above
    #   MeZO (the orthogonalised step of a noisy estimate is mostly noise): 0.372-0.382.
    # - Forward gradient: the same Gaussian directions with the exact derivative; mu = 1e-3
    #   loses nothing here, so it tracks MeZO at 1e-5: within 0.002 of 0.3766 / 0.3948,
    #   at 1.5-3x MeZO's seconds a pass (a jvp on CPU).
    "sst2_short_sparse_mezo": [Grid("sst2_ft_full", "sparse_mezo", (-18, -16, -20),
                                    ("constant",), (0,), 4_000, 1_000, MEZO_MU, refine=False)],
    "sst2_short_lozo": [Grid("sst2_ft_full", "lozo", (-22, -20, -24), ("constant",), (0,),
                             4_000, 1_000, (("mu", 1e-3), ("rank", 2)), "_r2", refine=False)],
    "sst2_short_subzero": [Grid("sst2_ft_full", "subzero", (-20, -22, -18), ("constant",),
                                (0,), 4_000, 1_000, (("mu", 1e-3), ("rank", 8)), "_r8",
                                refine=False)],
    "sst2_short_zo_muon": [Grid("sst2_ft_full", "zo_muon", (-12, -14, -10), ("constant",),
                                (0,), 4_000, 1_000,
                                (("mu", 1e-3), ("rank", 64), ("num_directions", 4)), "_r64",
                                refine=False)],
    "sst2_short_forward_gradient": [Grid("sst2_ft_full", "forward_gradient", (-20, -22, -18),
                                         ("constant",), (0,), 4_000, 1_000, refine=False)],
    # Seed 0 of those grids (measured 2026-12-04): Sparse MeZO 1e-4 ended at 0.3749 train /
    # 0.3904 val CE (MeZO 0.3766 / 0.3948) and reached MeZO's final train CE in 0.45-0.50 of
    # its passes; SubZero 1e-5 at 0.3759 / 0.3914 (ratio 0.93-1.00); ZO-Muon 3.16e-3 at
    # 0.3750 / 0.3933 (0.72-0.75); LOZO 3.16e-6 at 0.3780 / 0.3972 (never). A seed-0 win
    # has not held before (FZOO-8 constant: 0.3727 at seed 0, above MeZO at seeds 1 and 2),
    # so the three that won go to the baseline's other seeds at their selected rate: Sparse
    # MeZO at seeds 1-4 (MeZO has all five), SubZero and ZO-Muon at seeds 1 and 2.
    # Predicted 2026-12-04 10:50, before they started: Sparse MeZO's train CE within 0.002
    # of MeZO's on each seed, paired mean difference -0.001 +- 0.001 (seed 0: -0.0017), its
    # ratio below 1 on 2-3 of the 4 new seeds; SubZero and ZO-Muon level with MeZO (paired
    # difference within +-0.002, ratios 0.7 to never).
    "sst2_short_sparse_mezo_seeds": [Grid("sst2_ft_full", "sparse_mezo", (-16,), ("constant",),
                                          (1, 2, 3, 4), 4_000, 1_000, MEZO_MU, widen=False,
                                          refine=False)],
    "sst2_short_subzero_seeds": [Grid("sst2_ft_full", "subzero", (-20,), ("constant",), (1, 2),
                                      4_000, 1_000, (("mu", 1e-3), ("rank", 8)), "_r8",
                                      widen=False, refine=False)],
    "sst2_short_zo_muon_seeds": [Grid("sst2_ft_full", "zo_muon", (-10,), ("constant",), (1, 2),
                                      4_000, 1_000,
                                      (("mu", 1e-3), ("rank", 64), ("num_directions", 4)),
                                      "_r64", widen=False, refine=False)],
    # Seeds 0-2 of ZO-Muon at 3.16e-3 (measured 2026-12-04): paired against constant MeZO,
    # train CE -0.0024 +- 0.0017 (seeds -0.0016, -0.0056, -0.0000), val CE +0.0011 +- 0.0014,
    # test CE -0.0038 +- 0.0017, test acc +0.2 +- 0.4 points. The only method whose test CE
    # is lower on every seed so far; two more seeds (MeZO has 3 and 4) decide whether that
    # holds. Predicted 2026-12-04 12:40, before they started: train CE within 0.004 of
    # MeZO's on each (0.3735-0.3815), below it on at least one; over five seeds the paired
    # train difference -0.002 +- 0.0015 (not two standard errors from zero) and test CE
    # -0.003 +- 0.0015; ratios 0.7-1.0 or never, none below 0.5.
    # Measured (13:15): seeds 3 and 4 at 0.3712 and 0.3718 (MeZO 0.3770, 0.3745), below the
    # predicted range; over five seeds train -0.0031 +- 0.0011, test CE -0.0044 +- 0.0015,
    # ratios 0.72, start, 1.00, 0.42, 0.81 (interpolated): better than predicted.
    # ZO-Muon on layers 1-3 and the head only: of the full fine-tuning methods at this budget
    # ZO-Muon alone ends lower than constant MeZO over five paired seeds (train CE -0.0031 +-
    # 0.0011), and MeZO on layers 1-3 ended -0.0020 +- 0.0016 (the gradient's share there
    # is about twice the curvature's). Whether the two compound: ZO-Muon's grid at seed 0,
    # closed, then seeds 1 and 2 at the selected rate, against constant MeZO on every
    # parameter (the tuned baseline). Predicted 2026-12-04 13:22, before it started: its
    # step has a fixed length per matrix, so with a third of the matrices the best rate is
    # the same or a half-decade higher (3.16e-3 or 1e-2, interior); seed 0 ends at train CE
    # 0.368-0.374 and val CE 0.389-0.396 (full ZO-Muon 0.3750 / 0.3933, MeZO on layers 1-3
    # 0.3733 / 0.3930); over seeds 0-2 a paired train difference against the baseline of
    # -0.004 to -0.008, ratios 0.3-0.8 where counted, test accuracy level (within 1 point).
    # Measured (14:29): 1e-2 selected, interior; seed 0 at 0.3748 / 0.3907; over seeds 0-2
    # train -0.0022 +- 0.0004 (as either change alone: the gains did not compound), ratios
    # 0.54, start, 0.63, test accuracy -0.1 +- 0.3 points.
    "sst2_short_layers_zo_muon": [Grid("sst2_ftl123_full", "zo_muon", (-10, -12, -8),
                                       ("constant",), (0,), 4_000, 1_000,
                                       (("mu", 1e-3), ("rank", 64), ("num_directions", 4)),
                                       "_r64", refine=False, confirm_seeds=(1, 2))],
    # Its point above the grid, run beside the grid's last point on the otherwise idle core
    # (the same run as the grid's widening would make, so the grid finds it done). 1e-1
    # (-4) was started too and stopped at its start: at 2,000 passes 3.16e-2 was already
    # above 1e-2 in train and val CE (0.3783 / 0.3964 against 0.3769 / 0.3955).
    "sst2_short_layers_zo_muon_up": [Grid("sst2_ftl123_full", "zo_muon", (-6,), ("constant",),
                                          (0,), 4_000, 1_000,
                                          (("mu", 1e-3), ("rank", 64), ("num_directions", 4)),
                                          "_r64", widen=False, refine=False)],
    # Its seeds 1 and 2 at 1e-2, started while 3.16e-2 ran (the grid's confirm_seeds, the
    # same runs, if 1e-2 is selected; they would be set aside if 3.16e-2 ended lower).
    "sst2_short_layers_zo_muon_s12": [Grid("sst2_ftl123_full", "zo_muon", (-8,),
                                           ("constant",), (1, 2), 4_000, 1_000,
                                           (("mu", 1e-3), ("rank", 64), ("num_directions", 4)),
                                           "_r64", widen=False, refine=False)],
    "sst2_short_zo_muon_seeds_more": [Grid("sst2_ft_full", "zo_muon", (-10,), ("constant",),
                                           (3, 4), 4_000, 1_000,
                                           (("mu", 1e-3), ("rank", 64), ("num_directions", 4)),
                                           "_r64", widen=False, refine=False)],
    # HiZOO itself on SST-2 full fine-tuning at the short budget (4,000 passes, seed 0,
    # constant like the tuned baseline, constant MeZO 1e-5): the library's namesake had only
    # its ceiling (the curvature oracle) on real data. One grid per alpha, the three
    # (hessian_smoothing 1e-3, the example's; 0.5/d = 2.2e-8, hz.presets'; 1e-6, the reference
    # scripts' full fine-tuning value), widened until interior, the step-size control (MeZO
    # with lr / mean H(t) of the selected run) after alpha 1e-3 only: with the two small
    # alphas H(t) stays at its start of 1 over 1,333 steps (1,333 alpha < 1.4e-3 of the way
    # to its target), so their control would be the baseline's own run. Alpha 1e-3 first
    # (the only one whose H moves in this budget), then the preset's, then 1e-6.
    # Predicted 2026-12-04 16:23 (commit 4276b06), before any of them started (seed 0;
    # constant MeZO 1e-5: 0.3783 / 0.3953 at 2,000 passes, 0.3770 / 0.3955 at 3,000, 0.3766
    # / 0.3948 at 4,000; the exact diagonal, fixed, cosine, ended at 0.3782 / 0.3965):
    # - alpha 1e-3: mean H(t) rises from 1 to 10-50 (the LoRA runs of docs/results/sst2.md
    #   reached 16.6 in 500 steps), so the step is lr / H and the best rate is 3-30x MeZO's:
    #   3.16e-5 or 1e-4, interior. It ends at train CE 0.376-0.380 and val CE 0.394-0.399,
    #   level with or above MeZO, and does not reach MeZO's final train CE (ratio never or
    #   above 0.9): even the exact diagonal does not, and HiZOO spends 3 passes a step to
    #   MeZO's 2. Its control ends within 0.0015 of it in train CE (on digits and on the
    #   LoRA page the control matched HiZOO).
    # - alpha 0.5/d and 1e-6: MeZO with 2/3 of its steps a pass. Best rate 1e-5 (interior),
    #   ending where MeZO is at about 2,700 passes: train 0.3765-0.380, val 0.394-0.398;
    #   ratio never or above 0.9. The two end within 0.001 of each other.
    # - Seconds a pass: within 1.3x MeZO's (the H update is elementwise).
    # Measured at 16:42 (seed 0, alpha 1e-3): 3.16e-5 ended at 0.3806 / 0.3985, 1e-4 at 0.3803
    # / 0.3987, both within 0.0007 of the start (0.3809 / 0.3987), because mean H(t) rose by
    # about 1 a step (104 at step 100, 472 at 500, 733 at 900; the EMA's target is about
    # 1,000 times its start): the step is lr / H, so by step 300 these rates move 300 times
    # less than they say. Validation separates them by 0.0002, noise, so "interior" there
    # would mean nothing: the grid goes on up the rates a run of this budget can use, to
    # 1e-2 (-14, -12, -10, -8), and widens further if the best is still its top.
    # Predicted 16:47, before any of those started: the first ~50 steps, while H < 50, carry
    # the risk (MeZO at 3.16e-5 already ends 0.012 above its own best); 3.16e-4 ends at
    # 0.378-0.380, 1e-3 at 0.376-0.380 or hurt early and recovering; 3.16e-3 and 1e-2 above
    # the start (train CE > 0.383 at 1,000 passes); the best is 3.16e-4 or 1e-3, still above
    # MeZO's 0.3766 / 0.3948 (ratio never), and its control ends within 0.0015 of it.
    # At 2,000 passes 3.16e-4 was above its start (0.3830 / 0.4044 against 0.3809 / 0.3987;
    # 16:59): its first steps, before H grew, did the damage the prediction feared. So the
    # grid stops at 1e-3 (the next half-decade, which shows whether the trend turns):
    # 3.16e-3 and 1e-2 were dropped before they started.
    # Measured 2026-12-04 18:37 (seed 0; "HiZOO itself at this budget"): alpha 1e-3 selects
    # 3.16e-5 (a tie in the noise) at 0.3806 / 0.3985, its control 0.3801 / 0.3984; 0.5/d
    # selects 1e-5 at 0.3772 / 0.3953 (H 1.02); 1e-6 selects 1e-5 at 0.3776 / 0.3957 (H
    # 1.69), its control 0.3771 / 0.3951. None reaches MeZO's 0.3766 (ratio never).
    "sst2_short_hizoo": [
        Grid("sst2_ft_full", "hizoo", (-18, -16, -20, -14, -12), ("constant",), (0,),
             4_000, 1_000,
             (("hessian_smoothing", 1e-3), ("mu", 1e-3)), _alpha_tag(1e-3), refine=False,
             control=True),
        Grid("sst2_ft_full", "hizoo", (-20, -22, -18), ("constant",), (0,), 4_000, 1_000,
             (("hessian_smoothing", "0.5/d"), ("mu", 1e-3)), _alpha_tag("0.5/d"), refine=False),
        # alpha 1e-6 gets its control after all (added 16:50, before its grid started): the
        # EMA's target is about 1,000 (above), so 1,333 steps of 1e-6 take H from 1 to about
        # 2.3, a decay to ~0.4 of the rate, not the "stays at 1" written above (which holds
        # for 0.5/d: 1 + 0.03). On digits the control of 1e-6 was the best MeZO of its
        # table. Predicted: HiZOO 1e-6 selects 1e-5 or 3.16e-5 and ends at 0.3765-0.380; its
        # control (2 passes a step to HiZOO's 3) ends 0.000-0.003 below it.
        Grid("sst2_ft_full", "hizoo", (-20, -22, -18), ("constant",), (0,), 4_000, 1_000,
             (("hessian_smoothing", 1e-6), ("mu", 1e-3)), _alpha_tag(1e-6), refine=False,
             control=True),
    ],
    # HiZOO on the LoRA task at the same budget, with the tuned LoRA baseline's schedule
    # (cosine; MeZO 5.62e-4 at seed 0: 0.3698 / 0.3896 at 2,000 passes, 0.3686 / 0.3891 at
    # 3,000, 0.3682 / 0.3889 / 80.3% at 4,000) and the LoRA alphas (1e-3; 0.5/d = 6.7e-6 of
    # the 74,498 trainable numbers; 1e-10, the reference scripts' LoRA value), the control
    # after 1e-3. Queued after sst2_short_hizoo's first two grids. The grids start at the
    # baseline's 5.62e-4 for the small alphas (H stays within 1% of 1) and a half-decade
    # above it for 1e-3 (the step is lr / H(t)).
    # Predicted 2026-12-04 16:26, before any of them started (seed 0):
    # - alpha 1e-3: best 1.78e-3 or 5.62e-3, interior; ends at train 0.368-0.374, val
    #   0.388-0.395, level with or above the baseline; ratio never or above 0.8; its control
    #   within 0.0015 of it in train CE.
    # - alpha 0.5/d and 1e-10: cosine MeZO with 2/3 of its steps: best 5.62e-4, ending at
    #   0.369-0.374 / 0.389-0.394, within 0.001 of each other; ratio never.
    # Measured 2026-12-04 18:45 (seed 0): 1.78e-3 ended at 0.3735 / 0.3955 / 79.0%, above the
    # baseline and inside the predicted ranges; 5.62e-3 at 0.4099 / 0.4392 (hurt early).
    # The grid goes on at 5.62e-4.
    # Measured 2026-12-04 20:10 (seed 0, every grid closed; "HiZOO itself at this budget"):
    # alpha 1e-3 selects 1.78e-3 (0.3735 / 0.3955, mean H 22), its control 0.3736 / 0.3952;
    # 0.5/d selects 5.62e-4 (0.3707 / 0.3908; H rose to 1.24, not "within 1%"), 1e-10
    # selects 5.62e-4 (0.3705 / 0.3905, H 1.00). None reaches the baseline (ratio never).
    "sst2_short_lora_hizoo": [
        Grid("sst2_lora_full", "hizoo", (-11, -9, -13), ("cosine",), (0,), 4_000, 1_000,
             (("hessian_smoothing", 1e-3), ("mu", 1e-3)), _alpha_tag(1e-3), refine=False,
             control=True),
        *[Grid("sst2_lora_full", "hizoo", (-13, -11, -15), ("cosine",), (0,), 4_000, 1_000,
               (("hessian_smoothing", a), ("mu", 1e-3)), _alpha_tag(a), refine=False)
          for a in ("0.5/d", 1e-10)],
    ],
    # The low-rank methods' key option, their rank, on SST-2 full fine-tuning at the short
    # budget (4,000 passes, seed 0, constant, like their rows at the library's default rank
    # in sst2_short_lozo/_subzero/_zo_muon): one more rank each, on the side the default
    # leaves open (LOZO 2 -> 8, SubZero 8 -> 32, ZO-Muon 64 -> 16), each grid widened until
    # its best rate is interior. Predicted 2026-12-04 19:40, before any of them started
    # (rank-2/8/64 rows: LOZO 3.16e-6 0.3780 / 0.3972, SubZero 1e-5 0.3759 / 0.3914, ZO-Muon
    # 3.16e-3 0.3750 / 0.3933; constant MeZO 1e-5 0.3766 / 0.3948):
    # - The rate model's gain a step at the best rate, |P g|^4 / (E|ghat|^2 L), comes out
    #   the same for every rank in all three (a larger subspace holds more of the gradient
    #   and as much more of the noise), so the ranks move the best rate, not the end point.
    # - LOZO rank 8: E[ghat] = r g (U V^T is not scaled by the rank), so its best rate is
    #   about a quarter of rank 2's: 1e-6 selected (3.16e-7 or 3.16e-6 at the edges);
    #   a subspace four times larger holds V's 50 steps closer to MeZO's: 0.3765-0.3790 /
    #   0.394-0.399, between rank 2 and MeZO or level with either.
    # - SubZero rank 32: energy-matched and unbiased at every rank, so MeZO's 1e-5 again,
    #   ending within 0.002 of rank 8 (0.374-0.378 / 0.389-0.394).
    # - ZO-Muon rank 16, 4 probes: the orthogonalised step has Frobenius norm about
    #   sqrt(rank) per matrix, half rank 64's, so its best rate is about twice rank 64's
    #   (3.16e-3 or 1e-2, interior), ending within 0.002 of rank 64 (0.373-0.377 /
    #   0.391-0.396), at fewer seconds a pass (a smaller QR and Newton-Schulz).
    # Measured 2026-12-04 21:47 (seed 0): LOZO rank 8 selects 1e-6 (interior) at 0.3800 /
    # 0.3968, above the predicted train range (3.16e-6 climbs to 0.3863); SubZero rank 32
    # ran at 1e-5 only (its other points stopped for the session's time; 3.16e-6 and
    # 3.16e-5 not run): 0.3782 / 0.3944, 0.0023 above rank 8 (3.16e-6 ended at 0.3791 /
    # 0.3967 on 2026-12-04 and 3.16e-5 at 0.3997 / 0.4090 on 2026-12-05, so 1e-5 is
    # interior, as predicted); ZO-Muon rank 16 selects 1e-2
    # (interior once sst2_short_ranks_up's 3.16e-2 ended at 0.3991) at 0.3730 / 0.3928,
    # inside its range, ratio 0.51. Its seconds a pass missed (measured 2026-12-05,
    # benchmarks/RESULTS.md): at rank 16 the product is formed inside the fused passes, so
    # its MiniLM step is 10.8 forward passes against rank 64's 9.9 (loaded cores).
    "sst2_short_ranks": [
        Grid("sst2_ft_full", "lozo", (-24, -26, -22), ("constant",), (0,), 4_000, 1_000,
             (("mu", 1e-3), ("rank", 8)), "_r8", refine=False),
        Grid("sst2_ft_full", "subzero", (-20, -22, -18), ("constant",), (0,), 4_000, 1_000,
             (("mu", 1e-3), ("rank", 32)), "_r32", refine=False),
        Grid("sst2_ft_full", "zo_muon", (-10, -8, -12), ("constant",), (0,), 4_000, 1_000,
             (("mu", 1e-3), ("rank", 16), ("num_directions", 4)), "_r16", refine=False),
    ],
    # ZO-Muon rank 16's point above its grid (3.16e-2), started 21:18 beside the grid's last
    # point 1e-3: at 1e-2 (0.3730 / 0.3928) it ended below 3.16e-3 (0.3764 / 0.3954), so
    # the grid widens upward, and the queue would only see that once 1e-3 has ended (the
    # same run as the grid's widening would make, so the grid finds it done).
    "sst2_short_ranks_up": [Grid("sst2_ft_full", "zo_muon", (-6,), ("constant",), (0,), 4_000,
                                 1_000, (("mu", 1e-3), ("rank", 16), ("num_directions", 4)),
                                 "_r16", widen=False, refine=False)],
    # ZO-Muon rank 16 at its seed-0 rate (1e-2) at the baseline's seeds 1 and 2, paired with
    # rank 64's seeds (sst2_short_zo_muon_seeds) to see whether a quarter of the state keeps
    # rank 64's result. Predicted 2026-12-04 23:35, before it started (rank 64 at 3.16e-3:
    # 0.3697 / 0.3799 at seed 1, 0.3748 / 0.3871 at seed 2; seed 0 ranks 16 and 64 within
    # 0.002): rank 16 ends within 0.003 of rank 64 in training and validation CE on both
    # seeds, so over seeds 0-2 the two ranks are level (mean training-CE difference within
    # 0.002), and rank 16 goes on ending below MeZO's training CE on seeds 1 and 2 (0.3753,
    # 0.3748) as rank 64 does on seed 1, level on seed 2.
    "sst2_short_ranks_seeds": [Grid("sst2_ft_full", "zo_muon", (-8,), ("constant",), (1, 2),
                                    4_000, 1_000,
                                    (("mu", 1e-3), ("rank", 16), ("num_directions", 4)),
                                    "_r16", widen=False, refine=False)],
    # Measured 2026-12-05 00:28: seed 1 0.3659 / 0.3769 (rank 64 0.3697 / 0.3799), seed 2
    # 0.3770 / 0.3869 (0.3748 / 0.3871): within 0.003 of rank 64 but seed 1's training CE
    # (0.0038 lower); mean over seeds 0-2 -0.0012 (hit); below MeZO on seed 1, above on
    # seed 2 (missed). Test accuracy +1.0, +0.8, +1.1 points over rank 64 at each seed.
    # Its seeds 3 and 4, as rank 64's five. Predicted 00:31, before they started: test
    # accuracy above rank 64's at both seeds (80.3, 80.5%), training CE within 0.004 of
    # rank 64's (0.3712, 0.3718), so over five seeds rank 16's test-accuracy gain over MeZO
    # stays >= +0.5 points and its pass ratios stay above 0.5 on at least two seeds.
    # Measured 2026-12-05 00:57: seed 3 0.3710 / 0.3828 / 80.3% (level with rank 64 in test
    # accuracy: that claim missed), seed 4 0.3695 / 0.3776 / 81.1%; five seeds against
    # MeZO: +0.8 +- 0.5 points (hit), ratios 0.51, start, never, 0.45, 0.63 (hit).
    "sst2_short_ranks_seeds34": [Grid("sst2_ft_full", "zo_muon", (-8,), ("constant",), (3, 4),
                                      4_000, 1_000,
                                      (("mu", 1e-3), ("rank", 16), ("num_directions", 4)),
                                      "_r16", widen=False, refine=False)],
    # ZO-Muon at the preset's rank 16 (4 probes, 20,000 passes = 4,000 steps of 5) against
    # the 20,000-pass tuned baseline (cosine MeZO 1e-5, sst2_long_ft_cosine): the one method
    # with a paired five-seed gain at 4,000 passes (+0.8 +- 0.5 test points, training CE
    # -0.0043 +- 0.0019) not yet run at the longer budget. The grid starts at 4,000 passes'
    # selection (1e-2) and the half-decade below, two queues side by side, widened until
    # interior, then seeds 1 and 2 at the selected rate. Predicted 2026-12-05 01:24, before
    # either started (seed 0: the baseline ends at 0.3706 / 0.3880 / 79.2%; FZOO-8 on every
    # parameter at 1.78e-4 at 0.3624 / 0.3797 / 80.0%, ratio 0.45):
    # - the best constant rate moves down one half-decade from 4,000 passes, as MeZO's
    #   (1e-5 -> 3.16e-6) and FZOO's (5.62e-4 -> 1.78e-4) did: 3.16e-3, with 1e-2 stopping
    #   at a higher noise floor after ~8,000 passes; the grid then needs 1e-3 to close;
    # - at it seed 0 ends at 0.360-0.366 / 0.377-0.383 (about where FZOO ends: at 4,000
    #   passes the two gained the same per pass at seed 0, ratios 0.51 and 0.52), reaching
    #   the baseline's final training CE in 0.35-0.55 of its passes, and 79.5-81.0% in test
    #   accuracy: not the +1 point over the baseline on the mean of three seeds.
    # Measured 2026-12-05 03:22 (seed 0): 3.16e-3 ends at 0.3627 / 0.3813 / 79.8% and
    # reaches the baseline's final training CE in 0.51 of its passes (every range hit);
    # 1e-2 reaches it at 0.38, then stops falling after 8,000 passes and ends at 0.3714 /
    # 0.3909 / 80.8% (hit). 1e-3 (sst2_long_ft_zo_muon_lo, 03:51) ends at 0.3719 / 0.3904 /
    # 79.6%, so 3.16e-3 is selected in the interior (predicted).
    "sst2_long_ft_zo_muon": [Grid("sst2_ft_full", "zo_muon", (-8, -10), ("constant",), (0,),
                                  20_000, 2_000,
                                  (("mu", 1e-3), ("rank", 16), ("num_directions", 4)), "_r16",
                                  refine=False, confirm_seeds=(1, 2))],
    # The grid's point below (1e-3), started 02:23 beside both (1e-2 had stopped falling
    # after 8,000 passes, 0.3701 -> 0.3712 -> 0.3741 at 8,000-12,000, while 3.16e-3 was at
    # 0.3717 at 8,000), before 3.16e-3 has ended: the grid would widen to it only then, and
    # this is the same run (same id), so the grid finds it done.
    "sst2_long_ft_zo_muon_lo": [Grid("sst2_ft_full", "zo_muon", (-12,), ("constant",), (0,),
                                     20_000, 2_000,
                                     (("mu", 1e-3), ("rank", 16), ("num_directions", 4)),
                                     "_r16", widen=False, refine=False)],
    # FZOO's key option, its probes, on SST-2 full fine-tuning at the short budget: 16 probes
    # beside sst2_short_fzoo_constant's 8 (constant, 4,000 passes, seed 0; on digits 4
    # probes were the worst of 4, 8 and 16, so 16 is the side left open). Queued after
    # sst2_short_ranks. Predicted 2026-12-04 20:15, before it started (8 probes: 5.62e-4,
    # 0.3727 / 0.3923, a decrease of 0.0082 from the start's 0.3809, MeZO's 0.0043):
    # - FZOO's step is about lr sqrt(d / n), so 16 probes want sqrt(2) times 8's rate; on
    #   the half-decade grid that is 5.62e-4 again or 1.78e-3, interior.
    # - The rate model gains 2n / (n + 1) times MeZO's decrease a pass: 1.88 for 16 against
    #   1.78 for 8, 6% more, inside one run's noise (0.001-0.004 between evaluations): it
    #   ends at 0.3705-0.3760 in training CE and 0.389-0.396 in validation CE, level with
    #   8 probes.
    # Measured 2026-12-04 23:20 (hizoo_jax 813561a, two queues): 1.78e-3 selected (interior:
    # 5.62e-3 ends at 0.5223) at 0.3770 / 0.3889 / 77.8%, its training CE swinging by up to
    # 0.008 between evaluations (0.3870 at 1,003 passes, 0.3857 at 3,009); 5.62e-4 ends at
    # 0.3751 / 0.3909. The rate hit; the end point missed: 0.0043 above 8 probes' 0.3727
    # in training CE (outside the range by 0.001), validation CE 0.0001 under the range.
    "sst2_short_fzoo_probes": [Grid("sst2_ft_full", "fzoo", (-13, -11, -15), ("constant",),
                                    (0,), 4_000, 1_000,
                                    (("mu", 1e-3), ("num_directions", 16)), "_n16",
                                    refine=False)],
    # LoRA under the paper's k = 512 protocol (the split, probe and test set of
    # sst2_short_k512_*, rank-8 LoRA on query/value plus the head, 74,498 parameters), at
    # the short budget: the tuned baseline's two schedules and FZOO with 8 probes, each
    # grid centred on the rate the same method selected on LoRA with all of train.tsv,
    # tuned at seed 0 and widened until interior, then seeds 1 and 2 at the selected rate.
    # Predicted 2026-12-04 22:30, before any ran (full fine-tuning at k = 512: MeZO
    # constant 1e-5 0.2450 / 0.4229, cosine 3.16e-5 0.2451 / 0.4197, FZOO 1.78e-3 0.2877 /
    # 0.4196 from the probe's 0.2561 / 0.4366 at seed 0):
    # - Selected rates: constant MeZO 1.78e-4 or 5.62e-4; cosine MeZO 5.62e-4; FZOO
    #   1.78e-3 or 5.62e-3. As for full fine-tuning at k = 512, the 256-sentence
    #   validation set picks the upper of two near-tied rates.
    # - LoRA went further per pass than full fine-tuning on all of train.tsv (0.3730
    #   against 0.3766 from 0.3809), so at seed 0 constant MeZO ends at training CE
    #   0.235-0.248 and validation CE 0.418-0.432.
    # - FZOO against the baseline: it reaches the baseline's final training CE in <= 0.5 of
    #   the passes on at most one of the three seeds; no row gains 2 test points over the
    #   probe on average (probe 79.0 / 74.4 / 79.6% at seeds 0, 1, 2).
    # Measured 2026-12-05 00:05: constant 1.78e-4 (0.2446 / 0.4328: train inside, val 0.0008
    # above the range), cosine 5.62e-4 (the tuned baseline, val 0.4286) and FZOO 1.78e-3
    # (0.2370 / 0.4184) selected, all interior; FZOO ends below the cosine baseline in
    # training CE on all three seeds (-0.0050 +- 0.0009) and reaches it in 0.62, 0.75, 0.74
    # of the passes (none <= 0.5: hit); +0.9 points over the probe (hit); FZOO picked the
    # lower of its two near-tied rates (the mechanism missed there).
    "sst2_short_lora_k512_mezo": [Grid("sst2_lora_k512", "mezo", (-15, -13, -17),
                                       ("constant",), (0,), 4_000, 1_000, MEZO_MU,
                                       refine=False, confirm_seeds=(1, 2))],
    "sst2_short_lora_k512_mezo_cosine": [Grid("sst2_lora_k512", "mezo", (-13, -11, -15),
                                              ("cosine",), (0,), 4_000, 1_000, MEZO_MU,
                                              refine=False, confirm_seeds=(1, 2))],
    "sst2_short_lora_k512_fzoo": [Grid("sst2_lora_k512", "fzoo", (-11, -9, -13),
                                       ("constant",), (0,), 4_000, 1_000,
                                       (("mu", 1e-3), ("num_directions", 8)), "_n8",
                                       refine=False, confirm_seeds=(1, 2))],
})


# ----------------------------------------------------------------------------------------
# Locks shared by queues.


def claim(path: str) -> str | None:
  """Creates ``path + ".lock"`` holding ``host pid``; None if a live queue holds it. A lock
  of a dead process, or one written on another host (a machine of an earlier session), is
  stale and taken over."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  lock = path + ".lock"
  me = f"{socket.gethostname()} {os.getpid()}"
  for _ in range(2):
    try:
      fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
      try:
        with open(lock) as fh:
          host, pid = fh.read().split()
        if host == socket.gethostname():
          os.kill(int(pid), 0)  # raises if the process is gone
          return None
      except (OSError, ValueError):
        pass
      try:
        os.remove(lock)
      except FileNotFoundError:
        pass
      continue
    with os.fdopen(fd, "w") as fh:
      fh.write(me)
    return lock
  return None


def load(cfg: harness.RunConfig, results: str = harness.RESULTS) -> dict | None:
  """The result of ``cfg`` from its task's table, or None where it has not finished."""
  return harness.load_result(cfg.task, cfg.run_id, results)


def execute(cfg: harness.RunConfig, *, results: str = harness.RESULTS,
            ckpts: str = harness.CKPTS, traces: str = harness.TRACES,
            stop_after: int | None = None) -> dict | None:
  """Runs ``cfg`` unless done or locked; returns its result (None if not finished here)."""
  done = load(cfg, results)
  if done is not None:
    return done
  lock = claim(harness.ckpt_dir(cfg, ckpts))
  if lock is None:
    print(f"... {cfg.task}/{cfg.run_id} is being run by another queue", flush=True)
    return None
  print(f"=== {cfg.task}/{cfg.run_id} ({time.strftime('%H:%M:%S')})", flush=True)
  try:
    res = harness.run(cfg, tasks.TASKS[cfg.task], results=results, ckpts=ckpts, traces=traces,
                      stop_after=stop_after, log=lambda s: print(s, flush=True))
  except Exception:  # keep the queue going; the traceback is in the log
    traceback.print_exc()
    res = None
  finally:
    os.remove(lock)
  if res is not None:
    f, te = res["final"], res["test"] or {}
    print(f"--- {cfg.run_id}: train {f['train_loss']} val {f['val_loss']} test {te} "
          f"{res['sec_per_fp']:.2e} s/fp", flush=True)
  return res


# ----------------------------------------------------------------------------------------
# Selection and widening.


def val_loss(res: dict | None) -> float:
  """Final validation loss; a diverged run is infinitely bad, a missing one is NaN."""
  if res is None:
    return math.nan
  v = res["final"]["val_loss"]
  return math.inf if v is None or not np.isfinite(v) else float(v)


def select(grid: Grid, schedule: str, exponents, results: str = harness.RESULTS):
  """``(best exponent or None, {e: mean final val loss over seeds})``; None until every run
  of the grid has finished."""
  means = {}
  for e in exponents:
    vals = [val_loss(load(grid.config(e, schedule, s), results)) for s in grid.seeds]
    means[e] = float(np.mean(vals)) if not any(math.isnan(v) for v in vals) else math.nan
  if any(math.isnan(v) for v in means.values()):
    return None, means
  return min(means, key=lambda e: (means[e], e)), means


def matches(cfg: harness.RunConfig, only=()) -> bool:
  """Whether ``--only`` lets the queue run ``cfg``: no patterns, or its run id (or
  ``<task>/<run id>``) matches one of the shell-style patterns."""
  return not only or any(fnmatch.fnmatchcase(cfg.run_id, p)
                         or fnmatch.fnmatchcase(f"{cfg.task}/{cfg.run_id}", p) for p in only)


def run_grid(grid: Grid, *, results: str = harness.RESULTS, ckpts: str = harness.CKPTS,
             traces: str = harness.TRACES,
             reverse: bool = False, only=()) -> None:
  """Every schedule's learning rates x seeds, widened until the best is interior.

  ``only``: shell-style patterns of run ids; runs that match none are not started here
  (their results still count where they exist), so a second queue can take one named run
  of a table, such as a grid's widening point or a confirming seed, while the first runs the
  rest; the run is the same one (same id) that the table's own queue would make.
  """
  def run_one(cfg):
    if not matches(cfg, only):
      return load(cfg, results)
    return execute(cfg, results=results, ckpts=ckpts, traces=traces)

  for schedule in grid.schedules:
    exps = list(grid.exponents)
    while True:
      order = list(reversed(exps)) if reverse else exps
      for e in order:
        for s in (reversed(grid.seeds) if reverse else grid.seeds):
          run_one(grid.config(e, schedule, s))
      best, means = select(grid, schedule, exps, results)
      shown = ", ".join(f"{lr_of(e):.3g}: {means[e]:.4f}" for e in sorted(exps))
      print(f"### {grid.task} {grid.method}{grid.tag} {schedule}: mean val loss {{{shown}}}"
            f" best {None if best is None else f'{lr_of(best):.3g}'}", flush=True)
      if best is None or len(exps) >= grid.max_points:
        break
      if grid.widen and best == min(exps):
        exps.append(best - 2)
      elif grid.widen and best == max(exps):
        exps.append(best + 2)
      elif grid.refine and (best - 1 not in exps or best + 1 not in exps) and best % 2 == 0:
        exps += [e for e in (best - 1, best + 1) if e not in exps]
      else:
        break
    if best is not None:
      for s in grid.confirm_seeds:
        if s not in grid.seeds:
          run_one(grid.config(best, schedule, s))
    if grid.control and best is not None:
      for s in grid.seeds:
        if load(grid.config(best, schedule, s), results) is not None:
          run_one(grid.control_config(best, schedule, s))


def progress(name: str, results: str = harness.RESULTS) -> str:
  """``done/planned`` runs of a table (planned: the grids before any widening)."""
  done = planned = 0
  for g in TABLES[name]:
    for sch in g.schedules:
      for e in g.exponents:
        for s in g.seeds:
          planned += 1
          done += load(g.config(e, sch, s), results) is not None
  return f"{name}: {done}/{planned} runs done"


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--table", action="append", default=[], help=f"one of {sorted(TABLES)}")
  p.add_argument("--reverse", action="store_true",
                 help="go through the grids from the other end (a second queue)")
  p.add_argument("--list", action="store_true", help="print the tables' progress")
  p.add_argument("--only", action="append", default=[], metavar="PATTERN",
                 help="run only the runs whose id (or task/id) matches this shell-style "
                      "pattern (repeatable), e.g. 'zo_muon_r64_constant_lr0.01_s[12]_*'")
  p.add_argument("--results", default=harness.RESULTS)
  p.add_argument("--ckpts", default=harness.CKPTS)
  p.add_argument("--traces", default=harness.TRACES,
                 help="loss tapes: how a run whose checkpoint is gone resumes (harness.py)")
  a = p.parse_args(argv)
  if a.list:
    for name in TABLES:
      print(progress(name, a.results))
    return
  import jax

  print(f"jax {jax.__version__} {jax.devices()} ({time.strftime('%Y-%m-%d %H:%M:%S')})",
        flush=True)
  for name in a.table:
    if name not in TABLES:
      p.error(f"unknown table {name!r}; one of {sorted(TABLES)}")
    grids = list(reversed(TABLES[name])) if a.reverse else TABLES[name]
    for g in grids:
      run_grid(g, results=a.results, ckpts=a.ckpts, traces=a.traces, reverse=a.reverse,
               only=tuple(a.only))
    print(f"##### {progress(name, a.results)} ({time.strftime('%H:%M:%S')})", flush=True)


if __name__ == "__main__":
  main()
