"""Dense search: exact cosine top-k over float32 rows, and the compact copies beside them.

numpy when it is present (``deps.np``), else plain Python.  A knowledge base
may keep int8 or float16 rows, or one sign bit per dimension, scanned first
and then re-scored exactly.  Functions of arrays only; the store keeps the
arrays on disk and picks which search a generation gets.

May import: deps, npy, placement.
"""
from __future__ import annotations

import functools
import heapq
import math
import operator
import os
import threading

from . import deps, placement
from .npy import NpyArray


def _unit(query_vec):
    """The query as a list of floats of length 1, or None for a zero vector."""
    q = [float(x) for x in query_vec]
    norm = math.sqrt(sum(x * x for x in q))
    if not norm or math.isnan(norm):
        return None
    return [x / norm for x in q]


def _vector_dim(vectors):
    np = deps.np
    if np is not None and isinstance(vectors, np.ndarray):
        return vectors.shape[1] if vectors.ndim == 2 else None
    if isinstance(vectors, NpyArray):
        return vectors.dim
    return len(vectors[0]) if len(vectors) else None


def _check_candidates(rows, n):
    for r in rows:
        if not 0 <= r < n:
            raise IndexError("candidate row %d out of range for %d vectors" % (r, n))


_TOP_BLOCK = 1024


def _np_top(scores, rows, k):
    """Indices into `scores` of the k best, best first, ties to the lower index.

    `rows`, when given, must be ascending (it maps indices to row numbers).
    """
    np = deps.np
    n = scores.shape[0]
    if k >= n:
        part = np.arange(n)
    else:
        # A full argpartition costs ~15 ms at a million scores.  The k-th
        # largest of the block maxima is a lower bound for the k-th largest
        # score (k distinct scores reach it), so only the few scores above
        # it need a real selection: ~1 ms.
        blocks = n // _TOP_BLOCK
        if blocks >= 4 * k:
            maxima = scores[:blocks * _TOP_BLOCK].reshape(blocks, _TOP_BLOCK).max(axis=1)
            bound = np.partition(maxima, blocks - k)[blocks - k]
            cand = np.flatnonzero(scores >= bound)
        else:
            cand = np.arange(n)
        sub = scores[cand]
        if cand.size > k:
            kth = np.partition(sub, cand.size - k)[cand.size - k]
            # Ties at the k-th score go to the lowest indices, so results do
            # not depend on how the selection happened to split them.
            above = cand[sub > kth]
            tied = cand[sub == kth][:k - above.size]
            part = np.concatenate((above, tied))
        else:
            part = cand
    order = np.lexsort((part, -scores[part]))
    return part[order]


def _checked_query(vectors, query_vec):
    """The unit-length query, or None for a zero vector; its dimension must match the rows'."""
    dim = _vector_dim(vectors)
    if len(query_vec) != dim:
        raise ValueError("query has %d dimensions, vectors have %s" % (len(query_vec), dim))
    return _unit(query_vec)


def dense_top_k(vectors, query_vec, k, candidates=None):
    """Exact cosine top-k over L2-normalised `vectors`: [(row, score)], best first.

    `vectors` is a numpy 2-D array (a memmap is fine), an array from
    _npy_read_array, or a list of rows.  `candidates` restricts the search to
    those row numbers.  The query is normalised here; a zero query matches
    nothing.
    """
    np = deps.np
    if vectors is None or k <= 0 or not len(vectors):
        return []
    q = _checked_query(vectors, query_vec)
    if q is None:
        return []
    n = len(vectors)
    if np is not None:
        mat = vectors
        if not isinstance(mat, np.ndarray):
            mat = np.asarray(mat.tolist() if isinstance(mat, NpyArray) else mat, dtype=np.float32)
        qv = np.asarray(q, dtype=np.float32)
        rows = None
        if candidates is None:
            scores = mat @ qv
        else:
            if isinstance(candidates, np.ndarray):
                rows = np.unique(candidates.astype(np.int64, copy=False))
            else:
                rows = np.unique(np.fromiter(candidates, dtype=np.int64))
            if not rows.size:
                return []
            if rows[0] < 0 or rows[-1] >= n:
                _check_candidates((int(rows[0]), int(rows[-1])), n)
            scores = mat[rows] @ qv
        top = _np_top(scores, rows, k)
        ids = top if rows is None else rows[top]
        return [(int(r), float(s)) for r, s in zip(ids.tolist(), scores[top].tolist())]
    rows = None
    if candidates is not None:
        rows = sorted(set(int(r) for r in candidates))
        _check_candidates(rows[:1] + rows[-1:], n)
    scores = _pure_scores(vectors, q, rows)
    ids = range(n) if rows is None else rows
    # nlargest on (score, -row) keeps ties on the lower row, as numpy does.
    best = heapq.nlargest(k, zip(scores, map(operator.neg, ids)))
    return [(-neg_row, score) for score, neg_row in best]


