"""The samplers and the key schedule."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hizoo_jax as hz
from hizoo_jax._src import sampling


def _byte_sum_pmf():
  """Exact distribution of the sum of 4 independent uniform bytes (0..1020)."""
  pmf = np.ones(256) / 256
  out = pmf
  for _ in range(3):
    out = np.convolve(out, pmf)
  return out


def test_fast_gaussian_moments_are_exactly_gaussian_through_the_fourth():
  """Computed exactly over the 1021-point distribution, not by sampling."""
  pmf = _byte_sum_pmf()
  s = (np.arange(1021) - 510.0) * sampling._FAST_SCALE / 256.0
  z = sampling._FAST_A * s + sampling._FAST_B * s**3
  moment = lambda k: float(np.sum(pmf * z**k))
  assert moment(1) == pytest.approx(0.0, abs=1e-15)
  assert moment(3) == pytest.approx(0.0, abs=1e-14)
  assert moment(2) == pytest.approx(1.0, abs=1e-12)
  assert moment(4) == pytest.approx(3.0, abs=1e-11)
  assert 14.0 < moment(6) < 15.0  # a normal has 15
  assert np.max(np.abs(z)) < 4.1
  # the float32 values the generator actually produces, all 1021 of them
  m = (np.arange(1021) - 510).astype(np.float32)
  poly = np.float32(sampling._FAST_POLY_A)
  for piece in sampling._FAST_POLY_B:
    poly = poly + np.float32(piece) * (m * m)
  z32 = (m * poly).astype(np.float64)
  np.testing.assert_allclose(z32, z, rtol=1e-6, atol=1e-7)
  assert float(np.sum(pmf * z32**2)) == pytest.approx(1.0, abs=2e-6)
  assert float(np.sum(pmf * z32**4)) == pytest.approx(3.0, abs=1e-5)


def test_fast_gaussian_matches_its_own_pmf_and_float_math():
  """The jitted generator computes the same values as the NumPy formula of its hash."""
  key = jax.random.key(7)
  z = np.asarray(sampling.fast_gaussian(key, (3, 5)), np.float64)
  words = np.asarray(jax.random.key_data(key)).reshape(-1).astype(np.uint64)
  idx = np.arange(15, dtype=np.uint64)
  x = ((idx * 0x9E3779B9 + words[0]) & 0xFFFFFFFF) ^ words[-1]
  x ^= x >> 16
  x = (x * 0x7FEB352D) & 0xFFFFFFFF
  x ^= x >> 15
  x = (x * 0x846CA68B) & 0xFFFFFFFF
  x ^= x >> 16
  b = (x & 0xFF) + ((x >> 8) & 0xFF) + ((x >> 16) & 0xFF) + (x >> 24)
  s = (b.astype(np.float64) - 510) * sampling._FAST_SCALE / 256
  np.testing.assert_allclose(z.ravel(), sampling._FAST_A * s + sampling._FAST_B * s**3,
                             rtol=1e-6, atol=1e-6)
  # and bit for bit the float32 evaluation the module documents (no FMA can change it)
  m = (b.astype(np.int64) - 510).astype(np.float32)
  poly = np.float32(sampling._FAST_POLY_A)
  for piece in sampling._FAST_POLY_B:
    prod = np.float32(piece) * (m * m)
    assert np.all(prod.astype(np.float64) == piece * (m.astype(np.float64) ** 2))  # exact
    poly = poly + prod
  np.testing.assert_array_equal(np.asarray(sampling.fast_gaussian(key, (3, 5))).ravel(),
                                m * poly)


def test_fast_gaussian_is_the_same_bits_in_every_program():
  """Eager, jitted, fused into an update and sharded programs draw identical noise."""
  key = jax.random.key(3)
  eager = np.asarray(hz.fast_gaussian(key, (256, 256)))
  jitted = np.asarray(jax.jit(lambda: hz.fast_gaussian(key, (256, 256)))())
  fused = np.asarray(jax.jit(lambda w: w * 0.5 + 1e-3 * hz.fast_gaussian(key, w.shape))(
      jnp.zeros((256, 256))))
  np.testing.assert_array_equal(eager, jitted)
  np.testing.assert_array_equal(np.float32(1e-3) * eager, fused)


@pytest.mark.parametrize("sampler", [hz.fast_gaussian, hz.gaussian])
def test_noise_statistics(sampler):
  """Mean 0, variance 1, kurtosis 3; no correlation across neighbours, leaves, keys."""
  n = 1 << 22
  z = np.asarray(sampler(jax.random.key(0), (n,), jnp.float32), np.float64)
  se = 1 / np.sqrt(n)
  assert abs(z.mean()) < 5 * se
  assert abs(z.var() - 1) < 5 * np.sqrt(2) * se
  assert abs((z**4).mean() / z.var() ** 2 - 3) < 5 * np.sqrt(96) * se
  for lag in (1, 2, 7, 4096):
    assert abs(np.corrcoef(z[:-lag], z[lag:])[0, 1]) < 5 * se
  z2 = np.asarray(sampler(jax.random.key(1), (n,), jnp.float32), np.float64)
  assert abs(np.corrcoef(z, z2)[0, 1]) < 5 * se
  assert abs(np.corrcoef(z**2, z2**2)[0, 1]) < 5 * se  # independence, not just decorrelation


def test_fast_gaussian_index_layout_and_dtypes():
  key = jax.random.key(3)
  flat = sampling.fast_gaussian(key, (24,))
  np.testing.assert_array_equal(sampling.fast_gaussian(key, (2, 3, 4)).ravel(), flat)
  assert sampling.fast_gaussian(key, (4,), jnp.bfloat16).dtype == jnp.bfloat16
  assert sampling.fast_gaussian(jax.random.key(3, impl="rbg"), (4,)).shape == (4,)
  with pytest.raises(ValueError, match="2\\*\\*32"):
    jax.eval_shape(lambda: sampling.fast_gaussian(key, (1 << 16, 1 << 16)))


def test_key_schedule_is_stable():
  """direction_noise follows the documented schedule (split, fold_in, per-leaf key words)."""
  params = {"a": jnp.zeros((3,)), "b": jnp.zeros((2, 2))}
  noise_key, _ = sampling.split_state_key(jax.random.key(5))
  got = sampling.direction_noise(noise_key, 2, params, hz.fast_gaussian)
  data = np.asarray(jax.random.key_data(jax.random.fold_in(noise_key, 2)))

  def mix32(x):  # the documented finalizer, in NumPy uint32 arithmetic
    x = np.uint32(x)
    x ^= x >> np.uint32(16)
    x = np.uint32((int(x) * 0x7FEB352D) % 2**32)
    x ^= x >> np.uint32(15)
    x = np.uint32((int(x) * 0x846CA68B) % 2**32)
    return x ^ (x >> np.uint32(16))

  for i, name in enumerate(["a", "b"]):  # jax.tree.leaves order
    words = data.copy()
    words[-1] = mix32(words[-1] ^ mix32((i * 0x9E3779B9 + 1) % 2**32))
    key = jax.random.wrap_key_data(jnp.asarray(words, jnp.uint32))
    np.testing.assert_array_equal(got[name], hz.fast_gaussian(key, params[name].shape))
  # leaves of one direction are distinct streams
  assert not np.allclose(got["a"], np.asarray(got["b"]).ravel()[:3])


def test_samplers_are_objects_and_functions_are_wrapped():
  assert isinstance(hz.fast_gaussian, hz.Sampler) and hz.fast_gaussian.has_rows
  assert hz.gaussian.is_gaussian and not hz.gaussian.has_rows
  assert not hz.rademacher.is_gaussian
  fn = lambda key, shape, dtype: jax.random.normal(key, shape, dtype)
  wrapped = sampling.as_sampler(fn)
  assert wrapped.is_gaussian and wrapped.sample is not None
  assert not sampling.as_sampler(jax.random.rademacher).is_gaussian
  with pytest.raises(ValueError, match="Gaussian"):
    hz.hizoo(1e-3, sampler=jax.random.rademacher)
  with pytest.raises(TypeError, match="callable"):
    hz.mezo(1e-3, sampler=3)


def test_an_integer_sampler_is_refused_not_silently_zero():
  ints = lambda key, shape, dtype: jnp.zeros(shape, jnp.int32)
  tx = hz.mezo(1e-3, sampler=ints)
  params = {"w": jnp.ones(3)}
  with pytest.raises(TypeError, match="floating-point noise"):
    tx.update(None, tx.init(params), params, value_fn=lambda p: jnp.sum(p["w"]))


def test_default_sampler_is_fast_gaussian_and_accepted_by_hizoo():
  assert sampling.DEFAULT_SAMPLER is hz.fast_gaussian
  assert hz.fast_gaussian.is_gaussian and not hz.rademacher.is_gaussian
  hz.hizoo(1e-3, sampler=hz.fast_gaussian)
