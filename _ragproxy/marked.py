"""Marked retrieval context (<sbproxy-retrieval> blocks) in message text: the parser (being written: issue 18).

May import: nothing.
"""
from __future__ import annotations
