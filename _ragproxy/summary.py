"""summary_buffer: replace older plain-text history with an incremental summary.  (Being written.)

May import: compress, sessionstate.
"""
from __future__ import annotations

from . import sessionstate  # noqa: F401
from .compress import Outcome  # noqa: F401
