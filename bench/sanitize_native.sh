#!/usr/bin/env bash
# The C kernels of the CPU engines (hiertail_fast/ops/*.c) under AddressSanitizer +
# UndefinedBehaviorSanitizer: their tests and a random loss / nearest-prototype fuzz on small
# row blocks (the edges), with sanitized builds in a fresh cache. Any report aborts the test.
#   bash bench/sanitize_native.sh            # OpenMP builds (torch's libgomp), ~2 min
#   SAN_SERIAL=1 bash bench/sanitize_native.sh
# Needs gcc with libasan / libubsan. First run on 2026-11-28 (2-core CPU VM): no report; one
# found in an internal helper (_nearest_rows.native_step, a strided single row), fixed.
set -u -o pipefail
cd "$(dirname "$0")/.."
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
export PYTHONPATH="$PWD/bench${PYTHONPATH:+:$PYTHONPATH}" HIERTAIL_NATIVE_CACHE="$cache"
export LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
status=0
run() { timeout 900 python -m pytest -p _sanitize_plugin -p no:cacheprovider -x -q "$@" \
          | tail -2 || status=1; }
run tests/test_native.py tests/test_block_exp.py tests/test_lse_symmetric.py \
    tests/test_positive_blocks.py tests/test_tied_keys.py tests/test_max_fold.py \
    tests/test_nearest_prototype.py tests/test_contrastive_numerics.py \
    tests/test_balanced_contrastive_loss.py
HIERTAIL_FUZZ_EXAMPLES=300 HIERTAIL_FUZZ_RANDOM=1 HIERTAIL_FUZZ_ROWS=40 \
HIERTAIL_CPU_BLOCK_BYTES=128 run tests/test_fuzz.py -k "contrastive or nearest"
exit $status
