"""Packaging for hiertail_fast.

`kernels/` (Triton kernels and launchers) lives at the top level of the repository but is
installed as `hiertail_fast.kernels`, so the generic name `kernels` is never claimed in
site-packages.
"""
from setuptools import setup

PACKAGES = [
    "hiertail_fast",
    "hiertail_fast.reference",
    "hiertail_fast.ops",
    "hiertail_fast.nn",
    "hiertail_fast.data",
    "hiertail_fast.baselines",
    "hiertail_fast.kernels",
]

setup(
    name="hiertail_fast",
    version="0.1.0",
    description=(
        "Fast, memory-lean HierTail (KDD'24): long-tail node classification with fused "
        "class-balanced contrastive losses, sparse GCN propagation and top-k pooling kernels"
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=PACKAGES,
    package_dir={"hiertail_fast.kernels": "kernels"},
    # psutil: memory figures of bench/scale.py (the main job) and the benchmark suites
    install_requires=["torch>=2.4", "numpy", "scipy", "tqdm", "matplotlib", "psutil"],
    extras_require={
        # triton ships with CUDA builds of torch; on CPU-only machines it is only needed to run
        # the kernels under TRITON_INTERPRET=1 (tests), so it is listed here, never imported
        # by `import hiertail_fast`.
        "triton": ["triton>=3.0"],
        "test": [
            "pytest",
            "pytest-benchmark",
            "hypothesis",
            "triton>=3.0",
            "torch_geometric",
            "scikit-learn",
            "imbalanced-learn",
        ],
        "pyg": ["torch-scatter", "torch-sparse"],
    },
    entry_points={"console_scripts": ["hiertail-train=hiertail_fast.__main__:main"]},
)
