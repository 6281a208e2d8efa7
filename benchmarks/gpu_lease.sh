#!/usr/bin/env bash
# Every part of benchmarks/gpu_run.sh in one time-limited call, as run on an H200 on
# 2026-12-04 (benchmarks/RESULTS.md, "GPU rows"):
#
#   bash benchmarks/gpu_lease.sh OUTDIR
#
# (before the device call: `bash benchmarks/device_tree.sh slim`, carry [".gpu"]; after:
# `bash benchmarks/device_tree.sh restore`)
#
# from the repository root, on a machine with jax (CUDA), optax, flax, safetensors and
# tokenizers but without this package installed: the package runs from the source tree,
# and the MiniLM weights and SST-2 come from $PACK (default .gpu):
#   python benchmarks/pack_minilm.py .gpu && mkdir -p .gpu/sst2 && cp DATA/*.tsv .gpu/sst2/
# Each part stops itself at its share (L1..L4 seconds: 185 + 60 + 110 + 140, about 8.5
# minutes in all); after each, everything so far is packed into OUTDIR/gpu.tgz, so a call
# cut off later still returns what finished.
set -u
out=${1:?an output folder}
pack_dir=${PACK:-$PWD/.gpu}
export PYTHONPATH=$pack_dir:$PWD PYTHONUNBUFFERED=1 HIZOO_SST2_DIR=$pack_dir/sst2
work=${WORK:-/tmp/hizoo-gpu-lease}
mkdir -p "$work" "$out"
py=${PYTHON:-python3}
pack() { tar czf "$out/gpu.tgz" -C "$work" . ; echo "== packed after $1 at $SECONDS s"; }
(nvidia-smi; $py -c "import jax, optax, flax; print(jax.__version__, optax.__version__, \
flax.__version__, jax.devices())") > "$work/env.txt" 2>&1
cat "$work/env.txt"; pack env
LIMIT=${L1:-185} bash benchmarks/gpu_run.sh minilm "$work"; pack minilm
LIMIT=${L2:-60} bash benchmarks/gpu_run.sh batch "$work"; pack batch
LIMIT=${L3:-110} bash benchmarks/gpu_run.sh harness "$work"; pack harness
LIMIT=${L4:-140} METHODS=${M4:-"mezo hizoo adam zo_muon lozo fzoo_batched sparse_mezo \
subzero hizoo_l forward_gradient fzoo"} bash benchmarks/gpu_run.sh llama1b "$work"
pack llama1b
