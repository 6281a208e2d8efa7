#!/usr/bin/env bash
# Makes the working tree small enough to travel to a lent accelerator machine, and puts it
# back. The device tool copies the tracked files and the untracked ones git does not ignore,
# plus the paths given as `carry`, 64 MiB in all; the committed results, logs and figures
# (42.5 of the tree's 44.8 MiB on 2026-12-04) and the packed float16 MiniLM weights (.gpu,
# 43 MiB: benchmarks/pack_minilm.py) do not fit together; slim, the tree is 2.3 MiB.
#
#   bash benchmarks/device_tree.sh slim      # results leave the index and are ignored
#   ... run the device command with carry [".gpu"] ...
#   bash benchmarks/device_tree.sh restore   # the index and .git/info/exclude as before
#   bash benchmarks/device_tree.sh size      # MiB that would travel now (and .gpu)
#
# Nothing in the working tree is deleted: `slim` takes the paths out of the index
# (`git rm --cached`) and lists them in .git/info/exclude between two marker lines;
# `restore` adds them back (`git reset`) and drops the marked lines. Run `restore` before
# committing anything: a commit made while slim would delete the results from main.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
paths=(experiments/choose/results experiments/choose/logs docs/results examples/results
       notebooks/figures experiments/sst2/results experiments/sst2/logs)
exclude=.git/info/exclude
begin="# >>> device_tree.sh slim"
end="# <<< device_tree.sh slim"

size() {
  local tracked untracked gpu
  tracked=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}')
  untracked=$(git ls-files -z --others --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null \
              | awk '{s+=$1} END {print s+0}')
  gpu=$(du -sb .gpu 2>/dev/null | cut -f1 || echo 0)
  awk -v t="$tracked" -v u="$untracked" -v g="${gpu:-0}" 'BEGIN {
    printf "tree %.1f MiB (tracked %.1f, untracked %.1f); .gpu %.1f MiB; with .gpu %.1f of 64\n",
      (t + u) / 2^20, t / 2^20, u / 2^20, g / 2^20, (t + u + g) / 2^20 }'
}

case "${1:-}" in
  slim)
    if grep -qxF "$begin" "$exclude" 2>/dev/null; then
      echo "already slim (run: $0 restore)" >&2; exit 1
    fi
    mkdir -p "$(dirname "$exclude")"
    { echo "$begin"; for p in "${paths[@]}"; do echo "/$p/"; done; echo "$end"; } >> "$exclude"
    for p in "${paths[@]}"; do
      git ls-files --error-unmatch "$p" > /dev/null 2>&1 && git rm -r -q --cached "$p"
    done
    size ;;
  restore)
    if ! grep -qxF "$begin" "$exclude" 2>/dev/null; then
      echo "not slim: nothing to restore" >&2; exit 0
    fi
    git reset -q -- "${paths[@]}"
    sed -i "/^$begin\$/,/^$end\$/d" "$exclude"
    git status --short | head -5
    size ;;
  size) size ;;
  *) echo "usage: $0 slim|restore|size" >&2; exit 2 ;;
esac
