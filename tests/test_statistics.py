"""Statistical properties of the estimators with the default Gaussian sampler (float64).

Each check compares a Monte-Carlo mean over many keys with its expectation, with a
tolerance of 5 standard errors of that mean.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax.tree_utils as otu
import pytest

import hizoo_jax as hz

N = 100_000


def _quadratic(d=6, seed=0, diagonal=False):
  rng = np.random.default_rng(seed)
  if diagonal:
    A = np.diag(rng.uniform(0.5, 8.0, d))
  else:
    M = rng.standard_normal((d, d))
    A = M @ M.T / d + np.eye(d)
  b = rng.standard_normal(d)
  theta = rng.standard_normal(d)
  f = lambda x: 0.5 * x @ jnp.asarray(A) @ x + jnp.asarray(b) @ x
  return A, b, theta, f


def _keys(n=N, seed=0):
  return jax.random.split(jax.random.key(seed), n)


def _sample(fn):
  """``fn`` at each of the N keys, vmapped and compiled as one program (one compile in
  place of one per operation)."""
  return jax.jit(jax.vmap(fn))(_keys())


def _assert_mean(samples, expected, k=5.0):
  samples = np.asarray(samples)
  mean = samples.mean(0)
  se = samples.std(0, ddof=1) / np.sqrt(samples.shape[0])
  assert np.all(np.abs(mean - expected) <= k * se + 1e-12), (mean, expected, se)


SAMPLERS = pytest.mark.parametrize("sampler", [hz.fast_gaussian, hz.gaussian],
                                   ids=["fast_gaussian", "gaussian"])


@SAMPLERS
def test_zo_gradient_is_unbiased_for_sigma_grad(sampler):
  """E[g] = Sigma grad f = H^{-1} grad f on a quadratic (H fixed: alpha = 0)."""
  A, b, theta, f = _quadratic()
  H = np.random.default_rng(1).uniform(0.3, 3.0, theta.shape)
  tx = hz.scale_by_hizoo(mu=1e-3, hessian_smoothing=0.0, sampler=sampler)
  params = jnp.asarray(theta)
  state = otu.tree_set(tx.init(params), hessian=jnp.asarray(H))
  g = _sample(lambda k: tx.update(None, state, params, value_fn=f, key=k)[0])
  _assert_mean(g, (A @ theta + b) / H)


@SAMPLERS
def test_mezo_gradient_is_unbiased(sampler):
  A, b, theta, f = _quadratic(seed=3)
  tx = hz.scale_by_zo(mu=1e-3, sampler=sampler)
  params = jnp.asarray(theta)
  state = tx.init(params)
  g = _sample(lambda k: tx.update(None, state, params, value_fn=f, key=k)[0])
  _assert_mean(g, A @ theta + b)


def _one_step_estimator(estimator, theta, f, alpha, sampler=None):
  """``H -> samples``: the estimate ``est`` recovered from one EMA step from H at each of
  the N keys, est = H + (H_new - H) / alpha; H is an argument of the compiled program."""
  tx = hz.scale_by_hizoo(mu=1e-3, hessian_smoothing=alpha, estimator=estimator,
                         sampler=sampler)
  params = jnp.asarray(theta)

  def est(k, H):
    state = otu.tree_set(tx.init(params), hessian=H)
    _, new = tx.update(None, state, params, value_fn=f, key=k)
    return H + (hz.get_hessian(new) - H) / alpha

  program = jax.jit(jax.vmap(est, in_axes=(0, None)))
  return lambda H: program(_keys(), jnp.asarray(H))


@SAMPLERS
def test_unbiased_estimator_mean_is_the_true_diagonal(sampler):
  """E[c H (z^2 - 1)] = diag(A) on a diagonal quadratic, for any current H."""
  A, _, theta, f = _quadratic(diagonal=True)
  estimate = _one_step_estimator("unbiased", theta, f, alpha=1e-3, sampler=sampler)
  for H in (np.ones(6), np.random.default_rng(2).uniform(0.5, 4.0, 6)):
    _assert_mean(estimate(H), np.diag(A))


@SAMPLERS
def test_paper_estimator_mean_is_trace_plus_diagonal(sampler):
  """For H = I the paper estimator's mean is (tr A + 2 A_ii) / 2 (spec section 1)."""
  A, _, theta, f = _quadratic(diagonal=True)
  samples = _one_step_estimator("paper", theta, f, alpha=1e-3, sampler=sampler)(np.ones(6))
  _assert_mean(samples, (np.trace(A) + 2 * np.diag(A)) / 2)
