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
# STEPS (default "install report tests"; "install" runs under INSTALL_S, default 300 s; "scale" adds the scale study at SCALE_SIZES (default
# "100000 1000000") with the loss in each of SCALE_DTYPES (default "float32 bfloat16"), each
# under SCALE_S, default 240 s, with SCALE_WARMUP (default 1) + SCALE_EPOCHS (default 2)
# epochs; "guard" adds bench/attention_guard.py under GUARD_S, default 60 s, with GUARD_ARGS
# (default: the bounds 256 ... 4096; e.g. "--dtype bfloat16 --bounds 4096 8192"); "profile" adds
# bench/loss_profile.py under PROFILE_S, default 200 s, its timed rows getting PROFILE_S - 60,
# with PROFILE_ARGS, e.g. "--sizes 20000:64"; "resources" adds bench/kernel_resources.py
# --fixed-only under RESOURCES_S, default 120 s; "kernels" adds bench/attention_kernels.py, the
# loss's LSE call on each of PyTorch's attention kernels against float64, under KERNELS_S,
# default 60 s, with KERNELS_ARGS), REPORT_S (gpu_report's limit, default 270 s;
# its own --budget is 30 s less),
# REPORT_ARGS (more gpu_report arguments, e.g. "--sections loss"), TESTS_S (the test suite's
# limit, default 270 s). summary.txt gets one line per step with its exit status (124: it ran past its
# limit). PYTHON: the interpreter (default: python, else python3: the GPU image has only the
# latter). PYTEST_ARGS: extra pytest arguments (e.g. "-n 8": the GPU image has pytest-xdist).
# ARCHIVE: a .tar.gz path that gets every file of $OUT at the end (a device call brings back
# at most 8 files; the session writes more).
set -u
OUT=${OUT:-bench/results/gpu_session}
STEPS=${STEPS:-install report tests}
INSTALL_S=${INSTALL_S:-300}
REPORT_S=${REPORT_S:-270}
TESTS_S=${TESTS_S:-270}
SCALE_S=${SCALE_S:-240}
SCALE_SIZES=${SCALE_SIZES:-100000 1000000}
SCALE_DTYPES=${SCALE_DTYPES:-float32 bfloat16}
SCALE_EPOCHS=${SCALE_EPOCHS:-2}
SCALE_WARMUP=${SCALE_WARMUP:-1}
GUARD_S=${GUARD_S:-60}
GUARD_ARGS=${GUARD_ARGS:---bounds 256 512 1024 2048 4096}
PROFILE_S=${PROFILE_S:-200}
PROFILE_ARGS=${PROFILE_ARGS:-}
RESOURCES_S=${RESOURCES_S:-120}
KERNELS_S=${KERNELS_S:-60}
KERNELS_ARGS=${KERNELS_ARGS:-}
REPORT_ARGS=${REPORT_ARGS:-}
PY=${PYTHON:-$(command -v python || command -v python3)}
PYTEST_ARGS=${PYTEST_ARGS:-}
ARCHIVE=${ARCHIVE:-}
for s in $STEPS; do          # every name before the first step: a typo found at step 3
  case $s in                 # spent the device time of steps 1-2 and brought nothing back
    install|report|tests|guard|profile|scale|resources|kernels) ;;
    *) echo "unknown step $s (install, report, tests, guard, profile, scale, resources," \
            "kernels)" >&2
       exit 2 ;;
  esac
done
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
{ date -u; timeout 30 nvidia-smi 2>&1 || echo "no nvidia-smi (or it hung)"; } > "$OUT/machine.txt"
for s in $STEPS; do
  case $s in
    install) step install "$INSTALL_S" "$PY" -m pip install --no-deps --no-build-isolation -e . ;;
    report)
      # shellcheck disable=SC2086  # REPORT_ARGS: several words on purpose
      step gpu_report "$REPORT_S" "$PY" bench/gpu_report.py --budget $((REPORT_S - 30)) \
        --out "$OUT" $REPORT_ARGS ;;
    guard)      # the attention path's error against float64 as the logits grow (its guard)
      # shellcheck disable=SC2086  # GUARD_ARGS: several words on purpose
      step attention_guard "$GUARD_S" "$PY" bench/attention_guard.py $GUARD_ARGS \
        --out "$OUT/attention_guard.json" ;;
    profile)    # why the loss takes its time: every engine's rows and a profiler breakdown
      # shellcheck disable=SC2086  # PROFILE_ARGS: several words on purpose
      step loss_profile "$PROFILE_S" "$PY" bench/loss_profile.py --budget $((PROFILE_S - 60)) \
        --out "$OUT" $PROFILE_ARGS ;;
    tests)      # -v: one line per test as it ends, so a run stopped at its limit still
      # names every test it got through (the junit XML is only written at the end)
      # shellcheck disable=SC2086  # PYTEST_ARGS: several words on purpose
      step pytest "$TESTS_S" "$PY" -m pytest --benchmark-disable -v --tb=short $PYTEST_ARGS \
        -p no:cacheprovider -o junit_family=xunit2 --junitxml="$OUT/pytest.xml" ;;
    scale)      # issue 9's scale study: HierTail epochs at 100k and 1M nodes, loss in fp32
      # and in bf16 (not a default step: about SCALE_S seconds per dtype)
      for dt in $SCALE_DTYPES; do
        # shellcheck disable=SC2086  # SCALE_SIZES: several words on purpose
        step "scale_$dt" "$SCALE_S" "$PY" bench/scale.py --device cuda --sizes $SCALE_SIZES \
          --methods hiertail --epochs "$SCALE_EPOCHS" --warmup "$SCALE_WARMUP" --loss-dtype "$dt" \
          --time-budget $((SCALE_S / 2 - 10)) --no-plot --out "$OUT/scale_$dt"
      done ;;
    resources)  # registers / spills / shared memory of the loss kernels' fixed tiles, as
      # this image's triton compiles them (bench/kernel_resources.py; compile only)
      step kernel_resources "$RESOURCES_S" "$PY" bench/kernel_resources.py --fixed-only \
        --dtypes fp32 bf16 --workers 8 --out "$OUT" ;;
    kernels)    # the loss's LSE call on flash / memory-efficient / cuDNN attention: time
      # against SDPA bf16 and error against float64 (bench/attention_kernels.py)
      # shellcheck disable=SC2086  # KERNELS_ARGS: several words on purpose
      step attention_kernels "$KERNELS_S" "$PY" bench/attention_kernels.py --out "$OUT" \
        $KERNELS_ARGS ;;
  esac
done
if [ -n "$ARCHIVE" ]; then     # written beside, then moved: ARCHIVE may lie inside $OUT
  tmp=$(mktemp "${TMPDIR:-/tmp}/gpu_session.XXXXXX")
  tar czf "$tmp" --exclude="./$(basename "$ARCHIVE")" -C "$OUT" . && mv "$tmp" "$ARCHIVE" \
    && echo "archived $OUT in $ARCHIVE"
fi
exit 0
