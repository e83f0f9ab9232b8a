"""The vector store (_ragproxy.store): crash-safe generations and dense search on them, in-process.

Most tests run in both modes (the ``mode`` fixture: numpy, then pure);
the crash test forks a writer and SIGKILLs it mid-commit.  The .npy files
a generation is made of are test_npy's.
"""
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

import ragproxy
from _ragproxy import deps, npy
from _ragproxy.store import _Registry
from conftest import brute_force, random_rows, unit

# --- helpers -----------------------------------------------------------------

def as_lists(vectors):
    return [[float(x) for x in row] for row in vectors]


def kb_entries(root):
    return sorted(os.listdir(root))


def commit_state(store, n, tag, dim=4, extra=None):
    chunks = [{"id": "%s-%d" % (tag, j), "text": "%s chunk %d" % (tag, j)} for j in range(n)]
    rows = random_rows(n, dim, seed=hash(tag) & 0xFFFF)
    with store.begin() as w:
        w.add_chunks(chunks)
        w.add_vectors(rows)
        if extra is not None:
            w.write_file("extra.bin", extra)
    return chunks, rows


# --- generations ----------------------------------------------------------------


def test_a_generation_records_when_it_was_committed_by_the_stores_clock(tmp_path):
    root = str(tmp_path / "kb")
    ticks = iter([1700000000.5, 1700000123.25])
    store = ragproxy.KBStore(root, clock=lambda: next(ticks))
    for n in range(2):
        with store.begin() as w:
            w.add_chunks([{"id": "c%d" % n, "text": "t"}])
    assert store.current().created == 1700000123.25
    # Another process, or this one after a restart, reads it from the generation itself.
    assert ragproxy.KBStore(root).current().created == 1700000123.25

def test_commit_and_reload_round_trip(tmp_path, mode):
    root = str(tmp_path / "kb")
    store = ragproxy.KBStore(root)
    assert store.current() is None
    chunks = [{"id": "a%d" % i, "text": "line one\nline \"two\" é ☃ %d" % i, "source": "docs/a.md",
               "headings": ["A", "B"], "line_start": i, "line_end": i + 3} for i in range(25)]
    rows = random_rows(25, 6)
    manifest = {"docs/a.md": {"size": 10, "mtime": 1.5, "hash": "ab", "chunk_ids": [c["id"] for c in chunks]}}
    with store.begin() as w:
        w.add_chunks(chunks[:10])
        w.add_vectors(rows[:10])
        w.add_chunks(chunks[10:])
        w.add_vectors(rows[10:])
        w.set_manifest(manifest)
        w.write_file("bm25.bin", b"\x00\x01binary")
        with open(w.path("notes.txt"), "w") as f:
            f.write("caller wrote this")
    gen = ragproxy.KBStore(root).current()
    assert gen.number == 1 and len(gen) == 25 and gen.dim == 6
    assert list(gen.chunks) == chunks
    assert gen.chunks[7] == chunks[7] and gen.chunks[-1] == chunks[-1]
    assert gen.chunks[3:9] == chunks[3:9] and gen.chunks[::7] == chunks[::7]
    assert gen.chunks.get_many([24, 0, 7, 7]) == [chunks[24], chunks[0], chunks[7], chunks[7]]
    for row in (25, -1):
        with pytest.raises(IndexError):
            gen.chunks.get_many([0, row])
    assert gen.manifest == manifest
    assert gen.read_file("bm25.bin") == b"\x00\x01binary"
    assert open(gen.path("notes.txt")).read() == "caller wrote this"
    assert gen.has("notes.txt") and not gen.has("missing")
    for got, want in zip(as_lists(gen.vectors), rows):
        assert got == pytest.approx(unit(want), abs=1e-6)
    assert gen.rows_for_ids(["a3", "nope", "a24"]) == [3, 24]
    # Plain tools can read the files.
    with open(gen.path("chunks.jsonl"), encoding="utf-8") as f:
        assert [json.loads(line) for line in f] == chunks


def test_vectors_file_loads_with_numpy(tmp_path, mode):
    np = pytest.importorskip("numpy")
    store = ragproxy.KBStore(str(tmp_path / "kb"))
    _, rows = commit_state(store, 40, "v", dim=5)
    loaded = np.load(store.current().path("vectors.npy"))
    assert loaded.dtype == np.float32 and loaded.shape == (40, 5) and loaded.flags.c_contiguous
    assert np.allclose(loaded, [unit(r) for r in rows], atol=1e-6)


