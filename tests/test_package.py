"""The installed package: every module imports with its declared dependencies alone, the
version is written once, and the docstring examples run."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
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

# One fresh interpreter runs every probe of the installed package, each phase printing
# "<phase>: ok" or "<phase>: FAILED" and its traceback (starting Python with JAX costs a
# few seconds a process). A meta-path hook makes the blocked top-level names unimportable
# (it raises ModuleNotFoundError, as a plain install without them would):
#   core:   the core modules with the flax extra and the undeclared packages blocked;
#   probe:  with flax alone blocked, importing hizoo_jax.models fails naming the block (the
#           hook works; the partly imported models modules are then dropped);
#   models: the models modules with the undeclared packages blocked (flax allowed);
#   doctest: with nothing blocked, every ``>>>`` example of the given modules.
# Each import phase also asserts that no blocked module was loaded.
_PROBE = r"""
import doctest, importlib, json, sys, traceback
plan = json.loads(sys.argv[1])
BLOCKED = set()

class Block:
  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] in BLOCKED:
      raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
    return None

sys.meta_path.insert(0, Block())

def imports(blocked, modules):
  BLOCKED.clear()
  BLOCKED.update(blocked)
  for mod in modules:
    importlib.import_module(mod)
  leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
  assert not leaked, leaked

def probe(blocked, module):
  BLOCKED.clear()
  BLOCKED.update(blocked)
  try:
    importlib.import_module(module)
  except ModuleNotFoundError as e:
    assert "blocked" in str(e), e
  else:
    raise AssertionError(f"{module} imported with {blocked} blocked")
  for m in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
    del sys.modules[m]

def doctests(modules):
  BLOCKED.clear()
  failed = tried = 0
  for name in modules:
    res = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS
                          | doctest.NORMALIZE_WHITESPACE)
    failed += res.failed
    tried += res.attempted
  print(f"doctests: {tried} tried, {failed} failed")
  assert not failed

for phase, fn, args in plan:
  try:
    {"imports": imports, "probe": probe, "doctests": doctests}[fn](*args)
    print(f"{phase}: ok", flush=True)
  except BaseException:
    print(f"{phase}: FAILED\n{traceback.format_exc()}", flush=True)
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


def test_the_package_ships_the_expected_modules():
  mods = _modules()
  assert {"hizoo_jax", "hizoo_jax.presets", "hizoo_jax._src.transform",
          "hizoo_jax.models.bert"} <= set(mods)
  assert not any(m.startswith(("hizoo_jax.problems", "hizoo_jax.digits")) for m in mods)


# Modules that need an extra beyond the core: the models (flax) and the integrations (each
# its own framework, e.g. tunix), tested in tests/test_models_* and tests/test_tunix.py.
WITH_EXTRAS = ("hizoo_jax.models", "hizoo_jax.integrations.")


def _phase(out, phase):
  assert f"{phase}: ok" in out.stdout, out.stdout[-6000:] + out.stderr[-3000:]


def test_modules_import_with_their_declared_dependencies_and_the_doctests_run():
  """In one fresh interpreter (``_PROBE``), run outside the repository so that only the
  installed package is importable: the core modules import with the core dependencies
  alone, the probe's block does block, the models import with the flax extra alone, and
  every ``>>>`` example in the package runs, with jax's defaults (float32, as a user runs
  them; the test session has float64 on)."""
  core = [m for m in _modules() if not m.startswith(WITH_EXTRAS)]
  models = [m for m in _modules() if m.startswith("hizoo_jax.models")]
  with_doctests = [m for m in _modules() if not m.startswith("hizoo_jax.integrations.")
                   or importlib.util.find_spec(m.split(".")[-1]) is not None]  # its framework
  plan = [("core", "imports", [FLAX_EXTRA + NOT_DECLARED, core]),
          ("probe", "probe", [["flax"], "hizoo_jax.models"])]
  has_flax = importlib.util.find_spec("flax") is not None  # hizoo_jax.models needs flax
  if has_flax:
    plan += [("models", "imports", [NOT_DECLARED, models]),
             ("doctests", "doctests", [with_doctests])]
  out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(plan)], cwd="/",
                       env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True,
                       text=True, timeout=600)
  for phase, _, _ in plan:
    _phase(out, phase)
  assert out.returncode == 0, out.stderr[-3000:]
  if not has_flax:
    pytest.skip("the models and the doctests need flax (the core and the probe ran)")
  tried = int(out.stdout.split("doctests: ")[1].split()[0])
  assert tried >= 10, out.stdout


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
