#!/usr/bin/env bash
# Runs tables of the "choosing a method" study in the background, from a frozen snapshot of
# the code, so that edits to the working tree during a run (hours) cannot change it.
#
#   bash experiments/choose/queue.sh digits_mezo sst2_ft_mezo    # tables, in this order
#   CHOOSE_REF=<commit> bash experiments/choose/queue.sh ...      # hizoo_jax of that commit
#
# The snapshot (in $CHOOSE_SNAPSHOT, default /tmp/choose_run) is hizoo_jax/, experiments/ and
# examples/ of $CHOOSE_REF (default HEAD) plus the working tree's experiments/choose/. Results,
# checkpoints and loss tapes go to this checkout's experiments/choose/{results,ckpt,traces}
# (commit traces/ at the end of a session: on a new machine a run replays its tape in a
# few minutes instead of starting again); the log to
# experiments/choose/logs/<first table>.log (or $CHOOSE_LOG: two queues that start with the
# same table keep separate logs). $CHOOSE_ONLY (space-separated shell patterns of run ids)
# limits the queue to the matching runs of its tables (run.py --only): a second queue takes
# named runs, say a grid's confirming seeds, and leaves the rest to the first. Runs are
# niced and XLA is kept to one thread (the machine's two cores are shared). Resumable: run
# the same command again.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
ref="${CHOOSE_REF:-HEAD}"
snap="${CHOOSE_SNAPSHOT:-/tmp/choose_run}"
py="${CHOOSE_PYTHON:-/work/venv/bin/python}"
commit="$(git -C "$root" rev-parse "$ref")"
rm -rf "$snap" && mkdir -p "$snap"
git -C "$root" archive "$commit" hizoo_jax experiments examples | tar -x -C "$snap"
rm -rf "$snap/experiments/choose" && cp -r "$here" "$snap/experiments/choose"
rm -rf "$snap/experiments/choose/results" "$snap/experiments/choose/ckpt" "$snap/experiments/choose/traces"
mkdir -p "$here/logs"
log="${CHOOSE_LOG:-$here/logs/$1.log}"
# the queue runs from the snapshot: paths given relative to the checkout are made absolute
# here, before the cd below
case "$py" in */*) [[ "$py" = /* ]] || py="$root/$py" ;; esac
[[ "$log" = /* ]] || log="$root/$log"
tables=()
for t in "$@"; do tables+=(--table "$t"); done
for pat in ${CHOOSE_ONLY:-}; do tables+=(--only "$pat"); done
cd "$snap"
export CHOOSE_HIZOO_COMMIT="$commit"
# the snapshot lives elsewhere: point the SST-2 task at this checkout's data
export HIZOO_SST2_DIR="${HIZOO_SST2_DIR:-$(cd "$root/.." && pwd)/shared/data/sst2}"
export XLA_FLAGS="${XLA_FLAGS:---xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1}"
nohup nice -n 15 "$py" -m experiments.choose.run "${tables[@]}" \
  --results "$here/results" --ckpts "$here/ckpt" --traces "$here/traces" >> "$log" 2>&1 &
echo "queue pid $! (hizoo_jax $commit, snapshot $snap, log $log)"
