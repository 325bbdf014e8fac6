#!/bin/bash
# A follow-up device call (2026-11-27): after the loss dispatch / guard changes, measure what
# they rest on, most important first, each step under its own limit (bench/gpu_session.sh):
#   1. attention_guard --dtype bfloat16 (the bf16 limits) and --engines triton[tf32x3] torch
#      (the 3xTF32 limits), 2. the CUDA tests of the loss and dispatch, 3. loss_profile rows at
#      20k / 50k / 100k (TRITON_MIN_ROWS, bf16 on every engine), 4. the scale study at 100k
#      and 1M nodes, fp32 (one epoch: ~40 s) and bf16 (warm-up + one epoch).
# Everything lands in $OUT/followup.tgz (a device call brings back at most 8 files), plus
# the profile's markdown and the step summaries beside it.
#   A=$OUT; OUT=$A bash bench/gpu_followup.sh
set -u
A=${OUT:?set OUT to the folder that comes back}
R=${TMPDIR:-/tmp}/gpu_followup
rm -rf "$R" && mkdir -p "$R"
s() { env OUT="$R/$1" "${@:2}" bash bench/gpu_session.sh; }
s install STEPS=install
s guard_bf16 STEPS=guard GUARD_S=45 GUARD_ARGS="--dtype bfloat16 --bounds 1024 4096 8192 16384"
s guard_tf32x3 STEPS=guard GUARD_S=45 \
  GUARD_ARGS="--engines triton[tf32x3] torch --bounds 64 128 256 512 1024 2048"
s tests STEPS=tests TESTS_S=100 PYTEST_ARGS="-n 16 tests/test_attention_lse.py \
  tests/test_balanced_contrastive_loss.py tests/test_balanced_contrastive_loss_triton.py \
  tests/test_dispatch.py tests/test_positive_blocks.py tests/test_bench_loss_profile.py \
  tests/test_bench_loss_grid.py tests/test_contrastive_numerics.py"
s profile STEPS=profile PROFILE_S=150 PROFILE_ARGS="--sizes 20000:64 50000:64 100000:64 \
  --engines auto attention torch triton --no-profile"
s scale32 STEPS=scale SCALE_DTYPES=float32 SCALE_WARMUP=0 SCALE_EPOCHS=1 SCALE_S=240
s scale16 STEPS=scale SCALE_DTYPES=bfloat16 SCALE_WARMUP=1 SCALE_EPOCHS=1 SCALE_S=160
tar czf "$A/followup.tgz" -C "$R" . && cp "$R/profile/loss_profile.md" "$A/" 2>/dev/null
cat "$R"/*/summary.txt
