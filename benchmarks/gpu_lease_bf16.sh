#!/usr/bin/env bash
# The bfloat16 rows in one call of at most 10 minutes (benchmarks/RESULTS.md, "GPU rows"):
#
#   bash benchmarks/gpu_lease_bf16.sh OUTDIR
#
# Set up as for benchmarks/gpu_lease.sh (the package from the source tree, the MiniLM
# weights from $PACK). Three parts, each stopping itself at its share (L1..L3 seconds:
# 250 + 190 + 110, about 9 minutes in all), packed into OUTDIR/gpu.tgz after each:
#   1. the 1.1B bfloat16 decoder: the default step (restore="exact": theta + c mu D formed
#      where the forward pass reads it) against the in-place one, MeZO and HiZOO, then
#      FZOO and ZO-Muon (time in forward passes, compiled and live memory);
#   2. MiniLM-L6 float32: MeZO in place (its default) against exact, then the rows the
#      first lease did not reach (SubZero, ZO-Muon, the batched probes, Adam);
#   3. the decoder's other methods.
# gpu.py --append merges each part's rows into the part's JSON, so a second call with
# other METHODS adds to the same files.
set -u
out=${1:?an output folder}
pack_dir=${PACK:-$PWD/.gpu}
export PYTHONPATH=$pack_dir:$PWD PYTHONUNBUFFERED=1
work=${WORK:-/tmp/hizoo-gpu-lease}
mkdir -p "$work" "$out"
py=${PYTHON:-python3}
pack() { tar czf "$out/gpu.tgz" -C "$work" . ; echo "== packed after $1 at $SECONDS s"; }
(nvidia-smi; $py -c "import jax, optax, flax; print(jax.__version__, optax.__version__, \
flax.__version__, jax.devices())") > "$work/env.txt" 2>&1
cat "$work/env.txt"; pack env
LIMIT=${L1:-250} METHODS="mezo mezo_inplace hizoo hizoo_inplace fzoo zo_muon" \
  bash benchmarks/gpu_run.sh llama1b "$work"; pack llama1b
LIMIT=${L2:-190} METHODS="mezo mezo_exact subzero zo_muon fzoo_batched zo_muon_batched adam" \
  bash benchmarks/gpu_run.sh minilm "$work"; pack minilm
LIMIT=${L3:-110} METHODS="adam lozo subzero sparse_mezo hizoo_l forward_gradient \
fzoo_batched zo_muon_batched" bash benchmarks/gpu_run.sh llama1b "$work"; pack llama1b_rest
