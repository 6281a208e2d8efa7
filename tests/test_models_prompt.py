"""Prompted classification (models.prompt): templates, label words, padding, the loss, and
the shared-prefix forward pass against the plain one."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hizoo_jax.models import data, heads, llama, peft, prompt

CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\\nYou are helpful.<|im_end|>\\n' }}{% endif %}"
          "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
          "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
          "{% endif %}")
INSTRUCTION = "Is this review positive or negative? Review: {sentence}"
SENTENCES = ["a charming and funny film", "it 's a bore ", "dull , dull , dull",
             "one of the best movies of the year , full of heart and wit"]


def bpe_tokenizer():
  """A small byte-level BPE (GPT-2 style pre-tokenizer) with ChatML special tokens."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|im_start|>", "<|im_end|>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  corpus = SENTENCES * 5 + [INSTRUCTION, "positive negative great terrible It was"] * 5
  tok.train_from_iterator(corpus, trainer)
  return tok


def test_chat_template_renders_one_user_turn_and_the_generation_prompt():
  tpl = prompt.chat(CHATML, INSTRUCTION, ("negative", "positive"), name="chat")
  assert tpl.text == ("<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n"
                      "Is this review positive or negative? Review: {sentence}<|im_end|>\n"
                      "<|im_start|>assistant\n")
  assert tpl.head.endswith("Review:") and tpl.tail == "<|im_end|>\n<|im_start|>assistant\n"
  assert tpl.render(" great fun ") == tpl.text.replace("{sentence}", "great fun")
  with_system = prompt.chat(CHATML, INSTRUCTION, ("n", "p"), system="Be brief.")
  assert with_system.text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n")


@pytest.mark.parametrize("text, words, message", [
    ("no slot", ("a", "b"), "exactly once"),
    ("{sentence} {sentence}", ("a", "b"), "exactly once"),
    ("{sentence} It was", ("a",), "two or more distinct"),
    ("{sentence} It was", ("a", "a"), "two or more distinct"),
])
def test_template_rejects_bad_input(text, words, message):
  with pytest.raises(ValueError, match=message):
    prompt.Template(text, words)


def test_label_words_must_be_single_tokens():
  tokenize = data.hf_tokenize(bpe_tokenizer())
  tpl = prompt.Template("{sentence} It was", (" great", " terrible"))
  ids = tpl.label_ids(tokenize)
  assert [tokenize(w) for w in tpl.label_words] == [[i] for i in ids]
  with pytest.raises(ValueError, match="'xyzzyq' is [0-9]+ tokens"):
    prompt.Template("{sentence} It was", (" great", "xyzzyq")).label_ids(tokenize)
  with pytest.raises(ValueError, match="same token ids"):
    prompt.Template("{sentence}", ("a", "b")).label_ids(lambda w: [7])


def test_encode_splits_like_the_full_text_and_pads_on_the_right():
  """Prefix + row is the tokenization of the whole rendered prompt; rows are right-padded to
  the longest (rounded up), and truncation cuts the sentence, never the tail."""
  tokenize = data.hf_tokenize(bpe_tokenizer())
  tpl = prompt.chat(CHATML, INSTRUCTION, ("negative", "positive"))
  prefix = tpl.prefix_ids(tokenize)
  ids, mask = tpl.encode(tokenize, SENTENCES, pad_id=0, multiple=8)
  assert ids.shape[1] % 8 == 0 and ids.shape[1] - mask.sum(1).max() < 8
  for i, s in enumerate(SENTENCES):
    n = int(mask[i].sum())
    assert mask[i, :n].all() and not mask[i, n:].any() and not ids[i, n:].any()
    assert prefix + ids[i, :n].tolist() == tokenize(tpl.render(s))
  tail = tokenize(tpl.tail)
  short, smask = tpl.encode(tokenize, SENTENCES, max_length=len(tail) + 2)
  assert smask.all() and all(r[2:].tolist() == tail for r in short)
  with pytest.raises(ValueError, match="no room for the sentence"):
    tpl.encode(tokenize, SENTENCES, max_length=len(tail))
  plain = prompt.Template("{sentence} It was", (" terrible", " great"))
  assert plain.prefix_ids(tokenize) == []
  pids, pmask = plain.encode(tokenize, SENTENCES[:1])
  assert pids[0, :pmask[0].sum()].tolist() == tokenize("a charming and funny film It was")


