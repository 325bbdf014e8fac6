"""Datasets: the uniform .npz format, splits, and the synthetic long-tail graph generator."""
