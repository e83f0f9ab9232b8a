"""The BM25 index: Okapi BM25 scored at build time, searched exactly, kept in .npy files.

A numpy path and a pure-Python path that return the same rankings, to the
bit; the index files are .npy arrays (``npy``) and a term table read in place.
The tokens it indexes and is asked for are an Analyzer's (``text``).

May import: defaults, deps, files, npy, text.
"""
from __future__ import annotations

import array
import bisect
import collections
import collections.abc
import heapq
import itertools
import json
import math
import mmap
import os
import threading

from . import deps
from .defaults import BM25_B, BM25_K1
from .files import atomic_write
from .npy import NpyArray, npy_read_flat, npy_write_array
from .text import gc_paused

# Relative slack when comparing score bounds, far above float32/float64
# rounding, so pruning never drops a document that could still make the top k.
_BOUND_SLACK = 1e-6
# After a failed try at the pruning threshold, the next try waits until what the
# terms still to come can add has halved: a try costs a partition of a term's
# postings, and trying at every term was a fifth of a 27-term query's time.
# Measured on an 80k-chunk index (mean per query, exact same results): a
# Claude Code prompt 400 -> 295 us, 8 SciFact claims at once 410 -> 250 us,
# one claim 150 -> 130 us, a CoSQA query 85 -> 80 us.
_RETRY_SHRINK = 0.5
# Kept small so re-partitioning candidates to re-estimate theta stays cheap next to one term's full add (not swept).
_THETA_CANDS = 4096