def test_lexical_only_kb_has_no_vectors(tmp_path, mode):
    store = ragproxy.KBStore(str(tmp_path / "kb"))
    with store.begin() as w:
        w.add_chunks([{"id": "x", "text": "only words"}])
    gen = store.current()
    assert gen.vectors is None and gen.dim is None
    assert "vectors.npy" not in os.listdir(gen.dir)
    assert gen.dense_search([1.0, 0.0], 5) == []


def test_empty_generation(tmp_path, mode):
    store = ragproxy.KBStore(str(tmp_path / "kb"))
    with store.begin():
        pass
    gen = store.current()
    assert len(gen) == 0 and list(gen.chunks) == [] and gen.manifest == {}


def test_readers_see_old_generation_until_commit(tmp_path, mode):
    root = str(tmp_path / "kb")
    store = ragproxy.KBStore(root)
    old_chunks, old_rows = commit_state(store, 5, "old")
    reader = store.current()
    with store.begin() as w:
        w.add_chunks([{"id": "new", "text": "new"}])
        w.add_vectors([[0.0, 1.0, 0.0, 0.0]])
        assert store.current().number == 1
        assert ragproxy.KBStore(root).current().number == 1
        assert list(ragproxy.KBStore(root).current().chunks) == old_chunks
    assert store.current().number == 2
    assert ragproxy.KBStore(root).current().chunks[0]["id"] == "new"
    # The reader taken before the commit still sees the old data.
    assert list(reader.chunks) == old_chunks
    assert as_lists(reader.vectors)[4] == pytest.approx(unit(old_rows[4]), abs=1e-6)


def test_exception_inside_begin_leaves_nothing(tmp_path, mode):
    root = str(tmp_path / "kb")
    store = ragproxy.KBStore(root)
    before = kb_entries(root)
    with pytest.raises(RuntimeError, match="boom"):
        with store.begin() as w:
            w.add_chunks([{"id": "a", "text": "a"}])
            w.add_vectors([[1.0, 0.0]])
            w.write_file("extra", b"x")
            raise RuntimeError("boom")
    assert kb_entries(root) == before
    assert store.current() is None
    commit_state(store, 3, "first")
    with pytest.raises(RuntimeError):
        with store.begin() as w:
            w.add_chunks([{"id": "b", "text": "b"}])
            raise RuntimeError("again")
    assert store.current().number == 1
    assert not [e for e in kb_entries(root) if e.startswith(".")]


def test_vector_count_mismatch_fails_commit_and_leaves_nothing(tmp_path, mode):
    root = str(tmp_path / "kb")
    store = ragproxy.KBStore(root)
    with pytest.raises(ragproxy.StoreError, match="2 vectors for 3 chunks"):
        with store.begin() as w:
            w.add_chunks([{"id": str(i)} for i in range(3)])
            w.add_vectors([[1.0, 0.0], [0.0, 1.0]])
    assert store.current() is None
    assert not [e for e in kb_entries(root) if e.startswith(".")]


def test_writer_rejects_bad_input(tmp_path, mode):
    store = ragproxy.KBStore(str(tmp_path / "kb"))
    with store.begin() as w:
        with pytest.raises(TypeError):
            w.add_chunks(["not a dict"])
        with pytest.raises(ValueError):
            w.write_file("../escape", b"")
        with pytest.raises(ValueError):
            w.write_file("chunks.jsonl", b"")
        w.add_vectors([[1.0, 0.0, 0.0]])
        with pytest.raises(ValueError, match="dimensions"):
            w.add_vectors([[1.0, 0.0]])
        w.abort()
    with pytest.raises(ragproxy.StoreError):
        w.add_chunks([{"id": "late"}])
    assert store.current() is None


