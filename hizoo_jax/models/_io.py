"""Reading and writing Hugging Face checkpoint directories (``config.json`` + safetensors).

A checkpoint directory holds ``config.json`` and either ``model.safetensors`` or shards
listed in ``model.safetensors.index.json`` (the layout ``save_pretrained`` writes). Tensors
are read with ``safetensors.numpy``: no torch needed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
CONFIG = "config.json"


def _safetensors_numpy():
  try:
    from safetensors import numpy as st_numpy
  except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "reading Hugging Face checkpoints needs the `safetensors` package: "
        'pip install "hizoo-jax[flax]"'
    ) from e
  return st_numpy


def read_config(path: str | os.PathLike) -> dict[str, Any]:
  """The parsed ``config.json`` of a checkpoint directory."""
  file = os.path.join(os.fspath(path), CONFIG)
  if not os.path.isfile(file):
    raise FileNotFoundError(f"no {CONFIG} in checkpoint directory {os.fspath(path)!r}")
  with open(file) as fh:
    return json.load(fh)


def read_tensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
  """All tensors of a checkpoint directory (single file or sharded), as NumPy arrays."""
  path = os.fspath(path)
  st_numpy = _safetensors_numpy()
  single = os.path.join(path, SAFETENSORS)
  index = os.path.join(path, SAFETENSORS_INDEX)
  if os.path.isfile(single):
    return dict(st_numpy.load_file(single))
  if os.path.isfile(index):
    with open(index) as fh:
      shards = sorted(set(json.load(fh)["weight_map"].values()))
    out: dict[str, np.ndarray] = {}
    for shard in shards:
      out.update(st_numpy.load_file(os.path.join(path, shard)))
    return out
  raise FileNotFoundError(
      f"no {SAFETENSORS} or {SAFETENSORS_INDEX} in checkpoint directory {path!r} "
      "(PyTorch .bin checkpoints are not read; convert them to safetensors)"
  )


def write_checkpoint(
    path: str | os.PathLike, config: Mapping[str, Any], tensors: Mapping[str, np.ndarray]
) -> None:
  """Writes ``config.json`` and ``model.safetensors`` (contiguous NumPy arrays)."""
  path = os.fspath(path)
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, CONFIG), "w") as fh:
    json.dump(dict(config), fh, indent=2, sort_keys=True)
  arrays = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
  _safetensors_numpy().save_file(arrays, os.path.join(path, SAFETENSORS), metadata={"format": "pt"})


def take(tensors: dict[str, np.ndarray], name: str, shape: tuple[int, ...]) -> np.ndarray:
  """Pops ``tensors[name]``, checking its shape; a clear error when it is missing."""
  if name not in tensors:
    raise KeyError(f"checkpoint has no tensor {name!r}")
  value = tensors.pop(name)
  if tuple(value.shape) != tuple(shape):
    raise ValueError(f"tensor {name!r} has shape {value.shape}, expected {tuple(shape)}")
  return value
