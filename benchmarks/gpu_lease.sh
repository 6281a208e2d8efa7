#!/usr/bin/env bash
# The GPU rows of benchmarks/RESULTS.md ("GPU rows") in one time-limited device call:
#
#   bash benchmarks/gpu_lease.sh OUTDIR [all|bf16]
#
# all (default): every part of benchmarks/gpu_run.sh, as run on an H200 on 2026-12-04.
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
#
# bf16: the bfloat16 rows, in at most 10 minutes. Three parts, each stopping itself at its
# share (L1..L3 seconds: 250 + 190 + 110, about 9 minutes in all), packed after each:
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
export PYTHONPATH=$pack_dir:$PWD PYTHONUNBUFFERED=1 HIZOO_SST2_DIR=$pack_dir/sst2
work=${WORK:-/tmp/hizoo-gpu-lease}
mkdir -p "$work" "$out"
py=${PYTHON:-python3}
pack() { tar czf "$out/gpu.tgz" -C "$work" . ; echo "== packed after $1 at $SECONDS s"; }
(nvidia-smi; $py -c "import jax, optax, flax; print(jax.__version__, optax.__version__, \
flax.__version__, jax.devices())") > "$work/env.txt" 2>&1
cat "$work/env.txt"; pack env
case ${2:-all} in
  all)
LIMIT=${L1:-185} bash benchmarks/gpu_run.sh minilm "$work"; pack minilm
LIMIT=${L2:-60} bash benchmarks/gpu_run.sh batch "$work"; pack batch
LIMIT=${L3:-110} bash benchmarks/gpu_run.sh harness "$work"; pack harness
LIMIT=${L4:-140} METHODS=${M4:-"mezo hizoo adam zo_muon lozo fzoo_batched sparse_mezo \
subzero hizoo_l forward_gradient fzoo"} bash benchmarks/gpu_run.sh llama1b "$work"
pack llama1b
    ;;
  bf16)
LIMIT=${L1:-250} METHODS="mezo mezo_inplace hizoo hizoo_inplace fzoo zo_muon" \
  bash benchmarks/gpu_run.sh llama1b "$work"; pack llama1b
LIMIT=${L2:-190} METHODS="mezo mezo_exact subzero zo_muon fzoo_batched zo_muon_batched adam" \
  bash benchmarks/gpu_run.sh minilm "$work"; pack minilm
LIMIT=${L3:-110} METHODS="adam lozo subzero sparse_mezo hizoo_l forward_gradient \
fzoo_batched zo_muon_batched" bash benchmarks/gpu_run.sh llama1b "$work"; pack llama1b_rest
    ;;
  *) echo "unknown plan ${2}: all or bf16" >&2; exit 2 ;;
esac