def test_copy_rows_carries_chunks_and_vectors_over(tmp_path, mode):
    store = ragproxy.KBStore(str(tmp_path / "kb"), compact="f16")
    chunks, rows = commit_state(store, 20, "base", dim=8)
    old = store.current()
    picked = [2, 5, 6, 7, 19, 0, 1]
    with store.begin() as w:
        w.copy_rows(old, picked)
        w.add_chunks([{"id": "fresh"}])
        w.add_vectors([[1.0] * 8])
        w.copy_rows(old, [3])
    gen = store.current()
    assert list(gen.chunks) == [chunks[i] for i in picked] + [{"id": "fresh"}, chunks[3]]
    assert gen.chunks[7] == {"id": "fresh"} and gen.chunks[8] == chunks[3]
    got, before = as_lists(gen.vectors), as_lists(old.vectors)
    assert got[:7] == [before[i] for i in picked]
    assert got[7] == pytest.approx(unit([1.0] * 8), abs=1e-6)
    assert got[8] == before[3]
    assert len(gen.compact) == 9
    with store.begin() as w:
        with pytest.raises(IndexError):
            w.copy_rows(gen, [9])
        w.abort()


def test_many_chunks_read_in_blocks_and_slices(tmp_path, mode):
    store = ragproxy.KBStore(str(tmp_path / "kb"))
    chunks = [{"id": i, "t": "x" * (i % 7)} for i in range(9000)]
    with store.begin() as w:
        w.add_chunks(chunks)
    gen = ragproxy.KBStore(str(tmp_path / "kb")).current()
    assert list(gen.chunks) == chunks
    assert gen.chunks[4094:4099] == chunks[4094:4099]
    assert gen.chunks[8999] == chunks[8999]
    with pytest.raises(IndexError):
        gen.chunks[9000]


def test_gc_keeps_current_previous_and_open_generations(tmp_path, mode):
    root = str(tmp_path / "kb")
    store = ragproxy.KBStore(root)
    commit_state(store, 2, "g1")
    held = store.current()            # a reader holding generation 1
    for n in range(2, 6):
        commit_state(store, 2, "g%d" % n)
    gens = [e for e in kb_entries(root) if e.startswith("g")]
    assert gens == ["g000001", "g000004", "g000005"]
    assert list(held.chunks)[0]["id"] == "g1-0"
    del held
    commit_state(store, 2, "g6")
    assert [e for e in kb_entries(root) if e.startswith("g")] == ["g000005", "g000006"]


def test_gc_on_open_removes_abandoned_temp_dirs(tmp_path, mode):
    root = str(tmp_path / "kb")
    store = ragproxy.KBStore(root)
    commit_state(store, 2, "a")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = os.path.join(root, ".tmp-%d-deadbeef" % dead.pid)
    os.mkdir(stale)
    open(os.path.join(stale, "chunks.jsonl"), "w").write("{}\n")
    trash = os.path.join(root, ".trash-%d-0123abcd" % dead.pid)
    os.mkdir(trash)
    live = os.path.join(root, ".tmp-%d-cafef00d" % os.getppid())  # a live writer elsewhere
    os.mkdir(live)
    ragproxy.KBStore(root)
    entries = kb_entries(root)
    assert os.path.basename(stale) not in entries and os.path.basename(trash) not in entries
    assert os.path.basename(live) in entries
    assert store.current().chunks[0]["id"] == "a-0"


def test_a_commit_by_another_process_is_seen_by_the_next_current(tmp_path, mode):
    """current() re-reads CURRENT only when a stat says it was replaced: another store's
    commit (another process's) renames a new file over it, and the next call sees it."""
    root = str(tmp_path / "kb")
    reader, writer = ragproxy.KBStore(root), ragproxy.KBStore(root)
    commit_state(writer, 3, "one")
    seen = [reader.current().number, reader.current().number]
    for n in range(2):
        commit_state(writer, 3, f"again{n}")
        seen.append(reader.current().number)
    os.unlink(os.path.join(root, "CURRENT"))   # the newest complete generation stands in
    commit_state(writer, 3, "last")
    seen.append(reader.current().number)
    assert seen == [1, 1, 2, 3, 4]


