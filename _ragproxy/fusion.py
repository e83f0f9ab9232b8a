"""Merging ranked lists: score fusion (zscore_fusion) and reciprocal rank fusion (rrf).

Used twice: to fuse a knowledge base's lexical and dense lists (``kb``), and
to merge the lists of several knowledge bases (``retrieval``).  One formula,
one constant (RRF_K), one depth (FUSION_DEPTH).

May import: nothing (the standard library only).
"""
from __future__ import annotations

import math

RRF_K = 60
# Hybrid search takes this many candidates from each retriever, and score
# fusion scales each list by the statistics of its top this-many, whatever
# top_k is: a search for 5 returns the first 5 of a search for 100.
FUSION_DEPTH = 100


def zscore_fusion(lists):
    """Score fusion on each retriever's own scale: ``[(row, fused, {retriever: score, ..., "fused": f})]``.

    BM25 scores are unbounded and cosines crowd near each other, so raw
    scores cannot be added.  Each list is mapped through the distribution of
    its top _FUSION_DEPTH scores, (s - (mean - 3 sd)) / (6 sd), and the
    weighted values are summed; a chunk missing from a list gets 0 there, the
    floor of that scale.  On SciFact train this beat reciprocal rank by about
    +0.025 nDCG@10 (bench/README.md): it keeps how far apart the scores are.

    Only ranks within _FUSION_DEPTH count towards the fused score, so a
    search for 5 is exactly the first 5 of a search for 500; chunks found
    only deeper than that (when more than _FUSION_DEPTH are asked for) follow.
    """
    fused, deeper, detail = {}, {}, {}
    for name, ranked, weight in lists:
        if not ranked:
            continue
        top = [score for _, score in ranked[:FUSION_DEPTH]]
        mean = math.fsum(top) / len(top)
        spread = 6.0 * math.sqrt(math.fsum((x - mean) ** 2 for x in top) / len(top)) or 1.0
        floor = mean - spread / 2.0
        for rank, (row, score) in enumerate(ranked):
            into = fused if rank < FUSION_DEPTH else deeper
            into[row] = into.get(row, 0.0) + weight * (score - floor) / spread
            detail.setdefault(row, {})[name] = score
    order = sorted(fused, key=lambda r: (-fused[r], r))
    order += sorted((r for r in deeper if r not in fused), key=lambda r: (-deeper[r], r))
    value = {**deeper, **fused}
    return [(row, value[row], dict(detail[row], fused=value[row])) for row in order]


def reciprocal_ranks(lists):
    """``{key: fused}`` over ``[(keys best first, weight), ...]``, in the order keys were first seen.

    A key's fused value is the sum over the lists that hold it of weight /
    (RRF_K + rank), ranks counted from 1: the reciprocal rank fusion of
    Cormack et al. (2009), where k = 60 is their constant.
    """
    fused = {}
    for keys, weight in lists:
        for rank, key in enumerate(keys, 1):
            fused[key] = fused.get(key, 0.0) + weight / (RRF_K + rank)
    return fused


def rrf(lists):
    """Reciprocal rank fusion of retrievers' lists ``[(name, [(row, score)], weight)]``:
    ``[(row, fused, {retriever: score, ..., "rrf": fused})]``, best first, ties to the lower row."""
    fused = reciprocal_ranks([([row for row, _ in ranked], weight) for _, ranked, weight in lists])
    detail = {}
    for name, ranked, _ in lists:
        for row, score in ranked:
            detail.setdefault(row, {})[name] = score
    order = sorted(fused, key=lambda r: (-fused[r], r))
    return [(row, fused[row], dict(detail[row], rrf=fused[row])) for row in order]
