"""The compression rewriter: picks a request's levers and runs them in declared order.  (Being written.)

May import: compress.
"""
from __future__ import annotations

from . import compress  # noqa: F401
