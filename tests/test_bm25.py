"""The BM25 index (_ragproxy.bm25): its scores, its exact pruning and its files.

In-process, on the numpy path and the pure-Python path (the ``pure``
fixture), which must rank alike, and against a brute-force reference; the
.npy format the index files use is test_npy's.
"""
import array
import json
import math
import os
import random

import pytest

from _ragproxy import deps, npy
from _ragproxy.bm25 import TermTable
from ragproxy import Analyzer, BM25Index

try:
    import numpy
except ImportError:  # the pure-Python path is still tested
    numpy = None

needs_numpy = pytest.mark.skipif(numpy is None or deps.np is None,
                                 reason="numpy not available (or RAGPROXY_PURE=1)")


@pytest.fixture
def pure(monkeypatch):
    """Build and read without numpy, as on a machine that lacks it."""
    monkeypatch.setattr(deps, "np", None)


# --------------------------------------------------------------------------
# BM25 scores


def lucene_bm25(docs, query, k1=1.2, b=0.75):
    """Reference scores straight from the formula, for every document."""
    n = len(docs)
    avgdl = sum(map(len, docs)) / n
    scores = [0.0] * n
    for term in query:
        df = sum(term in d for d in docs)
        if not df:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        for i, d in enumerate(docs):
            tf = d.count(term)
            if tf:
                scores[i] += idf * tf / (tf + k1 * (1 - b + b * len(d) / avgdl))
    return scores


def assert_ranked(got, want, rel=1e-6):
    assert [d for d, _ in got] == [d for d, _ in want]
    assert [s for _, s in got] == pytest.approx([s for _, s in want], rel=rel)


def reference_top(docs, query, top_k, k1=1.2, b=0.75):
    scores = lucene_bm25(docs, query, k1, b)
    ranked = sorted((i for i, s in enumerate(scores) if s > 0), key=lambda i: (-scores[i], i))
    return [(i, scores[i]) for i in ranked[:top_k]]


TINY = [["a", "b", "a"], ["b", "c"], ["c", "c", "c", "d"]]


@pytest.mark.parametrize("path", ["default", "pure"])
def test_scores_match_the_formula_on_a_tiny_corpus(path, request):
    if path == "pure":
        request.getfixturevalue("pure")
    index = BM25Index.build(TINY)
    # N=3, avgdl=3.  "a": df=1, idf=ln(1 + 2.5/1.5)=ln(8/3); doc 0 has tf=2, dl=3,
    # so the norm is k1 * (1 - b + b) = 1.2 and the score ln(8/3) * 2 / 3.2.
    [(doc, score)] = index.search(["a"])
    assert doc == 0
    assert score == pytest.approx(math.log(8 / 3) * 2 / 3.2, rel=1e-6)
    assert score == pytest.approx(0.613018, abs=1e-6)
    # "b" and "c": df=2, idf=ln(1.6).  Doc 1 (dl=2, norm 0.9) has both once;
    # doc 2 (dl=4, norm 1.5) has c three times; doc 0 (norm 1.2) has b once.
    idf = math.log(1.6)
    expected = [(1, 2 * idf / 1.9), (2, idf * 3 / 4.5), (0, idf / 2.2)]
    got = index.search(["b", "c"])
    assert_ranked(got, expected)
    assert_ranked(got, reference_top(TINY, ["b", "c"], 10))


def test_parameters_change_scores_as_the_formula_says():
    index = BM25Index.build(TINY, k1=2.0, b=0.0)
    assert_ranked(index.search(["c", "d"], top_k=3),
                  reference_top(TINY, ["c", "d"], 3, k1=2.0, b=0.0))
    with pytest.raises(ValueError):
        BM25Index.build(TINY, b=1.5)


def test_repeated_query_terms_count_again():
    index = BM25Index.build(TINY)
    once = dict(index.search(["a", "c"]))
    twice = dict(index.search(["a", "a", "c"]))
    assert twice[0] == pytest.approx(2 * once[0], rel=1e-6)
    assert twice[2] == pytest.approx(once[2], rel=1e-6)


def test_ties_go_to_the_lower_doc_index():
    docs = [["x"], ["y", "z"], ["y", "z"], ["q"], ["y", "z"]]
    index = BM25Index.build(docs)
    assert [d for d, _ in index.search(["z", "y"], top_k=2)] == [1, 2]
    assert [d for d, _ in index.search(["z", "y"])] == [1, 2, 4]


