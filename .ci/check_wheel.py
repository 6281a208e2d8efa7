"""Check a built wheel: the package's modules are in it, and nothing else from the repository.

    python .ci/check_wheel.py dist/hizoo_jax-*.whl
"""

from __future__ import annotations

import ast
import email.parser
import os
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(path: str) -> None:
  with zipfile.ZipFile(path) as zf:
    names = set(zf.namelist())
    (meta_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    meta = email.parser.Parser().parsestr(zf.read(meta_name).decode())
  dist_info = meta_name.split("/")[0]

  # the installed modules: every .py file under hizoo_jax/ in the source tree
  expected = set()
  for dirpath, _, files in os.walk(os.path.join(ROOT, "hizoo_jax")):
    for f in files:
      if f.endswith(".py"):
        expected.add(os.path.relpath(os.path.join(dirpath, f), ROOT).replace(os.sep, "/"))
  missing = sorted(expected - names)
  assert not missing, f"modules missing from the wheel: {missing}"
  data = {"hizoo_jax/py.typed", "hizoo_jax/measured.json"}  # pyproject's package-data
  assert data <= names, f"package data missing from the wheel: {sorted(data - names)}"
  expected |= data

  stray = sorted(n for n in names if not n.startswith(("hizoo_jax/", dist_info + "/")))
  assert not stray, f"files outside the package in the wheel: {stray}"
  for folder in ("tests/", "experiments/", "notebooks/", "examples/", "benchmarks/", "docs/"):
    assert not any(folder in n for n in names), f"{folder} is in the wheel"
  extra = sorted(n for n in names if n.startswith("hizoo_jax/") and n not in expected)
  assert not extra, f"files in the wheel that are not package modules: {extra}"

  # the version: written once, in hizoo_jax/__init__.py
  with open(os.path.join(ROOT, "hizoo_jax", "__init__.py")) as fh:
    tree = ast.parse(fh.read())
  version = next(ast.literal_eval(node.value) for node in tree.body
                 if isinstance(node, ast.Assign)
                 and any(getattr(t, "id", None) == "__version__" for t in node.targets))
  assert meta["Version"] == version, (meta["Version"], version)
  extras = set(meta.get_all("Provides-Extra"))
  want = {"cpu", "cuda", "tpu", "flax", "test", "examples", "docs"}
  assert want <= extras, f"extras missing: {sorted(want - extras)}"
  print(f"{os.path.basename(path)}: {len(expected)} modules, version {version}, "
        f"extras {', '.join(sorted(extras))}: ok")


if __name__ == "__main__":
  (wheel,) = sys.argv[1:]
  main(wheel)
