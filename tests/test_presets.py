"""Named settings: the paper's, and the recommended ones with alpha = 0.5 / d."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.tree_utils as otu
import pytest

import hizoo_jax as hz


def _problem(shapes=((3, 4), (5,))):
  rng = np.random.default_rng(0)
  params = {f"w{i}": jnp.asarray(rng.standard_normal(s)) for i, s in enumerate(shapes)}
  f = lambda p: sum(jnp.sum(jnp.sin(x) ** 2 + 0.1 * x**2) for x in jax.tree.leaves(p))
  return params, f


def test_smoothing_rule():
  assert hz.presets.smoothing(2) == 0.25
  assert hz.presets.smoothing(26_122) == pytest.approx(0.5 / 26_122)
  assert hz.presets.smoothing(1) == hz.presets.MAX_SMOOTHING  # capped
  params, _ = _problem()
  assert hz.presets.num_params(params) == 17
  assert hz.presets.smoothing(params) == pytest.approx(0.5 / 17)
  assert hz.presets.smoothing(100, per_param=2.0) == pytest.approx(0.02)
  with pytest.raises(ValueError, match="no scalars"):
    hz.presets.smoothing({})
  with pytest.raises(ValueError, match="per_param"):
    hz.presets.smoothing(10, per_param=0.0)


def test_recommended_and_paper_settings():
  params, _ = _problem()
  rec = hz.presets.recommended(params)
  assert rec == dict(mu=1e-2, hessian_smoothing=pytest.approx(0.5 / 17), estimator="paper",
                     hessian_clip=(1e-8, 1e8))
  assert dict(hz.presets.PAPER) == dict(mu=1e-3, hessian_smoothing=1e-8, estimator="paper",
                                        hessian_clip=(1e-8, 1e8))
  assert hz.presets.REFERENCE_FT["hessian_smoothing"] == 1e-6
  assert hz.presets.REFERENCE_LORA["hessian_smoothing"] == 1e-10
  with pytest.raises(TypeError):
    hz.presets.PAPER["mu"] = 1.0  # read-only
  for settings in (rec, hz.presets.PAPER, hz.presets.REFERENCE_FT, hz.presets.REFERENCE_LORA):
    tx = hz.hizoo(1e-2, **settings)
    tx.update(None, tx.init(params), params, value_fn=_problem()[1])


def _run(tx, params, f, steps=3):
  @jax.jit
  def go(params):
    state = tx.init(params)
    for _ in range(steps):
      u, state = tx.update(None, state, params, value_fn=f)
      params = optax.apply_updates(params, u)
    return params, state

  return go(params)


def test_auto_hizoo_equals_hizoo_with_the_rule():
  params, f = _problem()
  p1, s1 = _run(hz.presets.hizoo(1e-2, seed=3), params, f)
  p2, s2 = _run(hz.hizoo(1e-2, seed=3, **hz.presets.recommended(params)), params, f)
  chex.assert_trees_all_close(p1, p2)
  chex.assert_trees_all_close(hz.get_hessian(s1), hz.get_hessian(s2))
  # keywords override the recommendation
  p3, _ = _run(hz.presets.hizoo(1e-2, seed=3, hessian_smoothing=0.3, mu=1e-3), params, f)
  p4, _ = _run(hz.hizoo(1e-2, seed=3, hessian_smoothing=0.3, mu=1e-3, estimator="paper"),
               params, f)
  chex.assert_trees_all_close(p3, p4)


def test_auto_hizoo_l_factors_and_matches():
  params, f = _problem(((128, 128), (7,)))
  tx = hz.presets.hizoo_l(1e-3, seed=1)
  state = tx.init(params)
  assert isinstance(otu.tree_get(state, "hessian")["w0"], hz.FactoredHessian)
  p1, s1 = _run(tx, params, f, steps=2)
  p2, s2 = _run(hz.hizoo_l(1e-3, seed=1, **hz.presets.recommended(params)), params, f, steps=2)
  chex.assert_trees_all_close(p1, p2)
  chex.assert_trees_all_close(hz.get_hessian(s1), hz.get_hessian(s2))


def test_auto_hizoo_composes():
  params, f = _problem()
  tx = optax.chain(hz.presets.hizoo(optax.linear_schedule(1e-2, 0.0, 10)),
                   optax.clip_by_global_norm(1.0))
  state = tx.init(params)
  u, state = tx.update(None, state, params, value_fn=f)
  assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(u))
  step = hz.make_train_step(hz.presets.hizoo(1e-2), lambda p, s: f(p) * s)
  _, _, loss = step(params, hz.presets.hizoo(1e-2).init(params), 1.0)
  assert np.isfinite(float(loss))
  with pytest.raises(ValueError, match="params"):
    hz.presets.hizoo(1e-2).update(None, state[0], None, value_fn=f)


def test_decay_to_floor_is_cosine_to_a_fraction_of_the_peak():
  s = hz.presets.decay_to_floor(1e-2, 100)
  assert float(s(0)) == pytest.approx(1e-2)
  assert float(s(50)) == pytest.approx(1e-2 * (0.3 + 0.7 * 0.5))  # half way down the cosine
  assert float(s(100)) == pytest.approx(3e-3) and float(s(500)) == pytest.approx(3e-3)
  assert float(hz.presets.decay_to_floor(1.0, 10, floor=0.0)(10)) == 0.0
  with pytest.raises(ValueError, match="floor"):
    hz.presets.decay_to_floor(1e-2, 100, floor=1.5)
  with pytest.raises(ValueError, match="total_steps"):
    hz.presets.decay_to_floor(1e-2, 0)


@pytest.mark.parametrize("name", ["mezo", "fzoo"])
def test_measured_presets_are_the_method_with_the_decay(name):
  """``hz.presets.mezo``/``fzoo`` = the alias with ``decay_to_floor`` (and FZOO's 8
  probes), step for step, in the plain path and the lean engine."""
  params, f = _problem()
  preset = getattr(hz.presets, name)(1e-2, 20, seed=4, mu=1e-3)
  extra = {"num_directions": 8} if name == "fzoo" else {}
  spelled = getattr(hz, name)(hz.presets.decay_to_floor(1e-2, 20), seed=4, mu=1e-3, **extra)
  p1, s1 = _run(preset, params, f, steps=4)
  p2, s2 = _run(spelled, params, f, steps=4)
  chex.assert_trees_all_equal(p1, p2)
  assert int(otu.tree_get(s1, "forward_passes")) == 4 * (9 if name == "fzoo" else 2)
  step = hz.make_train_step(preset, lambda p, s: f(p) * s)
  _, _, loss = step(params, preset.init(params), 1.0)
  assert np.isfinite(float(loss))


def test_measured_settings_are_the_package_data():
  """``MEASURED`` is ``measured.json`` (shipped as package data), read-only, and
  ``measured`` builds the alias at it, any keyword overriding."""
  import json
  from importlib import resources

  text = resources.files("hizoo_jax").joinpath("measured.json").read_text(encoding="utf-8")
  data = json.loads(text)
  assert {t: dict(m) for t, m in hz.presets.MEASURED.items()} == {
      t: entry["methods"] for t, entry in data["tasks"].items()}
  assert all(entry["what"] for entry in data["tasks"].values())  # each task says what it is
  with pytest.raises(TypeError):
    hz.presets.MEASURED["digits"]["mezo"]["learning_rate"] = 1.0
  params, f = _problem()
  got = _run(hz.presets.measured("mezo", "digits", seed=3), params, f, steps=3)[0]
  want = _run(hz.mezo(1e-3, mu=1e-3, seed=3), params, f, steps=3)[0]
  chex.assert_trees_all_equal(got, want)
  with pytest.raises(ValueError, match="measured tasks"):
    hz.presets.measured("mezo", "imagenet")
  with pytest.raises(ValueError, match="measured there"):
    hz.presets.measured("sparse_mezo", "digits")
