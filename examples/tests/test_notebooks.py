"""The notebooks run end to end in their small mode, and the committed ones hold full runs.

Each notebook reads ``HIZOO_NOTEBOOK_SMALL=1`` (tiny budgets: its numbers mean nothing) and
writes its figures to ``HIZOO_NOTEBOOK_FIGURES``, here a temporary folder, so the committed
outputs and figures are left alone. The committed ``.ipynb`` files must hold the outputs
of a full run: the numbers of the documentation's results pages come from them.
"""

from __future__ import annotations

import ast
import json
import os

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOKS = os.path.join(ROOT, "notebooks")
FIGURES = {
    "01_test_functions.ipynb": ["test_functions.png", "float32_probe.png"],
    "02_curvature_estimate.ipynb": ["curvature_one_step.png", "curvature_fixed_point.png",
                                    "curvature_recovery.png", "curvature_vs_steps.png"],
    "03_ablations.ipynb": ["digits_methods.png", "digits_hessian.png", "digits_control.png",
                           "digits_alpha.png", "digits_directions.png"],
}


def test_every_notebook_is_listed():
  assert sorted(f for f in os.listdir(NOTEBOOKS) if f.endswith(".ipynb")) == sorted(FIGURES)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FIGURES))
def test_notebook_runs_in_small_mode(name, tmp_path, monkeypatch):
  monkeypatch.setenv("HIZOO_NOTEBOOK_SMALL", "1")
  monkeypatch.setenv("HIZOO_NOTEBOOK_FIGURES", str(tmp_path))
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.setenv("MPLBACKEND", "Agg")
  nb = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
  client = nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                                   resources={"metadata": {"path": NOTEBOOKS}})
  client.execute()  # raises CellExecutionError on the first failing cell
  text = json.dumps([c.get("outputs", []) for c in nb.cells if c.cell_type == "code"])
  assert "mode: SMALL" in text
  for fig in FIGURES[name]:
    assert (tmp_path / fig).stat().st_size > 0, fig


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_committed_notebook_holds_a_full_run(name):
  nb = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
  code = [c for c in nb.cells if c.cell_type == "code"]
  assert code and all(c.get("execution_count") for c in code), "not executed"
  text = json.dumps([c.get("outputs", []) for c in code])
  assert "mode: full" in text
  assert '"output_type": "error"' not in text
  for fig in FIGURES[name]:
    assert os.path.getsize(os.path.join(NOTEBOOKS, "figures", fig)) > 0, fig


def _outputs_text(name):
  """The text and Markdown outputs of a committed notebook, joined."""
  nb = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
  parts = []
  for cell in nb.cells:
    for out in cell.get("outputs", []):
      if out.get("output_type") == "stream":
        parts.append(out["text"])
      else:
        parts.append(out.get("data", {}).get("text/markdown", ""))
  return "\n".join(parts)


def test_demo_learning_rates_are_the_notebooks_choice():
  """The demo's digits learning rates are the ones notebook 03 chose on its held-out seed."""
  with open(os.path.join(ROOT, "examples", "demo.py")) as fh:
    tree = ast.parse(fh.read())
  demo_lr = next(ast.literal_eval(node.value) for node in ast.walk(tree)
                 if isinstance(node, ast.Assign)
                 and any(getattr(t, "id", None) == "DIGITS_LR" for t in node.targets))
  chosen = {}
  for line in _outputs_text("03_ablations.ipynb").splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) == 5 and "final train loss (seed 100)" not in line and ":" in cells[1]:
      chosen[cells[0]] = float(cells[-1])
  assert set(demo_lr) <= set(chosen), (demo_lr, chosen)
  for name, lr in demo_lr.items():
    assert lr == pytest.approx(chosen[name]), name


def _page_table_rows(page: str, start: str, stop: str) -> list[str]:
  """The body rows of the first Markdown table between ``start`` and ``stop`` in a docs page."""
  with open(os.path.join(ROOT, "docs", page)) as fh:
    text = fh.read()
  section = text[text.index(start):]
  section = section[: section.index(stop)]
  return [ln.strip() for ln in section.splitlines()
          if ln.startswith("| ") and not ln.startswith("| method") and "---" not in ln]


@pytest.mark.parametrize("name, page, start, stop", [
    ("01_test_functions.ipynb", "results/test_functions.md", "Steps to f < 0.1",
     "## What it shows"),
    ("03_ablations.ipynb", "results/digits.md", "A Flax NNX MLP", "## What it shows"),
])
def test_results_pages_tables_come_from_the_notebooks(name, page, start, stop):
  """Each row of a results page's main table starts a row of the notebook's output."""
  rows = _page_table_rows(page, start, stop)
  assert len(rows) >= 6
  lines = [ln.strip() for ln in _outputs_text(name).splitlines()]
  for row in rows:
    assert any(ln.startswith(row) for ln in lines), row
