#!/bin/bash
# The next device call, prepared 2026-11-27 (session 16, no GPU lent): what issue 9 still needs
# measured, most important first, each step under its own limit (bench/gpu_session.sh):
#   1. the CUDA tests of the new Triton positives kernel and of the Triton loss engine (does it
#      compile and hold its tolerances on the card; with the duplicate-row tie rule of session
#      17, tests/test_tied_keys.py; session 18's autocast path, tests/test_amp.py: CUDA autocast
#      bf16 -> the bf16 kernels, fp16 -> the fp16 path; the second-derivative guard and the
#      column-major tie rule, tests/test_hardening.py; session 19's custom ops under
#      torch.compile on CUDA, tests/test_compile.py and tests/test_compile_graph_ops.py; session
#      20's torch.func transforms over the CUDA kernels' backward, tests/test_func_transforms.py;
#      session 21's learnable tau with 16-bit rows, tests/test_balanced_contrastive_loss.py, the
#      official variant's exact ties between distinct rows, tests/test_tied_keys.py, the
#      near-tie re-decision of nearest_prototype on degenerate input on the Triton backend,
#      tests/test_nearest_prototype.py, the logit-overflow and dense-tensor checks on CUDA,
#      tests/test_bad_inputs.py; session 22's relative mode of the official LSE kernels,
#      tests/test_balanced_contrastive_loss_triton.py and tests/test_contrastive_numerics.py:
#      do the backward's recomputed scores equal the forward's row max on the card?; session
#      23's official arg-max entry taken out of the torch row-block engine's GEMMs on CUDA,
#      ops/_max_fold.py, tests/test_contrastive_numerics.py's shared-argmax cases on "cuda",
#      and the Triton backward's argmax_coef (the positives' share in its key-side fold),
#      tests/test_balanced_contrastive_loss_triton.py; bench/kernel_resources.py compiles it;
#      session 24: that fold's per-block launches cut, 1,914 -> 1,564 kernel-launching torch
#      calls per official loss at 20k, which the profile's "auto" official rows at 20k time;
#      session 25: a launch the card refuses for shared memory falls back to a smaller tile,
#      tests/test_triton_tile_fallback.py, and the Ampere fp32 tile 32x64x4 run on this card
#      by request, test_lean_tiles[32x64x4] in tests/test_balanced_contrastive_loss_triton.py;
#      session 26: top-k pooling's 16-bit scores and backward in float32, the Triton score
#      kernel's output now float32, tests/test_topk_pool.py; session 28: the ops' IEEE GEMMs
#      under TF32 settings, tests/test_matmul_precision.py; session 29: GCN degrees summed in
#      float64 on the card too, and the Triton loss backward's int64 level offsets,
#      tests/test_gcn_propagate.py and the Triton loss tests above; session 33: the mutation
#      audit's corner tests of the Triton loss kernels, the attention adapter, the graph
#      kernels and the compile layer, the four "corners" test files below),
#      2. the loss kernels' registers / spills as
#      the image's triton compiles them (bench/kernel_resources.py found the LSE backward's
#      fixed tile spilling ~1 KB per thread), 3. loss_profile rows at d 64 and 128, N 20k and
#      100k, the automatic choice against the Triton modes (the other engines were timed at
#      d 64 on 2026-11-27; their rows would not fit the budget): the official variant on the
#      Triton engine now runs
#      the positives kernel (was 82-95 ms at 20k, 245 ms at 100k), the Triton kernels at d 128
#      (never timed: TRITON_MAX_DIM), the LSE kernels on the spill-free "lean" tile
#      (kernels/_utils.LEAN_TILES), three levels in the shared-keys mode (one exp per entry for
#      all levels), the torch / attention engines with the positives kernel
#      ($HIERTAIL_POSITIVES=triton), then the autotuned tiles, whose choice is recorded.
# About 8 minutes of command time: run with the device tool's timeout_s = 560.
#   A=$OUT; OUT=$A bash bench/gpu_next.sh
# Then, on any machine: python bench/next_defaults.py <profile/loss_profile.json from next.tgz>
set -u
A=${OUT:?set OUT to the folder that comes back}
R=${TMPDIR:-/tmp}/gpu_next
rm -rf "$R" && mkdir -p "$R"
s() { env OUT="$R/$1" "${@:2}" bash bench/gpu_session.sh; }
s install STEPS=install
s tests STEPS=tests TESTS_S=90 CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTEST_ARGS="-n 16 \
  tests/test_balanced_contrastive_loss_positives.py tests/test_balanced_contrastive_loss.py \
  tests/test_balanced_contrastive_loss_triton.py tests/test_tied_keys.py tests/test_amp.py \
  tests/test_hardening.py tests/test_compile.py tests/test_compile_graph_ops.py \
  tests/test_func_transforms.py tests/test_nearest_prototype.py tests/test_bad_inputs.py \
  tests/test_contrastive_numerics.py tests/test_triton_tile_fallback.py tests/test_topk_pool.py \
  tests/test_matmul_precision.py tests/test_gcn_propagate.py tests/test_triton_loss_corners.py \
  tests/test_attention_lse_corners.py tests/test_graph_kernel_corners.py \
  tests/test_compile_layer_corners.py"
s resources STEPS=resources RESOURCES_S=60
s profile STEPS=profile PROFILE_S=300 PROFILE_ARGS="--sizes 20000:64 100000:64 20000:128 \
  100000:128 --engines auto triton triton[lean] triton[shared] triton[shared+lean] \
  torch+triton attention+triton triton[tf32x3+autotune] --no-profile"
tar czf "$A/next.tgz" -C "$R" . && cp "$R/profile/loss_profile.md" "$A/" 2>/dev/null
cat "$R"/*/summary.txt
