"""Which parameters should a zeroth-order method perturb? The predicted rate per subset.

For a two-point estimate along a Gaussian direction ``z`` restricted to a subset ``S`` of the
parameters, ``g_hat = (z . g_B) z`` (``g_B`` the minibatch gradient, the limit ``mu -> 0``),
one step of size ``lr`` changes the loss in expectation by

    -lr |g_S|^2 + lr^2 / 2 E_B[ |g_B,S|^2 tr(H_S) + 2 g_B,S' H_S g_B,S ]

(``g`` the gradient of the whole training loss, ``H`` its Hessian). At its best ``lr`` a step
gains ``|g_S|^4 / (2 E|g_B,S|^2 tr(H_S))`` when ``tr(H_S)`` dominates (it does: the subsets
here hold 10^5-10^7 parameters). So the subset that a zeroth-order method should perturb is
the one with the largest ``rate(S) = |g_S|^4 / (E|g_B,S|^2 tr(H_S))``: its step sizes
follow, and the ratio of two rates predicts the ratio of forward passes to a given loss early
in a run. Parameters with little gradient but a share of the curvature (a token embedding
row is used by few batches, yet the noise a step writes into it is paid on every batch that
uses the token) lower the rate of any subset that contains them.

This module measures, per parameter leaf, the three sums on MiniLM-L6 / SST-2 at the
linear-probe start of the harness (``tasks.SST2``, seed 0):

* ``|g_S|^2``: from the mean of ``N`` minibatch gradients, debiased (``E|mean|^2 = |g|^2 +
  (E|g_B|^2 - |g|^2) / N``);
* ``E|g_B,S|^2``: the mean squared norm of the same minibatch gradients;
* ``tr(H_S)``: Hutchinson, ``v_S . (H_B v)_S`` with ``v`` Rademacher on every parameter,
  averaged over minibatches (one Hessian-vector product each: the cross terms between
  leaves vanish in expectation, so one product gives every leaf's trace).

and prints the rate of the subsets a user can pick (every parameter, no token embeddings,
the encoder layers only, ...), relative to every parameter::

    python -m experiments.choose.zo_rate --batches 256 --hvp 64 --out sst2_ft_full
    python -m experiments.choose.zo_rate --batches 256 --hvp 160 --hvp-seed 1 --offset 5000 \
        --out sst2_ft_full_b                                # independent
    python -m experiments.choose.zo_rate --load sst2_ft_full sst2_ft_full_b
    python -m experiments.choose.zo_rate --load sst2_ft_full sst2_ft_full_b \
        --batch-sizes 16 32 64 128 256    # the same rate at other batch sizes

A measurement is a record of the table ``results/zo_rate.jsonl.gz`` named by ``--out``.
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments import table as table_io


def _layers(*ids: int):
  return lambda p: any(f"['layers'][{i}]" in p for i in ids)


def _head(p: str) -> bool:
  return "['backbone']" not in p


# The subsets reported: name -> predicate on a leaf's path string (a subset that selects
# no leaf of the measured params, or the same leaves as a subset above it, is left out).
SUBSETS = {
    "every parameter": lambda p: True,
    "all but the token embeddings": lambda p: "['word']" not in p,
    "encoder layers + head": lambda p: "['layers']" in p or _head(p),
    "the head only": _head,
    "biases + LayerNorms + head (BitFit-like)":
        lambda p: p.endswith("['bias']") or p.endswith("['scale']") or _head(p),
    "token embeddings only": lambda p: "['word']" in p,
    "layers 0-3 + head": lambda p: _layers(0, 1, 2, 3)(p) or _head(p),
    "layers 1-3 + head": lambda p: _layers(1, 2, 3)(p) or _head(p),
    "layers 2-3 + head": lambda p: _layers(2, 3)(p) or _head(p),
    "layers 4-5 + head": lambda p: _layers(4, 5)(p) or _head(p),
    "all but the head": lambda p: not _head(p),
    "layers 1-3 (head frozen)": _layers(1, 2, 3),
}


def leaf_names(tree) -> list[str]:
  return [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_leaves_with_path(tree)]


def measure(task_name: str = "sst2_ft_full", seed: int = 0, batches: int = 256, hvp: int = 64,
            hvp_seed: int = 0, offset: int = 0) -> dict:
  """:func:`measure_instance` on a task of the harness (``tasks.TASKS``) at its start."""
  from experiments.choose import tasks

  out = measure_instance(tasks.TASKS[task_name].setup(seed), batches, hvp, hvp_seed, offset)
  return {"task": task_name, "seed": seed, **out}


def measure_instance(inst, batches: int = 256, hvp: int = 64, hvp_seed: int = 0,
                     offset: int = 0) -> dict:
  """Per-leaf ``n``, ``g2`` (debiased ``|g|^2``), ``gb2`` (``E|g_B|^2``), ``trh`` (and its
  standard error ``trh_se``) at ``inst.params``, from the minibatches ``inst.batch(t)``:
  gradients on ``t = offset .. offset + batches - 1``, one Hessian-vector product on each
  of the next ``hvp``."""
  params, extra = inst.params, inst.extra
  names = leaf_names(params)
  sq = lambda t: jnp.stack([jnp.sum(jnp.square(x.astype(jnp.float32)))
                            for x in jax.tree.leaves(t)])
  grad = jax.jit(jax.grad(inst.loss_fn))

  @jax.jit
  def hvp_terms(p, v, *batch):
    g = lambda q: jax.grad(inst.loss_fn)(q, *extra, *batch)
    _, hv = jax.jvp(g, (p,), (v,))
    return jnp.stack([jnp.sum(a * b) for a, b in zip(jax.tree.leaves(v), jax.tree.leaves(hv),
                                                      strict=True)])

  t0 = time.perf_counter()
  gsum = jax.tree.map(jnp.zeros_like, params)
  gb2 = np.zeros(len(names))
  for t in range(batches):
    gb = grad(params, *extra, *inst.batch(offset + t))
    gsum = jax.tree.map(jnp.add, gsum, gb)
    gb2 += np.asarray(sq(gb), np.float64)
  gb2 /= batches
  mean2 = np.asarray(sq(jax.tree.map(lambda s: s / batches, gsum)), np.float64)
  g2 = (batches * mean2 - gb2) / (batches - 1)
  t_grad = time.perf_counter() - t0

  t0 = time.perf_counter()
  key = jax.random.key(hvp_seed)
  leaves, treedef = jax.tree.flatten(params)
  trh_samples = []
  for t in range(hvp):
    key, sub = jax.random.split(key)
    keys = jax.random.split(sub, len(leaves))
    v = jax.tree.unflatten(treedef, [
        jax.random.rademacher(k, x.shape, x.dtype) for k, x in zip(keys, leaves, strict=True)])
    # batches after the gradient's, so the two estimates are independent
    trh_samples.append(np.asarray(hvp_terms(params, v, *inst.batch(offset + batches + t)),
                                  np.float64))
  trh_samples = np.stack(trh_samples)
  t_hvp = time.perf_counter() - t0
  return {"batches": batches, "hvp": hvp, "hvp_seed": hvp_seed, "offset": offset,
          "names": names, "n": [int(x.size) for x in leaves], "g2": g2.tolist(),
          "gb2": gb2.tolist(), "trh": trh_samples.mean(0).tolist(),
          "trh_se": (trh_samples.std(0, ddof=1) / np.sqrt(hvp)).tolist(),
          "seconds": {"gradients": t_grad, "hvp": t_hvp}}


def rates(m: dict, subsets=None) -> list[dict]:
  """Rate of each subset relative to every parameter (see the module docstring)."""
  subsets = SUBSETS if subsets is None else subsets
  names = m["names"]
  arr = {k: np.asarray(m[k], np.float64) for k in ("n", "g2", "gb2", "trh", "trh_se")}
  out = []
  seen: list = []
  for label, pred in subsets.items():
    sel = np.array([bool(pred(p)) for p in names])
    if seen and (not sel.any() or any(np.array_equal(sel, x) for x in seen)):
      continue  # a subset of another model's params, or one already reported
    seen.append(sel)
    n, g2, gb2 = arr["n"][sel].sum(), arr["g2"][sel].sum(), arr["gb2"][sel].sum()
    trh, se = arr["trh"][sel].sum(), np.sqrt(np.square(arr["trh_se"][sel]).sum())
    ok = trh > 0
    out.append({"subset": label, "params": int(n), "g2": g2, "gb2": gb2, "trh": trh,
                "trh_se": se, "rate": g2 ** 2 / (gb2 * trh) if ok else float("nan"),
                # the best constant step and what one step gains at it (loss units)
                "lr_star": g2 / (gb2 * trh) if ok else float("nan"),
                "gain_per_step": g2 ** 2 / (2 * gb2 * trh) if ok else float("nan")})
  base = out[0]["rate"]
  for r in out:
    r["relative_rate"] = r["rate"] / base
  return out


def table(rows: list[dict]) -> str:
  """One measurement: the shares, the relative rate, the best lr and the gain."""
  lines = ["| subset | params | share of \\|g\\|² | share of E\\|g_B\\|² | share of tr H "
           "(± 2 se) | rate relative to every parameter | best lr | loss gain per 1,000 steps |",
           "|---|---|---|---|---|---|---|---|"]
  b = rows[0]
  for r in rows:
    lines.append(f"| {r['subset']} | {r['params']:,} | {r['g2'] / b['g2']:.3f} | "
                 f"{r['gb2'] / b['gb2']:.3f} | {r['trh'] / b['trh']:.3f} "
                 f"(± {2 * r['trh_se'] / b['trh']:.3f}) | {r['relative_rate']:.2f} | "
                 f"{r['lr_star']:.3g} | {1000 * r['gain_per_step']:.2g} |")
  return "\n".join(lines)


def compare(ms: list[dict], subsets=None) -> str:
  """Several measurements of the same params side by side: relative rate and best lr."""
  per = [rates(m, subsets) for m in ms]
  head = " | ".join(f"measurement {chr(97 + i)}: rate, best lr" for i in range(len(ms)))
  lines = [f"| subset | params | {head} |", "|---|---|" + "---|" * len(ms)]
  for i, r in enumerate(per[0]):
    cells = " | ".join(f"{p[i]['relative_rate']:.2f}, {p[i]['lr_star']:.2g}" for p in per)
    lines.append(f"| {r['subset']} | {r['params']:,} | {cells} |")
  return "\n".join(lines)


def batch_scaling(m: dict, batch: int, sizes=(16, 32, 64, 128, 256, 1024)) -> list[dict]:
  """The rate of every parameter at other batch sizes, from one measurement at ``batch``.

  Minibatches of ``B`` independent examples have ``E|g_B|^2 = |g|^2 + s^2 / B`` (``s^2`` the
  per-example variance, summed over parameters), so the measurement at ``batch`` gives
  ``s^2`` and, with ``|g|^2`` and ``tr H`` unchanged, the best lr and the gain a step at it
  makes at any ``B``. A step costs two forward passes of ``B`` examples whatever ``B``: the
  gain per forward pass is the gain per step, the gain per example that over ``B``. Rows
  relative to ``batch``. (Sampling without replacement from a finite set only lowers
  ``s^2 / B`` further; not modelled.)"""
  g2 = float(np.sum(m["g2"]))
  gb2 = float(np.sum(m["gb2"]))
  s2 = (gb2 - g2) * batch

  def noise(b):
    return g2 + s2 / b

  return [{"batch": b, "gb2_over_g2": noise(b) / g2,
           "per_pass": noise(batch) / noise(b),
           "per_example": noise(batch) * batch / (noise(b) * b),
           "lr_star": noise(batch) / noise(b)} for b in sizes]


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--task", default="sst2_ft_full")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--batches", type=int, default=256)
  p.add_argument("--hvp", type=int, default=64)
  p.add_argument("--hvp-seed", type=int, default=0, help="seed of the Rademacher probes")
  p.add_argument("--offset", type=int, default=0,
                 help="first batch (training steps' batches offset..): an independent "
                      "measurement takes batches and probes no other one used")
  p.add_argument("--out", default=None,
                 help="save the per-leaf measurements under this name in the zo_rate table")
  p.add_argument("--load", nargs="+", default=None,
                 help="report saved measurements (names) instead of measuring (several: side "
                      "by side)")
  p.add_argument("--batch-sizes", type=int, nargs="+", default=None,
                 help="with --load: the rate of every parameter at these batch sizes, "
                      "relative to the task's (per forward pass and per example)")
  a = p.parse_args()
  if a.batch_sizes and not a.load:
    p.error("--batch-sizes reads saved measurements: give them with --load")
  saved = table_io.path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"),
                        "zo_rate")

  def load(name):
    m = table_io.find(saved, name)
    if m is None:
      p.error(f"--load: no measurement {name!r} in {saved}; saved: "
              f"{sorted(table_io.index(saved))}")
    return m

  if a.load and a.batch_sizes:
    from experiments.choose import tasks

    for path in a.load:
      m = load(path)
      b0 = tasks.TASKS[m["task"]].batch_size
      print(f"{path} (measured at batch {b0}):")
      print("| batch | E\\|g_B\\|² / \\|g\\|² | gain per forward pass | gain per example "
            "| best lr |")
      print("|---|---|---|---|---|")
      for r in batch_scaling(m, b0, a.batch_sizes):
        print(f"| {r['batch']} | {r['gb2_over_g2']:.1f} | {r['per_pass']:.2f}x | "
              f"{r['per_example']:.2f}x | {r['lr_star']:.2f}x |")
    return
  if a.load and len(a.load) > 1:
    print(compare([load(name) for name in a.load]))
    return
  if a.load:
    m = load(a.load[0])
  else:
    m = measure(a.task, a.seed, a.batches, a.hvp, a.hvp_seed, a.offset)
    if a.out:
      table_io.append(saved, {"key": a.out, **m})
  print(table(rates(m)))
  print(f"seconds: {m['seconds']}")


if __name__ == "__main__":
  main()
