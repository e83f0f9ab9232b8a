"""Context compression levers over a message list (being written: issue 18).

May import: nothing yet.
"""
from __future__ import annotations