def _pure_scores(vectors, q, rows=None):
    """Dot products of `q` with the rows (all, or those listed), lazily."""
    dot = getattr(math, "sumprod", None)  # 3.12+: about twice as fast
    mul = operator.mul
    if dot is None:
        def dot(a, b):
            return sum(map(mul, a, b))
    if isinstance(vectors, NpyArray):
        if rows is None and vectors.flat is not None:
            flat, d = vectors.flat, vectors.dim
            return (dot(flat[i:i + d], q) for i in range(0, len(vectors) * d, d))
        if rows is None:
            return (dot(r, q) for r in vectors)
        row = vectors.row
        return (dot(row(i), q) for i in rows)
    if rows is None:
        return (dot(r, q) for r in vectors)
    return (dot(vectors[i], q) for i in rows)


def _query_for_copy(copy, vectors, query_vec, k):
    """The checked query for scanning a compact copy of ``vectors``; None when nothing can match."""
    if vectors is None or k <= 0 or not len(vectors):
        return None
    if len(copy) != len(vectors):
        raise ValueError("compact copy has %d rows, vectors have %d" % (len(copy), len(vectors)))
    return _checked_query(vectors, query_vec)


def dense_top_k_compact(compact, vectors, query_vec, k, oversample=4, scales=None, candidates=None):
    """Top-k via a compact copy, re-scored exactly: [(row, score)], best first.

    `compact` is the float16 copy (or int8 with per-row `scales`) of the
    float32 `vectors`.  It is scanned first; the best k*oversample rows are
    then scored exactly against `vectors`, so scores are the float32 ones.
    """
    np = deps.np
    if compact is None or candidates is not None:
        return dense_top_k(vectors, query_vec, k, candidates)
    q = _query_for_copy(compact, vectors, query_vec, k)
    if q is None:
        return []
    n = len(vectors)
    want = min(n, max(k, int(k * oversample)))
    if np is not None:
        qv = np.asarray(q, dtype=np.float32)
        scores = np.empty(n, dtype=np.float32)
        _parallel_rows(n, _SCAN_BLOCK, _float_scan(compact, qv, scores))
        if scales is not None:
            scores *= scales
        picked = _np_top(scores, None, want)
        return dense_top_k(vectors, q, k, picked.tolist())
    approx = _pure_scores(compact, q)
    if scales is not None:
        approx = map(operator.mul, approx, scales)
    picked = heapq.nlargest(want, zip(approx, map(operator.neg, range(n))))
    return dense_top_k(vectors, q, k, [-neg for _, neg in picked])


# Candidates a sign-bit scan hands to exact re-scoring: k * this, or one row in
# _BINARY_POOL_SHARE, whichever is more.  Measured on 40,000 all-MiniLM-L6-v2
# embeddings of papers and code with real queries, recall@10 against exact
# search was 0.989 at 32 per k and 0.996 at 64; the pool needed for a given
# recall grew by about a fifth per doubling of the collection, slower than
# the share.  Re-scoring reads whole float32 rows at random, but only a few
# thousand of them at a million.
_BINARY_POOL_PER_K = 64
_BINARY_POOL_SHARE = 256


