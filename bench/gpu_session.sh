#!/bin/bash
# One prepared call for a borrowed GPU machine (see README "On a GPU machine"): install on top of
# the image's own torch/triton, record the card, run bench/gpu_report.py and the test suite on
# CUDA, each under its own time limit, every log under $OUT (the folder a device call brings
# back). The device time is short and a fresh machine costs minutes to start: one call, with
# limits that leave room for a rerun.
#
#   OUT=/some/dir bash bench/gpu_session.sh            # all steps
#   STEPS="report tests" REPORT_S=200 TESTS_S=300 bash bench/gpu_session.sh
#
# STEPS (default "install report tests"; "scale" adds the 100k / 1M-node scale study with the
# loss in fp32 and in bf16, each under SCALE_S, default 240 s), REPORT_S (gpu_report's limit,
# default 270 s; its own --budget is 30 s less), TESTS_S (the test suite's limit, default
# 270 s). summary.txt gets one line per step with its exit status (124: it ran past its
# limit). PYTHON: the interpreter (default: python, else python3: the GPU image has only the
# latter). PYTEST_ARGS: extra pytest arguments (e.g. "-n 8": the GPU image has pytest-xdist).
# ARCHIVE: a .tar.gz path that gets every file of $OUT at the end (a device call brings back
# at most 8 files; the session writes more).
set -u
OUT=${OUT:-bench/results/gpu_session}
STEPS=${STEPS:-install report tests}
REPORT_S=${REPORT_S:-270}
TESTS_S=${TESTS_S:-270}
SCALE_S=${SCALE_S:-240}
PY=${PYTHON:-$(command -v python || command -v python3)}
PYTEST_ARGS=${PYTEST_ARGS:-}
ARCHIVE=${ARCHIVE:-}
mkdir -p "$OUT"
summary="$OUT/summary.txt"
: > "$summary"
step() {        # step NAME LIMIT_S CMD...: run CMD under a limit, log to $OUT/NAME.log
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc $rc in $((SECONDS - t0)) s (limit $limit s)" | tee -a "$summary"
}
{ date -u; nvidia-smi 2>&1 || echo "no nvidia-smi"; } > "$OUT/machine.txt"
for s in $STEPS; do
  case $s in
    install) step install 300 "$PY" -m pip install --no-deps --no-build-isolation -e . ;;
    report)
      step gpu_report "$REPORT_S" "$PY" bench/gpu_report.py --budget $((REPORT_S - 30)) \
        --out "$OUT" ;;
    tests)      # -v: one line per test as it ends, so a run stopped at its limit still
      # names every test it got through (the junit XML is only written at the end)
      # shellcheck disable=SC2086  # PYTEST_ARGS: several words on purpose
      step pytest "$TESTS_S" "$PY" -m pytest --benchmark-disable -v --tb=short $PYTEST_ARGS \
        -p no:cacheprovider -o junit_family=xunit2 --junitxml="$OUT/pytest.xml" ;;
    scale)      # issue 9's scale study: HierTail epochs at 100k and 1M nodes, loss in fp32
      # and in bf16 (not a default step: about SCALE_S seconds per dtype)
      for dt in float32 bfloat16; do
        step "scale_$dt" "$SCALE_S" "$PY" bench/scale.py --device cuda --sizes 100000 1000000 \
          --methods hiertail --epochs 2 --loss-dtype "$dt" --time-budget $((SCALE_S / 2 - 10)) \
          --no-plot --out "$OUT/scale_$dt"
      done ;;
    *) echo "unknown step $s (install, report, tests, scale)" | tee -a "$summary"; exit 2 ;;
  esac
done
if [ -n "$ARCHIVE" ]; then tar czf "$ARCHIVE" -C "$OUT" . && echo "archived $OUT in $ARCHIVE"; fi
exit 0
