"""Prompted classification with a decoder LM: the task written as text, answered by the
LM's next word.

A :class:`Template` is a text with one ``{sentence}`` slot and one label word per class::

    from hizoo_jax.models import prompt
    plain = prompt.Template("{sentence} It was", (" terrible", " great"))   # MeZO's
    chat = prompt.chat(chat_template, "Is the sentiment of this movie review positive or "
                       "negative? Answer with one word. Review: {sentence}",
                       ("negative", "positive"))      # the model's own chat format
    clf = prompt.classifier(model, tokenize, chat)    # heads.LabelWordClassifier
    ids, mask = chat.encode(tokenize, sentences)      # each row: sentence + template tail
    logits = clf(ids, mask)                           # [batch, classes]
    loss = heads.cross_entropy(logits, labels)

Class ``c``'s logit is the LM's logit of label word ``c`` as the next token after the
prompt, so the cross-entropy is the LM's log-probability of the right word renormalised over
the label words; the LM head is evaluated at that one position, for those words only.

The text before ``{sentence}`` (a chat template's system turn and the instruction, about
40 tokens for SmolLM2) is the same for every row: the classifier holds its token ids and
computes its keys and values once per forward pass (one row, broadcast), then runs only
each row's sentence and tail against them, positions continuing after the prefix. Rows are
right-padded (positions ``0 .. T-1`` after the prefix, as the Llama port wants) and scored
at their last real token.

Whitespace just before ``{sentence}`` is tokenized with the sentence, which is how a
byte-level BPE (GPT-2, Llama 3, SmolLM) splits the full text: ``"Review: it 's"`` is
``"Review:"`` then ``" it"``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from hizoo_jax.models import heads
from hizoo_jax.models.data import Tokenize

SLOT = "{sentence}"


@dataclasses.dataclass(frozen=True)
class Template:
  """A prompt with one ``{sentence}`` slot, and one label word per class.

  Attributes:
    text: e.g. ``"{sentence} It was"``; the answer is the next token after the text.
    label_words: class ``c``'s word, e.g. ``(" terrible", " great")``; each must be a single
      token of the model's tokenizer (leading spaces matter for byte-level BPE).
    name: a short name for tables.
  """

  text: str
  label_words: tuple[str, ...]
  name: str = ""

  def __post_init__(self):
    if self.text.count(SLOT) != 1:
      raise ValueError(f"template text must hold {SLOT!r} exactly once, got {self.text!r}")
    words = tuple(self.label_words)
    if len(words) < 2 or len(set(words)) != len(words):
      raise ValueError(f"label_words must be two or more distinct words, got {words!r}")
    object.__setattr__(self, "label_words", words)

  @property
  def head(self) -> str:
    """The text before the sentence, less its trailing whitespace (the shared prefix)."""
    return self.text.split(SLOT)[0].rstrip(" ")

  @property
  def tail(self) -> str:
    """The text after the sentence."""
    return self.text.split(SLOT)[1]

  def render(self, sentence: str) -> str:
    """The full prompt text of one sentence."""
    return self.text.replace(SLOT, sentence.strip())

  def prefix_ids(self, tokenize: Tokenize) -> list[int]:
    """Token ids of :attr:`head`: what every row shares."""
    return list(tokenize(self.head)) if self.head else []

  def label_ids(self, tokenize: Tokenize) -> list[int]:
    """One token id per label word; ValueError if a word is not exactly one token."""
    ids = []
    for word in self.label_words:
      toks = list(tokenize(word))
      if len(toks) != 1:
        raise ValueError(f"label word {word!r} is {len(toks)} tokens {toks} of this tokenizer, "
                         "not one: pick a single-token word (with or without a leading space)")
      ids.append(toks[0])
    if len(set(ids)) != len(ids):
      raise ValueError(f"label words {self.label_words} map to the same token ids {ids}")
    return ids

  def encode(self, tokenize: Tokenize, sentences: Sequence[str], *,
             max_length: int | None = None, pad_id: int = 0,
             multiple: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """Each row's part after the shared prefix, ``(ids, mask)`` int32 ``[n, length]``.

    A row is the sentence (with the whitespace before the slot) then :attr:`tail`,
    right-padded with ``pad_id``; the sentence is cut so the tail always survives.

    Args:
      tokenize: ``text -> ids`` without special tokens added (``data.hf_tokenize``).
      sentences: the texts (surrounding whitespace stripped).
      max_length: padded length; None: the longest row rounded up to ``multiple``.
      pad_id: id of padding (mask 0).
      multiple: rounding of the automatic length.
    """
    lead = self.text.split(SLOT)[0][len(self.head):]
    tail = list(tokenize(self.tail)) if self.tail else []
    rows = [list(tokenize(lead + s.strip())) for s in sentences]
    if max_length is None:
      longest = max((len(r) for r in rows), default=0) + len(tail)
      max_length = -(-max(longest, 1) // multiple) * multiple
    budget = max_length - len(tail)
    if budget < 1:
      raise ValueError(f"max_length={max_length} leaves no room for the sentence after the "
                       f"template's {len(tail)} tail tokens")
    ids = np.full((len(rows), max_length), pad_id, np.int32)
    mask = np.zeros((len(rows), max_length), np.int32)
    for i, r in enumerate(rows):
      row = r[:budget] + tail
      ids[i, :len(row)] = row
      mask[i, :len(row)] = 1
    return ids, mask


def render_chat(chat_template: str, user: str, *, system: str | None = None,
                bos_token: str = "", eos_token: str = "") -> str:
  """A Jinja chat template (Hugging Face ``chat_template``, GGUF
  ``tokenizer.chat_template``) rendered for one user turn and the assistant's generation
  prompt, as ``tokenizer.apply_chat_template(..., add_generation_prompt=True)`` does."""
  try:
    from jinja2.sandbox import ImmutableSandboxedEnvironment
  except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError('render_chat needs jinja2: pip install "hizoo-jax[gguf]"') from e

  def raise_exception(message):
    raise ValueError(f"chat template: {message}")

  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
  env.globals["raise_exception"] = raise_exception
  messages = ([{"role": "system", "content": system}] if system is not None else [])
  messages.append({"role": "user", "content": user})
  return env.from_string(chat_template).render(
      messages=messages, add_generation_prompt=True, bos_token=bos_token, eos_token=eos_token)


def chat(chat_template: str, instruction: str, label_words: Sequence[str], *,
         name: str = "", system: str | None = None, **tokens: str) -> Template:
  """A :class:`Template` from the model's chat template: ``instruction`` (holding
  ``{sentence}``) as the user's turn, the answer as the assistant's first token.

  Args:
    chat_template: the Jinja source.
    instruction: the user's message with a ``{sentence}`` slot.
    label_words: one word per class (e.g. ``("negative", "positive")``).
    name: a short name for tables.
    system: an optional system message (else the template's default, if any).
    tokens: ``bos_token``/``eos_token`` strings the template may use.
  """
  if instruction.count(SLOT) != 1:
    raise ValueError(f"instruction must hold {SLOT!r} exactly once, got {instruction!r}")
  text = render_chat(chat_template, instruction, system=system, **tokens)
  return Template(text, tuple(label_words), name)


def classifier(model, tokenize: Tokenize, template: Template, *,
               share_prefix: bool = True, start_layer: int = 0) -> heads.LabelWordClassifier:
  """A :class:`~hizoo_jax.models.heads.LabelWordClassifier` of ``model`` (a decoder LM
  with ``word_logits``) for ``template``: scored at each row's last real token, the
  template's head as its shared prefix. Feed it :meth:`Template.encode`'s rows (through
  its ``inputs`` when ``start_layer > 0``: only the layers from there on are run)."""
  return heads.LabelWordClassifier(model, template.label_ids(tokenize), position="last",
                                   prefix_ids=template.prefix_ids(tokenize),
                                   share_prefix=share_prefix, start_layer=start_layer)
