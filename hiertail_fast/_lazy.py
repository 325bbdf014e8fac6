"""Lazy public exports: a package lists `name -> defining module` and imports on first use, so
`import hiertail_fast` stays cheap and never imports triton or the kernels."""
from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_getattr(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """Module-level ``__getattr__`` for `package` resolving the names of `exports`."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__
