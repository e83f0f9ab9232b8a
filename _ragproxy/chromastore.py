"""A knowledge base's chunks and vectors in a Chroma collection (the vector store interface on Chroma).

(Being written: issue 16.)

May import: nothing yet.
"""
from __future__ import annotations