def test_empty_cases():
    index = BM25Index.build(TINY)
    assert index.search([]) == []
    assert index.search(["nowhere"]) == []
    assert index.search(["a"], top_k=0) == []
    assert BM25Index.build([]).search(["a"]) == []
    assert BM25Index.build([[], []]).search(["a"]) == []
    assert len(index) == 3 and index.doc_freq("c") == 2 and index.doc_freq("zz") == 0


def test_from_counts_equals_build():
    docs, queries = random_corpus(5, n_docs=100)
    built = BM25Index.build(docs)
    vocab, term_ids, tfs, unique_counts = {}, [], [], []
    for doc in docs:
        counts = {}
        for token in doc:
            counts[token] = counts.get(token, 0) + 1
        for token, tf in counts.items():
            term_ids.append(vocab.setdefault(token, len(vocab)))
            tfs.append(tf)
        unique_counts.append(len(counts))
    vocab["unused"] = len(vocab)   # a term no document has any more
    index = BM25Index.from_counts(vocab, term_ids, tfs, unique_counts, [len(d) for d in docs])
    for query in queries[:30] + [["unused", "t1"]]:
        assert index.search(query, 10) == built.search(query, 10)
    with pytest.raises(ValueError, match="do not add up"):
        BM25Index.from_counts(vocab, term_ids, tfs[:-1], unique_counts, [len(d) for d in docs])
    with pytest.raises(ValueError, match="term ids"):
        BM25Index.from_counts({"a": 0}, [0, 1], [1, 1], [2], [2])


def random_corpus(seed, n_docs=400):
    rng = random.Random(seed)
    vocab = ["t%d" % i for i in range(300)]
    # Zipf-like: a few terms in most documents, so pruning has work to do.
    weights = [1 / (i + 1) for i in range(len(vocab))]
    docs = [rng.choices(vocab, weights, k=rng.randint(0, 60)) for _ in range(n_docs)]
    queries = [rng.choices(vocab, weights, k=rng.randint(1, 8)) + rng.sample(vocab, 2)
               for _ in range(120)]
    queries.append(["t0", "t0", "t1", "unknown"])
    # As long as a coding agent's prompt: the pruning threshold is tried, fails and waits.
    queries += [rng.choices(vocab, weights, k=25) + rng.sample(vocab, 5) for _ in range(20)]
    return docs, queries


def test_pure_path_returns_exact_top_k(pure):
    docs, queries = random_corpus(1)
    index = BM25Index.build(docs)
    for query in queries:
        for top_k in (1, 5, 50):
            assert_ranked(index.search(query, top_k), reference_top(docs, query, top_k),
                          rel=1e-5)


# numpy adds a query's postings up whole below EXHAUSTIVE_MAX_POSTINGS, and prunes above it.
NUMPY_WAYS = {"whole": 1 << 40, "pruned": 0}


@needs_numpy
@pytest.mark.parametrize("way", sorted(NUMPY_WAYS))
def test_numpy_and_pure_paths_agree(monkeypatch, way):
    docs, queries = random_corpus(2)
    fast = BM25Index.build(docs)
    fast.EXHAUSTIVE_MAX_POSTINGS = NUMPY_WAYS[way]
    assert isinstance(fast.weights, numpy.ndarray)
    monkeypatch.setattr(deps, "np", None)
    slow = BM25Index.build(docs)
    assert isinstance(slow.weights, array.array)
    for query in queries:
        for top_k in (1, 10, 100):
            got = fast.search(query, top_k)
            assert got == slow.search(query, top_k)   # to the bit
            assert_ranked(got, reference_top(docs, query, top_k), rel=1e-5)