def tiny_model(seed=0):
  return llama.LlamaForCausalLM(llama.tiny_config(), param_dtype=jnp.float64,
                                rngs=nnx.Rngs(seed))


def direct_loss(model, prefix, ids, mask, labels, label_ids):
  """Full-sequence forward of prefix + row, full-vocabulary logits at the last real token,
  log-softmax restricted to the label words, mean negative log-likelihood (float64)."""
  rows = [np.concatenate([prefix, ids[i, :mask[i].sum()]]) for i in range(len(ids))]
  width = max(map(len, rows)) + 3  # extra right padding must not matter
  full = np.zeros((len(rows), width), np.int32)
  fmask = np.zeros_like(full)
  for i, r in enumerate(rows):
    full[i, :len(r)], fmask[i, :len(r)] = r, 1
  logits = np.asarray(model.logits(model(jnp.asarray(full), jnp.asarray(fmask))))
  last = logits[np.arange(len(rows)), fmask.sum(1) - 1][:, label_ids]
  logp = last - np.log(np.exp(last - last.max(1, keepdims=True)).sum(1, keepdims=True)) - \
      last.max(1, keepdims=True)
  return -np.mean(logp[np.arange(len(rows)), labels])


def test_prompted_loss_matches_a_direct_computation_and_follows_the_params():
  """The classifier's cross-entropy (LM head at the answer only, label words only, shared
  prefix or not) equals the full forward + restricted log-softmax, to float64 rounding.

  And under a loss of params (what a zeroth-order step evaluates at w + mu z), the shared
  and the unshared prefix give the same loss for changed weights, which differs from the
  unchanged one: the prefix's keys/values are no constant of the original model. Both
  losses are the jitted loss of params a training step runs."""
  tokenize = data.byte_tokenize
  tpl = prompt.chat(CHATML, INSTRUCTION, ("n", "p"))
  ids, mask = tpl.encode(tokenize, SENTENCES)
  labels = np.array([1, 0, 0, 1])
  batch = (jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(labels))
  losses = []
  for share in (True, False):
    clf = prompt.classifier(tiny_model(), tokenize, tpl, share_prefix=share)
    assert clf.prefix_ids == tuple(tokenize(tpl.head)) and len(clf.prefix_ids) > 40
    graphdef, params, frozen = peft.split_trainable(clf, "ft")
    loss_fn = jax.jit(peft.make_loss_fn(
        graphdef, lambda m, i, am, y: heads.cross_entropy(m(i, am), y)))
    z = jax.tree.map(lambda p: 0.05 * jnp.ones_like(p), params)
    moved = jax.tree.map(jnp.add, params, z)
    losses.append((float(loss_fn(params, frozen, *batch)),
                   float(loss_fn(moved, frozen, *batch))))
  want = direct_loss(tiny_model(), np.array(clf.prefix_ids), ids, mask, labels,
                     clf.label_token_ids)
  assert abs(want) > 0.1
  (a0, a1), (b0, b1) = losses
  np.testing.assert_allclose([a0, b0], [want, want], rtol=1e-11)
  np.testing.assert_allclose([a0, a1], [b0, b1], rtol=1e-11)
  assert abs(a1 - a0) > 1e-3


def test_past_key_values_continue_the_positions():
  """Hidden states of tokens run after a prefix's keys/values equal those of the full
  sequence (positions continue at P); a batch-1 prefix broadcasts over the rows."""
  model = tiny_model(1)
  rng = np.random.default_rng(0)
  prefix = rng.integers(3, 500, (1, 7))
  rest = rng.integers(3, 500, (3, 5))
  full = np.concatenate([np.repeat(prefix, 3, 0), rest], 1)
  want = np.asarray(model(jnp.asarray(full)))[:, 7:]
  past = model.layer_key_values(jnp.asarray(prefix))
  got = np.asarray(model(jnp.asarray(rest), past_key_values=past))
  np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
  with pytest.raises(ValueError, match="past_key_values has 1 layers"):
    model(jnp.asarray(rest), past_key_values=past[:1])