class BM25Index:
    """Okapi BM25 over pre-tokenized documents, scored eagerly at build time.

    Variant: Lucene's.  idf = ln(1 + (N - df + 0.5) / (df + 0.5)) (never
    negative) and term weight = idf * tf / (tf + k1 * (1 - b + b * dl / avgdl)).
    Each posting stores its finished weight, so a query only adds up the
    postings of its terms and keeps the best ``top_k``.  Terms are visited from
    the highest possible contribution down; once the k-th best score so far
    beats everything the remaining terms could add, those terms only update
    the documents still in the running (MaxScore).  A query whose terms have
    few postings in all is added up whole instead, in fewer array operations
    (EXHAUSTIVE_MAX_POSTINGS).  Results are exact, the same to the bit either way.

    Field weighting is the caller's: repeat the tokens of a title, heading, path
    or symbol name to boost them.  Recommended: title/heading/path tokens twice,
    body once (+0.004 nDCG@10 on SciFact over once).

    Storage is CSR by term: ``indptr`` (int32, vocabulary + 1), ``doc_ids``
    (int32, ascending within a term), ``weights`` (float32) and ``max_weights``
    (float32, per term).  A built index holds numpy arrays (else
    ``array.array``); a loaded one holds read-only views of the memory-mapped
    files, and its vocabulary is looked up in the file too (TermTable), so
    opening a large index costs almost nothing.  Both paths give the same
    rankings: a loaded index scores with numpy when it is already imported or
    the postings are many enough to pay for importing it (NUMPY_MIN_POSTINGS).
    """

    #: Postings (all the query's terms') up to which numpy adds every one up in a single bincount and looks
    #: for the best among the documents they name, instead of pruning term by term.  Pruning spends a few
    #: array operations a term, over the whole corpus's scores; each lets the GIL go, and under a proxy's
    #: concurrent requests the search waits to get it back each time, holding the lock below.  Measured on
    #: an 80k-chunk index (bench/RESULTS.md, session 20), median per query, exhaustive against pruned: up to
    #: 5,000 postings 31 against 58 us; 5,000-10,000 47 against 76 us; 10,000-20,000 78 against 92 us;
    #: 20,000-30,000 224 against 126 us, past the size (16,384 float64 scores, 128 KiB) where malloc gives
    #: each array fresh pages.  GIL hand-offs per search, a query of 8,303 postings: 6 against 19.  Since
    #: the first floor comes from one term's postings (_seed_floor) rather than a partition of every
    #: posting's score (session 24, best of 5 per query): SciFact and CoSQA questions of 16,384-32,768
    #: postings 110 against 185 us, none slower; of 32,768-65,536 154-180 against 234-240 us, but up to
    #: 6 times slower on some, and longer made-up queries twice as slow: the fresh pages again.
    EXHAUSTIVE_MAX_POSTINGS = 32_768

    #: Postings below which a loaded index scores in pure Python rather than import numpy for it:
    #: the pure path sums ~10 million postings a second here, importing numpy takes ~50 ms.  They
    #: add up over the index's queries, so a process that keeps asking (``mcp --stdio``) goes over
    #: to numpy after about that long in the pure path, and a one-shot search stays.  ``serve``
    #: imports numpy as it starts (KnowledgeBases.start), its first search already past this.
    NUMPY_MIN_POSTINGS = 500_000

    def __init__(self, vocab, indptr, doc_ids, weights, max_weights, n_docs,
                 k1=BM25_K1, b=BM25_B, avgdl=0.0):
        np = deps.probed("np")   # arrays it did not make cannot be numpy's
        self.vocab = vocab          # term -> term id
        self.indptr = indptr
        self.doc_ids = doc_ids
        self.weights = weights
        self.max_weights = max_weights
        self.n_docs = n_docs
        self.k1 = k1
        self.b = b
        self.avgdl = avgdl
        # numpy arrays in, numpy scoring; views of loaded files choose per query (see _numpy_for).
        self._np = np if (np is not None and isinstance(weights, np.ndarray)) else None
        self._np_views = None
        self._pure_postings = 0   # summed in pure Python so far, numpy not imported (NUMPY_MIN_POSTINGS)
        # One query is scored at a time: concurrent ones (a proxy's threads) contend for the GIL,
        # which numpy drops and takes back around each array operation, and for the cache, each
        # with its own scores array.  Measured (bench/proxy_overhead.py, 16 clients, a new
        # question each request, 80k chunks): CPU per request about halved with this lock.
        self._scoring = threading.Lock()

    def __len__(self):
        return self.n_docs

    def doc_freq(self, term):
        """Number of documents containing ``term`` (an analyzed term)."""
        tid = self.vocab.get(term)
        return 0 if tid is None else int(self.indptr[tid + 1]) - int(self.indptr[tid])

    # -- building ----------------------------------------------------------

    @classmethod
    def build(cls, docs, k1=BM25_K1, b=BM25_B):
        """Index ``docs`` (a list of token lists); document ids are list positions."""
        vocab = collections.defaultdict()
        vocab.default_factory = vocab.__len__   # a new term gets the next id
        term_ids = array.array("i")
        tfs = array.array("i")
        unique_counts = array.array("i")
        lengths = array.array("i")
        count = _count_into
        with gc_paused():
            for tokens in docs:
                counts = {}
                count(counts, tokens)
                term_ids.extend(map(vocab.__getitem__, counts))
                tfs.extend(counts.values())
                unique_counts.append(len(counts))
                lengths.append(len(tokens))
        vocab.default_factory = None
        return cls.from_counts(dict(vocab), term_ids, tfs, unique_counts, lengths, k1, b)

    @classmethod
    def from_counts(cls, vocab, term_ids, tfs, unique_counts, lengths, k1=BM25_K1, b=BM25_B):
        """Index from term counts per document (what :meth:`build` computes first).

        ``vocab`` maps each term to its id, ids being 0 .. len(vocab) - 1.
        Document after document, ``term_ids`` and ``tfs`` hold each distinct
        term of the document and how often it occurs; ``unique_counts[d]`` is
        how many entries document ``d`` has and ``lengths[d]`` its number of
        tokens.  Sequences of ints; ``array.array('i')`` avoids a copy.
        """
        np = deps.np
        if k1 < 0 or not 0 <= b <= 1:
            raise ValueError("BM25 needs k1 >= 0 and 0 <= b <= 1 (got k1=%r, b=%r)" % (k1, b))
        term_ids, tfs, unique_counts, lengths = (
            x if isinstance(x, array.array) and x.typecode == "i" else array.array("i", x)
            for x in (term_ids, tfs, unique_counts, lengths))
        n_terms, n_docs = len(vocab), len(lengths)
        if len(term_ids) >= 2 ** 31:
            raise ValueError("too many postings for one index (%d)" % len(term_ids))
        if (len(tfs) != len(term_ids) or len(unique_counts) != n_docs
                or sum(unique_counts) != len(term_ids)):
            raise ValueError("term counts do not add up: %d ids, %d tfs, %d entries in "
                             "unique_counts for %d documents" % (
                                 len(term_ids), len(tfs), sum(unique_counts), n_docs))
        if term_ids:
            if np is not None:
                ids = np.frombuffer(term_ids, dtype=np.int32)
                low, high = int(ids.min()), int(ids.max())
            else:
                low, high = min(term_ids), max(term_ids)
            if low < 0 or high >= n_terms:
                raise ValueError("term ids must lie in 0 .. len(vocab) - 1")
        avgdl = (sum(lengths) / n_docs) if n_docs else 0.0
        if np is not None and term_ids:
            arrays = cls._csr_numpy(n_terms, term_ids, tfs, unique_counts, lengths, avgdl, k1, b)
        else:
            arrays = cls._csr_pure(n_terms, term_ids, tfs, unique_counts, lengths, avgdl, k1, b)
        return cls(vocab, *arrays, n_docs=n_docs, k1=k1, b=b, avgdl=avgdl)

    @staticmethod
    def _csr_numpy(n_terms, term_ids, tfs, unique_counts, lengths, avgdl, k1, b):
        np = deps.np
        tids = np.frombuffer(term_ids, dtype=np.int32)
        n_docs = len(lengths)
        docs = np.repeat(np.arange(n_docs, dtype=np.int32),
                         np.frombuffer(unique_counts, dtype=np.int32))
        order = np.argsort(tids, kind="stable")  # keeps doc ids ascending per term
        df = np.bincount(tids, minlength=n_terms)
        indptr = np.zeros(n_terms + 1, dtype=np.int32)
        np.cumsum(df, out=indptr[1:])
        doc_ids = docs[order]
        del docs
        tf = np.frombuffer(tfs, dtype=np.int32)[order].astype(np.float64)
        del order
        dl = np.frombuffer(lengths, dtype=np.int32).astype(np.float64)
        norm = k1 * (1.0 - b + b * dl / avgdl) if avgdl else np.full(n_docs, k1)
        idf = np.log1p((n_docs - df + 0.5) / (df + 0.5))
        # weight = idf * tf / (tf + norm), in place to spare 70 MB temporaries.
        denom = norm[doc_ids]
        denom += tf
        np.divide(tf, denom, out=tf)
        tf *= np.repeat(idf, df)
        weights = tf.astype(np.float32)
        # reduceat needs non-empty segments; a term no document uses keeps 0.
        max_weights = np.zeros(n_terms, dtype=np.float32)
        used = df > 0
        max_weights[used] = np.maximum.reduceat(weights, indptr[:-1][used])
        return indptr, doc_ids, weights, max_weights

    @staticmethod
    def _csr_pure(n_terms, term_ids, tfs, unique_counts, lengths, avgdl, k1, b):
        # Counting sort by term: where each term's postings start, then fill.
        df = [0] * n_terms
        for tid in term_ids:
            df[tid] += 1
        indptr = array.array("i", [0])
        indptr.extend(itertools.accumulate(df))
        fill = list(indptr[:-1])
        n = len(term_ids)
        doc_ids = array.array("i", bytes(4 * n))
        slot_tf = array.array("i", bytes(4 * n))
        pos = 0
        for doc, count in enumerate(unique_counts):
            for tid, tf in zip(term_ids[pos:pos + count], tfs[pos:pos + count]):
                at = fill[tid]
                fill[tid] = at + 1
                doc_ids[at] = doc
                slot_tf[at] = tf
            pos += count
        n_docs = len(lengths)
        norm = [k1 * (1.0 - b + b * dl / avgdl) if avgdl else k1 for dl in lengths]
        weights = array.array("f")
        max_weights = array.array("f")
        log1p = math.log1p
        for tid in range(n_terms):
            lo, hi = indptr[tid], indptr[tid + 1]
            idf = log1p((n_docs - (hi - lo) + 0.5) / (hi - lo + 0.5))
            # Same operation order as the numpy path, so both store the same floats.
            weights.extend([tf / (norm[d] + tf) * idf
                            for d, tf in zip(doc_ids[lo:hi], slot_tf[lo:hi])])
            max_weights.append(max(weights[lo:hi], default=0.0))
        return indptr, doc_ids, weights, max_weights

    # -- searching ---------------------------------------------------------

    def search(self, query_tokens, top_k=10):
        """Best ``top_k`` documents as ``[(doc_id, score), ...]``, best first.

        A term repeated in ``query_tokens`` counts that many times; unknown
        terms are ignored.  Equal scores are ordered by ascending doc id.
        """
        if top_k <= 0 or not self.n_docs:
            return []
        qtf = {}
        for tok in query_tokens:
            tid = self.vocab.get(tok)
            if tid is not None:
                qtf[tid] = qtf.get(tid, 0) + 1
        if not qtf:
            return []
        max_weights = self.max_weights
        # Highest possible contribution first; ties by term id keep the
        # summation order, hence the exact scores, the same on both paths.
        terms = sorted(((float(max_weights[tid]) * count, tid, count)
                        for tid, count in qtf.items()), key=lambda t: (-t[0], t[1]))
        # rest[j]: the most that terms after j can still add to any document.
        rest = [0.0] * len(terms)
        for j in range(len(terms) - 2, -1, -1):
            rest[j] = rest[j + 1] + terms[j + 1][0]
        with self._scoring:
            arrays = self._numpy_for(terms)
            if arrays is not None:
                return self._search_numpy(arrays, terms, rest, top_k)
            return self._search_pure(terms, rest, top_k)

    def _numpy_for(self, terms):
        """``(np, indptr, doc_ids, weights)`` when numpy scores this query, else None."""
        if self._np is not None:
            return self._np, self.indptr, self.doc_ids, self.weights
        np = deps.probed("np")
        if np is None:
            indptr = self.indptr
            self._pure_postings += sum(indptr[tid + 1] - indptr[tid] for _, tid, _ in terms)
            if self._pure_postings < self.NUMPY_MIN_POSTINGS:
                return None
            np = deps.np
            if np is None:
                return None
        if self._np_views is None:   # zero-copy: numpy reads the same memory-mapped pages
            self._np_views = (np, np.frombuffer(self.indptr, dtype=np.int32),
                              np.frombuffer(self.doc_ids, dtype=np.int32),
                              np.frombuffer(self.weights, dtype=np.float32))
        return self._np_views

    def _search_numpy(self, arrays, terms, rest, top_k):
        np, indptr, doc_ids, weights = arrays
        spans = [(int(indptr[tid]), int(indptr[tid + 1]), count) for _, tid, count in terms]
        if sum(hi - lo for lo, hi, _ in spans) <= self.EXHAUSTIVE_MAX_POSTINGS:
            return self._search_exhaustive(np, doc_ids, weights, spans, top_k)
        cands = None      # once set, only these documents can still make the top k
        theta = 0.0       # a lower bound on the final k-th best score
        done = 0.0        # sum of the bounds of the terms scored in full
        retry_below = math.inf   # theta is tried again once rest[j] drops under this (_RETRY_SHRINK)
        # The leading terms, which could not add up to what the rest can add, are scored in full
        # whatever the threshold: all in one bincount rather than an array operation or four each
        # (most of a long query's time was those operations' own cost on short lists).  bincount
        # adds in input order, term by term, as the loop would: the same sums to the bit.
        first = 0
        while first < len(terms) and done + terms[first][0] <= rest[first]:
            done += terms[first][0]
            first += 1
        if first > 1:
            docs = np.concatenate([doc_ids[lo:hi] for lo, hi, _ in spans[:first]])
            w = np.concatenate([_term_weights(np, weights, lo, hi, count) for lo, hi, count in spans[:first]])
            scores = np.bincount(docs, weights=w, minlength=self.n_docs)
        else:
            first, done = 0, 0.0
            scores = np.zeros(self.n_docs)
        for j, (bound, _, count) in enumerate(terms[first:], first):
            lo, hi, _ = spans[j]
            if lo == hi:
                continue
            docs = doc_ids[lo:hi]
            w = _term_weights(np, weights, lo, hi, count)
            if cands is None:
                scores[docs] += w
                done += bound
                if rest[j] and done > rest[j] and rest[j] < retry_below and hi - lo >= top_k:
                    # The k-th best among this term's documents bounds the
                    # final k-th best from below: scores only grow.
                    part = scores[docs]
                    theta = max(theta, float(_kth_largest(np, part, top_k)))
                    if theta > rest[j] * (1 + _BOUND_SLACK):
                        cands = np.flatnonzero(scores >= theta - rest[j] * (1 + _BOUND_SLACK))
                    else:
                        retry_below = rest[j] * _RETRY_SHRINK
            else:
                if len(cands) * 8 < hi - lo:
                    pos = np.searchsorted(docs, cands)
                    np.minimum(pos, len(docs) - 1, out=pos)
                    hit = docs[pos] == cands
                    scores[cands[hit]] += w[pos[hit]]
                else:
                    # Candidates many for this term's postings: adding all of them costs less
                    # than finding the candidates' (a document out of the running stays so).
                    scores[docs] += w
                if rest[j]:
                    # Less is left to add after each term, so fewer documents can still make it:
                    # the candidates shrink before the next, usually longer, list.
                    cs = scores[cands]
                    if top_k < len(cs) <= _THETA_CANDS:
                        theta = max(theta, float(_kth_largest(np, cs, top_k)))
                    cands = cands[cs >= theta - rest[j] * (1 + _BOUND_SLACK)]
        if cands is None:
            cands = np.flatnonzero(scores)
        cs = scores[cands]
        if len(cands) > top_k:
            cands, cs = _at_least(cands, cs, _kth_largest(np, cs, top_k))
        order = np.lexsort((cands, -cs))[:top_k]
        return [(int(d), float(s)) for d, s in zip(cands[order], cs[order])]

    def _search_exhaustive(self, np, doc_ids, weights, spans, top_k):
        """The best ``top_k`` of every document in the postings ``spans``, each posting added once."""
        docs = np.concatenate([doc_ids[lo:hi] for lo, hi, _ in spans])
        w = np.concatenate([_term_weights(np, weights, lo, hi, count) for lo, hi, count in spans])
        scores = np.bincount(docs, weights=w, minlength=self.n_docs)
        found = scores.take(docs)   # a document's score once for each of its terms
        # Fewer than top_k documents score above the k-th best, each found at most once a term: so no
        # more than (top_k - 1) * terms places hold more than it, and the next place holds no more.
        place = (top_k - 1) * len(spans) + 1
        if len(found) > place:
            docs, found = _at_least(docs, found, _seed_floor(np, scores, doc_ids, spans, top_k))
        if len(found) > place:
            docs, found = _at_least(docs, found, _kth_largest(np, found, place))
        order = np.lexsort((docs, -found))
        best, last = [], -1
        for doc, score in zip(docs[order].tolist(), found[order].tolist()):
            if doc != last:   # a document's places are neighbours: the same score, the same doc id
                best.append((doc, score))
                if len(best) == top_k:
                    break
                last = doc
        return best

    def _search_pure(self, terms, rest, top_k):
        indptr, doc_ids, weights = self.indptr, self.doc_ids, self.weights
        acc = {}
        pruned = False
        done = 0.0
        retry_below = math.inf
        for j, (bound, tid, count) in enumerate(terms):
            lo, hi = indptr[tid], indptr[tid + 1]
            ws = weights[lo:hi]
            if count != 1:
                ws = [w * count for w in ws]
            if not pruned:
                if acc:
                    get = acc.get
                    for d, w in zip(doc_ids[lo:hi], ws):
                        acc[d] = get(d, 0.0) + w
                else:
                    acc = dict(zip(doc_ids[lo:hi], ws))
                done += bound
                if rest[j] and done > rest[j] and rest[j] < retry_below and len(acc) >= top_k:
                    theta = heapq.nlargest(top_k, acc.values())[-1]
                    if theta > rest[j] * (1 + _BOUND_SLACK):
                        floor = theta - rest[j] * (1 + _BOUND_SLACK)
                        acc = {d: s for d, s in acc.items() if s >= floor}
                        pruned = True
                    else:
                        retry_below = rest[j] * _RETRY_SHRINK
            elif len(acc) * 16 < hi - lo:
                bisect = _bisect_left
                for d in acc:
                    at = bisect(doc_ids, d, lo, hi)
                    if at < hi and doc_ids[at] == d:
                        acc[d] += ws[at - lo]
            else:
                for d, w in zip(doc_ids[lo:hi], ws):
                    if d in acc:
                        acc[d] += w
        return heapq.nlargest(top_k, acc.items(), key=_score_then_low_doc)

    # -- persistence -------------------------------------------------------

    _ARRAYS = (("indptr", "<i4"), ("doc_ids", "<i4"), ("weights", "<f4"), ("max_weights", "<f4"))

    def save(self, dirpath):
        """Write the index into directory ``dirpath`` (created if missing).

        Files: ``bm25.json`` (parameters), ``bm25_<array>.npy`` for each
        array, and the vocabulary as a TermTable (``bm25_terms.bin``,
        ``bm25_term_offsets.npy``, ``bm25_term_ids.npy``).  Each file is
        replaced atomically and the JSON goes last, but the set is not: to
        swap a live index, save into a new directory and rename it.
        """
        os.makedirs(dirpath, exist_ok=True)
        for name, dtype in self._ARRAYS:
            npy_write_array(os.path.join(dirpath, "bm25_%s.npy" % name),
                             getattr(self, name), dtype)
        TermTable.write(dirpath, self.vocab)
        meta = {"format": 2, "variant": "lucene", "k1": self.k1, "b": self.b,
                "n_docs": self.n_docs, "avgdl": self.avgdl, "n_terms": len(self.vocab)}
        atomic_write(os.path.join(dirpath, "bm25.json"),
                     json.dumps(meta, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))

    @classmethod
    def load(cls, dirpath):
        """Read an index written by :meth:`save`: nothing is parsed or copied but bm25.json.

        Format 1 (before the TermTable) kept the vocabulary in bm25.json; such
        an index still loads, parsing it.
        """
        path = os.path.join(dirpath, "bm25.json")
        try:
            with open(path, encoding="utf-8") as f:
                meta = json.load(f)
        except ValueError as e:
            raise ValueError("%s: not a BM25 index (%s)" % (path, e)) from None
        if meta.get("format") not in (1, 2):
            raise ValueError("%s: unsupported BM25 index format %r" % (path, meta.get("format")))
        arrays = {name: _read_view(os.path.join(dirpath, "bm25_%s.npy" % name)) for name, _ in cls._ARRAYS}
        if meta["format"] == 1:
            vocab = {term: tid for tid, term in enumerate(meta["terms"])}
        else:
            vocab = TermTable(dirpath)
        if (len(arrays["indptr"]) != len(vocab) + 1 or len(arrays["max_weights"]) != len(vocab)
                or len(arrays["doc_ids"]) != len(arrays["weights"])
                or (len(vocab) and int(arrays["indptr"][-1]) != len(arrays["doc_ids"]))):
            raise ValueError("%s: BM25 index files do not match each other" % dirpath)
        return cls(vocab, n_docs=meta["n_docs"], k1=meta["k1"], b=meta["b"],
                   avgdl=meta["avgdl"], **arrays)