@needs_numpy
def test_numpy_adds_up_whole_or_prunes_to_the_same_bits():
    docs, queries = random_corpus(7, n_docs=1000)
    docs += [["t0", "t1", "t2"]] * 12   # equal scores: ties by doc id, across the top_k boundary
    queries += [["t0", "t1", "t2"], ["t1", "t1", "t2", "t2", "t2"], ["t299", "nowhere"], ["nowhere"]]
    index = BM25Index.build(docs)
    postings = [sum(index.doc_freq(term) for term in set(query)) for query in queries]
    index.EXHAUSTIVE_MAX_POSTINGS = sorted(postings)[len(postings) // 2]   # by size, as the default does
    forced = {way: BM25Index.build(docs) for way in NUMPY_WAYS}
    for way, limit in NUMPY_WAYS.items():
        forced[way].EXHAUSTIVE_MAX_POSTINGS = limit
    for query in queries:
        reference = reference_top(docs, query, len(docs))
        for top_k in (1, 2, 5, 13, 100, 5000):
            got = {way: forced[way].search(query, top_k) for way in NUMPY_WAYS}
            assert got["whole"] == got["pruned"] == index.search(query, top_k)
            if top_k <= 100:   # deeper, float32 weights may order near-ties other than exact sums would
                assert_ranked(got["whole"], reference[:top_k], rel=1e-5)


def test_finds_code_and_prose_the_way_a_user_asks():
    chunks = [
        "def join_paths(parts):\n    return os.path.join(*parts)",
        "The HTTP client retries a request three times before giving up.",
        "class ResponseParser:\n    def parseHTTPResponse(self, raw): ...",
        "Paths are joined with slashes on every platform.",
        "Run the tests with pytest -q from the repository root.",
    ]
    an = Analyzer()
    index = BM25Index.build(an.tokens_many(chunks))
    assert index.search(an.query_tokens("how does os.path.join work?"))[0][0] == 0
    assert index.search(an.query_tokens("parse_http_response"))[0][0] == 2
    assert index.search(an.query_tokens("how many retries does the HTTP client make"))[0][0] == 1
    assert index.search(an.query_tokens("running tests"))[0][0] == 4


# --------------------------------------------------------------------------
# Files


def test_save_and_load_give_the_same_results(tmp_path):
    docs, queries = random_corpus(3)
    index = BM25Index.build(docs, k1=1.5, b=0.6)
    index.save(str(tmp_path / "kb"))
    assert sorted(os.listdir(tmp_path / "kb")) == [
        "bm25.json", "bm25_doc_ids.npy", "bm25_indptr.npy", "bm25_max_weights.npy",
        "bm25_term_ids.npy", "bm25_term_offsets.npy", "bm25_terms.bin", "bm25_weights.npy"]
    loaded = BM25Index.load(str(tmp_path / "kb"))
    assert (loaded.k1, loaded.b, len(loaded)) == (1.5, 0.6, len(docs))
    for query in queries[:40]:
        assert loaded.search(query, 10) == index.search(query, 10)
    assert dict(loaded.vocab.items()) == dict(index.vocab)


def test_a_loaded_index_parses_nothing_and_copies_nothing(tmp_path):
    docs, queries = random_corpus(5)
    BM25Index.build(docs).save(str(tmp_path))
    loaded = BM25Index.load(str(tmp_path))
    assert isinstance(loaded.vocab, TermTable) and loaded.vocab._all is None
    for name in ("indptr", "doc_ids", "weights", "max_weights"):   # views of the memory-mapped files
        assert isinstance(getattr(loaded, name), memoryview), name
    for query in queries[:40]:
        loaded.search(query, 10)
    assert loaded.vocab._all is None   # queries looked terms up without decoding the table


def test_the_term_table_answers_like_the_dict_it_was_written_from(tmp_path):
    vocab = {"retry": 0, "r\u00e9sum\u00e9": 1, "\u6570\u636e": 2, "a": 3, "ab": 4, "b": 5, "": 6,
             "lone\udcff": 7, "tab\tand\nnewline": 8}
    TermTable.write(str(tmp_path), vocab)
    table = TermTable(str(tmp_path))
    assert len(table) == len(vocab)
    for term, tid in vocab.items():
        assert table.get(term) == tid and table[term] == tid and term in table
    for missing in ("aa", "retries", "\u6570", "zzz", "0"):
        assert table.get(missing) is None and missing not in table
        with pytest.raises(KeyError):
            table[missing]
    assert dict(table.items()) == vocab and sorted(table) == sorted(vocab)
    (tmp_path / "empty").mkdir()
    TermTable.write(str(tmp_path / "empty"), {})
    empty = TermTable(str(tmp_path / "empty"))
    assert len(empty) == 0 and empty.get("a") is None and dict(empty.items()) == {}


def test_an_index_of_format_1_still_loads(tmp_path):
    # Before the term table, bm25.json held the vocabulary as a list in id order.
    docs, queries = random_corpus(6)
    index = BM25Index.build(docs)
    index.save(str(tmp_path))
    meta = json.loads((tmp_path / "bm25.json").read_text())
    terms = [""] * len(index.vocab)
    for term, tid in index.vocab.items():
        terms[tid] = term
    meta.update(format=1, terms=terms)
    del meta["n_terms"]
    (tmp_path / "bm25.json").write_text(json.dumps(meta))
    for name in TermTable.FILES:
        os.unlink(str(tmp_path / name))
    old = BM25Index.load(str(tmp_path))
    for query in queries[:40]:
        assert old.search(query, 10) == index.search(query, 10)


@needs_numpy
def test_a_loaded_index_scores_with_numpy_only_where_it_pays(tmp_path, monkeypatch):
    docs, queries = random_corpus(7)
    BM25Index.build(docs).save(str(tmp_path))
    small = BM25Index.load(str(tmp_path))
    monkeypatch.delitem(deps.__dict__, "np")   # numpy not imported yet, as in a fresh process
    want = [small.search(query, 10) for query in queries[:20]]
    assert small._np_views is None   # these few postings were summed without importing numpy
    big = BM25Index.load(str(tmp_path))
    big.NUMPY_MIN_POSTINGS = 1   # enough postings to pay for the import: numpy is probed and used
    assert [big.search(query, 10) for query in queries[:20]] == want
    assert big._np_views is not None and deps.probed("np") is numpy


@needs_numpy
def test_index_saved_without_numpy_loads_with_it_and_back(tmp_path, monkeypatch):
    docs, queries = random_corpus(4)
    with monkeypatch.context() as m:
        m.setattr(deps, "np", None)
        slow = BM25Index.build(docs)
        slow.save(str(tmp_path / "pure"))
    fast = BM25Index.load(str(tmp_path / "pure"))
    fast.NUMPY_MIN_POSTINGS = 0   # score with numpy whatever the query
    fast.save(str(tmp_path / "np"))
    monkeypatch.setattr(deps, "np", None)
    back = BM25Index.load(str(tmp_path / "np"))
    for query in queries[:40]:
        want = slow.search(query, 10)
        assert [d for d, _ in fast.search(query, 10)] == [d for d, _ in want]
        assert back.search(query, 10) == want


def test_load_rejects_mismatched_files(tmp_path):
    BM25Index.build(TINY).save(str(tmp_path))
    npy.npy_write_array(str(tmp_path / "bm25_indptr.npy"), [0, 1], "<i4")
    with pytest.raises(ValueError, match="do not match"):
        BM25Index.load(str(tmp_path))
    (tmp_path / "bm25.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a BM25 index"):
        BM25Index.load(str(tmp_path))


@needs_numpy
def test_a_loaded_index_goes_over_to_numpy_once_its_queries_have_summed_enough_postings(tmp_path, monkeypatch):
    """A process that keeps asking without a server (mcp --stdio) pays for importing numpy between its
    queries: the postings add up over them."""
    docs, queries = random_corpus(7)
    BM25Index.build(docs).save(str(tmp_path))
    index = BM25Index.load(str(tmp_path))
    monkeypatch.delitem(deps.__dict__, "np")   # numpy not imported yet, as in a fresh process
    want = [BM25Index.load(str(tmp_path)).search(query, 10) for query in queries[:20]]
    assert deps.probed("np") is None
    postings = [sum(index.doc_freq(t) for t in set(query)) for query in queries[:20]]
    index.NUMPY_MIN_POSTINGS = sum(postings[:3]) + 1
    assert postings[3] < index.NUMPY_MIN_POSTINGS   # the fourth query alone would not pay for it
    got = []
    for n, query in enumerate(queries[:20]):
        got.append(index.search(query, 10))
        assert (index._np_views is not None) == (n >= 3), n
    assert got == want
    assert index._np_views is not None and deps.probed("np") is numpy


def test_term_table_lookups_stay_right_when_remembered_and_when_forgotten(tmp_path):
    docs, _ = random_corpus(3)
    built = BM25Index.build(docs)
    built.save(str(tmp_path))
    table = BM25Index.load(str(tmp_path)).vocab
    assert isinstance(table, TermTable)
    table.SEEN_MAX = 5   # starts again every few terms
    terms = sorted(built.vocab)[:40] + ["no-such-term", "\u00e9t\u00e9"]
    for _ in range(2):   # looked up afresh, then remembered
        assert [table.get(t) for t in terms] == [built.vocab.get(t) for t in terms]
        assert table.get("no-such-term", -1) == -1 and "no-such-term" not in table
