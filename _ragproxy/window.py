"""window_fit: keep a request's message list inside the model's context window.  (Being written.)

May import: compress.
"""
from __future__ import annotations

from .compress import Outcome  # noqa: F401
