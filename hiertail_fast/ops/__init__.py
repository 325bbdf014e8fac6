"""Autograd Functions and the one place that picks a backend (see `_dispatch.py`)."""
