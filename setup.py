"""Packaging shim: the metadata, packages and the `kernels/` -> `hiertail_fast.kernels` mapping
live in pyproject.toml ([project], [tool.setuptools]); this file only lets tools that still run
`python setup.py ...` work."""
from setuptools import setup

setup()
