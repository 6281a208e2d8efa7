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
    # CI.
    "smoke": [Grid("digits", "mezo", (-12, -8), ("constant", "cosine"), (0,), 200, 100,
                   widen=False, refine=False)],
    # The baseline on digits.
    "digits_mezo": [Grid("digits", "mezo", tuple(range(-16, -3, 2)), harness.SCHEDULES,
                         (0, 1, 2), 40_000, 2_000, MEZO_MU),
                    # Decay to a floor (10%, 30%, 50% of the peak): on digits HiZOO's
                    # step-size control, a decay that stops partway, beat decay to 0.
                    Grid("digits", "mezo", tuple(range(-16, -3, 2)),
                         ("cosine_f0.1", "cosine_f0.3", "cosine_f0.5"), (0, 1, 2), 40_000,
                         2_000, MEZO_MU)],
    # The baseline on MiniLM-L6 SST-2 full fine-tuning (all of train.tsv).
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
    # LoRA at five times the short budget, 20,000 passes (about 70 min a run on a free core).
    **{f"sst2_long_ft_{sch}": [Grid("sst2_ft_full", "mezo", (-20, -22), (sch,), (0,),
                                    20_000, 2_000, MEZO_MU, refine=False,
                                    confirm_seeds=(1, 2))] for sch in ("constant", "cosine")},
    "sst2_long_ft_fzoo": [Grid("sst2_ft_full", "fzoo", (-13, -15), ("constant",), (0,),
                               19_998, 2_000, (("mu", 1e-3), ("num_directions", 8)), "_n8",
                               refine=False, confirm_seeds=(1, 2))],
    # FZOO's 20,000-pass paired seeds at either grid point.
    **{f"sst2_long_ft_fzoo{lo}_s{s}": [Grid("sst2_ft_full", "fzoo", (e,), ("constant",), (s,),
                                            19_998, 2_000,
                                            (("mu", 1e-3), ("num_directions", 8)), "_n8",
                                            widen=False, refine=False)]
       for s in (1, 2) for lo, e in (("", -13), ("_lo", -15))},
    "sst2_long_ftl123": [Grid("sst2_ftl123_full", "mezo", (-19, -21), ("constant",), (0,),
                              20_000, 2_000, MEZO_MU, refine=False, confirm_seeds=(1, 2))],
    # FZOO (8 probes, constant) perturbing layers 1-3 and the head only, against the same
    # 20,000-pass baseline.
    "sst2_long_ftl123_fzoo": [Grid("sst2_ftl123_full", "fzoo", (-13, -15), ("constant",),
                                   (0,), 19_998, 2_000,
                                   (("mu", 1e-3), ("num_directions", 8)), "_n8",
                                   refine=False, confirm_seeds=(1, 2))],
    # The same with cosine decay to 0.
    "sst2_long_ftl123_fzoo_cos": [Grid("sst2_ftl123_full", "fzoo", (-13, -11), ("cosine",),
                                       (0,), 19_998, 2_000,
                                       (("mu", 1e-3), ("num_directions", 8)), "_n8",
                                       refine=False, confirm_seeds=(1, 2))],
    # Its seed-0 first point (5.62e-4) at seeds 1 and 2, one table a seed so that they run beside
    # each other or beside the grid.
    **{f"sst2_long_ftl123_fzoo_s{s}": [Grid("sst2_ftl123_full", "fzoo", (-13,), ("constant",),
                                            (s,), 19_998, 2_000,
                                            (("mu", 1e-3), ("num_directions", 8)), "_n8",
                                            widen=False, refine=False)] for s in (1, 2, 3, 4)},
    # Five paired seeds for the goal's test accuracy.
    **{f"sst2_long_ft_cosine_s{s}": [Grid("sst2_ft_full", "mezo", (-20,), ("cosine",), (s,),
                                          20_000, 2_000, MEZO_MU, widen=False, refine=False)]
       for s in (3, 4)},
    # Batch 64 against the baseline's 16.
    "sst2_short_b64": [Grid("sst2_ft_full_b64", "mezo", (-18, -20), ("constant",), (0,), 4_000,
                            1_000, MEZO_MU, refine=False, confirm_seeds=(1, 2))],
    # The same for LoRA, the example's --data configuration.
    "sst2_short_lora_b64": [Grid("sst2_lora_full_b64", "mezo", (-13, -15), ("constant",), (0,),
                                 4_000, 1_000, MEZO_MU, refine=False, confirm_seeds=(1, 2))],
    "sst2_long_lora_cosine": [Grid("sst2_lora_full", "mezo", (-13, -15),
                                   ("cosine",), (0,), 20_000, 2_000, MEZO_MU, refine=False,
                                   confirm_seeds=(1, 2))],
    # Cosine MeZO's seed-0 selection (1.78e-4) at seeds 1 and 2, one table a seed so that both run
    # beside each other (the grid above reuses them as its confirmation seeds).
    **{f"sst2_long_lora_cosine_s{s}": [Grid("sst2_lora_full", "mezo", (-15,), ("cosine",),
                                            (s,), 20_000, 2_000, MEZO_MU, widen=False,
                                            refine=False)] for s in (1, 2)},
    # Constant MeZO's selection at seeds 3 (and 4).
    **{f"sst2_long_lora_constant_s{s}": [Grid("sst2_lora_full", "mezo", (-15,),
                                              ("constant",), (s,), 20_000, 2_000, MEZO_MU,
                                              widen=False, refine=False)] for s in (3, 4)},
    "sst2_long_lora_constant": [Grid("sst2_lora_full", "mezo", (-15, -17),
                                     ("constant",), (0,), 20_000, 2_000, MEZO_MU,
                                     refine=False, confirm_seeds=(1, 2))],
    # FZOO (8 probes, constant) at the same five-times budget, 19,998 passes (2,222 steps of 9),
    # seed 0.
    "sst2_long_lora_fzoo": [Grid("sst2_lora_full", "fzoo", (-11, -13), ("constant",), (0,),
                                 19_998, 2_000, (("mu", 1e-3), ("num_directions", 8)), "_n8",
                                 refine=False, confirm_seeds=(1, 2))],
    # Its paired seed 1 at the grid's first rate (1.78e-3, the 4,000-pass selection), run beside the
    # grid's 5.62e-4 point so that both fit in one session.
    "sst2_long_lora_fzoo_s1": [Grid("sst2_lora_full", "fzoo", (-11,), ("constant",), (1,),
                                    19_998, 2_000, (("mu", 1e-3), ("num_directions", 8)),
                                    "_n8", widen=False, refine=False)],
    # FZOO's seed-0 selection at 20,000 passes (5.62e-4) at seed 1, run beside the grid's widening
    # point (1.78e-4) so that the paired seed fits in the same session.
    "sst2_long_lora_fzoo_s1b": [Grid("sst2_lora_full", "fzoo", (-13,), ("constant",), (1,),
                                     19_998, 2_000, (("mu", 1e-3), ("num_directions", 8)),
                                     "_n8", widen=False, refine=False)],
    # Which parameters to perturb (experiments/choose/zo_rate.py).
    "sst2_short_layers": [
        Grid(f"sst2_ftl{ls}_full", "mezo", exps, ("constant",), (0,), 4_000,
             1_000, MEZO_MU, refine=False, confirm_seeds=(1, 2))
        # layers 2-3 start from two rates: 1.78e-4 diverged for layers 1-3
        for ls, exps in (("123", (-17, -19, -15)), ("23", (-17, -19)))],
    # Layers 1-3 at the rate selected at seed 0, and the tuned constant baseline, at seeds 3 and 4.
    "sst2_short_layers_seeds": [Grid("sst2_ftl123_full", "mezo", (-19,), ("constant",), (3, 4),
                                     4_000, 1_000, MEZO_MU, widen=False, refine=False)],
    "sst2_short_constant_seeds_34": [Grid("sst2_ft_full", "mezo", (-20,), ("constant",),
                                          (3, 4), 4_000, 1_000, MEZO_MU, widen=False,
                                          refine=False)],
    # The same for LoRA (zo_rate on sst2_lora_full, two measurements).
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
    "digits_oracle_fixed": [g for g in oracle_grids("digits", tuple(range(-16, -3, 2)),
                                                    ("constant",), (0, 1, 2), 40_000, 2_000,
                                                    refresh=2_000) if "_r0" in g.tag],
    # The fixed oracles that do not lengthen any step (floor 1) under the baseline's schedule
    # (cosine decay to 30% of the peak).
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
    # The new methods with the baseline's schedule (cosine decay to 30% of the peak, the best MeZO
    # schedule on digits).
    "digits_methods_sched": [
        *[Grid("digits", "fzoo", tuple(range(-16, -3, 2)), ("cosine_f0.3",), (0, 1, 2),
               40_000, 2_000, (("mu", 1e-3), ("num_directions", n)), f"_n{n}")
          for n in (8, 16)],
        Grid("digits", "forward_gradient", tuple(range(-16, -3, 2)), ("cosine_f0.3",),
             (0, 1, 2), 40_000, 2_000),
        Grid("digits", "lozo", tuple(range(-16, -3, 2)), ("cosine_f0.3",), (0, 1, 2), 40_000,
             2_000, (("mu", 1e-3), ("rank", 2)), "_r2"),
    ],
    # What an Optax chain adds to the estimate (the library's compositions, harness.THEN), and the
    # control FZOO's gain needs.
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
    # After FZOO (8 probes, cosine to 30%), the one estimate momentum helped on digits.
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
    # The goal asks for the tuned baseline's final training loss (40,000 passes) in at most half its
    # passes.
    "digits_half": [
        Grid("digits", "fzoo", tuple(range(-20, -7, 2)), ("cosine_f0.3",), (0, 1, 2), 18_000,
             1_000, FZOO_MOM, "_n8_mom0.9"),
        Grid("digits", "fzoo", tuple(range(-16, -3, 2)), ("cosine_f0.3",), (0, 1, 2), 18_000,
             1_000, (("mu", 1e-3), ("num_directions", 8)), "_n8"),
        Grid("digits", "mezo", tuple(range(-16, -3, 2)), ("cosine_f0.3",), (0, 1, 2), 18_000,
             1_000, MEZO_MU),
    ],
    # Momentum 0.95 after FZOO beat 0.9 (0.52-0.60 of the baseline's passes against 0.56-0.65).
    "digits_compose_fzoo_mom": [
        Grid("digits", "fzoo", tuple(range(-24, -11, 2)), ("cosine_f0.3",), (0, 1, 2), 40_000,
             2_000, (("decay", d), ("mu", 1e-3), ("num_directions", 8), ("then", "trace")),
             f"_n8_mom{d}") for d in (0.98, 0.99)
    ],
    # The schedule search the baseline had, for the best digits row (FZOO 8 probes + momentum 0.9,
    # tuned so far only under the baseline's cosine to 30%).
    "digits_fzoo_sched": [
        Grid("digits", "fzoo", tuple(range(-20, -7, 2)),
             ("cosine_f0.3", "cosine", "linear", "cosine_f0.1", "cosine_f0.5"), (0, 1, 2), 40_000,
             2_000, FZOO_MOM, "_n8_mom0.9"),
    ],
    # Half the baseline's passes exactly (19,998 = 2,222 FZOO steps of 9 passes), tuned for it.
    "digits_half20": [
        *[Grid("digits", "fzoo", tuple(range(-16, -3, 2)), (s,), (0, 1, 2), 19_998, 1_000,
               (("mu", 1e-3), ("num_directions", 8)), "_n8") for s in ("cosine_f0.3", "cosine")],
        *[Grid("digits", "fzoo", tuple(range(-22, -9, 2)), (s,), (0, 1, 2), 19_998, 1_000,
               (("decay", 0.95), ("mu", 1e-3), ("num_directions", 8), ("then", "trace")),
               "_n8_mom0.95") for s in ("cosine_f0.3", "cosine")],
    ],
    # Adam's normalisation at SGD's memory.
    "digits_compose_rms": [
        Grid("digits", "mezo", tuple(range(-16, -3, 2)), ("cosine_f0.3",), (0, 1, 2), 40_000,
             2_000, (("mu", 1e-3), ("then", "global_rms")), "_grms"),
    ],
    # SST-2 full fine-tuning at a budget two cores can run in a session (4,000 forward passes, ~20
    # min a run).
    "sst2_short_mezo": [Grid("sst2_ft_full", "mezo", (-18, -20, -22, -21), ("cosine",), (0,),
                             4_000, 1_000, MEZO_MU, refine=False)],
    "sst2_short_fzoo": [Grid("sst2_ft_full", "fzoo", (-14, -12, -10, -13), ("cosine",), (0,),
                             4_000, 1_000, (("mu", 1e-3), ("num_directions", 8)), "_n8",
                             refine=False)],
    # The same two selected runs at seeds 1 and 2.
    "sst2_short_seeds": [
        Grid("sst2_ft_full", "mezo", (-20,), ("cosine",), (1, 2), 4_000, 1_000, MEZO_MU,
             widen=False, refine=False),
        Grid("sst2_ft_full", "fzoo", (-13,), ("cosine",), (1, 2), 4_000, 1_000,
             (("mu", 1e-3), ("num_directions", 8)), "_n8", widen=False, refine=False),
    ],
    # The curvature ceiling at the short budget.
    "sst2_short_oracle": [
        Grid("sst2_ft_full", "oracle", (-20, -18, -16), ("cosine",), (0,), 4_000, 1_000,
             (("mu", 1e-3), ("oracle", kind), ("refresh", 0), ("samples", 32), ("floor", 1.0)),
             f"_{kind}_r0_f1", widen=False, refine=False)
        for kind in ("diag", "tensor")
    ],
    "sst2_short_oracle_seeds": [
        Grid("sst2_ft_full", "oracle", (-18,), ("cosine",), (1, 2), 4_000, 1_000,
             (("mu", 1e-3), ("oracle", kind), ("refresh", 0), ("samples", 32), ("floor", 1.0)),
             f"_{kind}_r0_f1", widen=False, refine=False)
        for kind in ("tensor", "diag")
    ],
    # The paper's test functions.
    "testfn_mezo": [Grid(f, "mezo", tuple(range(-16, -1, 2)), harness.SCHEDULES, (0, 1, 2),
                         6_000, 300, MEZO_MU) for f in ("fa", "fb", "fc")],
    # The rest of the SST-2 baseline's schedule at the short budget.
    "sst2_short_mezo_constant": [Grid("sst2_ft_full", "mezo", (-20, -22, -18), ("constant",),
                                      (0,), 4_000, 1_000, MEZO_MU, refine=False)],
    "sst2_short_mezo_linear": [Grid("sst2_ft_full", "mezo", (-20, -18, -22), ("linear",),
                                    (0,), 4_000, 1_000, MEZO_MU, refine=False)],
    # The selected baseline.
    "sst2_short_constant_seeds": [Grid("sst2_ft_full", "mezo", (-20,), ("constant",), (1, 2),
                                       4_000, 1_000, MEZO_MU, widen=False, refine=False)],
    # FZOO (8 probes) with the baseline's selected schedule, constant.
    "sst2_short_fzoo_constant": [Grid("sst2_ft_full", "fzoo", (-15, -13, -11), ("constant",),
                                      (0,), 4_000, 1_000,
                                      (("mu", 1e-3), ("num_directions", 8)), "_n8",
                                      refine=False)],
    # FZOO constant at its best rate of seed 0 (5.62e-4, which reached constant MeZO's final
    # training CE in about half the passes there) at seeds 1 and 2.
    "sst2_short_fzoo_constant_seeds": [Grid("sst2_ft_full", "fzoo", (-13,), ("constant",),
                                            (1, 2), 4_000, 1_000,
                                            (("mu", 1e-3), ("num_directions", 8)), "_n8",
                                            widen=False, refine=False)],
    # LoRA.
    "sst2_short_lora_mezo": [Grid("sst2_lora_full", "mezo", (-13, -11, -15), ("constant",),
                                  (0,), 4_000, 1_000, MEZO_MU, refine=False,
                                  confirm_seeds=(1, 2))],
    "sst2_short_lora_fzoo": [Grid("sst2_lora_full", "fzoo", (-9, -7, -11), ("constant",),
                                  (0,), 4_000, 1_000, (("mu", 1e-3), ("num_directions", 8)),
                                  "_n8", refine=False, confirm_seeds=(1, 2))],
    # The LoRA baseline's schedule.
    "sst2_short_lora_mezo_cosine": [Grid("sst2_lora_full", "mezo", (-13, -11, -15),
                                         ("cosine",), (0,), 4_000, 1_000, MEZO_MU,
                                         refine=False)],
    # FZOO with heavy-ball momentum (the one Optax stage that gained on digits) on SST-2 LoRA, at
    # the rate equivalent to FZOO's tuned one there (1.78e-3 x (1 - 0.9)), three paired seeds.
    "sst2_short_lora_fzoo_mom": [Grid("sst2_lora_full", "fzoo", (-15,), ("constant",),
                                      (0, 1, 2), 4_000, 1_000, FZOO_MOM, "_n8_mom0.9",
                                      widen=False, refine=False)],
    # The harness on an accelerator.
    "gpu_sst2": [Grid("sst2_ft_full", "mezo", (-20,), ("constant",), (0,), 4_000, 1_000,
                      MEZO_MU, widen=False, refine=False),
                 Grid("sst2_lora_full", "mezo", (-13,), ("cosine",), (0,), 4_000, 1_000,
                      MEZO_MU, widen=False, refine=False)],
    # Its rate at seed 0.
    "sst2_short_lora_cosine_seeds": [Grid("sst2_lora_full", "mezo", (-13,), ("cosine",), (1, 2),
                                          4_000, 1_000, MEZO_MU, widen=False, refine=False)],
    # The paper's protocol, k = 512 per class (1,024 training sentences drawn by seed, 128 a class
    # held out for validation), full fine-tuning at the short budget.
    "sst2_short_k512_mezo": [Grid("sst2_ft_k512", "mezo", (-20, -18, -22), ("constant",),
                                  (0,), 4_000, 1_000, MEZO_MU, refine=False,
                                  confirm_seeds=(1, 2))],
    "sst2_short_k512_fzoo": [Grid("sst2_ft_k512", "fzoo", (-13, -11, -15), ("constant",),
                                  (0,), 4_000, 1_000, (("mu", 1e-3), ("num_directions", 8)),
                                  "_n8", refine=False, confirm_seeds=(1, 2))],
    # The baseline's schedule at k = 512.
    "sst2_short_k512_mezo_cosine": [Grid("sst2_ft_k512", "mezo", (-20, -18, -22), ("cosine",),
                                         (0,), 4_000, 1_000, MEZO_MU, refine=False,
                                         confirm_seeds=(1, 2))],
    "sst2_short_oracle_refresh": [
        Grid("sst2_ft_full", "oracle", (-18, -16, -20), ("cosine",), (0,), 4_000, 1_000,
             (("mu", 1e-3), ("oracle", kind), ("refresh", 500), ("samples", 32),
              ("floor", 1.0)), f"_{kind}_r500_f1", widen=False, refine=False)
        for kind in ("diag", "tensor")
    ],
    # The curvature ceiling for LoRA at the short budget, as sst2_short_oracle for full fine-tuning.
    "sst2_short_lora_oracle": [
        Grid("sst2_lora_full", "oracle", (-13, -11, -9), ("cosine",), (0,), 4_000, 1_000,
             (("mu", 1e-3), ("oracle", kind), ("refresh", 0), ("samples", 32), ("floor", 1.0)),
             f"_{kind}_r0_f1", refine=False)
        for kind in ("diag", "tensor")
    ],
    # Its per-parameter oracle (fixed) at its selected rate at seeds 1 and 2, the batches and noise
    # of sst2_short_lora_cosine_seeds.
    "sst2_short_lora_oracle_seeds": [
        Grid("sst2_lora_full", "oracle", (-13,), ("cosine",), (1, 2), 4_000, 1_000,
             (("mu", 1e-3), ("oracle", "diag"), ("refresh", 0), ("samples", 32),
              ("floor", 1.0)), "_diag_r0_f1", widen=False, refine=False)
    ],
    "sst2_short_lora_oracle_refresh": [
        Grid("sst2_lora_full", "oracle", (-13, -11), ("cosine",), (0,), 4_000, 1_000,
             (("mu", 1e-3), ("oracle", "diag"), ("refresh", 500), ("samples", 32),
              ("floor", 1.0)), "_diag_r500_f1", widen=False, refine=False)
    ],
    # The refreshed oracle on digits under the tuned baseline's schedule.
    "digits_oracle_refresh_sched": [
        Grid("digits", "oracle", (-12, -10, -14, -8), ("cosine_f0.3",), (0, 1, 2), 40_000,
             2_000, (("mu", 1e-3), ("oracle", kind), ("refresh", 2_000), ("samples", 32),
                     ("floor", 1.0)), f"_{kind}_r2000_f1")
        for kind in ("diag", "tensor")
    ],
    # HiZOO on the test functions at its preset's mu.
    "testfn_hizoo_mu": [
        Grid(f, "hizoo", tuple(range(-16, -1, 2)), ("constant",), (0, 1, 2), 6_000, 300,
             (("hessian_smoothing", "0.5/d"), ("mu", 1e-2)), "_a0.5d_mu0.01", control=True)
        for f in ("fa", "fb", "fc")],
    # The paper's test functions for the other methods.
    "testfn_methods": [
        *[g for f in ("fa", "fb", "fc")
          for g in hizoo_grids(f, "hizoo", tuple(range(-16, -1, 2)), ("constant",), (0, 1, 2),
                               6_000, 300, HIZOO_ALPHAS["ft"])],
        *[Grid(f, "fzoo", tuple(range(-16, -1, 2)), harness.SCHEDULES, (0, 1, 2), 6_000, 300,
               (("mu", 1e-3), ("num_directions", 8)), "_n8") for f in ("fa", "fb", "fc")],
    ],
    # Every other method of the library on SST-2 full fine-tuning at the short budget (4,000 passes,
    # seed 0), constant like the tuned baseline there.
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
    "sst2_short_layers_zo_muon": [Grid("sst2_ftl123_full", "zo_muon", (-10, -12, -8),
                                       ("constant",), (0,), 4_000, 1_000,
                                       (("mu", 1e-3), ("rank", 64), ("num_directions", 4)),
                                       "_r64", refine=False, confirm_seeds=(1, 2))],
    # Its point above the grid, run beside the grid's last point on the otherwise idle core (the
    # same run as the grid's widening would make, so the grid finds it done).
    "sst2_short_layers_zo_muon_up": [Grid("sst2_ftl123_full", "zo_muon", (-6,), ("constant",),
                                          (0,), 4_000, 1_000,
                                          (("mu", 1e-3), ("rank", 64), ("num_directions", 4)),
                                          "_r64", widen=False, refine=False)],
    "sst2_short_layers_zo_muon_s12": [Grid("sst2_ftl123_full", "zo_muon", (-8,),
                                           ("constant",), (1, 2), 4_000, 1_000,
                                           (("mu", 1e-3), ("rank", 64), ("num_directions", 4)),
                                           "_r64", widen=False, refine=False)],
    "sst2_short_zo_muon_seeds_more": [Grid("sst2_ft_full", "zo_muon", (-10,), ("constant",),
                                           (3, 4), 4_000, 1_000,
                                           (("mu", 1e-3), ("rank", 64), ("num_directions", 4)),
                                           "_r64", widen=False, refine=False)],
    # HiZOO itself on SST-2 full fine-tuning at the short budget (4,000 passes, seed 0, constant
    # like the tuned baseline, constant MeZO 1e-5).
    "sst2_short_hizoo": [
        Grid("sst2_ft_full", "hizoo", (-18, -16, -20, -14, -12), ("constant",), (0,),
             4_000, 1_000,
             (("hessian_smoothing", 1e-3), ("mu", 1e-3)), _alpha_tag(1e-3), refine=False,
             control=True),
        Grid("sst2_ft_full", "hizoo", (-20, -22, -18), ("constant",), (0,), 4_000, 1_000,
             (("hessian_smoothing", "0.5/d"), ("mu", 1e-3)), _alpha_tag("0.5/d"), refine=False),
        # alpha 1e-6 moves H from 1 to about 2.3 in 1,333 steps, so it gets its control
        Grid("sst2_ft_full", "hizoo", (-20, -22, -18), ("constant",), (0,), 4_000, 1_000,
             (("hessian_smoothing", 1e-6), ("mu", 1e-3)), _alpha_tag(1e-6), refine=False,
             control=True),
    ],
    # HiZOO on the LoRA task at the same budget, with the tuned LoRA baseline's schedule.
    "sst2_short_lora_hizoo": [
        Grid("sst2_lora_full", "hizoo", (-11, -9, -13), ("cosine",), (0,), 4_000, 1_000,
             (("hessian_smoothing", 1e-3), ("mu", 1e-3)), _alpha_tag(1e-3), refine=False,
             control=True),
        *[Grid("sst2_lora_full", "hizoo", (-13, -11, -15), ("cosine",), (0,), 4_000, 1_000,
               (("hessian_smoothing", a), ("mu", 1e-3)), _alpha_tag(a), refine=False)
          for a in ("0.5/d", 1e-10)],
    ],
    "sst2_short_ranks": [
        Grid("sst2_ft_full", "lozo", (-24, -26, -22), ("constant",), (0,), 4_000, 1_000,
             (("mu", 1e-3), ("rank", 8)), "_r8", refine=False),
        Grid("sst2_ft_full", "subzero", (-20, -22, -18), ("constant",), (0,), 4_000, 1_000,
             (("mu", 1e-3), ("rank", 32)), "_r32", refine=False),
        Grid("sst2_ft_full", "zo_muon", (-10, -8, -12), ("constant",), (0,), 4_000, 1_000,
             (("mu", 1e-3), ("rank", 16), ("num_directions", 4)), "_r16", refine=False),
    ],
    "sst2_short_ranks_up": [Grid("sst2_ft_full", "zo_muon", (-6,), ("constant",), (0,), 4_000,
                                 1_000, (("mu", 1e-3), ("rank", 16), ("num_directions", 4)),
                                 "_r16", widen=False, refine=False)],
    "sst2_short_ranks_seeds": [Grid("sst2_ft_full", "zo_muon", (-8,), ("constant",), (1, 2),
                                    4_000, 1_000,
                                    (("mu", 1e-3), ("rank", 16), ("num_directions", 4)),
                                    "_r16", widen=False, refine=False)],
    "sst2_short_ranks_seeds34": [Grid("sst2_ft_full", "zo_muon", (-8,), ("constant",), (3, 4),
                                      4_000, 1_000,
                                      (("mu", 1e-3), ("rank", 16), ("num_directions", 4)),
                                      "_r16", widen=False, refine=False)],
    # ZO-Muon at the preset's rank 16 (4 probes, 20,000 passes = 4,000 steps of 5) against the
    # 20,000-pass tuned baseline (cosine MeZO 1e-5, sst2_long_ft_cosine).
    "sst2_long_ft_zo_muon": [Grid("sst2_ft_full", "zo_muon", (-8, -10), ("constant",), (0,),
                                  20_000, 2_000,
                                  (("mu", 1e-3), ("rank", 16), ("num_directions", 4)), "_r16",
                                  refine=False, confirm_seeds=(1, 2))],
    "sst2_long_ft_zo_muon_lo": [Grid("sst2_ft_full", "zo_muon", (-12,), ("constant",), (0,),
                                     20_000, 2_000,
                                     (("mu", 1e-3), ("rank", 16), ("num_directions", 4)),
                                     "_r16", widen=False, refine=False)],
    # FZOO's key option, its probes, on SST-2 full fine-tuning at the short budget.
    "sst2_short_fzoo_probes": [Grid("sst2_ft_full", "fzoo", (-13, -11, -15), ("constant",),
                                    (0,), 4_000, 1_000,
                                    (("mu", 1e-3), ("num_directions", 16)), "_n16",
                                    refine=False)],
    # LoRA under the paper's k = 512 protocol (the split, probe and test set of sst2_short_k512_*,
    # rank-8 LoRA on query/value plus the head, 74,498 parameters), at the short budget.
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
