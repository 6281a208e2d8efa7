"""The installed package: every module imports with its declared dependencies alone, the
version is written once, and the docstring examples run."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import subprocess
import sys

import pytest

try:
  import tomllib
except ImportError:  # Python 3.10
  tomllib = pytest.importorskip("tomli")

import hizoo_jax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Import names of everything that is not a core dependency (jax, optax, chex, numpy).
FLAX_EXTRA = ("flax", "safetensors", "tokenizers", "orbax")
NOT_DECLARED = ("sklearn", "matplotlib", "tqdm", "torch", "transformers", "pandas", "scipy",
                "IPython", "experiments", "tests")

# A fresh interpreter with the given top-level names made unimportable (a meta-path hook that
# raises ModuleNotFoundError, as a plain install without them would), importing each module.
_PROBE = """
import importlib, sys
BLOCKED = set(sys.argv[1].split(","))

class Block:
  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] in BLOCKED:
      raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
    return None

sys.meta_path.insert(0, Block())
for mod in sys.argv[2].split(","):
  importlib.import_module(mod)
leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
assert not leaked, leaked
print("ok", len(sys.argv[2].split(",")))
"""


def _modules() -> list[str]:
  """Every module the package ships: its ``.py`` files, ``_src`` (a namespace folder that
  ``pkgutil.walk_packages`` does not enter) included."""
  (top,) = hizoo_jax.__path__
  names = []
  for dirpath, _, files in os.walk(top):
    rel = os.path.relpath(dirpath, os.path.dirname(top)).replace(os.sep, ".")
    for f in files:
      if f.endswith(".py"):
        names.append(rel if f == "__init__.py" else f"{rel}.{f[:-3]}")
  return sorted(n for n in names if "__pycache__" not in n)


def _import_blocking(blocked, modules):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  # run outside the repository so that only the installed package is importable
  return subprocess.run([sys.executable, "-c", _PROBE, ",".join(blocked), ",".join(modules)],
                        cwd="/", env=env,
                        capture_output=True, text=True, timeout=300)


def test_the_package_ships_the_expected_modules():
  mods = _modules()
  assert {"hizoo_jax", "hizoo_jax.presets", "hizoo_jax._src.transform",
          "hizoo_jax.models.bert"} <= set(mods)
  assert not any(m.startswith(("hizoo_jax.problems", "hizoo_jax.digits")) for m in mods)


# Modules that need an extra beyond the core: the models (flax) and the integrations (each
# its own framework, e.g. tunix), tested in tests/test_models_* and tests/test_tunix.py.
WITH_EXTRAS = ("hizoo_jax.models", "hizoo_jax.integrations.")


def test_core_modules_import_with_the_core_dependencies_alone():
  core = [m for m in _modules() if not m.startswith(WITH_EXTRAS)]
  out = _import_blocking(FLAX_EXTRA + NOT_DECLARED, core)
  assert out.returncode == 0, out.stderr[-3000:]


def test_models_import_with_the_flax_extra_alone():
  pytest.importorskip("flax")
  models = [m for m in _modules() if m.startswith("hizoo_jax.models")]
  out = _import_blocking(NOT_DECLARED, models)
  assert out.returncode == 0, out.stderr[-3000:]


def test_the_probe_does_block():
  out = _import_blocking(("flax",), ["hizoo_jax.models"])
  assert out.returncode != 0 and "blocked" in out.stderr


def test_no_module_outside_models_names_flax_or_sklearn():
  """A static check over the source, so that a lazy import inside a function is caught too."""
  for name in _modules():
    if name.startswith(WITH_EXTRAS):
      continue
    with open(importlib.util.find_spec(name).origin) as fh:
      tree = ast.parse(fh.read())
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        roots = [a.name.split(".")[0] for a in node.names]
      elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        roots = [node.module.split(".")[0]]
      else:
        continue
      bad = set(roots) & set(FLAX_EXTRA + NOT_DECLARED)
      assert not bad, (name, bad)


def _imports(name):
  """``(modules imported, attribute reads of imported names)`` of a module."""
  with open(importlib.util.find_spec(name).origin) as fh:
    tree = ast.parse(fh.read())
  modules, attrs, aliases = [], [], set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      modules += [a.name for a in node.names]
      aliases |= {a.asname or a.name.split(".")[0] for a in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      modules.append(node.module)
      modules += [f"{node.module}.{a.name}" for a in node.names]
      aliases |= {a.asname or a.name for a in node.names}
    elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
      attrs.append((node.value.id, node.attr))
  return modules, [(v, a) for v, a in attrs if v in aliases]


def test_modules_use_each_others_public_names_only():
  """No optax internals; models and integrations use the public package, not its _src;
  no module reads a private name of another module (``mod._name``)."""
  for name in _modules():
    modules, attrs = _imports(name)
    assert not [m for m in modules if m.startswith("optax._src")], name
    if name.startswith(WITH_EXTRAS):
      assert not [m for m in modules if m.startswith("hizoo_jax._src")], name
    private = [(v, a) for v, a in attrs if a.startswith("_") and not a.startswith("__")]
    assert not private, (name, private)


def test_version_is_written_once():
  with open(os.path.join(ROOT, "pyproject.toml")) as fh:
    text = fh.read()
  project = tomllib.loads(text)["project"]
  assert "version" not in project and "version" in project["dynamic"]
  assert 'attr = "hizoo_jax.__version__"' in text
  assert importlib.metadata.version("hizoo-jax") == hizoo_jax.__version__
  with open(os.path.join(ROOT, "CHANGELOG.md")) as fh:
    changelog = fh.read()
  assert "## [Unreleased]" in changelog
  assert f"## [{hizoo_jax.__version__}]" in changelog


_DOCTEST = """
import doctest, importlib, sys
failed = tried = 0
for name in sys.argv[1].split(","):
  res = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS
                        | doctest.NORMALIZE_WHITESPACE)
  failed += res.failed
  tried += res.attempted
print(f"doctests: {tried} tried, {failed} failed")
sys.exit(1 if failed else 0)
"""


def test_docstring_examples_run():
  """Every ``>>>`` example in the package, in a fresh interpreter with jax's defaults (float32,
  as a user runs them; the test session has float64 on)."""
  mods = [m for m in _modules() if not m.startswith("hizoo_jax.integrations.")
          or importlib.util.find_spec(m.split(".")[-1]) is not None]  # its framework
  pytest.importorskip("flax", reason="hizoo_jax.models needs flax")
  out = subprocess.run([sys.executable, "-c", _DOCTEST, ",".join(mods)], cwd="/",
                       env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True,
                       timeout=600)
  assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
  tried = int(out.stdout.split("doctests: ")[1].split()[0])
  assert tried >= 10, out.stdout