def test_with_a_max_age_another_process_commit_is_seen_once_the_last_look_is_that_old(tmp_path, mode):
    """current(max_age) answers from a look at CURRENT younger than max_age without a stat
    (the retrieval path's per-request saving); older, or with no max_age, it looks again."""
    now = [100.0]
    root = str(tmp_path / "kb")
    reader, writer = ragproxy.KBStore(root, monotonic=lambda: now[0]), ragproxy.KBStore(root)
    commit_state(writer, 3, "one")
    assert reader.current(max_age=0.05).number == 1
    commit_state(writer, 3, "two")
    now[0] += 0.04
    assert reader.current(max_age=0.05).number == 1     # 40 ms after the last look: not yet
    now[0] += 0.02
    assert reader.current(max_age=0.05).number == 2     # 60 ms: looked again
    commit_state(writer, 3, "three")
    assert reader.current(max_age=0.05).number == 2
    assert reader.current().number == 3                 # writers and the admin API ask for no max_age
    os.unlink(os.path.join(root, "CURRENT"))
    now[0] += 1.0
    assert reader.current(max_age=0.05).number == 3    # the newest complete generation stands in


def test_with_a_max_age_this_stores_own_commit_is_seen_at_once(tmp_path, mode):
    now = [100.0]
    store = ragproxy.KBStore(str(tmp_path / "kb"), monotonic=lambda: now[0])
    commit_state(store, 3, "one")
    assert store.current(max_age=60).number == 1
    commit_state(store, 3, "two")
    assert store.current(max_age=60).number == 2


def test_garbage_current_falls_back_to_newest_complete(tmp_path, mode, caplog):
    root = str(tmp_path / "kb")
    store = ragproxy.KBStore(root)
    commit_state(store, 3, "one")
    commit_state(store, 4, "two")
    # An unfinished writer's temp dir is newer but must never be chosen.
    w = store.begin()
    w.add_chunks([{"id": "unfinished"}])
    open(os.path.join(root, "CURRENT"), "wb").write(b"\x00garbage")
    with caplog.at_level(logging.WARNING, logger="ragproxy"):
        gen = ragproxy.KBStore(root).current()
    assert gen.number == 2 and len(gen) == 4
    assert "CURRENT" in caplog.text
    w.abort()


def test_current_naming_missing_dir_falls_back(tmp_path, mode, caplog):
    root = str(tmp_path / "kb")
    store = ragproxy.KBStore(root)
    commit_state(store, 3, "one")
    open(os.path.join(root, "CURRENT"), "w").write("g000009\n")
    with caplog.at_level(logging.WARNING, logger="ragproxy"):
        gen = ragproxy.KBStore(root).current()
    assert gen.number == 1
    assert "g000009" in caplog.text


def test_missing_current_falls_back(tmp_path, mode):
    root = str(tmp_path / "kb")
    store = ragproxy.KBStore(root)
    commit_state(store, 3, "one")
    os.unlink(os.path.join(root, "CURRENT"))
    assert ragproxy.KBStore(root).current().number == 1


def test_damaged_current_generation_falls_back_to_previous(tmp_path, mode, caplog):
    root = str(tmp_path / "kb")
    store = ragproxy.KBStore(root)
    commit_state(store, 3, "one")
    commit_state(store, 4, "two")
    path = os.path.join(root, "g000002", "vectors.npy")
    data = open(path, "rb").read()
    open(path, "wb").write(data[:-4])
    with caplog.at_level(logging.WARNING, logger="ragproxy"):
        gen = ragproxy.KBStore(root).current()
    assert gen.number == 1 and len(gen) == 3
    assert "vectors.npy" in caplog.text


def test_chunks_shorter_than_their_index_are_refused_at_open(tmp_path, mode, caplog):
    # Even when meta.json agrees with the damaged size, a chunk list is never
    # mapped past the end of its file (that would be SIGBUS on first read).
    root = str(tmp_path / "kb")
    store = ragproxy.KBStore(root)
    commit_state(store, 3, "one")
    commit_state(store, 4, "two")
    gen_dir = os.path.join(root, "g000002")
    path = os.path.join(gen_dir, "chunks.jsonl")
    data = open(path, "rb").read()
    open(path, "wb").write(data[:-10])
    meta_path = os.path.join(gen_dir, "meta.json")
    meta = json.load(open(meta_path))
    meta["files"]["chunks.jsonl"] = len(data) - 10
    open(meta_path, "w").write(json.dumps(meta))
    with caplog.at_level(logging.WARNING, logger="ragproxy"):
        gen = ragproxy.KBStore(root).current()
    assert gen.number == 1 and [c["id"] for c in gen.chunks] == ["one-0", "one-1", "one-2"]
    assert "shorter than its index" in caplog.text