def binary_pool(n, k):
    """How many candidates dense_top_k_binary re-scores for top-k of n rows."""
    return min(n, max(k * _BINARY_POOL_PER_K, -(-n // _BINARY_POOL_SHARE)))


def dense_top_k_binary(codes, vectors, query_vec, k, pool=None, candidates=None):
    """Top-k via sign-bit codes, re-scored exactly: [(row, score)], best first.

    `codes` holds one bit per dimension (set where the component is
    positive, see _compact_rows), so a row is 1/32 of its float32 size.  The
    rows whose bits differ least from the query's (Hamming distance, an
    estimate of the angle between them) are scored exactly against
    `vectors`: the best `pool` of them, binary_pool() by default.  Scores
    are therefore the float32 ones; what the bits can cost is recall, when a
    true neighbour falls outside the pool.
    """
    np = deps.np
    if codes is None or candidates is not None:
        return dense_top_k(vectors, query_vec, k, candidates)
    q = _query_for_copy(codes, vectors, query_vec, k)
    if q is None:
        return []
    n = len(vectors)
    want = min(n, max(k, pool if pool is not None else binary_pool(n, k)))
    qcode = _sign_bits(q, codes.shape[1] if np is not None else codes.dim)
    if np is not None:
        words = codes.view(np.uint64) if codes.shape[1] % 8 == 0 else codes
        qwords = np.frombuffer(qcode, dtype=words.dtype)
        dist = np.empty(n, dtype=np.uint16)
        _parallel_rows(n, _BINARY_BLOCK, _hamming_scan(words, qwords, dist))
        return dense_top_k(vectors, q, k, _np_nearest(dist, want))
    qint = int.from_bytes(qcode, "big")
    dist = (_popcount(qint ^ int.from_bytes(codes.row_bytes(i), "big")) for i in range(n))
    picked = heapq.nsmallest(want, zip(dist, range(n)))
    return dense_top_k(vectors, q, k, [row for _, row in picked])


_popcount = getattr(int, "bit_count", None) or (lambda x: bin(x).count("1"))  # int.bit_count: 3.10+


def _sign_bits(row, width):
    """`width` bytes: bit j (most significant first) set where row[j] > 0."""
    out = bytearray(width)
    for j, x in enumerate(row):
        if x > 0:
            out[j >> 3] |= 0x80 >> (j & 7)
    return bytes(out)


def binary_width(dim):
    """Bytes per sign-bit row: whole 64-bit words, so the scan can XOR words."""
    return -(-dim // 64) * 8


@functools.lru_cache(maxsize=None)
def _popcount_table(np):
    """Bits set in each byte value, for numpy releases without bitwise_count."""
    return np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


def _np_nearest(dist, want):
    """Row numbers of the `want` smallest distances (ties to the lower row).

    A distance is a small integer, so one counting pass finds the cut-off
    and one comparison takes the rows below it: about a third of an
    argpartition's time at a million rows.
    """
    np = deps.np
    counts = np.bincount(dist)
    cut = int(np.searchsorted(np.cumsum(counts), want))
    below = np.flatnonzero(dist < cut)
    at_cut = np.flatnonzero(dist == cut)[:want - len(below)]
    return np.concatenate((below, at_cut))


def _hamming_scan(words, qwords, dist, popcount=True):
    """A block scanner (for _parallel_rows): dist[i] = bits differing in row i.

    Bits are counted by numpy's popcount ufunc (numpy 2.0+) unless
    ``popcount`` is false or it is missing; a 256-entry table counting byte
    by byte is several times slower.
    """
    np = deps.np
    count = getattr(np, "bitwise_count", None) if popcount else None
    table = _popcount_table(np) if count is None else None

    def scan(lo, hi):
        block = words[lo:hi] ^ qwords
        if count is not None:
            np.sum(count(block), axis=1, dtype=np.uint16, out=dist[lo:hi])
        else:
            np.sum(table[block.view(np.uint8)], axis=1, dtype=np.uint16, out=dist[lo:hi])
    return scan


_SCAN_BLOCK = 8192          # rows per float32 temporary (12 MiB at 384 dims): stays in cache
_BINARY_BLOCK = 32768       # rows per XOR temporary (1.5 MiB at 384 dims)
_SCAN_PARALLEL_ROWS = 65536  # below this, starting threads costs more than it saves


def _float_scan(compact, qv, scores):
    """A block scanner (for _parallel_rows): ``scores[i] = compact[i] . qv``.

    No BLAS kernel takes int8 or float16, so each block is converted into a
    float32 buffer, one per thread and reused.  The product is einsum, not
    BLAS: a multithreaded BLAS gemv per block was measured 2-6x slower than
    one thread on a busy 2-core machine (its threads spin against each
    other), while einsum releases the GIL, so our own threads scale.
    """
    local = threading.local()

    def scan(lo, hi):
        np = deps.np
        buf = getattr(local, "buf", None)
        if buf is None:
            buf = local.buf = np.empty((_SCAN_BLOCK, compact.shape[1]), dtype=np.float32)
        block = buf[:hi - lo]
        np.copyto(block, compact[lo:hi], casting="unsafe")
        np.einsum("ij,j->i", block, qv, out=scores[lo:hi])
    return scan


def _parallel_rows(n, block, scan):
    """Call scan(lo, hi) over rows 0..n in blocks, on up to 4 threads.

    numpy releases the GIL in the kernels the scanners use, so each thread,
    one slice of rows each, runs on its own core.
    """
    workers = 1 if n < _SCAN_PARALLEL_ROWS else min(4, os.cpu_count() or 1)
    bounds = [n * i // workers for i in range(workers + 1)]

    def run(lo, hi):
        for start in range(lo, hi, block):
            scan(start, min(start + block, hi))

    def run_beside(lo, hi):
        placement.free_thread()   # not on the one CPU of the connection thread that started it
        run(lo, hi)

    threads = [threading.Thread(target=run_beside, args=(bounds[i], bounds[i + 1]), daemon=True)
               for i in range(1, workers)]
    for thread in threads:
        thread.start()
    run(bounds[0], bounds[1])
    for thread in threads:
        thread.join()


def normalise_rows(rows):
    """L2-normalised float32 rows (numpy array or list of lists); zero rows stay zero."""
    np = deps.np
    if np is not None:
        arr = np.asarray(rows, dtype=np.float32)
        if arr.ndim != 2:
            raise ValueError("vectors must be 2-D, got shape %r" % (arr.shape,))
        norms = np.sqrt(np.einsum("ij,ij->i", arr, arr, dtype=np.float64))
        norms[norms == 0] = 1.0
        return (arr / norms[:, None].astype(np.float32)).astype(np.float32, copy=False)
    out = []
    for row in rows:
        row = [float(x) for x in row]
        norm = math.sqrt(sum(x * x for x in row)) or 1.0
        out.append([x / norm for x in row])
    return out


def compact_rows(rows, kind):
    """(compact rows, per-row scales or None) for kind "f16", "i8" or "b1"."""
    np = deps.np
    if kind == "b1":
        if np is not None and isinstance(rows, np.ndarray):
            bits = np.packbits(rows > 0, axis=1)
            width = binary_width(rows.shape[1])
            if bits.shape[1] < width:
                bits = np.concatenate((bits, np.zeros((len(bits), width - bits.shape[1]), np.uint8)), axis=1)
            return bits, None
        return [_sign_bits(row, binary_width(len(row))) for row in rows], None
    if kind == "f16":
        if np is not None and isinstance(rows, np.ndarray):
            return rows.astype(np.float16), None
        return rows, None  # the appender packs float16 itself
    if np is not None and isinstance(rows, np.ndarray):
        peak = np.abs(rows).max(axis=1) if rows.size else np.zeros(len(rows), np.float32)
        scales = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
        return np.rint(rows / scales[:, None]).astype(np.int8), scales
    out, scales = [], []
    for row in rows:
        peak = max((abs(x) for x in row), default=0.0)
        scale = peak / 127.0 if peak > 0 else 1.0
        scales.append(scale)
        out.append([max(-127, min(127, int(round(x / scale)))) for x in row])
    return out, scales
