"""Flax NNX models, fine-tuning modes and checkpoints for zeroth-order fine-tuning.

Needs the ``flax`` extra (``pip install "hizoo-jax[flax]"``: flax, safetensors, tokenizers,
orbax-checkpoint). Submodules:

* :mod:`~hizoo_jax.models.bert`: BERT encoder + Hugging Face loader (all-MiniLM-L6-v2).
* :mod:`~hizoo_jax.models.llama`: Llama-architecture decoder LM + Hugging Face loader;
  ``llama.from_gguf`` / ``llama.gguf_tokenizer`` read llama.cpp GGUF files (the ``gguf``
  extra), e.g. SmolLM2-135M-Instruct from ``llama.smollm2_gguf_path()``.
* :mod:`~hizoo_jax.models.heads`: linear and prompt-based (label-word) classifiers, losses
  including the non-differentiable ``-accuracy`` and ``-F1``.
* :mod:`~hizoo_jax.models.prompt`: prompted classification with a decoder LM (plain or
  chat templates, label words, a shared prefix computed once per pass).
* :mod:`~hizoo_jax.models.peft`: full fine-tuning, LoRA and prefix tuning; trainable splits.
* :mod:`~hizoo_jax.models.checkpoint`: Orbax checkpoints of params + optimizer state.
* :mod:`~hizoo_jax.models.data`: GLUE SST-2 TSV reader and prompt encoding.
"""

from hizoo_jax.models import bert, checkpoint, data, heads, linen, llama, peft, prompt
from hizoo_jax.models._layers import PrefixKV, PrefixParam
from hizoo_jax.models.heads import HeadParam, LabelWordClassifier, SequenceClassifier

__all__ = [
    "HeadParam",
    "LabelWordClassifier",
    "PrefixKV",
    "PrefixParam",
    "SequenceClassifier",
    "bert",
    "checkpoint",
    "data",
    "heads",
    "linen",
    "llama",
    "peft",
    "prompt",
]
