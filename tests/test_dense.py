"""Tests for dense search (section 9): exact top-k on both paths, and the scans
behind the compact copies (int8/float16 blocks, sign-bit Hamming distances)."""
import os
import random
import threading

import pytest

import ragproxy
from _ragproxy import dense, deps
from conftest import brute_force, random_rows, unit


def test_dense_top_k_matches_brute_force(mode):
    rows = random_rows(300, 16, seed=1)
    vectors = [unit(r) for r in rows]
    if mode == "numpy":
        vectors = deps.np.asarray(vectors, dtype=deps.np.float32)
    for seed in range(5):
        query = random_rows(1, 16, seed=100 + seed)[0]
        got = ragproxy.dense_top_k(vectors, query, 10)
        want = brute_force(rows, query, 10)
        assert [r for r, _ in got] == [i for _, i in want]
        assert [s for _, s in got] == pytest.approx([s for s, _ in want], abs=1e-5)


def test_dense_top_k_edge_cases(mode):
    vectors = [unit([1.0, 0.0]), unit([0.0, 1.0])]
    assert ragproxy.dense_top_k(vectors, [0.0, 0.0], 3) == []
    assert ragproxy.dense_top_k([], [1.0, 0.0], 3) == []
    assert ragproxy.dense_top_k(vectors, [1.0, 0.0], 0) == []
    with pytest.raises(ValueError, match="dimensions"):
        ragproxy.dense_top_k(vectors, [1.0, 0.0, 0.0], 3)
    # Ties go to the lower row, on both paths.
    tied = [unit([1.0, 1.0])] * 4
    assert [r for r, _ in ragproxy.dense_top_k(tied, [1.0, 1.0], 2)] == [0, 1]


def test_numpy_top_k_selection_matches_a_full_sort():
    if deps.np is None:
        pytest.skip("numpy disabled")
    np = deps.np
    rng = random.Random(3)
    for n in (50, 5000, 300000):
        values = [round(rng.gauss(0.0, 1.0), 2) for _ in range(n)]  # plenty of ties
        scores = np.asarray(values, dtype=np.float32)
        ranked = sorted(range(n), key=lambda i: (-float(scores[i]), i)) if n < 10000 else None
        if ranked is None:
            as_float = scores.tolist()
            ranked = sorted(range(n), key=lambda i: (-as_float[i], i))
        for k in (1, 10, 40):
            assert dense._np_top(scores, None, k).tolist() == ranked[:k]


def test_compact_scan_on_several_threads_matches_the_plain_product():
    if deps.np is None:
        pytest.skip("numpy disabled")
    np = deps.np
    rng = np.random.default_rng(3)
    n = 3 * dense._SCAN_PARALLEL_ROWS + 1234  # several slices, ragged block ends
    compact = rng.integers(-127, 128, size=(n, 6), dtype=np.int8)
    query = rng.standard_normal(6).astype(np.float32)
    scores = np.full(n, np.nan, dtype=np.float32)
    dense._parallel_rows(n, dense._SCAN_BLOCK, dense._float_scan(compact, query, scores))
    assert np.allclose(scores, compact.astype(np.float32) @ query, rtol=1e-5, atol=1e-4)


def test_binary_pool_grows_with_k_and_with_the_collection():
    assert ragproxy.binary_pool(100, 10) == 100
    assert ragproxy.binary_pool(50000, 10) == 10 * dense._BINARY_POOL_PER_K
    assert ragproxy.binary_pool(50000, 50) == 50 * dense._BINARY_POOL_PER_K
    assert ragproxy.binary_pool(10 ** 7, 10) == -(-10 ** 7 // dense._BINARY_POOL_SHARE)


def test_hamming_scan_on_several_threads_counts_differing_bits():
    if deps.np is None:
        pytest.skip("numpy disabled")
    np = deps.np
    rng = np.random.default_rng(4)
    n = 2 * dense._SCAN_PARALLEL_ROWS + 777
    codes = rng.integers(0, 256, size=(n, 16), dtype=np.uint8)
    query = rng.integers(0, 256, size=16, dtype=np.uint8)
    expect = np.unpackbits(codes ^ query, axis=1).sum(axis=1)
    for words, qwords in ((codes.view(np.uint64), query.view(np.uint64)), (codes, query)):
        for popcount in (True, False):  # numpy 2's popcount, and the table for numpy 1
            dist = np.full(n, 999, dtype=np.uint16)
            dense._parallel_rows(n, dense._BINARY_BLOCK, dense._hamming_scan(words, qwords, dist, popcount))
            assert (dist == expect).all()


def test_numpy_nearest_takes_the_smallest_distances_ties_to_lower_rows():
    if deps.np is None:
        pytest.skip("numpy disabled")
    np = deps.np
    rng = random.Random(8)
    dist = np.asarray([rng.randrange(40) for _ in range(5000)], dtype=np.uint16)
    ranked = sorted(range(len(dist)), key=lambda i: (int(dist[i]), i))
    for want in (1, 7, 100, 4999, 5000):
        assert sorted(dense._np_nearest(dist, want).tolist()) == sorted(ranked[:want])


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs os.sched_setaffinity and two CPUs")
def test_a_scan_started_by_a_connection_thread_on_one_cpu_runs_its_helpers_on_every_cpu():
    everywhere = os.sched_getaffinity(0)
    seen = {}

    def scan(lo, hi):
        seen.setdefault(threading.get_ident(), os.sched_getaffinity(0))

    def connection():   # as placement.CpuPlacement places a connection thread
        os.sched_setaffinity(0, {min(everywhere)})
        dense._parallel_rows(2 * dense._SCAN_PARALLEL_ROWS, dense._SCAN_BLOCK, scan)
        seen["caller"] = threading.get_ident()

    thread = threading.Thread(target=connection)
    thread.start()
    thread.join(30)
    caller = seen.pop("caller")
    assert seen.pop(caller) == {min(everywhere)}
    assert seen and all(cpus == everywhere for cpus in seen.values())
