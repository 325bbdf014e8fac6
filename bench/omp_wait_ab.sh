#!/bin/bash
# usage: bench/omp_wait_ab.sh OUTDIR [busy]
# scale.py's workers under OMP_WAIT_POLICY=PASSIVE (their default) and under libgomp's own
# default (an empty value: spin a while, then sleep), two rounds each, HierTail and GCN at
# 100 / 1k / 10k nodes; with "busy", two busy-loop processes take the cores meanwhile. Prints
# one line per run. Run it in bench/idle_window.sh (busy: with MEASURE_WINDOW=1 exported, so
# the window does not pause the busy loops). An empty OMP_WAIT_POLICY makes libgomp warn
# "Invalid value" on the worker's stderr and use its default. Results of 2026-12-02:
# docs/results/omp_wait_policy_2026-12-02.txt.
OUT=${1:-}; BUSY=${2:-}
if [ -z "$OUT" ]; then       # (scale.py --out "/PASSIVE1": folders at the file system's root)
  echo "usage: bench/omp_wait_ab.sh OUTDIR [busy]" >&2; exit 2
fi
OUT=$(realpath -m "$OUT")    # the caller's folder, not the repository root cd'ed into below
cd "$(dirname "$0")/.."
if [ "$BUSY" = busy ]; then
  python -c "while True: pass" & B1=$!
  python -c "while True: pass" & B2=$!
  trap 'kill $B1 $B2' EXIT
  sleep 2
fi
for round in 1 2; do
  for policy in PASSIVE default; do
    value=$policy; [ $policy = default ] && value=""
    OMP_WAIT_POLICY=$value python bench/scale.py --sizes 100 1000 10000 --methods hiertail gcn \
      --out "$OUT/$policy$round" > /dev/null 2>&1
    tail -n +2 "$OUT/$policy$round/scale.csv" | awk -F, -v p=$policy -v r=$round \
      '{printf "%-8s round %d  %-9s %6d nodes  %.4f s/epoch\n", p, r, $1, $2, $4}'
  done
done
