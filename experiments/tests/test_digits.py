"""The digits task: data, model, training loop and step timing (small budgets)."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest

pytest.importorskip("sklearn")
pytest.importorskip("flax")

import hizoo_jax as hz  # noqa: E402
from experiments import digits as D  # noqa: E402


@pytest.fixture(scope="module")
def data():
  return D.load_data()


def test_data_split(data):
  assert data.x_train.shape == (1437, 64) and data.x_test.shape == (360, 64)
  assert data.x_train.dtype == np.float32 and data.y_train.dtype == np.int32
  assert float(data.x_train.min()) == 0.0 and float(data.x_train.max()) == 1.0
  # stratified: every class in both parts, in about the same proportion
  tr = np.bincount(np.asarray(data.y_train), minlength=10) / 1437
  te = np.bincount(np.asarray(data.y_test), minlength=10) / 360
  np.testing.assert_allclose(tr, te, atol=0.01)


def test_model_and_loss(data):
  graphdef, params = D.init_model(0)
  assert D.num_params(params) == 64 * 128 + 128 + 128 * 128 + 128 + 128 * 10 + 10 == 26_122
  shapes = sorted(x.shape for x in jax.tree.leaves(params))
  assert (128, 128) in shapes  # the leaf HiZOO-L factors
  loss = float(D.make_loss(graphdef)(params, data.x_train, data.y_train))
  assert loss == pytest.approx(np.log(10), abs=0.1)
  acc = float(D.make_accuracy(graphdef)(params, data.x_test, data.y_test))
  assert 0.0 <= acc <= 1.0


def test_batches_are_epochs_without_replacement():
  idx = D.batches(100, 32, 7, seed=0)
  assert idx.shape == (7, 32)
  first_epoch = idx[:3].ravel()  # 3 full batches per epoch (4 rows dropped)
  assert len(np.unique(first_epoch)) == 96
  np.testing.assert_array_equal(idx, D.batches(100, 32, 7, seed=0))


def test_train_zeroth_and_first_order(data):
  seen = []
  h = D.train(hz.presets.hizoo(5e-3), data, steps=60, eval_every=20,
              monitor=lambda s: float(np.mean(jax.device_get(hz.get_hessian(s))["layers"][0]
                                              ["bias"])),
              progress=seen.append)
  np.testing.assert_array_equal(h.steps, [0, 20, 40, 60])
  assert seen == [20, 40, 60]
  assert len(h.monitored) == 4 and h.monitored[-1] > h.monitored[0] == 1.0  # H grew from 1
  assert h.train_loss[-1] < h.train_loss[0] and not h.diverged
  assert h.seconds > 0
  adam = D.train(optax.adam(3e-3), data, steps=50, eval_every=50, first_order=True)
  assert adam.train_loss[-1] < 1.0 and adam.test_accuracy[-1] > 0.7


def test_train_stops_on_divergence(data):
  h = D.train(hz.mezo(100.0), data, steps=40, eval_every=10, monitor=lambda s: 0)
  assert h.diverged
  assert np.isnan(h.train_loss[-1]) and np.isfinite(h.train_loss[0])
  assert len(h.monitored) == len(h.steps) and h.monitored[-1] is None


def test_time_steps_reports_ratios(data):
  graphdef, params = D.init_model(0)
  loss = D.make_loss(graphdef)
  tx = hz.mezo(1e-3)
  out = D.time_steps({"mezo": (hz.make_train_step(tx, loss), tx.init(params))}, loss, params,
                     (data.x_train[:64], data.y_train[:64]), repeats=2, inner=2)
  assert set(out) == {"forward_seconds", "mezo"}
  assert out["forward_seconds"] > 0 and out["mezo"] > 0


def test_runs_sharing_a_transformation_share_its_step(data):
  tx = hz.mezo(1e-3)
  hits = D._compiled_step.cache_info().hits
  h0 = D.train(tx, data, steps=10, eval_every=10, seed=0)
  h1 = D.train(tx, data, steps=10, eval_every=10, seed=1)
  assert D._compiled_step.cache_info().hits == hits + 1
  assert h0.train_loss[-1] != h1.train_loss[-1]  # the seed still decides the run
  again = D.train(tx, data, steps=10, eval_every=10, seed=0)  # the cached step keeps no state
  np.testing.assert_array_equal(h0.train_loss, again.train_loss)
