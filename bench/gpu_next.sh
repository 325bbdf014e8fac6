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
#      ($HIERTAIL_POSITIVES=triton), then the autotuned tiles, whose choice is recorded;
#      session 54: the LSE kernels' automatic key splits (at 20k) against triton[nosplit];
#      session 55: the table's 8 warps (the same tiles) against triton[warps4], the launches
#      timed before; session 66: 4. before the profile, the loss's LSE call on each of
#      PyTorch's attention kernels (bench/attention_kernels.py: flash with the folded bias, as
#      the bf16 path runs it, against cuDNN attention with the same operands at head dim 72
#      instead of flash's 96, and with its own bf16 bias; memory-efficient fp32 and bf16),
#      timed against SDPA bf16 and checked against float64: is cuDNN the bf16 path's kernel?
#      and in the profile, the whole exact bf16 loss with it (attention[cudnn],
#      $HIERTAIL_ATTENTION_BF16=cudnn) against the automatic row (attention on flash);
#      next_defaults.py gives the verdict
# About 8 minutes of command time (limits: install 40 s (4 s on 2026-12-04), tests 150 s,
# resources 60 s, kernels 40 s, profile 250 s): run with the device tool's timeout_s = 560.
#   A=$OUT; OUT=$A bash bench/gpu_next.sh
# Then, on any machine: python bench/next_defaults.py <profile/loss_profile.json>
# What comes back, if the call is stopped at its limit too: next.tgz is rewritten after every
# step before the profile (install, tests, resources, kernels: their logs and files), and the
# profile writes straight under $A/profile (loss_profile.py rewrites its JSON and markdown after every row):
# 6 files in all, under the device tool's 8. The sizes run in that order, 100k x 64 last (its
# other engines were timed on 2026-11-27; d 128 never was, and decides TRITON_MAX_DIM): ~128
# rows may not all fit the 190 s, and a row past the budget is reported as skipped.
set -u
A=${OUT:?set OUT to the folder that comes back}
R=${TMPDIR:-/tmp}/gpu_next
rm -rf "$R" && mkdir -p "$R"
s() { env OUT="$R/$1" "${@:2}" bash bench/gpu_session.sh
      tar czf "$R.tgz" -C "$R" . && mv "$R.tgz" "$A/next.tgz"; }   # (whole, or the last one)
s install STEPS=install INSTALL_S=40
# OMP_NUM_THREADS=1: 16 xdist workers on 16 cores, not 16 x 16 OpenMP threads
s tests STEPS=tests TESTS_S=150 OMP_NUM_THREADS=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 \
  PYTEST_ARGS="-n 16 \
  tests/test_balanced_contrastive_loss_positives.py tests/test_balanced_contrastive_loss.py \
  tests/test_balanced_contrastive_loss_triton.py tests/test_tied_keys.py tests/test_amp.py \
  tests/test_hardening.py tests/test_compile.py tests/test_compile_graph_ops.py \
  tests/test_func_transforms.py tests/test_nearest_prototype.py tests/test_bad_inputs.py \
  tests/test_contrastive_numerics.py tests/test_triton_tile_fallback.py tests/test_topk_pool.py \
  tests/test_matmul_precision.py tests/test_gcn_propagate.py tests/test_triton_loss_corners.py \
  tests/test_attention_lse_corners.py tests/test_graph_kernel_corners.py \
  tests/test_compile_layer_corners.py \
  tests/test_attention_lse.py::test_bf16_cudnn_kernel_on_the_card"
s resources STEPS=resources RESOURCES_S=60
s kernels STEPS=kernels KERNELS_S=40
env OUT="$A/profile" STEPS=profile PROFILE_S=250 PROFILE_ARGS="--sizes 20000:64 20000:128 \
  100000:128 100000:64 --engines auto attention[cudnn] triton triton[nosplit] triton[warps4] triton[lean] triton[shared] triton[shared+lean] \
  torch+triton attention+triton triton[tf32x3+autotune] --no-profile" bash bench/gpu_session.sh
cat "$R"/*/summary.txt "$A/profile/summary.txt"
