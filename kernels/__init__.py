"""Triton kernels and their launchers (installed as `hiertail_fast.kernels`).

No autograd and no model code here: launchers take contiguous tensors, pick block sizes
(`_utils.py`) and allocate outputs. Importing this package imports triton.
"""