def _seed_floor(np, scores, doc_ids, spans, top_k):
    """A score the k-th best document reaches, from the postings of one term: the rarest with
    ``top_k`` or more.  Its documents are distinct, so ``top_k`` of them score this much or more.

    Partitioning every posting's score for the exact floor cost half of a search over 6,700
    postings (bench/RESULTS.md, session 24); a term's few postings cost next to nothing, and
    the rarest term weighs most, so its best documents' scores leave few places above them.
    None when every term has fewer postings than ``top_k``.
    """
    seeds = [(hi - lo, lo, hi) for lo, hi, _ in spans if hi - lo >= top_k]
    if not seeds:
        return None
    _, lo, hi = min(seeds)
    return _kth_largest(np, scores.take(doc_ids[lo:hi]), top_k)


def _kth_largest(np, values, k):
    """The ``k``-th largest of ``values`` (1: the largest), which holds at least ``k`` of them."""
    return np.partition(values, len(values) - k)[len(values) - k]


def _at_least(docs, found, floor):
    """``docs`` and ``found``, their scores, where the score is ``floor`` or more (all of them for None)."""
    if floor is None:
        return docs, found
    keep = found >= floor
    return docs[keep], found[keep]


def _term_weights(np, weights, lo, hi, count):
    """A term's posting weights ``weights[lo:hi]`` times its count in the query: as stored once, else
    in float64, as the pure path's Python floats multiply them, so both paths sum the same numbers."""
    w = weights[lo:hi]
    return w if count == 1 else w.astype(np.float64) * count


