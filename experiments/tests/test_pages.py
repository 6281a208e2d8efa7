"""The results pages and the README against the results tables they are drawn from: every
number a page shows is recomputed from ``experiments/**/*.jsonl.gz``."""

from __future__ import annotations

import ast
import os

import numpy as np
import pytest

from experiments import table

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "experiments", "examples" + table.SUFFIX)


def _read(*path: str) -> str:
  with open(os.path.join(ROOT, *path), encoding="utf-8") as fh:
    return fh.read()


def _page(path: str) -> str:
  return _read("docs", path)


def saved_run(key: str) -> dict:
  """The saved results.json of an example run (``experiments/examples.jsonl.gz``)."""
  return table.find(EXAMPLES, key)["results"]


def _table(text: str, marker: str) -> dict[str, list[str]]:
  """The Markdown table after ``marker``, as {first cell: the other cells}."""
  rows = {}
  for line in text[text.index(marker):].splitlines()[1:]:
    if not line.startswith("|"):
      if rows:
        break
      continue
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if cells[0] not in ("method", "f") and not set(cells[0]) <= {"-"}:
      rows[cells[0]] = cells[1:]
  return rows


# The README's network columns: method -> (table, the report's label, seeds besides the grid's)
DIGITS = {"MeZO": ("digits_mezo", "mezo cosine_f0.3"),
          "HiZOO": ("digits_hizoo", "hizoo_a1e-06 constant"),
          "HiZOO-L": ("digits_hizoo_l", "hizoo_l_a1e-06 constant"),
          "FZOO, 8 probes": ("digits_methods_sched", "fzoo_n8 cosine_f0.3")}
SST2 = {"MeZO": ("sst2_long_ft_cosine", "mezo cosine"),
        "FZOO, 8 probes": ("sst2_long_ft_fzoo", "fzoo_n8 constant")}


def _selected(name: str, label: str, task: str, extra=()) -> list[dict]:
  from experiments.choose import harness, report

  (runs,) = [rs for lab, _, rs in report.selected_runs(name, harness.RESULTS, task, extra)
             if lab == label]
  return [r for r in runs.values() if r is not None]


@pytest.mark.filterwarnings("ignore")
def test_readme_headline_results_are_the_tables():
  """The README's results table: the test functions' steps (the notebook's table, which
  examples/tests/test_notebooks.py checks) times the forward passes a step of the method executes
  (its state's counter); the digits and SST-2 columns: the mean over seeds of the selected
  runs' final training loss and test accuracy, from the tables."""
  pytest.importorskip("flax")
  import hizoo_jax as hz
  from experiments import problems as P

  head = _table(_read("README.md"), "<!-- headline-results -->")
  functions = _table(_page("results/test_functions.md"), "| method | f_a")
  assert list(head) == ["MeZO", "HiZOO", "HiZOO-L", "FZOO, 8 probes"]
  rec = hz.presets.recommended(np.zeros(2))
  cost = {}
  for name, fn, opts in (("MeZO", hz.mezo, {}), ("HiZOO", hz.hizoo, rec),
                         ("HiZOO-L", hz.hizoo_l, rec)):
    sw = P.sweep(fn, P.f_a, P.START["f_a"], 4, np.array([1e-3]), 1, **opts)
    cost[name] = int(sw.counters["forward_passes"][0, 0]) // 4
  assert cost == {"MeZO": 2, "HiZOO": 3, "HiZOO-L": 3}
  page_names = {"HiZOO": "HiZOO (paper est.)"}
  for method, cells in head.items():
    if method in cost:
      f_row = functions[page_names.get(method, method)]
      for cell, steps in zip(cells[:3], (f_row[0], f_row[3], f_row[6]), strict=True):
        steps = steps.split(" (")[0]
        want = "never" if steps == "never" else f"{float(steps) * cost[method]:g}"
        assert cell == want, (method, cell, steps)
    else:
      assert cells[:3] == ["–"] * 3, cells
    runs = _selected(*DIGITS[method], "digits")
    assert len(runs) == 3, method
    assert cells[3] == f"{np.mean([r['final']['train_loss'] for r in runs]):.3f}", method
    acc = np.mean([r["test"]["test_accuracy"] for r in runs])
    assert cells[4] == f"{100 * acc:.1f}", method
    if method in SST2:
      runs = _selected(*SST2[method], "sst2_ft_full", (1, 2))
      assert sorted(r["config"]["seed"] for r in runs) == [0, 1, 2], method
      assert cells[5] == f"{np.mean([r['final']['train_loss'] for r in runs]):.4f}", method
      acc = np.mean([r["test"]["test_accuracy"] for r in runs])
      assert cells[6] == f"{100 * acc:.1f}", method
    else:
      assert cells[5:] == ["–", "–"], method


def test_results_index_demo_tables_are_the_saved_demo_run():
  """The results index's demo tables are the saved demo run's results.md (the digits table
  without its step-time column, which varies with the machine's load)."""
  saved = [t.strip() for t in table.find(EXAMPLES, "demo")["files"]["results.md"].split("\n\n")
           if t.startswith("|")]
  functions, digits = saved
  digits = "\n".join("|".join(line.split("|")[:-2]) + "|" for line in digits.splitlines())
  index = _page("results/index.md")
  section = index[index.index("## The demo"):index.index("## The recommended settings")]
  assert functions in section and digits in section
  assert "forward passes (reached, stayed)" in functions and "10,000 (5,000)" in digits


def finetune_minilm_module():
  """examples/finetune_minilm.py as a module (its summary and smoothing helpers)."""
  import importlib.util

  spec = importlib.util.spec_from_file_location(
      "finetune_minilm", os.path.join(ROOT, "examples", "finetune_minilm.py"))
  ex = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(ex)
  return ex