@pytest.mark.skipif(os.name == "nt", reason="Windows keeps an open file's directory")
def test_chunks_handed_out_read_on_after_their_generation_is_collected(tmp_path, mode):
    root = str(tmp_path / "kb")
    store = ragproxy.KBStore(root)
    chunks, _ = commit_state(store, 5, "old")
    taken = store.current().chunks     # the Generation itself is dropped at once
    for n in range(3):
        commit_state(store, 2, "new%d" % n)
    assert "g000001" not in kb_entries(root)
    assert taken.get_many([4, 0]) == [chunks[4], chunks[0]] and list(taken) == chunks
    taken.close()
    with pytest.raises(ValueError):
        taken[0]


def test_generation_without_meta_is_not_complete(tmp_path, mode):
    root = str(tmp_path / "kb")
    store = ragproxy.KBStore(root)
    commit_state(store, 3, "one")
    commit_state(store, 4, "two")
    os.unlink(os.path.join(root, "g000002", "meta.json"))
    os.unlink(os.path.join(root, "CURRENT"))
    assert ragproxy.KBStore(root).current().number == 1


def test_concurrent_commits_get_distinct_generations(tmp_path, mode):
    root = str(tmp_path / "kb")
    errors = []

    def writer(tag):
        try:
            store = ragproxy.KBStore(root)
            for i in range(5):
                commit_state(store, 3, "%s%d" % (tag, i))
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(t,)) for t in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    gen = ragproxy.KBStore(root).current()
    assert gen.number == 10 and len(gen) == 3


# --- dense search on stored generations ---------------------------------------------

def test_dense_top_k_on_stored_vectors_and_candidates(tmp_path, mode):
    store = ragproxy.KBStore(str(tmp_path / "kb"))
    _, rows = commit_state(store, 200, "d", dim=12)
    gen = store.current()
    query = rows[17]
    assert gen.dense_search(query, 1)[0][0] == 17
    assert gen.dense_search(query, 1)[0][1] == pytest.approx(1.0, abs=1e-5)
    cands = [3, 50, 199, 50]
    got = ragproxy.dense_top_k(gen.vectors, query, 10, candidates=cands)
    want = [(i, s) for s, i in brute_force(rows, query, 200) if i in cands]
    assert [r for r, _ in got] == [i for i, _ in want]
    assert ragproxy.dense_top_k(gen.vectors, query, 5, candidates=[]) == []
    with pytest.raises(IndexError):
        ragproxy.dense_top_k(gen.vectors, query, 5, candidates=[200])
    assert len(ragproxy.dense_top_k(gen.vectors, query, 1000)) == 200


def test_numpy_and_pure_agree(tmp_path, monkeypatch):
    if deps.np is None:
        pytest.skip("numpy disabled")
    store = ragproxy.KBStore(str(tmp_path / "kb"))
    _, rows = commit_state(store, 500, "agree", dim=24)
    path = store.current().dir
    query = random_rows(1, 24, seed=7)[0]
    fast = ragproxy.dense_top_k(npy.npy_read_array(os.path.join(path, "vectors.npy")), query, 10)
    monkeypatch.setattr(deps, "np", None)
    slow = ragproxy.dense_top_k(npy.npy_read_array(os.path.join(path, "vectors.npy")), query, 10)
    assert [r for r, _ in fast] == [r for r, _ in slow]
    assert [s for _, s in fast] == pytest.approx([s for _, s in slow], abs=1e-5)


@pytest.mark.parametrize("kind", ["f16", "i8"])
def test_compact_copy_recall_and_exact_scores(tmp_path, mode, kind):
    store = ragproxy.KBStore(str(tmp_path / "kb"), compact=kind)
    n, dim = 1500 if mode == "numpy" else 400, 32
    commit_state(store, n, "cmp", dim=dim)
    gen = store.current()
    assert gen.compact_kind == kind and len(gen.compact) == n
    hits = total = 0
    for seed in range(10):
        query = random_rows(1, dim, seed=1000 + seed)[0]
        exact = gen.dense_search(query, 10, use_compact=False)
        approx = gen.dense_search(query, 10, oversample=4, use_compact=True)
        exact_scores = dict(ragproxy.dense_top_k(gen.vectors, query, n))
        for row, score in approx:  # re-scored against float32
            assert score == pytest.approx(exact_scores[row], abs=1e-6)
        hits += len({r for r, _ in exact} & {r for r, _ in approx})
        total += 10
    assert hits / total >= 0.95