def _read_view(path):
    """A read-only, zero-copy view of a 1-D .npy file's numbers (a copy where the host's byte order
    needs one): search slices and bisects it, and numpy can wrap it without copying either."""
    arr = NpyArray(path)
    return arr.flat if arr.flat is not None else npy_read_flat(path)[0]


def _map_file(path):
    """A file's bytes as a read-only memory map (bytes for an empty file, which cannot be mapped)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return b""
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


class TermTable(collections.abc.Mapping):
    """A loaded index's vocabulary, term -> term id, read from files without parsing them.

    ``bm25_terms.bin`` holds the terms (UTF-8) one after another in byte
    order, ``bm25_term_offsets.npy`` where each begins (and the end), and
    ``bm25_term_ids.npy`` each one's id.  A lookup is a binary search over
    the memory-mapped files: a query's few terms cost microseconds, where
    parsing 200,000 terms costs ~40 ms, which was most of a one-shot search
    of a large KB.  Iterating (indexing rebuilds the vocabulary from it)
    decodes every term once and keeps the dict.
    """

    FILES = ("bm25_terms.bin", "bm25_term_offsets.npy", "bm25_term_ids.npy")

    def __init__(self, dirpath):
        blob, offsets, ids = (os.path.join(dirpath, name) for name in self.FILES)
        self._blob = _map_file(blob)
        self._offsets, self._ids = _read_view(offsets), _read_view(ids)
        if len(self._offsets) != len(self._ids) + 1 or (len(self._ids) and self._offsets[-1] != len(self._blob)):
            raise ValueError("%s: the BM25 term table files do not match each other" % dirpath)
        self._all = None
        self._seen = {}   # term -> id (or None) for terms looked up: a server's queries repeat them

    #: Terms _seen holds at most before it starts again.
    SEEN_MAX = 65536

    @staticmethod
    def write(dirpath, vocab):
        """Write ``vocab`` (a mapping term -> id) as a table."""
        pairs = sorted((term.encode("utf-8", "surrogatepass"), tid) for term, tid in vocab.items())
        offsets = array.array("q", [0])
        offsets.extend(itertools.accumulate(len(term) for term, _ in pairs))
        atomic_write(os.path.join(dirpath, TermTable.FILES[0]), b"".join(term for term, _ in pairs))
        npy_write_array(os.path.join(dirpath, TermTable.FILES[1]), offsets, "<i8")
        npy_write_array(os.path.join(dirpath, TermTable.FILES[2]), array.array("i", (tid for _, tid in pairs)), "<i4")

    def get(self, term, default=None):
        if self._all is not None:
            return self._all.get(term, default)
        seen = self._seen
        if term in seen:
            tid = seen[term]
            return default if tid is None else tid
        if len(seen) >= self.SEEN_MAX:
            seen.clear()
        tid = seen[term] = self._find(term)
        return default if tid is None else tid

    def _find(self, term):
        """``term``'s id by a binary search over the files, or None."""
        key = term.encode("utf-8", "surrogatepass")
        blob, offsets = self._blob, self._offsets
        lo, hi = 0, len(self._ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if blob[offsets[mid]:offsets[mid + 1]] < key:
                lo = mid + 1
            else:
                hi = mid
        if lo < len(self._ids) and blob[offsets[lo]:offsets[lo + 1]] == key:
            return self._ids[lo]
        return None

    def __getitem__(self, term):
        tid = self.get(term)
        if tid is None:
            raise KeyError(term)
        return tid

    def __contains__(self, term):
        return self.get(term) is not None

    def __len__(self):
        return len(self._ids)

    def _dict(self):
        if self._all is None:
            blob, offsets = bytes(self._blob), self._offsets
            self._all = {blob[offsets[i]:offsets[i + 1]].decode("utf-8", "surrogatepass"): tid
                         for i, tid in enumerate(self._ids)}
        return self._all

    def __iter__(self):
        return iter(self._dict())

    def keys(self):
        return self._dict().keys()

    def items(self):
        return self._dict().items()

    def values(self):
        return self._dict().values()


def _score_then_low_doc(item):
    return item[1], -item[0]


# collections.Counter's counting loop (C in CPython), without Counter's
# per-call overhead, which shows at ~100k small documents.
_count_into = collections._count_elements
_bisect_left = bisect.bisect_left
