"""The vector store interface a knowledge base is written against, and the built-in store behind it.

(Being written: issue 16.)

May import: nothing yet.
"""
from __future__ import annotations