def clustered_rows(n, dim, seed, clusters=12):
    """Unit rows around a few centres, as embeddings group by topic."""
    rng = random.Random(seed)
    centres = random_rows(clusters, dim, seed=seed + 1)
    rows = []
    for _ in range(n):
        centre = centres[rng.randrange(clusters)]
        rows.append(unit([c + 0.8 * rng.gauss(0.0, 1.0) for c in centre]))
    return rows


def test_binary_codes_are_sign_bits_in_whole_words(tmp_path, mode):
    store = ragproxy.KBStore(str(tmp_path / "kb"), compact="b1")
    dim = 70  # not a multiple of 8 or 64: the last word is part padding
    rows = [[1.0 if j % 3 == 0 else -1.0 for j in range(dim)],
            [0.0] * (dim - 1) + [0.5],  # zero counts as not positive
            [-1.0] * dim]
    with store.begin() as w:
        w.add_chunks({"id": str(i), "text": "t"} for i in range(3))
        w.add_vectors(rows)
    with open(os.path.join(store.current().dir, "vectors.b1.npy"), "rb") as f:
        data = f.read()
    width = 16  # 70 bits -> two 64-bit words
    body = data[-3 * width:]
    assert len(data) == 128 + 3 * width  # the streamed .npy header, then the rows
    expect = [int("".join("1" if x > 0 else "0" for x in row).ljust(8 * width, "0"), 2).to_bytes(width, "big")
              for row in rows]
    assert [body[i * width:(i + 1) * width] for i in range(3)] == expect
    if mode == "numpy":
        np = deps.np
        loaded = np.load(os.path.join(store.current().dir, "vectors.b1.npy"))
        assert loaded.dtype == np.uint8 and loaded.shape == (3, width)


def test_binary_search_recall_and_exact_scores(tmp_path, mode):
    store = ragproxy.KBStore(str(tmp_path / "kb"), compact="b1")
    n, dim = (3000 if mode == "numpy" else 600), 64
    rows = clustered_rows(n, dim, seed=5)
    with store.begin() as w:
        w.add_chunks({"id": str(i), "text": "t"} for i in range(n))
        w.add_vectors(rows)
    gen = store.current()
    assert gen.compact_kind == "b1"
    hits = total = 0
    rng = random.Random(6)
    queries = [[x + 0.05 * rng.gauss(0.0, 1.0) for x in rows[rng.randrange(n)]] for _ in range(12)]
    for query in queries:  # near the rows, as a question is near its answers
        exact = gen.dense_search(query, 10, use_compact=False)
        approx = gen.dense_search(query, 10)  # auto: binary first with numpy, exact scan without
        forced = gen.dense_search(query, 10, use_compact=True)
        assert approx == (forced if mode == "numpy" else exact)
        exact_scores = dict(ragproxy.dense_top_k(gen.vectors, query, n))
        for row, score in forced:  # re-scored against float32
            assert score == pytest.approx(exact_scores[row], abs=1e-6)
        assert [s for _, s in forced] == sorted((s for _, s in forced), reverse=True)
        hits += len({r for r, _ in exact} & {r for r, _ in forced})
        total += 10
    assert hits / total >= 0.97
    # A pool as small as k keeps only the Hamming order: recall must drop.
    small = sum(len({r for r, _ in gen.dense_search(q, 10, use_compact=False)}
                    & {r for r, _ in gen.dense_search(q, 10, oversample=1, use_compact=True)})
                for q in queries)
    assert small < hits
    assert gen.dense_search(random_rows(1, dim)[0], 10, candidates=[3, 4], use_compact=True) == \
        gen.dense_search(random_rows(1, dim)[0], 10, candidates=[3, 4], use_compact=False)


def test_a_finalizer_releasing_a_generation_under_the_registry_lock_does_not_deadlock():
    # The garbage collector runs weakref finalizers inside whatever allocation
    # triggered it, which may be one made while this thread holds the lock.
    registry = _Registry()
    registry.retain(("root", "g000001"))
    registry.retain(("root", "g000002"))
    result = {}

    def scenario():
        with registry.lock:
            registry.release(("root", "g000001"))  # as a finalizer would, lock held
        result["open"] = registry.open_names("root")

    worker = threading.Thread(target=scenario, daemon=True)
    worker.start()
    worker.join(5.0)
    assert not worker.is_alive(), "release() blocked on the registry lock"
    assert result["open"] == {"g000002"}


