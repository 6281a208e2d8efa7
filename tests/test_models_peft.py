"""Fine-tuning modes (full, LoRA, prefix), the NNX patterns, and Orbax resume."""

from __future__ import annotations

import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.tree_utils as otu
import pytest
from flax import nnx

import hizoo_jax as hz
from hizoo_jax.models import PrefixParam, bert, checkpoint, heads, llama, peft
from hizoo_jax.models._layers import PrefixKV, attend

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
RNG = np.random.default_rng(0)


def tiny(kind: str):
  if kind == "bert":
    return bert.from_pretrained(os.path.join(DATA, "tiny_bert_mlm"))
  return llama.from_pretrained(os.path.join(DATA, "tiny_llama"))


def toy_batch(n=32, length=8, vocab=128, seed=0):
  """Random ids; the label says whether token 1 is in the upper half of the vocabulary."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, vocab, (n, length))
  ids[:, 0] = 1
  mask = np.ones((n, length), np.int32)
  labels = (ids[:, 1] >= vocab // 2).astype(np.int32)
  return jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(labels)


def paths(tree):
  return ["/".join(str(getattr(k, "key", k)) for k in p)
          for p, _ in jax.tree_util.tree_leaves_with_path(tree)]


@pytest.mark.parametrize("kind", ["bert", "llama"])
def test_lora_keeps_outputs_and_only_lora_params_train(kind):
  model = tiny(kind)
  ids, mask, _ = toy_batch(4, vocab=128)
  before = model(ids, mask)
  peft.apply_lora(model, rank=4, alpha=8, rngs=nnx.Rngs(0))
  np.testing.assert_array_equal(model(ids, mask), before)  # B = 0 at init
  graphdef, params, frozen = peft.split_trainable(model, "lora")
  names = paths(params)
  n_layers = model.config.num_hidden_layers
  assert len(names) == n_layers * 2 * 2  # (query, value) x (A, B) per layer
  assert all(n.endswith(("lora_a", "lora_b")) for n in names)
  assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(params))  # pure arrays
  # HiZOO perturbs and keeps a Hessian for exactly these leaves
  tx = hz.hizoo(1e-2, hessian_smoothing=0.1)
  state = tx.init(params)
  assert paths(hz.get_hessian(state)) == names
  # LoRA changes the output once B moves
  params = jax.tree.map(lambda x: x + 0.1, params)
  assert not np.allclose(peft.merge(graphdef, params, frozen)(ids, mask), before)
  with pytest.raises(ValueError, match="rank"):
    peft.apply_lora(tiny(kind), rank=0, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="no nnx.Linear"):
    peft.apply_lora(tiny(kind), targets=("nothing",), rngs=nnx.Rngs(0))


def test_lora_scale_is_alpha_over_rank():
  base = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
  lora = peft.LoRA(base, rank=2, alpha=6.0, rngs=nnx.Rngs(1))
  lora.lora_b[...] = jnp.ones((2, 2), jnp.float32)
  x = jnp.ones((1, 3), jnp.float32)
  expect = base(x) + 3.0 * (x @ lora.lora_a[...]) @ lora.lora_b[...]
  np.testing.assert_allclose(lora(x), expect, rtol=1e-6)
  assert isinstance(lora, nnx.LoRA)


def test_attend_with_prefix_is_attention_over_the_concatenation():
  q = jnp.asarray(RNG.standard_normal((2, 5, 4, 8)), jnp.float32)
  k = jnp.asarray(RNG.standard_normal((2, 5, 2, 8)), jnp.float32)
  v = jnp.asarray(RNG.standard_normal((2, 5, 2, 8)), jnp.float32)
  pk = jnp.asarray(RNG.standard_normal((3, 2, 8)), jnp.float32)
  pv = jnp.asarray(RNG.standard_normal((3, 2, 8)), jnp.float32)
  allowed = jnp.asarray(RNG.random((2, 1, 5, 5)) > 0.3) | jnp.eye(5, dtype=bool)
  bias = jnp.where(allowed, 0.0, -1e30).astype(jnp.float32)
  ours = attend(q, k, v, bias, PrefixKV(pk, pv))
  kk = jnp.concatenate([jnp.broadcast_to(pk, (2, 3, 2, 8)), k], axis=1)
  vv = jnp.concatenate([jnp.broadcast_to(pv, (2, 3, 2, 8)), v], axis=1)
  ref = attend(q, kk, vv, jnp.concatenate([jnp.zeros((2, 1, 5, 3)), bias], axis=-1))
  np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["bert", "llama"])
def test_prefix_tuning_init_from_real_activations(kind):
  model = tiny(kind)
  ids, mask, _ = toy_batch(4, vocab=128)
  before = model(ids, mask)
  peft.add_prefix(model, num_tokens=5, rngs=nnx.Rngs(3))
  # init="real": the keys/values the layers compute for 5 random tokens (MeZO)
  tokens = jax.random.randint(nnx.Rngs(3).params(), (1, 5), 0, model.config.vocab_size)
  kvs = tiny(kind).layer_key_values(tokens)
  for attn, (k, v) in zip(model.attention_layers(), kvs, strict=True):
    kv_heads = getattr(attn, "num_kv_heads", attn.num_heads)
    assert attn.prefix.key.shape == (5, kv_heads, attn.head_dim)
    np.testing.assert_allclose(attn.prefix.key[...], k[0], rtol=1e-6)
    np.testing.assert_allclose(attn.prefix.value[...], v[0], rtol=1e-6)
  assert not np.allclose(model(ids, mask), before)  # every token now attends to the prefix
  graphdef, params, frozen = peft.split_trainable(model, "prefix")
  names = paths(params)
  assert len(names) == 2 * model.config.num_hidden_layers
  assert all(n.endswith(("prefix/key", "prefix/value")) for n in names)
  assert jax.tree.leaves(nnx.state(model, PrefixParam))
  random = peft.add_prefix(tiny(kind), num_tokens=2, init="random", rngs=nnx.Rngs(0))
  assert random.attention_layers()[0].prefix.num_tokens == 2
  with pytest.raises(ValueError, match="init"):
    peft.add_prefix(tiny(kind), init="zeros", rngs=nnx.Rngs(0))


def test_split_trainable_modes_and_errors():
  clf = heads.SequenceClassifier(tiny("bert"), 32, 2)
  _, ft, _ = peft.split_trainable(clf, "ft")
  assert len(jax.tree.leaves(ft)) == len(jax.tree.leaves(nnx.state(clf, nnx.Param)))
  with pytest.raises(ValueError, match="no params matching"):
    peft.split_trainable(tiny("bert"), "lora")
  with pytest.raises(ValueError, match="mode must be one of"):
    peft.trainable_filter("bitfit")
  # the classification head trains in every mode
  peft.apply_lora(clf.backbone, rngs=nnx.Rngs(0))
  _, lora, _ = peft.split_trainable(clf, "lora")
  assert {"kernel", "bias"} <= {n.split("/")[-1] for n in paths(lora)}


@pytest.mark.parametrize("kind", ["bert", "llama"])
def test_trainable_filter_layers_keeps_those_layers_and_the_head(kind):
  model = tiny(kind)
  n_layers = model.config.num_hidden_layers
  assert n_layers >= 2
  clf = heads.SequenceClassifier(model, model.config.hidden_size, 2)
  _, sub, rest = peft.split_trainable(clf, peft.trainable_filter("ft", layers=[n_layers - 1]))
  names = paths(sub)
  layer_leaves = [n for n in names if n.startswith("backbone/layers/")]
  assert layer_leaves and all(n.startswith(f"backbone/layers/{n_layers - 1}/")
                              for n in layer_leaves)
  assert {"kernel", "bias"} == {n for n in names if "/" not in n}  # the head
  # everything else, the embeddings and the other layers included, is frozen
  _, full, _ = peft.split_trainable(clf, "ft")
  assert len(names) + len(jax.tree.leaves(rest)) == len(jax.tree.leaves(full))
  assert not any(n.startswith(("backbone/layers/0/", "backbone/embed")) for n in names)
  # LoRA: only the adapters of the kept layers
  peft.apply_lora(clf.backbone, rank=2, alpha=4, rngs=nnx.Rngs(0))
  _, lora, _ = peft.split_trainable(clf, peft.trainable_filter("lora", layers=range(1)))
  lora_names = [n for n in paths(lora) if "/" in n]
  assert len(lora_names) == 4 and all(n.startswith("backbone/layers/0/") for n in lora_names)
  # head=False: the head (e.g. a fitted linear probe) stays frozen too
  _, nohead, _ = peft.split_trainable(clf, peft.trainable_filter("lora", layers=[0],
                                                                 head=False))
  assert sorted(paths(nohead)) == sorted(lora_names)
  _, nohead, _ = peft.split_trainable(clf, peft.trainable_filter("ft", head=False))
  _, full, _ = peft.split_trainable(clf, "ft")  # LoRA's A and B are nnx.Params too
  assert len(jax.tree.leaves(nohead)) == len(jax.tree.leaves(full)) - 2
  with pytest.raises(ValueError, match="layer indices"):
    peft.trainable_filter("ft", layers=[])
  with pytest.raises(ValueError, match="no params matching"):  # no such layer, no head
    peft.split_trainable(tiny(kind), peft.trainable_filter("ft", layers=[n_layers + 5]))


def _train(tx, loss_fn, params, frozen, batch, steps):
  step = hz.make_train_step(tx, loss_fn)
  state = tx.init(params)
  losses = []
  for _ in range(steps):
    params, state, loss = step(params, state, frozen, *batch)
    losses.append(float(loss))
  return params, state, losses


@pytest.mark.parametrize("mode", ["ft", "lora", "prefix"])
def test_zeroth_order_fine_tuning_reduces_the_loss(mode):
  model = tiny("llama")
  if mode == "lora":
    peft.apply_lora(model, rank=4, alpha=8, rngs=nnx.Rngs(0))
  if mode == "prefix":
    peft.add_prefix(model, num_tokens=3, rngs=nnx.Rngs(0))
  clf = heads.LabelWordClassifier(model, [10, 20], position="last")
  graphdef, params, frozen = peft.split_trainable(clf, mode)
  frozen_before = jax.tree.map(jnp.copy, frozen)
  loss_fn = peft.make_loss_fn(graphdef, lambda m, i, am, y: heads.cross_entropy(m(i, am), y))
  batch = toy_batch(32, vocab=320)
  lr = {"ft": 2e-3, "lora": 2e-2, "prefix": 5e-2}[mode]
  tx = hz.hizoo(lr, mu=1e-2, hessian_smoothing=1e-3, seed=0)
  params, _, losses = _train(tx, loss_fn, params, frozen, batch, 60)
  assert np.mean(losses[-10:]) < np.mean(losses[:10]) - 0.01, (losses[:10], losses[-10:])
  chex.assert_trees_all_equal(frozen, frozen_before)


def test_training_on_negative_accuracy_uses_the_accuracy():
  """A non-differentiable objective: the loss HiZOO measures (l0) is -accuracy.

  The head comes from its own generator, not the module's shared one: -accuracy is
  piecewise constant, and from some heads (e.g. the first draw of default_rng(0)) no
  perturbation of size mu flips a prediction, so no estimate moves the params and the
  outcome would depend on how many draws earlier tests took. From this head both seeds 1
  and 2 raise the accuracy from 0.47 to 0.66-0.72 within 30 steps (measured)."""
  clf = heads.SequenceClassifier(tiny("bert"), 32, 2)
  clf.kernel[...] = jnp.asarray(np.random.default_rng(1).standard_normal((32, 2)), jnp.float32)
  graphdef, params, frozen = peft.split_trainable(clf, nnx.Any(heads.HeadParam))
  loss_fn = peft.make_loss_fn(graphdef, lambda m, i, am, y: heads.neg_accuracy(m(i, am), y))
  ids, mask, labels = toy_batch(32)
  tx = hz.hizoo(0.5, mu=0.5, hessian_smoothing=0.1, seed=1)
  state = tx.init(params)
  step = hz.make_train_step(tx, loss_fn, donate=False)
  seen = []
  for _ in range(30):
    acc = heads.accuracy(peft.merge(graphdef, params, frozen)(ids, mask), labels)
    params, state, loss = step(params, state, frozen, ids, mask, labels)
    assert float(loss) == -float(acc)  # l0: the objective at the params before the step
    seen.append(float(acc))
  assert max(seen) > seen[0]  # the estimate moves params where accuracy improves


def test_nnx_optimizer_with_nnx_value_fn_matches_the_functional_path():
  """Five HiZOO steps through ``nnx.Optimizer`` and through ``make_train_step``, in float64.

  The two paths trace the same arithmetic through different code, so XLA may fuse and order
  the reductions differently; a zeroth-order step then amplifies that rounding: a loss
  error dl becomes dl / mu in the projected gradient and 2 dl / mu^2 in the curvature
  c = (l+ + l- - 2 l0) / (2 mu^2). In float32 (u = 2^-24) that is ~1e-6 after 5 steps and
  machine-dependent, so the trajectory is compared in float64 (u = 2^-53 ~ 1.1e-16): with
  dl <= n u |l|, n ~ 1e3 (the chained reduction lengths: 2 layers of 32/64-wide matmuls,
  16-token attention, a 16-row mean) and |l| ~ 0.7, dl ~ 1e-13. Per step
  dtheta <= lr * (dl / mu) * max|z| / min sqrt(H) ~ 5e-2 * 1e-11 * 6 ~ 3e-12 and
  dH <= alpha * (2 dl / mu^2) * max H * max z^2 ~ 1e-2 * 2e-9 * 2 * 36 ~ 1.6e-9; over 5
  steps atol 1e-10 (params) and 1e-8 (H). A wrong path moves params by ~lr = 5e-2.
  """
  f64 = jnp.float64

  def build():
    model = bert.from_pretrained(os.path.join(DATA, "tiny_bert_mlm"), param_dtype=f64)
    peft.apply_lora(model, rank=4, alpha=8, rngs=nnx.Rngs(0))
    return heads.SequenceClassifier(model, 32, 2, param_dtype=f64)

  ids, mask, labels = toy_batch(16)
  loss = lambda m: heads.cross_entropy(m(ids, mask), labels)  # noqa: E731
  wrt = peft.trainable_filter("lora")
  clf = build()
  assert {x.dtype for x in jax.tree.leaves(nnx.state(clf))} == {jnp.dtype(f64)}  # x64 is on
  tx = hz.hizoo(5e-2, mu=1e-2, hessian_smoothing=1e-2, seed=4)
  optimizer = nnx.Optimizer(clf, tx, wrt=wrt)

  @nnx.jit
  def train_step(clf, optimizer):
    value_fn = peft.nnx_value_fn(clf, wrt, loss)
    optimizer.update(clf, nnx.state(clf, wrt), value_fn=value_fn)

  for _ in range(5):
    train_step(clf, optimizer)
  # the functional path from the same init and seed
  graphdef, params, frozen = peft.split_trainable(build(), "lora")
  loss_fn = peft.make_loss_fn(graphdef, lambda m: loss(m))
  params0 = jax.tree.map(jnp.copy, params)  # make_train_step donates params
  params, state, _ = _train(tx, loss_fn, params, frozen, (), 5)
  assert max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(
      jax.tree.leaves(params), jax.tree.leaves(params0), strict=True)) > 1e-3  # it trained
  chex.assert_trees_all_close(nnx.as_pure(nnx.state(clf, wrt)), params, rtol=0, atol=1e-10)
  h_opt = hz.get_hessian(nnx.as_pure(optimizer.opt_state))
  chex.assert_trees_all_close(h_opt, hz.get_hessian(state), rtol=0, atol=1e-8)
  assert paths(h_opt) == paths(params)


@pytest.mark.parametrize("name", ["hizoo_l", "zo_adam"])
def test_orbax_resume_is_bit_for_bit(tmp_path, name):
  """Save at step 3 of 7, restore into fresh objects, continue: the same bits as the
  uninterrupted run (params, factored + dense Hessian, PRNG key, step count, Adam moments).
  Plain HiZOO is resumed in a new process in ``examples/tests/test_finetune.py``."""
  model = tiny("llama")
  peft.apply_lora(model, rank=4, alpha=8, rngs=nnx.Rngs(0))
  clf = heads.SequenceClassifier(model, 64, 2, pooling="last")
  graphdef, params0, frozen = peft.split_trainable(clf, "lora")
  loss_fn = peft.make_loss_fn(graphdef, lambda m, i, am, y: heads.cross_entropy(m(i, am), y))
  tx = {"hizoo_l": hz.hizoo_l(2e-2, mu=1e-2, hessian_smoothing=1e-2, min_dim_size_to_factor=4,
                              seed=3),
        "zo_adam": optax.chain(hz.scale_by_zo(mu=1e-2, seed=3), optax.adam(1e-3))}[name]
  step = hz.make_train_step(tx, loss_fn)
  batches = [toy_batch(8, vocab=320, seed=s) for s in range(7)]
  fresh = lambda: (jax.tree.map(jnp.copy, params0), tx.init(params0))  # noqa: E731

  params, state = fresh()
  for k in range(7):
    params, state, _ = step(params, state, frozen, *batches[k])
  full = {"params": params, "opt_state": state}

  params, state = fresh()
  for k in range(3):
    params, state, _ = step(params, state, frozen, *batches[k])
  with checkpoint.Checkpointer(tmp_path / "ckpt") as ckpt:
    ckpt.save(3, {"params": params, "opt_state": state})
  del params, state
  with checkpoint.Checkpointer(tmp_path / "ckpt") as ckpt:
    assert ckpt.latest_step() == 3 and ckpt.all_steps() == [3]
    template_params, template_state = fresh()
    restored = ckpt.restore({"params": template_params, "opt_state": template_state})
  params, state = restored["params"], restored["opt_state"]
  assert all(int(c) == 3 for _, c in otu.tree_get_all_with_path(state, "count"))
  for k in range(3, 7):
    params, state, _ = step(params, state, frozen, *batches[k])
  resumed = {"params": params, "opt_state": state}
  assert jax.tree.structure(resumed) == jax.tree.structure(full)
  jax.tree.map(np.testing.assert_array_equal, resumed, full)
  # and a run that skips the restore differs (the test can fail)
  other, _ = fresh()
  assert not np.array_equal(jax.tree.leaves(other)[1], jax.tree.leaves(full["params"])[1])


def test_checkpointer_without_checkpoints_says_so(tmp_path):
  with checkpoint.Checkpointer(tmp_path / "none") as ckpt:
    assert ckpt.latest_step() is None
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
      ckpt.restore({"x": jnp.zeros(2)})
