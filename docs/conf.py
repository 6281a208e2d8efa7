"""Sphinx configuration for the hizoo-jax documentation.

    pip install -e ".[docs]"
    sphinx-build -W --keep-going -b html docs docs/_build/html

The notebooks are rendered from their committed outputs (never executed here); they are copied
from ``notebooks/`` into ``docs/notebooks/`` at build time.
"""

from __future__ import annotations

import os
import shutil
import sys

DOCS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(DOCS)
sys.path.insert(0, ROOT)

import hizoo_jax  # noqa: E402

project = "hizoo-jax"
author = "hizoo-jax developers"
copyright = "2026, hizoo-jax developers"  # noqa: A001
release = hizoo_jax.__version__
version = release

extensions = [
    "myst_nb",  # Markdown (MyST) pages and .ipynb notebooks
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
]

# --- the notebooks: copied in, rendered with their saved outputs -------------------------
_NB_SRC = os.path.join(ROOT, "notebooks")
_NB_DST = os.path.join(DOCS, "notebooks")
os.makedirs(_NB_DST, exist_ok=True)
for _name in sorted(os.listdir(_NB_SRC)):
  if _name.endswith(".ipynb"):
    shutil.copy2(os.path.join(_NB_SRC, _name), os.path.join(_NB_DST, _name))

nb_execution_mode = "off"
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

exclude_patterns = ["_build", "**.ipynb_checkpoints", "jupyter_execute"]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}

# --- API reference -------------------------------------------------------------------------
autosummary_generate = True
autodoc_default_options = {"members": True, "show-inheritance": False}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

intersphinx_mapping = {
    "python": ("https://docs.python.org/3", None),
}
# No network in CI: intersphinx falls back to plain text when the inventory cannot be read,
# and its warning would fail the -W build. Only the Python inventory is listed, and it is
# disabled unless HIZOO_DOCS_INTERSPHINX=1.
if os.environ.get("HIZOO_DOCS_INTERSPHINX") != "1":
  intersphinx_mapping = {}

# Type names from other libraries appear in signatures and docstrings; without their
# inventories (offline builds) Sphinx cannot link them. Cross-reference warnings are only
# raised in nitpicky mode, which stays off.
nitpicky = False

# --- HTML ------------------------------------------------------------------------------------
html_theme = "sphinx_book_theme"
html_title = f"hizoo-jax {release}"
html_theme_options = {
    "show_toc_level": 2,
    "repository_url": "",
    "use_repository_button": False,
    "navigation_with_keys": False,
}