# --- crash safety ---------------------------------------------------------------------

STATE_SRC = r'''
def expected_state(i):
    n = 1 + (i * 37) % 90
    chunks = [{"id": "s%d-c%d" % (i, j), "state": i, "text": "line\n" * (j % 4) + "\u00e9%d" % j}
              for j in range(n)]
    vectors = None if i % 5 == 0 else [
        [float((i + j) % 7 + 1), float(j % 5), 1.0, float(i % 3)] for j in range(n)]
    return chunks, vectors, {"state": i, "n": n}, ("extra%d" % i).encode() * 50
'''

# A fork server: it imports ragproxy once, then for each start number on stdin
# forks a worker that commits states start+1, start+2, ... until it is killed.
# Its stdout: the worker's pid, "c N" as each state N is committed (written by
# the worker itself), then "end" once the worker is dead and reaped.
CRASH_CHILD = STATE_SRC + r'''
import os, sys
sys.path.insert(0, sys.argv[1])
import ragproxy
KBStore = ragproxy.KBStore  # loaded once, before the forks
root = sys.argv[2]
print("ready", flush=True)
for line in sys.stdin:
    start = int(line)
    pid = os.fork()
    if pid == 0:
        store = KBStore(root)
        i = start
        while True:
            i += 1
            chunks, vectors, manifest, extra = expected_state(i)
            with store.begin() as wr:
                wr.add_chunks(chunks)
                if vectors is not None:
                    wr.add_vectors(vectors)
                wr.set_manifest(manifest)
                wr.write_file("extra.bin", extra)
            os.write(1, b"c %d\n" % i)
    print(pid, flush=True)
    os.waitpid(pid, 0)
    print("end", flush=True)
'''


def check_generation_is_state(gen, state):
    ns = {}
    exec(STATE_SRC, ns)
    chunks, vectors, manifest, extra = ns["expected_state"](state)
    assert gen.manifest == manifest
    assert len(gen.chunks) == len(chunks)
    assert list(gen.chunks) == chunks  # every line parses and matches
    assert gen.read_file("extra.bin") == extra
    if vectors is None:
        assert gen.vectors is None
    else:
        got = as_lists(gen.vectors)
        assert len(got) == len(chunks)
        for g, v in zip(got, vectors):
            assert g == pytest.approx(unit(v), abs=1e-6)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork and SIGKILL")
def test_sigkill_during_commits_never_exposes_a_partial_generation(tmp_path):
    root = str(tmp_path / "kb")
    here = os.path.dirname(os.path.abspath(ragproxy.__file__))
    rng = random.Random(1234)
    rounds = 30
    # Half the rounds write with numpy, half with the stdlib path; both are
    # read back here with whatever this process uses.
    envs = [dict(os.environ), dict(os.environ, RAGPROXY_PURE="1")]
    last_state = 0
    for env in envs:
        proc = subprocess.Popen([sys.executable, "-c", CRASH_CHILD, here, root], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "ready"
            for _ in range(rounds // len(envs)):
                proc.stdin.write("%d\n" % last_state)
                proc.stdin.flush()
                started = time.monotonic()
                worker = int(proc.stdout.readline())
                # Wait for one commit so the kill can land anywhere in the
                # next one, however slow fsync is on this disk.
                first = proc.stdout.readline().split()
                assert first[0] == "c"
                one_commit = time.monotonic() - started
                time.sleep(rng.uniform(0.0, one_commit))
                os.kill(worker, signal.SIGKILL)
                committed = [int(first[1])]
                for line in iter(proc.stdout.readline, "end\n"):
                    assert line.startswith("c "), line
                    committed.append(int(line.split()[1]))
                gen = ragproxy.KBStore(root).current()
                assert gen is not None
                state = gen.manifest["state"]
                # A commit that returned is durable; at most the one in flight is extra.
                assert committed[-1] <= state <= committed[-1] + 1
                check_generation_is_state(gen, state)
                entries = os.listdir(root)
                assert not [e for e in entries if e.startswith(".")]
                assert len([e for e in entries if e.startswith("g")]) <= 2
                last_state = state
                del gen
        finally:
            proc.stdin.close()
            proc.wait(timeout=10)
