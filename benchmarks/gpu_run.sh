#!/usr/bin/env bash
# The GPU rows in one command, in parts that each fit a time-limited call:
#
#   bash benchmarks/gpu_run.sh minilm  OUTDIR   # every method's step cost on MiniLM-L6
#   bash benchmarks/gpu_run.sh llama1b OUTDIR   # the same on a 1.1B-parameter bf16 decoder
#   bash benchmarks/gpu_run.sh harness OUTDIR   # the choose harness's gpu_sst2 table
#   bash benchmarks/gpu_run.sh batch   OUTDIR   # a MeZO step on MiniLM at batch 16..1024
#
# from the repository root. Each part writes its JSON and log into OUTDIR (the gpu.py JSON
# after every row, so a part cut off by a time limit keeps what it measured) and stops
# itself after $LIMIT seconds (default 400). One XLA compilation cache for every process
# (gpu.py's live-memory children compile what their parent compiled). On a machine that
# cannot install packages: the weights from `python benchmarks/pack_minilm.py DIR` on
# PYTHONPATH, and SST-2 at $HIZOO_SST2_DIR for the harness.
set -uo pipefail
part=${1:?minilm, llama1b, harness or batch}
out=${2:?an output folder}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/hizoo-gpu-xla-cache}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
limit=${LIMIT:-400}
py=${PYTHON:-python3}
case "$part" in
  minilm)
    timeout "$limit" "$py" benchmarks/gpu.py --models minilm --repeats 21 --append \
      ${METHODS:+--methods $METHODS} --out "$out/gpu_minilm.json" 2>&1 \
      | tee -a "$out/minilm.log" ;;
  llama1b)
    # the methods in the order they matter, so that a cut-off run has the main rows
    timeout "$limit" "$py" benchmarks/gpu.py --models llama1b --repeats 11 --append \
      --methods ${METHODS:-mezo hizoo hizoo_l adam lozo subzero zo_muon sparse_mezo \
      fzoo_batched forward_gradient fzoo zo_muon_batched} \
      --out "$out/gpu_llama1b.json" 2>&1 | tee -a "$out/llama1b.log" ;;
  harness)
    timeout "$limit" "$py" -m experiments.choose.run --table gpu_sst2 \
      --results "$out/harness_results" --ckpts "${TMPDIR:-/tmp}/hizoo-gpu-ckpts" 2>&1 \
      | tee "$out/harness.log" ;;
  batch)
    timeout "$limit" "$py" benchmarks/batch_cost.py --batches 16 32 64 128 256 512 1024 \
      --repeats 11 --out "$out/batch_cost.json" 2>&1 | tee "$out/batch.log" ;;
  *) echo "unknown part $part: minilm, llama1b, harness or batch" >&2; exit 2 ;;
esac
