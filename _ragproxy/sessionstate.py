"""Per-session lever state (summary_buffer): SQLite under the data directory, or Redis.  (Being written.)

May import: nothing.
"""
from __future__ import annotations