def test_prefix_needs_a_decoder_position():
  with pytest.raises(ValueError, match="prefix_ids needs position='last'"):
    heads.LabelWordClassifier(tiny_model(), [3, 4], position="mask", mask_token_id=5,
                              prefix_ids=[1, 2])


@pytest.mark.parametrize("mode", ["ft", "lora"])
def test_a_frozen_bottom_runs_once_and_the_top_gives_the_same_loss(mode):
  """``start_layer=L``: the rows' residual stream entering layer L computed once
  (``clf.inputs``), the loss of the params of layers L.. on it equals the whole forward's,
  at the params and at moved params (the prefix's keys and values above L follow them),
  to float64 rounding."""
  tokenize = data.byte_tokenize
  tpl = prompt.chat(CHATML, INSTRUCTION, ("n", "p"))
  ids, mask = tpl.encode(tokenize, SENTENCES)
  labels = jnp.asarray([1, 0, 0, 1])
  top = peft.trainable_filter(mode, layers=[1])
  losses = []
  for start in (0, 1):
    model = tiny_model()
    if mode == "lora":
      peft.apply_lora(model, rank=2, alpha=4.0, rngs=nnx.Rngs(1))
    clf = prompt.classifier(model, tokenize, tpl, start_layer=start)
    rows = jnp.asarray(ids)
    inputs = clf.inputs(rows, jnp.asarray(mask))
    if start:
      assert inputs.shape == (*ids.shape, model.config.hidden_size)
    else:
      assert inputs is rows
    graphdef, params, frozen = peft.split_trainable(clf, top)
    assert not any("layers" in p and 0 in p for p, _ in nnx.to_flat_state(params))
    loss_fn = jax.jit(peft.make_loss_fn(
        graphdef, lambda m, i, am, y: heads.cross_entropy(m(i, am), y)))
    moved = jax.tree.map(lambda p: p + 0.05, params)
    losses.append([float(loss_fn(p, frozen, inputs, jnp.asarray(mask), labels))
                   for p in (params, moved)])
  np.testing.assert_allclose(losses[1], losses[0], rtol=1e-11)
  assert abs(losses[0][1] - losses[0][0]) > 1e-3


def test_start_layer_rejects_what_it_cannot_run():
  """Bad layers, ids where the residual stream goes, and a split that trains what the
  classifier read once (the layers below its start, the embeddings) each raise, naming the
  fix."""
  model = tiny_model()
  with pytest.raises(ValueError, match="start_layer > 0 needs a decoder LM"):
    heads.LabelWordClassifier(model, [3, 4], position="mask", mask_token_id=5, start_layer=1)
  with pytest.raises(ValueError, match="needs share_prefix=True"):
    heads.LabelWordClassifier(model, [3, 4], position="last", prefix_ids=[1, 2],
                              share_prefix=False, start_layer=1)
  for bad in (2, 3, -1):  # two layers: 0 or 1
    with pytest.raises(ValueError, match=rf"start_layer must be in \[0, 1\].*got {bad}"):
      heads.LabelWordClassifier(model, [3, 4], position="last", start_layer=bad)
  with pytest.raises(ValueError, match="needs hidden"):
    model.layer_key_values(jnp.ones((1, 3), jnp.int32), layer=1)
  clf = heads.LabelWordClassifier(model, [3, 4], position="last", prefix_ids=[1, 2],
                                  start_layer=1)
  ids, mask = jnp.ones((2, 5), jnp.int32), jnp.ones((2, 5), jnp.int32)
  with pytest.raises(TypeError, match=r"takes clf.inputs\(ids, mask\).*not token ids"):
    clf(ids, mask)
  assert clf(clf.inputs(ids, mask), mask).shape == (2, 2)
  for wrt in ("ft", peft.trainable_filter("ft", layers=[0, 1])):
    with pytest.raises(ValueError, match=r"trainable, but the classifier runs from layer 1.*"
                                         r"layers=range\(1, num_layers\)"):
      peft.split_trainable(clf, wrt)
  _, params, _ = peft.split_trainable(clf, peft.trainable_filter("ft", layers=[1]))
  assert all("layers" in p and 1 in p for p, _ in nnx.to_flat_state(params))