def test_minilm_page_table_is_the_saved_results():
  """The MiniLM results page's HiZOO/MeZO/Adam rows are what the saved results.json give:
  the zeroth-order rows in forward passes (the state's count), Adam's in steps."""
  import re

  ex = finetune_minilm_module()
  page = _page("results/minilm.md")
  targets = [float(t) for t in re.search(r"--target-loss ([0-9.,]+)", page).group(1).split(",")]
  for sub, label in (("minilm", "HiZOO"), ("minilm", "MeZO"), ("minilm_adam", "Adam")):
    res = saved_run(sub)
    _, summary = ex.summarize(res["runs"], res["args"]["window"], targets)
    s = summary["optimizers"][label.lower()]
    counted = s["forward_passes"] is not None
    assert counted == (label != "Adam"), label
    if counted:  # the same budget for both
      assert s["forward_passes"] == [res["args"]["forward_passes"]] * 3, s["forward_passes"]
    (row,) = [r for r in page.splitlines() if r.startswith(f"| {label} ")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    for cell, t in zip(cells[1:], targets, strict=False):
      kind = "forward_passes" if counted else "steps"
      med, per_seed = s[f"median_{kind}_to_target"][str(t)], s[f"{kind}_to_target"][str(t)]
      unit = "" if counted else " steps"
      seeds = ", ".join("-" if h is None else str(h) for h in per_seed)
      assert cell == f"{'never' if med is None else f'{med}{unit}'} ({seeds})", (label, t, cell)
    assert cells[len(targets) + 1] == f"{s['final_smoothed_loss_median']:.4f}"
    accs = s["final_accuracy"]
    assert cells[len(targets) + 2].startswith(f"{np.mean(accs):.3f} ± {np.std(accs):.3f} (")


def test_minilm_page_divergence_table_is_the_saved_results():
  """The MiniLM page's lr 5e-3 rows (loss first > 1, lowest and final MA-50 loss, accuracy,
  H)."""
  ex = finetune_minilm_module()
  page = _page("results/minilm.md")
  rows = {
      "lr 5e-3, HiZOO, α = 1e-3": ("minilm", "hizoo"),
      "lr 5e-3, HiZOO, α = 0.5/d = 6.7e-6": ("minilm_hizoo_alpha_preset", "hizoo"),
      "lr 5e-3, MeZO": ("minilm_mezo_lr5e-3", "mezo"),
  }
  for prefix, (sub, name) in rows.items():
    (row,) = [r for r in page.splitlines() if r.startswith(f"| {prefix}")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    runs = saved_run(sub)["runs"][name]
    assert [r["lr"] for r in runs] == [5e-3] * 3 and [r["seed"] for r in runs] == [0, 1, 2]
    first, lowest, final = [], [], []
    for r in runs:
      losses = np.asarray(r["losses"], np.float64)
      above = np.flatnonzero(losses > 1.0)
      first.append(str(above[0] + 1) if above.size else None)
      ma = ex.smooth(losses, 50)  # the example's moving average, as in its plots and tables
      lowest.append(ma.min())
      final.append(ma[-1])
    assert cells[1] == ("never" if first == [None] * 3 else ", ".join(first)), (prefix, cells[1])
    assert cells[2] == f"{min(lowest):.3f}–{max(lowest):.3f}", (prefix, cells[2])
    assert float(cells[3]) == pytest.approx(np.median(final), rel=5e-3), (prefix, cells[3])
    assert cells[4] == f"{np.mean([r['final']['accuracy'] for r in runs]):.3f}", (prefix, cells[4])
    h = [r["hessian"]["median"] for r in runs] if name == "hizoo" else None
    if h is None:
      assert cells[5] == "–"
    elif cells[5].startswith("1e8"):
      assert h == pytest.approx([1e8] * 3)
    else:
      assert cells[5] == f"{min(h):.1f}–{max(h):.1f}", (prefix, cells[5])


def test_llm_guide_and_readme_give_the_prompted_tables_default():
  """The prompted-LLM example's default is the prompted table's tuned MeZO at its budget: the
  length is the budget, the rate is ``measured.json``'s, the example's runs are the table's
  step for step, and the guide's test rows and the README's figure are the table's test
  scores of that configuration on every seed."""
  import hizoo_jax as hz
  from experiments.prompted import report

  records = report.read()
  tree = ast.parse(_read("examples", "finetune_llm.py"))
  (defaults,) = [ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                 and getattr(n.targets[0], "id", None) == "DEFAULTS"]
  assert defaults["optimizer"] == "mezo" and 2 * defaults["steps"] == 400  # 2 passes a step
  assert defaults["batch_size"] == 16 and defaults["k_shot"] == 16 and defaults["mode"] == "lora"
  (mezo,) = [r for r in report.summary(records, 400) if r["arm"] == "mezo"]
  config = mezo["B"]["config"]
  setting = hz.presets.MEASURED[report.MEASURED_TASK]["mezo"]
  assert (setting["learning_rate"], setting["mu"]) == (config[2], config[3])
  # the example and the table's harness run the same steps: the example's 200-step runs at
  # its earlier rate against the table's runs of that rate
  for seed in (0, 1):
    example = saved_run(f"llm_sst2_mezo_lora_lr1e-3_400passes/seed{seed}")["runs"]["mezo"][0]
    (run,) = [r for r in records if r["arm"] == "mezo" and r["lr"] == 1e-3
              and r["seed"] == seed and r["steps"] == 200 and r["schedule"] == "constant"]
    assert example["losses"] == run["losses"]
  zero = saved_run("llm_sst2_mezo_lora_lr1e-3_400passes/seed0")["runs"]["mezo"][0][
      "zero_shot"]["accuracy"]
  test = report.test_at(records, config, 400)
  seeds = sorted(test)
  assert seeds == [0, 1, 2, 3, 4]
  rows = _table(_page("guides/llm_prompted.md"), "| seed | 0 | 1 | 2 | 3 | 4 |")
  acc = [test[s] for s in seeds]
  mean, sd = np.mean(acc), np.std(acc, ddof=1)
  row = rows["test accuracy after 400 passes"]
  assert row[:5] == [f"{a:.3f}" for a in acc]
  assert row[5].strip("*").startswith(f"{mean:.3f} ± {sd:.3f}")
  assert f"(+{100 * (mean - zero):.1f} points)" in row[5]
  readme = _read("README.md")
  assert f"from {100 * zero:.1f}% zero-shot to **{100 * mean:.1f}% ± {100 * sd:.1f}**" in readme


def _section(text: str, heading: str) -> str:
  """A page's section under ``heading``, its whitespace collapsed (prose wraps anywhere)."""
  body = text.split(heading, 1)[1].split("\n## ", 1)[0]
  return " ".join(body.split())


def _rate(x: float) -> str:
  """A rate as the pages write it: 1.8e-3, 5.6e-3, 1e-6."""
  mantissa, exponent = f"{x:e}".split("e")
  return f"{float(mantissa):g}e{int(exponent)}"


def _signed(x: float, scale: float = 1.0, digits: int = 3) -> str:
  """A paired difference as the pages write it: +0.045, or -2.5 (points, ``scale`` 100)."""
  return f"{scale * x:+.{digits}f}"


def _listed(items: list[str]) -> str:
  """Items as the prose lists them: "a, b and c"."""
  *first, last = items
  return f"{', '.join(first)} and {last}" if first else last


def _by_seed(p: dict, scale: float = 1.0, digits: int = 3) -> str:
  """A paired difference as the pages quote it with its t interval and seeds: "+0.008 (t
  [-0.073, +0.089]; +0.044, +0.001 and -0.020 by seed" (``scale`` 100: points)."""
  f = lambda x: _signed(x, scale, digits)  # noqa: E731
  return (f"{f(p['mean'])} (t [{f(p['t_lo'])}, {f(p['t_hi'])}]; "
          f"{_listed([f(d) for d in p['diffs']])} by seed")


def _in_points(p: dict) -> str:
  """A paired difference of test accuracy as the pages quote it: "-1.8 points (t [-6.4,
  +2.9]; -0.3, -3.9 and -1.0 by seed"."""
  mean, rest = _by_seed(p, 100, 1).split(" ", 1)
  return f"{mean} points {rest}"


def _over_every_seed(p: dict) -> str:
  """A test-accuracy difference over every seed, with both intervals, as the pages quote it:
  "over all five seeds is +6.1 points (bootstrap [..]; t [..]; a, b, c, d and e by seed)"."""
  f = lambda x: _signed(x, 100, 1)  # noqa: E731
  return (f"over all five seeds is {f(p['mean'])} points (bootstrap [{f(p['lo'])}, "
          f"{f(p['hi'])}]; t [{f(p['t_lo'])}, {f(p['t_hi'])}]; "
          f"{_listed([f(d) for d in p['diffs']])} by seed)")


def _quoted(p: dict, scale: float = 1.0, digits: int = 3, t: bool = False) -> list[str]:
  """A paired difference's mean and bootstrap interval (and with ``t`` its t interval), as
  the pages quote them."""
  f = lambda x: _signed(x, scale, digits)  # noqa: E731
  out = [f(p["mean"]), f"[{f(p['lo'])}, {f(p['hi'])}]"]
  return out + [f"[{f(p['t_lo'])}, {f(p['t_hi'])}]"] if t else out


@pytest.mark.parametrize("k", [16, 512])
def test_prompted_page_is_the_prompted_table(k):
  """docs/results/prompted.md's generated part for each task (k per class) is the report of
  the committed runs, and the figure it shows is one `python -m experiments.figures` draws."""
  from experiments import figures
  from experiments.prompted import report

  text = _page(os.path.join("results", "prompted.md"))
  begin, end = report.markers(k)
  block = text.split(begin, 1)[1].split(end, 1)[0].strip()
  assert block == report.page_block(report.read(k=k), 400).strip(), (
      f"regenerate it: python -m experiments.prompted.report --k {k} "
      "--page docs/results/prompted.md")
  name = figures.PROMPTED if k == 16 else figures.PROMPTED_K512
  assert f"figures/{name}" in text and name in figures.files()


class K512:
  """What the k = 512 section's prose is checked against: the prose itself (generated tables
  left out), the task's records, each arm's summary, tuned MeZO's configuration and runs at
  B and at 300 passes (its late rise), MeZO at the next rate down, and k = 16's summary."""

  def __init__(self):
    from experiments.prompted import report

    begin, end = report.markers(512)
    text = _section(_page(os.path.join("results", "prompted.md")), "## k = 512 per class")
    self.prose = text.split(begin)[0] + text.split(end)[1]
    self.records = report.read(k=512)
    self.rows = {r["arm"]: r for r in report.summary(self.records, 400)}
    self.rows16 = {r["arm"]: r for r in report.summary(report.read(), 400)}
    self.best = self.rows["mezo"]["B"]
    self.mezo_runs = report.by_config(report.select(self.records, arm="mezo"), 400)
    self.ref = self.mezo_runs[self.best["config"]]
    self.ref_300 = report.by_config(report.select(self.records, arm="mezo"),
                                    300)[self.best["config"]]
    self.steady_config = next(c for c in self.mezo_runs
                              if c[1] == "constant" and c[2] == 1e-3)
    self.steady = self.mezo_runs[self.steady_config]
    self.steady_test = report.test_at(self.records, self.steady_config, 400)

  def has(self, *quotes: str) -> None:
    for s in quotes:
      assert s in self.prose, s


@pytest.fixture(scope="module")
def k512() -> K512:
  return K512()


def test_prompted_k512_prose_quotes_mezo_and_hizoo(k512):
  """Tuned MeZO's and tuned HiZOO's rates and tuning means, HiZOO's paired differences with
  MeZO at B on the confirming seeds (validation CE with bootstrap and t intervals, test
  accuracy), MeZO's own B/2 against its B and HiZOO's B configuration read at B/2."""
  from experiments.prompted import report

  prose, records, best, f = k512.prose, k512.records, k512.best, _signed
  assert best["interior"]
  k512.has(f"best constant rate is {_rate(best['config'][2])} again",
           f"{best['tuning_mean']:.3f}")
  hizoo = k512.rows["hizoo"]["B"]
  assert hizoo["interior"] and hizoo["config"][2] == best["config"][2]
  k512.has(f"α {_rate(hizoo['config'][4])}", f"{hizoo['tuning_mean']:.3f}")
  p = hizoo["vs_mezo_B"]
  assert len(p["seeds"]) == 3
  k512.has(*_quoted(p, t=True), *_quoted(hizoo["test_vs_mezo_B"], 100, 1, t=True))
  own = k512.rows["mezo"]["B/2"]["vs_mezo_B"]
  assert f(own["mean"]) in prose and all(f(d) in prose for d in own["diffs"])
  half = report.paired(report.by_config(report.select(records, arm="hizoo"), 200)[
      hizoo["config"]], k512.ref)
  assert f"{f(half['mean'])} ([{f(half['lo'])}, {f(half['hi'])}])" in prose
  assert all(f(d) in prose for d in half["diffs"])


def test_prompted_k512_prose_quotes_mezo_at_the_steadier_rate(k512):
  """MeZO at 1e-3, read on the confirming seeds against HiZOO (validation CE and test
  accuracy) and against itself at the tuned rate."""
  from experiments.prompted import report

  prose, records, steady, f = k512.prose, k512.records, k512.steady, _signed
  assert set(steady) == set(range(5))
  k512.has(f"{np.mean([steady[s] for s in report.TUNING_SEEDS]):.3f}",
           f"{steady[2]:.3f}, {steady[3]:.3f} and {steady[4]:.3f} (seeds 2-4)")
  own = report.paired(steady, k512.ref)
  assert f"{abs(own['mean']):.3f} below itself" in prose and own["mean"] < 0
  assert all(f(d) in prose for d in own["diffs"])
  hizoo = k512.rows["hizoo"]["B"]["config"]
  k512.has(*_quoted(report.paired(
      report.by_config(report.select(records, arm="hizoo"), 400)[hizoo], steady), t=True))
  t = report.paired(report.test_at(records, hizoo, 400), k512.steady_test)
  k512.has(_in_points(t))


def test_prompted_k512_prose_quotes_fzoo(k512):
  """FZOO at its tuning seeds' rate: interior, the package's setting, the lowest tuning mean
  at B, falling through its last 100 passes; on the confirming seeds against tuned MeZO and
  MeZO at 1e-3 in validation CE and test accuracy; tuned at B/2 against MeZO at B."""
  import hizoo_jax as hz
  from experiments.prompted import report

  prose, records, best, f = k512.prose, k512.records, k512.best, _signed
  fzoo = k512.rows["fzoo"]
  fzoo_runs = report.by_config(report.select(records, arm="fzoo"), 400)[fzoo["B"]["config"]]
  assert set(fzoo_runs) == set(range(5))
  k512.has(f"best at {_rate(fzoo['B']['config'][2])}", f"mean {fzoo['B']['tuning_mean']:.3f}")
  p = fzoo["B"]["vs_mezo_B"]
  assert p["mean"] < 0 and f"{abs(p['mean']):.3f} below tuned MeZO" in prose
  expected = _quoted(p, t=True)[1:]
  half = fzoo["B/2"]["vs_mezo_B"]
  expected += [f(half["mean"]), f"t [{f(half['t_lo'])}, {f(half['t_hi'])}]"]
  expected += [f(d) for d in half["diffs"]]
  expected += _quoted(fzoo["B"]["test_vs_mezo_B"], 100, 1, t=True)
  steady_diff = report.paired(fzoo_runs, k512.steady)
  expected.append(_by_seed(steady_diff))
  # by seed: first the two where tuned MeZO's validation accuracy fell most in its last 100
  # passes, then the others in seed order
  fall = {r["seed"]: report.point_at(r, 300)["accuracy"] - report.point_at(r, 400)["accuracy"]
          for r in report.select(records, arm="mezo") if report.config(r) == best["config"]}
  most = sorted(fall, key=fall.get, reverse=True)[:2]
  p = fzoo["B"]["test_vs_mezo_B"]
  diff = {s: f(d, 100, 1) for s, d in zip(p["seeds"], p["diffs"], strict=True)}
  others = _listed([diff[s] for s in sorted(diff) if s not in most])
  expected.append(f"{diff[most[0]]} on seed {most[0]} and {diff[most[1]]} on seed {most[1]}, "
                  f"where MeZO's validation accuracy fell most, {others} on the others")
  # its grid: the neighbours on both tuning seeds, so the choice is interior, and it is the
  # package's setting for the task
  grid = report.by_config(report.select(records, arm="fzoo"), 400)
  up = next(v for c, v in grid.items() if c[2] == 3e-2)
  down = next(v for c, v in grid.items() if c[2] == 3e-3)
  assert set(report.TUNING_SEEDS) <= set(up) & set(down) and fzoo["B"]["interior"]
  expected += [f"{up[0]:.3f} and {up[1]:.3f}", f"3e-3 ends at {down[0]:.3f} and {down[1]:.3f}, "
               f"against 1e-2's {fzoo_runs[0]:.3f} and {fzoo_runs[1]:.3f}, so 1e-2 is interior"]
  assert "provisional" not in prose
  setting = hz.presets.MEASURED["smollm2_prompted_lora_k512"]["fzoo"]
  assert setting["learning_rate"] == fzoo["B"]["config"][2]
  assert 'hz.presets.measured("fzoo", "smollm2_prompted_lora_k512")' in prose
  # the lowest tuning mean of any zeroth-order configuration, and falling through the last
  # 100 passes
  means = [np.mean([v[s] for s in report.TUNING_SEEDS]) for c, v in report.by_config(
      records, 400).items() if c[0] != "adam" and all(s in v for s in report.TUNING_SEEDS)]
  assert min(means) == fzoo["B"]["tuning_mean"]
  for r in report.select(records, arm="fzoo"):
    if report.config(r) == fzoo["B"]["config"]:
      assert report.value_at(r, 400) < report.value_at(r, 300), r["seed"]
  # the setting "What to use" names is the one these runs used
  k16 = hz.presets.MEASURED["smollm2_prompted_lora"]["fzoo"]
  assert fzoo["B/2"]["config"] == fzoo["B"]["config"]
  assert k16["learning_rate"] == fzoo["B"]["config"][2]
  assert report.passes_per_step(records, fzoo["B"]["config"]) == k16["num_directions"] + 1
  assert {r["mu"] for r in report.select(records, arm="fzoo")} == {k16["mu"]}
  t = report.paired(report.test_at(records, fzoo["B"]["config"], 400), k512.steady_test)
  expected.append(f"in test accuracy {_in_points(t)}")
  expected += [f"{fzoo['B/2']['tuning_mean']:.3f}", f"{best['tuning_mean']:.3f} at B"]
  k512.has(*expected)
  assert fzoo["B/2"]["tuning_mean"] > best["tuning_mean"]


def test_prompted_k512_prose_quotes_mezo_at_batch_32(k512):
  """MeZO at batch 32, on the tuning seeds only: tuned MeZO's rate, interior, its neighbours
  and its tuning means at B and B/2 as quoted; it reaches MeZO's CE at B only at B."""
  from experiments.prompted import report

  prose, records, best = k512.prose, k512.records, k512.best
  b32 = k512.rows["mezo_batch32"]
  assert b32["B"]["interior"] and b32["B"]["config"][2] == best["config"][2]
  assert f"is best at {_rate(b32['B']['config'][2])} again, interior" in prose
  assert set(b32["B"]["values"]) == set(report.TUNING_SEEDS)
  assert abs(b32["B"]["tuning_mean"] - best["tuning_mean"]) < 0.005  # "ends level"
  # at k = 16 batch 32 held a rate that diverged at batch 16
  assert f"held {_rate(k512.rows16['mezo_batch32']['B']['config'][2])} stable" in prose
  assert b32["reach"]["passes"] == {s: 400.0 for s in report.TUNING_SEEDS}
  grid = report.by_config(report.select(records, arm="mezo_batch32"), 400)
  lo = next(v for c, v in grid.items() if c[2] == 1e-3)
  hi = next(v for c, v in grid.items() if c[2] == 3e-3)
  (diverged,) = [r for r in report.select(records, arm="mezo_batch32") if r["lr"] == 3e-3
                 and report.value_at(r, 400) - min(c["ce"] for c in r["curve"]) > 0.05]
  k512.has(f"leaves the basin on seed {diverged['seed']}",
           f"sentences does not on seed {diverged['seed']}",
           f"1e-3 ends at {lo[0]:.3f} and {lo[1]:.3f}",
           f"{report.value_at(diverged, 400):.3f} at B from "
           f"{report.value_at(diverged, 300):.3f} at 300 passes",
           f"ends at {hi[1]:.3f} on seed 1",
           f"mean of {b32['B']['tuning_mean']:.3f} against batch 16's {best['tuning_mean']:.3f}",
           f"tuned at B/2 it ends at {b32['B/2']['tuning_mean']:.3f}: no halving",
           "only at B, on both tuning seeds", "It ran on the tuning seeds only")
  assert b32["B/2"]["tuning_mean"] > best["tuning_mean"]
  # its curve falls through the last 100 passes on both seeds; batch 16's turned up on seed 0
  for r in report.select(records, arm="mezo_batch32"):
    if report.config(r) == b32["B"]["config"]:
      assert report.value_at(r, 400) < report.value_at(r, 300), r["seed"]
  (up,) = [s for s in report.TUNING_SEEDS if k512.ref[s] > k512.ref_300[s]]
  k512.has("falls through its last 100 passes on both tuning seeds",
           f"batch 16's at the same rate turned up on seed {up}",
           "MeZO at batch 32 and first-order Adam on the tuning seeds")


def test_prompted_k512_prose_quotes_zo_muon(k512):
  """ZO-Muon: k = 16's rate best at B and at B/2, interior, its neighbours as quoted (3e-1
  out of the basin on both seeds, diverged on seed 1); on the confirming seeds against tuned
  MeZO and MeZO at 1e-3 in validation CE and test accuracy, and over every seed against
  tuned MeZO in test accuracy; tuned at B/2, the tuning seeds' lead against the confirming
  seeds' difference; the seeds where its curve turns up late."""
  import hizoo_jax as hz
  from experiments.prompted import report

  records, best, f = k512.records, k512.best, _signed
  zo = k512.rows["zo_muon"]
  chosen = zo["B"]["config"]
  rate = k512.rows16["zo_muon"]["B"]["config"][2]
  assert zo["B/2"]["config"] == chosen and chosen[2] == rate
  assert zo["B"]["interior"] and zo["B/2"]["interior"]
  mine = report.select(records, arm="zo_muon")
  runs = report.by_config(mine, 400)[chosen]
  half = report.by_config(mine, 200)[chosen]
  late = report.by_config(mine, 300)[chosen]
  assert set(runs) == set(half) == set(range(5))
  assert report.passes_per_step(records, chosen) == 5
  assert {r["steps"] for r in mine} == {80}
  # the grid: 3e-2 below, 3e-1 above, out of the basin on both tuning seeds
  down = report.by_config(mine, 400)[chosen[:2] + (3e-2,) + chosen[3:]]
  up = {r["seed"]: r for r in mine if r["lr"] == 3e-1}
  assert set(up) == set(report.TUNING_SEEDS)
  chance = 1.96 * np.sqrt(0.25 / 1024)  # a coin's 95% band over 1,024 sentences
  for r in up.values():  # "at chance from 100 passes"
    assert all(abs(c["accuracy"] - 0.5) < chance for c in r["curve"] if c["passes"] >= 100
               and np.isfinite(c["accuracy"]))
  assert report.value_at(up[0], 400) - min(c["ce"] for c in up[0]["curve"]) > 0.05  # the basin
  assert up[1]["diverged_at"] * 5 == 300 and up[0].get("diverged_at") is None
  assert abs(zo["B"]["tuning_mean"] - best["tuning_mean"]) < 0.005
  expected = [
      f"best at {_rate(rate)}, k = 16's rate, at B and at B/2, interior",
      f"tuning-seed mean of {zo['B']['tuning_mean']:.3f} at B against tuned MeZO's "
      f"{best['tuning_mean']:.3f}",
      f"3e-2 ends at {down[0]:.3f} and {down[1]:.3f}, mean "
      f"{np.mean([down[s] for s in report.TUNING_SEEDS]):.3f}",
      f"a CE of {report.value_at(up[0], 400):.3f} at B on seed 0, and on seed 1 it diverges "
      f"at 300 passes, at {report.value_at(up[1], 300):.3f}",
      "five passes a step, 80 steps in B"]
  # the confirming seeds against tuned MeZO at B: below on every seed, MeZO's late rise
  p = zo["B"]["vs_mezo_B"]
  assert p["seeds"] == [2, 3, 4] and all(d < 0 for d in p["diffs"])
  expected += [f"{abs(p['mean']):.3f} below tuned MeZO at B", *_quoted(p, t=True)[1:],
               "their range at three seeds of one sign"]
  # "MeZO's late rise again": MeZO turns up on these seeds, and the lead is its rise
  assert all(k512.ref[s] > k512.ref_300[s] for s in p["seeds"])
  rise = report.paired(runs, k512.ref_300)
  assert abs(rise["mean"]) < abs(p["mean"]) / 10
  expected.append("against MeZO's own curve at 300 passes it is "
                  + _listed([f(d) for d in rise["diffs"]]))
  steady = report.paired(runs, k512.steady)
  expected.append(_by_seed(steady))
  t = report.paired(report.test_at(records, chosen, 400), k512.steady_test)
  expected.append(f"in test accuracy {_in_points(t)}")
  every = zo["B"]["test_vs_mezo_B"]
  assert every["seeds"] == list(range(5))
  expected.append(_over_every_seed(every))
  # "What to use" names the package's setting, which is these runs'
  setting = hz.presets.MEASURED["smollm2_prompted_lora_k512"]["zo_muon"]
  assert setting["learning_rate"] == rate and setting["rank"] == dict(chosen[5])["rank"] == 16
  assert max(t["diffs"]) < 0
  expected += ['(`hz.presets.measured("zo_muon", "smollm2_prompted_lora_k512")`, 1e-1 at rank '
               "16) ends level with MeZO at 1e-3 as well, at five passes a step, and below it "
               f"in test accuracy on every confirming seed ({f(t['mean'], 100, 1)} points on "
               "average)"]
  assert abs(steady["mean"]) < 0.01  # "level"
  # tuned at B/2: the tuning seeds' lead, then the confirming seeds
  assert zo["B/2"]["tuning_mean"] < best["tuning_mean"]
  others = [r["B/2"]["tuning_mean"] for a, r in k512.rows.items()
            if a not in ("adam", "zo_muon") and r.get("B/2")]
  assert zo["B/2"]["tuning_mean"] < min(others)
  h = zo["B/2"]["vs_mezo_B"]
  (cross,) = [s for s, d in zip(h["seeds"], h["diffs"], strict=True) if d < 0]
  assert cross == 2
  rest = [f(d) for s, d in zip(h["seeds"], h["diffs"], strict=True) if s != cross]
  hs = report.paired(half, k512.steady)
  assert min(hs["diffs"]) > 0  # "above it on every seed"
  own = report.paired(half, report.by_config(report.select(records, arm="mezo"), 200)[
      k512.rows["mezo"]["B/2"]["config"]])
  assert min(own["diffs"]) > 0  # "above tuned MeZO's own B/2 on each"
  expected += [
      f"above tuned MeZO's own B/2 on each ({f(own['mean'])}, t [{f(own['t_lo'])}, "
      f"{f(own['t_hi'])}])",
      "from MeZO at 1e-3 at B, above it on every seed",
      f"{zo['B/2']['tuning_mean']:.3f} on the tuning seeds, the lowest of any zeroth-order arm "
      f"at B/2 (MeZO's tuning-seed mean there is {k512.rows['mezo']['B/2']['tuning_mean']:.3f})",
      f"below tuned MeZO's {best['tuning_mean']:.3f} at B",
      f"{half[2]:.3f}, {half[3]:.3f} and {half[4]:.3f} on seeds 2-4",
      f"{f(h['mean'])} (t [{f(h['t_lo'])}, {f(h['t_hi'])}]) from tuned MeZO at B through seed "
      f"{cross}'s crossing alone ({f(h['diffs'][h['seeds'].index(cross)])}; {rest[0]} and "
      f"{rest[1]} on seeds 3 and 4)",
      f"{f(hs['mean'])} (t [{f(hs['t_lo'])}, {f(hs['t_hi'])}]) from MeZO at 1e-3"]
  rises = [s for s in range(5) if runs[s] > late[s]]
  falls = [s for s in range(5) if runs[s] < late[s]]
  assert len(rises) == 3 and len(falls) == 2
  by = [f"{runs[s] - late[s]:.3f}" for s in rises]
  expected.append(f"turns up in its last 100 passes on seeds {rises[0]}, {rises[1]} and "
                  f"{rises[2]} (by {by[0]}, {by[1]} and {by[2]}) and falls through them on seeds "
                  f"{falls[0]} and {falls[1]}")
  k512.has(*expected)


def test_prompted_k512_prose_quotes_lozo(k512):
  """LOZO-M: k = 16's setting, best at k = 16's rate at B and at B/2, interior, its
  neighbours as quoted (1e-3 diverged on seed 0, turning up late on seed 1); on the confirming
  seeds against tuned MeZO and MeZO at 1e-3 in validation CE and test accuracy, and over
  every seed against tuned MeZO in test accuracy; tuned at B/2 against tuned MeZO at B and
  at B/2; falling through its last 100 passes on every seed."""
  import hizoo_jax as hz
  from experiments.prompted import report

  records, best, f = k512.records, k512.best, _signed
  lz, lz16 = k512.rows["lozo"], k512.rows16["lozo"]
  chosen = lz["B"]["config"]
  assert lz["B/2"]["config"] == chosen and chosen[2] == lz16["B"]["config"][2]
  assert chosen[5:] == lz16["B"]["config"][5:]  # "k = 16's setting"
  assert dict(chosen[5]) == {"rank": 2, "momentum": 0.9}
  assert lz["B"]["interior"] and lz["B/2"]["interior"]
  mine = report.select(records, arm="lozo")
  assert report.passes_per_step(records, chosen) == 2 and {r["steps"] for r in mine} == {200}
  runs, late, half = (report.by_config(mine, b)[chosen] for b in (400, 300, 200))
  assert set(runs) == set(half) == set(range(5))
  # the grid on the tuning seeds: 1e-4 falling slowly, 1e-3 diverged on seed 0 and turning up
  # late on seed 1 after the lowest CE of the three at 300 passes
  grid = {c[2]: v for c, v in report.by_config(mine, 400).items()}
  grid_half = {c[2]: v for c, v in report.by_config(mine, 200).items()}
  grid_late = {c[2]: v for c, v in report.by_config(mine, 300).items()}
  assert sorted(grid) == [1e-4, 3e-4, 1e-3]
  assert all(grid[1e-4][s] < grid_late[1e-4][s] < grid_half[1e-4][s]
             for s in report.TUNING_SEEDS)  # "still falling slowly"
  (up0,) = [r for r in mine if r["lr"] == 1e-3 and r["seed"] == 0]
  assert up0["diverged_at"] * 2 == 400 and report.value_at(up0, 400) > 1.5 * up0["curve"][0]["ce"]
  chance = 1.96 * np.sqrt(0.25 / 1024)  # a coin's 95% band over 1,024 sentences
  assert all(abs(c["accuracy"] - 0.5) < chance for c in up0["curve"] if c["passes"] >= 300)
  early = {c[2]: v for c, v in report.by_config(mine, 100).items()}
  assert all(g[1e-3][1] == min(v[1] for v in g.values())  # "falls fastest of the three"
             for g in (early, grid_half, grid_late))
  assert grid[1e-3][1] > grid_late[1e-3][1]
  mean = lambda v: np.mean([v[s] for s in report.TUNING_SEEDS])  # noqa: E731
  expected = [
      "**LOZO-M ends above MeZO at the steadier rate on every confirming seed.**",
      "At rank 2 and momentum 0.9 (k = 16's setting: two passes a step, 200 steps in B) it is "
      f"best at {_rate(chosen[2])} at B and at B/2, interior (k = 16's rate at B), with a "
      f"tuning-seed mean of {lz['B']['tuning_mean']:.3f} at B against tuned MeZO's "
      f"{best['tuning_mean']:.3f}, as at k = 16 it ended above tuned MeZO "
      f"({lz16['B']['tuning_mean']:.3f} against {k512.rows16['mezo']['B']['tuning_mean']:.3f} "
      "there)",
      f"1e-4 ends at {grid[1e-4][0]:.3f} and {grid[1e-4][1]:.3f}, still falling slowly",
      f"1e-3 leaves the basin on seed 0 ({grid[1e-3][0]:.3f} at B, where it counts as "
      "diverged; validation accuracy at chance from 300 passes)",
      f"to {grid_late[1e-3][1]:.3f} at 300 passes, then turns up to {grid[1e-3][1]:.3f} at B",
      f"at B/2 its mean is {mean(grid_half[1e-3]):.3f} against 3e-4's "
      f"{lz['B/2']['tuning_mean']:.3f}"]
  assert lz["B"]["tuning_mean"] > best["tuning_mean"]
  assert lz16["B"]["tuning_mean"] > k512.rows16["mezo"]["B"]["tuning_mean"]
  assert mean(grid_half[1e-3]) > lz["B/2"]["tuning_mean"]
  # the confirming seeds: below tuned MeZO at B on seed 2 alone, where MeZO turned up late
  p = lz["B"]["vs_mezo_B"]
  assert p["seeds"] == [2, 3, 4] and p["mean"] < 0
  assert [d < 0 for d in p["diffs"]] == [True, False, False] and k512.ref[2] > k512.ref_300[2]
  lo, hi, t_lo, t_hi = (f(p[x]) for x in ("lo", "hi", "t_lo", "t_hi"))
  expected.append(f"LOZO-M ends {abs(p['mean']):.3f} below tuned MeZO at B (bootstrap [{lo}, "
                  f"{hi}]; t [{t_lo}, {t_hi}]; {_listed([f(d) for d in p['diffs']])} by seed): "
                  "below it on seed 2 alone, MeZO's late rise")
  steady = report.paired(runs, k512.steady)
  assert min(steady["diffs"]) > 0  # "above MeZO at the steadier rate on every confirming seed"
  expected.append(f"Against MeZO at 1e-3 it ends {_by_seed(steady)}")
  t = report.paired(report.test_at(records, chosen, 400), k512.steady_test)
  expected.append(f"in test accuracy {_in_points(t)}")
  every = lz["B"]["test_vs_mezo_B"]
  assert every["seeds"] == list(range(5))
  expected.append(_over_every_seed(every))
  # tuned at B/2: through seed 2's crossing alone, and above MeZO's own B/2 on every seed
  h = lz["B/2"]["vs_mezo_B"]
  assert [d < 0 for d in h["diffs"]] == [True, False, False]
  mezo_half = report.by_config(report.select(records, arm="mezo"), 200)[
      k512.rows["mezo"]["B/2"]["config"]]
  own = report.paired(half, mezo_half)
  assert min(report.paired(half, mezo_half, exclude=())["diffs"]) > 0  # "on every seed"
  expected += [
      f"Tuned at B/2 (3e-4 again, {lz['B/2']['tuning_mean']:.3f} on the tuning seeds) it ends "
      f"{f(h['mean'])} (t [{f(h['t_lo'])}, {f(h['t_hi'])}]) from tuned MeZO at B through seed "
      f"2's crossing alone ({f(h['diffs'][0])}; {f(h['diffs'][1])} and {f(h['diffs'][2])} on "
      "seeds 3 and 4)",
      f"above tuned MeZO's own B/2 on every seed ({f(own['mean'])}, t [{f(own['t_lo'])}, "
      f"{f(own['t_hi'])}])"]
  drops = [late[s] - runs[s] for s in range(5)]
  assert min(drops) > 0
  expected.append(f"falls through its last 100 passes on every seed, by {min(drops):.3f}-"
                  f"{max(drops):.3f}")
  # the package's setting is these runs'
  setting = hz.presets.MEASURED["smollm2_prompted_lora_k512"]["lozo"]
  assert setting["learning_rate"] == chosen[2]
  assert (setting["rank"], setting["momentum"]) == (2, 0.9)
  assert max(t["diffs"]) < 0
  expected.append('(`hz.presets.measured("lozo", "smollm2_prompted_lora_k512")`, 3e-4 at rank 2) '
                  "ends above MeZO at 1e-3 on every confirming seed, and below it in test "
                  f"accuracy on each ({f(t['mean'], 100, 1)} points on average)")
  k512.has(*expected)


def test_prompted_k512_lists_the_arms_by_their_seeds(k512):
  """The page's and the index's lists of what ran at k = 512 on five seeds and on the tuning
  seeds only are the table's."""
  from experiments.prompted import report

  seeds = {a: set(r["B" if "B" in r else "B/2"]["values"]) for a, r in k512.rows.items()}
  five = {"mezo", "hizoo", "fzoo", "zo_muon", "lozo"}
  assert {a for a, s in seeds.items() if s == set(range(5))} == five
  assert {a for a, s in seeds.items() if s == set(report.TUNING_SEEDS)} == {"mezo_batch32",
                                                                           "adam"}
  page = " ".join(_page(os.path.join("results", "prompted.md")).split())
  index = " ".join(_page(os.path.join("results", "index.md")).split())
  for s in ("At k = 512 (below), tuned MeZO, tuned HiZOO, FZOO, ZO-Muon and LOZO-M ran on five "
            "seeds, MeZO at 1e-3 on five too, and MeZO at batch 32 and first-order Adam on the "
            "tuning seeds.",
            "Tuned MeZO, tuned HiZOO, FZOO, ZO-Muon and LOZO-M ran on all five seeds, MeZO at the "
            "next rate down (1e-3) on all five too, and MeZO at batch 32 and first-order Adam on "
            "the tuning seeds"):
    assert s in page, s
  assert set(k512.steady) == set(range(5))
  assert ("k = 512: MeZO, HiZOO, FZOO, ZO-Muon and LOZO-M on five seeds, MeZO at twice the "
          "batch and Adam on the two tuning seeds)") in index


def test_readme_quotes_the_k512_task(k512):
  """The README's k = 512 sentences: HiZOO against tuned MeZO and MeZO at 1e-3 (validation
  and test, the steps each takes), FZOO, ZO-Muon and LOZO-M against MeZO at 1e-3, and the
  four at 200 passes (their 400-pass settings) against tuned MeZO at B, seed by seed."""
  from experiments.prompted import report

  readme = " ".join(_read("README.md").split())
  records, f = k512.records, _signed
  runs = {a: report.by_config(report.select(records, arm=a), 400)[k512.rows[a]["B"]["config"]]
          for a in ("hizoo", "fzoo", "zo_muon", "lozo")}
  p = k512.rows["hizoo"]["B"]["vs_mezo_B"]
  assert p["seeds"] == [2, 3, 4] and max(p["diffs"]) < 0 and p["t_lo"] < 0 < p["t_hi"]
  steady = report.paired(runs["hizoo"], k512.steady)
  test = report.paired(report.test_at(records, k512.rows["hizoo"]["B"]["config"], 400),
                       k512.steady_test)
  assert max(test["diffs"]) < 0  # "above it in test accuracy on each of the three seeds"
  steps = {a: {r["steps"] for r in report.select(records, arm=a)
               if report.config(r) == k512.rows[a]["B"]["config"]} for a in ("hizoo", "mezo")}
  assert steps == {"hizoo": {133}, "mezo": {200}}
  quotes = [f"on three confirming seeds ({f(p['mean'])} validation cross-entropy, t interval "
            "across zero)",
            f"({f(steady['mean'])} for HiZOO, t interval [{f(steady['t_lo'])}, "
            f"{f(steady['t_hi'])}])",
            f"(by {-100 * test['mean']:.1f} points on average, t interval "
            f"[{f(test['t_lo'], 100, 1)}, {f(test['t_hi'], 100, 1)}])",
            "taken 133 times instead of 200"]
  fzoo, zo, lozo = (report.paired(runs[a], k512.steady) for a in ("fzoo", "zo_muon", "lozo"))
  assert all(set(runs[a]) == set(range(5)) for a in ("fzoo", "zo_muon", "lozo"))
  assert max(fzoo["diffs"]) < 0 and fzoo["mean"] > -0.03  # "at or a little below"
  assert abs(zo["mean"]) < 0.01  # "level"
  assert min(lozo["diffs"]) > 0  # "above it on every confirming seed"
  quotes.append(f"FZOO ends at or a little below MeZO at 1e-3 ({f(fzoo['mean'])}), ZO-Muon "
                f"level with it ({f(zo['mean'])}) and LOZO-M above it on every confirming seed "
                f"({f(lozo['mean'])})")
  # tuned at B/2: the B configuration at 200 passes
  for arm in ("hizoo", "fzoo", "zo_muon", "lozo"):
    half = report.by_config(report.select(records, arm=arm), 200)[k512.rows[arm]["B"]["config"]]
    h = report.paired(half, k512.ref)
    by_seed = dict(zip(h["seeds"], h["diffs"], strict=True))
    assert h["mean"] < 0 and by_seed[2] < 0 and by_seed[3] > 0 and by_seed[4] > 0, arm
  assert k512.ref[2] > k512.ref_300[2]  # "where MeZO turned up late"
  quotes.append("HiZOO, FZOO, ZO-Muon and LOZO-M are below tuned MeZO's loss at 400 on the mean "
                "only through seed 2, where MeZO turned up late; on the other two confirming "
                "seeds they are above it")
  for q in quotes:
    assert q in readme, q


def test_prompted_k512_prose_quotes_adam(k512):
  """First-order Adam tuned at B/2: its rate, interior, its neighbours and k = 16's rate as
  quoted; its CE at the evaluation serving B/2 against tuned MeZO's at B; every rate from
  1e-4 up below tuned MeZO's CE at B by its first evaluation on both tuning seeds."""
  from experiments.prompted import report

  adam, ref = k512.rows["adam"]["B/2"], k512.ref
  rate = adam["config"][2]
  assert adam["interior"]
  assert np.isclose(k512.rows16["adam"]["B/2"]["config"][2] * 10, rate)  # "ten times"
  grid = report.by_config(report.select(k512.records, arm="adam"), 200)
  rates = sorted(c[2] for c in grid)
  down, up = (next(v for c, v in grid.items() if c[2] == r)
              for r in (rates[rates.index(rate) - 1], rates[rates.index(rate) + 1]))
  runs = report.select(k512.records, arm="adam")
  first = min(c["passes"] for r in runs for c in r["curve"] if c["passes"] > 0)
  (read,) = {report.point_at(r, 200)["passes"] for r in runs}  # the evaluation serving B/2
  assert all(set(v) == set(report.TUNING_SEEDS) for v in grid.values())
  assert set(k512.rows["adam"]["reach"]["passes"].values()) == {first}
  below = {(r["lr"], r["seed"]): report.value_at(r, first) < ref[r["seed"]] for r in runs}
  assert all(b for (lr, _), b in below.items() if lr >= 1e-4)
  assert not all(below[(rates[0], s)] for s in report.TUNING_SEEDS)  # "from 1e-4 up"
  assert rates[1] == 1e-4 and k512.rows["adam"]["reach"]["label"].startswith("adam, lr 0.0001,")
  assert report.passes_per_step(k512.records, adam["config"]) == 3
  assert {r["steps"] for r in runs} == {67}
  v = adam["values"]
  lower = grid[next(c for c in grid if c[2] == 3e-4)]
  assert lower[1] < v[1] and lower[0] > v[0]  # best on the mean, not on seed 1
  k512.has(f"over {_rate(rates[0])} to {_rate(rates[-1])}, it is best at {_rate(rate)} on "
           f"the mean, interior ({_rate(rates[rates.index(rate) - 1])} ends at {down[0]:.3f} and "
           f"{down[1]:.3f}, {_rate(rates[rates.index(rate) + 1])} at {up[0]:.3f} and "
           f"{up[1]:.3f})",
           f"favoured {_rate(k512.rows16['adam']['B/2']['config'][2])}; on seed 1 3e-4 ends "
           f"lower, by {v[1] - lower[1]:.3f}", "best at 1e-3 on the mean",
           "a step counted as three passes, tuned at B/2 (67 steps)",
           "the table's passes column names 1e-4, the first of the rates that tie there",
           f"At {read:.0f} pass-equivalents it is at {v[0]:.3f} and {v[1]:.3f} (mean "
           f"{adam['tuning_mean']:.3f}), against tuned MeZO's {ref[0]:.3f} and {ref[1]:.3f} "
           "at B", f"by its first evaluation, {first:.0f} pass-equivalents, on both tuning seeds",
           f"within {first:.0f} pass-equivalents")


def test_prompted_pages_prose_quotes_the_table():
  """The numbers "What it says" quotes are the table's: each confirmed arm's paired
  differences with tuned MeZO at B (validation at B and tuned at B/2, test accuracy in
  points), the tuning seeds' means it compares (MeZO's best cosine rate and its batch-32
  arm's among them), and Adam's passes to MeZO's loss."""
  from experiments.prompted import report

  records = report.read()
  prose = _section(_page(os.path.join("results", "prompted.md")), "## What it says")
  rows = {r["arm"]: r for r in report.summary(records, 400)}

  confirmed = [a for a, r in rows.items() if a not in ("mezo", "adam") and "B" in r
               and set(r["B"]["values"]) - set(report.TUNING_SEEDS)]
  assert {"fzoo", "hizoo"} <= set(confirmed)
  for arm in confirmed:
    r = rows[arm]
    expected = _quoted(r["B"]["vs_mezo_B"]) + _quoted(r["B/2"]["vs_mezo_B"])
    expected += _quoted(r["B"]["test_vs_mezo_B"], 100, 1)
    expected.append(f"{r['B']['tuning_mean']:.3f}")
    # and without the seed where tuned MeZO's test accuracy is lowest (its late crossing)
    p = r["B"]["test_vs_mezo_B"]
    worst = min(rows["mezo"]["B"]["test"], key=rows["mezo"]["B"]["test"].get)
    rest = [d for s, d in zip(p["seeds"], p["diffs"], strict=True) if s != worst]
    expected.append(_signed(np.mean(rest), 100, 1))
    for s in expected:
      assert s in prose, (arm, s)
  assert f"{rows['mezo']['B']['tuning_mean']:.3f}" in prose
  literature = report.by_config(report.select(records, arm="mezo", lr=1e-4), 400)
  (values,) = literature.values()
  assert f"{np.mean([values[s] for s in report.TUNING_SEEDS]):.3f}" in prose
  # MeZO's other schedule and batch, on the tuning seeds: the best of each, as quoted
  cosine = report.tune([r for r in report.select(records, arm="mezo")
                        if r["schedule"] == "cosine"], 400)
  assert cosine is not None and f"{cosine[1]:.3f}" in prose
  assert f"{rows['mezo_batch32']['B']['tuning_mean']:.3f}" in prose
  unnormalised = rows["fzoo_unnormalised"]["B"]  # the FZOO ablation, tuning seeds only
  assert unnormalised["interior"] and f"{unnormalised['tuning_mean']:.3f}" in prose
  assert f"best at {_rate(unnormalised['config'][2])}, interior" in prose
  half = rows["fzoo_unnormalised"]["B/2"]
  assert half["interior"] and f"tuned at B/2: {_rate(half['config'][2])}, interior" in prose
  adam = rows["adam"]["reach"]["passes"].values()
  assert f"{min(adam):g}-{max(adam):g} pass-equivalents" in prose
