"""A client for a Chroma server's HTTP API (v2), with the standard library.

(Being written: issue 16.)

May import: nothing yet.
"""
from __future__ import annotations
