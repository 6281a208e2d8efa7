"""Plain NumPy (float64) references of FZOO, Sparse MeZO and forward gradients.

Written from the methods' formulas, not from the package: dicts of arrays, loops over
probes, no JAX. The tests hand them the noise the transform drew (regenerated from the
state key with the documented key schedule) and compare step by step.

Every reference step returns ``(g, info)``: the estimate ``g`` (a dict shaped like the
params) and ``info`` with the step's ``loss`` (as the state logs it), ``losses`` (the
measuring passes' values in order) and ``skipped`` (probes counted as skipped).
"""

from __future__ import annotations

import numpy as np


def _zeros(theta: dict) -> dict:
  return {k: np.zeros_like(v) for k, v in theta.items()}


def _moved(theta: dict, d: dict, step: float) -> dict:
  return {k: theta[k] + step * d[k] for k in theta}


def fzoo_step(theta: dict, f, us: list[dict], mu: float, normalize: bool = True):
  """``l0 = f(theta)``, ``l_j = f(theta + mu u_j)``, ``sigma`` the population std of the
  finite ``l_j``, ``g = 1/(n sigma) sum_j (l_j - l0) u_j`` over the ``n`` finite probes;
  fewer than two finite probes (or ``l0`` not finite) or ``sigma == 0``: ``g = 0`` and
  every probe of the step is counted as skipped. ``normalize=False``: ``mu`` in place of
  ``sigma``, and one finite probe suffices."""
  num = len(us)
  l0 = f(theta)
  ls = [f(_moved(theta, u, mu)) for u in us]
  finite = [bool(np.isfinite(lj) and np.isfinite(l0)) for lj in ls]
  kept = np.array([lj for lj, ok in zip(ls, finite, strict=True) if ok])
  n = len(kept)
  sigma = float(np.std(kept)) if n else float("nan")  # ddof = 0
  g = _zeros(theta)
  skipped = num
  runs = n >= 2 and sigma > 0 if normalize else n >= 1
  if runs:
    scale = sigma if normalize else mu
    for lj, u, ok in zip(ls, us, finite, strict=True):
      if ok:
        for k in theta:
          g[k] = g[k] + (lj - l0) / (n * scale) * u[k]
    skipped = num - n
  return g, dict(loss=l0, losses=np.array(ls), skipped=skipped, sigma=sigma)


def sparse_threshold(theta0: np.ndarray, sparsity: float) -> float:
  """``h``: the ``(1 - sparsity)`` quantile of ``|theta0|`` (linear interpolation); ``inf``
  (no mask) where it is 0, a matrix with no spread."""
  h = float(np.quantile(np.abs(theta0), 1.0 - sparsity))
  return h if h > 0 else float("inf")


def sparse_masks(theta: dict, thresholds: dict) -> dict:
  """``|theta| <= h`` for every leaf with ``ndim >= 2``; all true for the others."""
  return {k: (np.abs(v) <= thresholds[k]) if v.ndim >= 2 else np.ones(v.shape, bool)
          for k, v in theta.items()}


def sparse_mezo_step(theta: dict, f, zs: list[dict], thresholds: dict, mu: float):
  """Two-sided SPSA along ``m * z_j`` with the mask ``m`` of the current params; the
  estimate averages the probes whose ``l+`` and ``l-`` are both finite."""
  masks = sparse_masks(theta, thresholds)
  g = _zeros(theta)
  n_valid, losses, means = 0, [], []
  for z in zs:
    d = {k: masks[k] * z[k] for k in theta}
    lp = f(_moved(theta, d, mu))
    lm = f(_moved(theta, d, -mu))
    losses += [lp, lm]
    means.append((lp + lm) / 2)
    if np.isfinite(lp) and np.isfinite(lm):
      n_valid += 1
      for k in theta:
        g[k] = g[k] + (lp - lm) / (2 * mu) * d[k]
  g = {k: v / max(n_valid, 1) for k, v in g.items()}
  return g, dict(loss=float(np.mean(means)), losses=np.array(losses),
                 skipped=len(zs) - n_valid, masks=masks)


def forward_gradient_step(theta: dict, f_jvp, zs: list[dict]):
  """``d_j``: the directional derivative along ``z_j`` (``f_jvp(theta, z) -> (f, d)``);
  ``g`` the mean of ``d_j z_j`` over the finite ``d_j``; the loss is ``f(theta)``."""
  g = _zeros(theta)
  ds, loss = [], None
  for z in zs:
    value, d = f_jvp(theta, z)
    loss = value if loss is None else loss
    ds.append(d)
  finite = [bool(np.isfinite(d)) for d in ds]
  for d, z, ok in zip(ds, zs, finite, strict=True):
    if ok:
      for k in theta:
        g[k] = g[k] + d * z[k]
  n_valid = sum(finite)
  g = {k: v / max(n_valid, 1) for k, v in g.items()}
  return g, dict(loss=loss, losses=np.array(ds), skipped=len(zs) - n_valid)
