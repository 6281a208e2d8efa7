"""A plain NumPy (float64) implementation of the formulas of spec section 1.

Written from the spec, not from the package: loops over directions and leaves, dicts of
arrays, no JAX. The tests feed it the same noise the transform drew (regenerated from the
state key with the documented key schedule) and compare step by step.
"""

from __future__ import annotations

import numpy as np


def _dense(h, lo, hi):
  if isinstance(h, tuple):
    r, c = h
    full = r[..., :, None] * c[..., None, :] / r.sum(-1)[..., None, None]
    return np.clip(full, lo, hi)
  return h


def _est(h_dense, z, c, estimator):
  if estimator == "paper":
    return abs(c) * h_dense * z**2
  return c * h_dense * (z**2 - 1)  # "unbiased": the signed MiNES estimate


def _guard(new, old, estimator):
  # The unbiased (signed) estimate may at most halve H per update.
  return np.maximum(new, old / 2) if estimator == "unbiased" else new


def ref_step(
    theta: dict,
    f,
    zs: list[dict],
    H: dict | None,
    *,
    mu: float,
    lr: float,
    alpha: float = 0.0,
    estimator: str = "paper",
    clip=(1e-8, 1e8),
    weight_decay: float = 0.0,
    hessian_step: bool = True,
    floor: float = 4.0,
):
  """One step of HiZOO (``H`` given) or MeZO (``H is None``).

  ``H`` maps leaf names to dense arrays or ``(row, col)`` tuples (factored leaves).
  Returns ``(new_theta, new_H, info)``.
  """
  lo, hi = clip
  H = None if H is None else {k: (tuple(v) if isinstance(v, tuple) else v) for k, v in H.items()}
  hizoo = H is not None
  l0 = f(theta) if (hizoo and hessian_step) else None
  g = {k: np.zeros_like(v) for k, v in theta.items()}
  n_valid, skipped_h, lps, lms = 0, 0, [], []
  for z in zs:
    s = {k: 1 / np.sqrt(_dense(H[k], lo, hi)) for k in theta} if hizoo else dict.fromkeys(theta, 1)
    lp = f({k: theta[k] + mu * s[k] * z[k] for k in theta})
    lm = f({k: theta[k] - mu * s[k] * z[k] for k in theta})
    lps.append(lp)
    lms.append(lm)
    finite = np.isfinite(lp) and np.isfinite(lm) and (l0 is None or np.isfinite(l0))
    if not finite:
      continue
    n_valid += 1
    if hizoo and hessian_step:
      d2 = lp + lm - 2 * l0
      if abs(d2) > floor * np.finfo(np.float64).eps * max(abs(lp), abs(lm), abs(l0)):
        c = d2 / (2 * mu**2)
        for k in theta:
          if isinstance(H[k], tuple):
            r, col = H[k]
            p, q = z[k].shape[-2:]
            E = _est(_dense(H[k], lo, hi), z[k], c, estimator)
            r = np.clip(_guard((1 - alpha) * r + alpha * E.sum(-1), r, estimator), q * lo, q * hi)
            col = np.clip(
                _guard((1 - alpha) * col + alpha * E.sum(-2), col, estimator), p * lo, p * hi
            )
            H[k] = (r, col)
          else:
            new = (1 - alpha) * H[k] + alpha * _est(H[k], z[k], c, estimator)
            H[k] = np.clip(_guard(new, H[k], estimator), lo, hi)
      else:
        skipped_h += 1
      s = {k: 1 / np.sqrt(_dense(H[k], lo, hi)) for k in theta}
    proj = (lp - lm) / (2 * mu)
    for k in theta:
      g[k] = g[k] + proj * s[k] * z[k]
  g = {k: v / max(n_valid, 1) for k, v in g.items()}
  # Weight decay on the matrices only (the reference trainers skip biases and norms).
  new_theta = {k: theta[k] - lr * (g[k] + (weight_decay if theta[k].ndim >= 2 else 0.0)
                                   * theta[k]) for k in theta}
  loss = l0 if l0 is not None else float(np.mean((np.array(lps) + np.array(lms)) / 2))
  info = dict(loss=loss, loss_plus=np.array(lps), loss_minus=np.array(lms),
              skipped_directions=len(zs) - n_valid, skipped_hessian_updates=skipped_h, g=g)
  return new_theta, H, info


def dense_hessian(H: dict, clip=(1e-8, 1e8)) -> dict:
  return {k: _dense(v, *clip) for k, v in H.items()}
