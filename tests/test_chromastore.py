"""ChromaStore (_ragproxy.chromastore) against a real Chroma server: markers, dimensions, failures, sweeps, lease.

The interface both stores share is test_vectorstore's; knowledge bases on
Chroma (mirror, replicas, kills) are test_kb_chroma's.
"""
import socket

import pytest

from _ragproxy.chroma import ChromaClient
from _ragproxy.chromastore import ChromaStore
from _ragproxy.vectorstore import StoreSpec, VectorStoreError


def _spec(server, prefix, **kw):
    return StoreSpec(type="chroma_http", base_url=server.url, collection_prefix=prefix, **kw)


def _chunks(source, n, word="alpha"):
    return [{"id": f"{source}#{i}", "text": f"{word} {i}", "source": source, "title": "", "headings": [],
             "symbol": "", "line_start": i, "line_end": i, "hash": f"h{i}", "context": ""} for i in range(n)]


def _record(chunks, digest="d"):
    return {"size": 1, "mtime": 1, "hash": digest, "chunk_ids": [c["id"] for c in chunks]}


def _write(store, source, n, dim=3, digest="d"):
    chunks = _chunks(source, n)
    store.replace_file(source, _record(chunks, digest), chunks, [[1.0 + i] + [0.5] * (dim - 1) for i in range(n)])
    return chunks


def _closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def client(chroma_server):
    c = ChromaClient(chroma_server.url)
    yield c
    c.close()


def test_a_collection_another_tool_wrote_is_refused_and_left_alone(chroma_server, chroma_prefix, client):
    foreign = client.create_collection(chroma_prefix + "kb", metadata={"owner": "someone else"})
    client.upsert(foreign["id"], ["theirs"], [[0.1, 0.2]], documents=["their text"])
    store = ChromaStore(_spec(chroma_server, chroma_prefix), "kb")
    with pytest.raises(VectorStoreError, match="not written by ragproxy.*collection_prefix") as info:
        store.open(create=True)
    assert chroma_prefix + "kb" in str(info.value)
    with pytest.raises(VectorStoreError, match="not written by ragproxy"):
        _write(store, "a.md", 2)
    assert client.count(foreign["id"]) == 1
    assert client.get_collection(chroma_prefix + "kb")["metadata"] == {"owner": "someone else"}
    assert client.get_collection(chroma_prefix + "kb.files") is None  # nothing created beside it either


def test_another_knowledge_bases_or_a_newer_schemas_collection_is_refused(chroma_server, chroma_prefix, client):
    client.create_collection(chroma_prefix + "kb", metadata={"ragproxy_schema": 1, "ragproxy_kb": "other",
                                                             "ragproxy_role": "chunks", "ragproxy_dim": 3})
    with pytest.raises(VectorStoreError, match="belongs to knowledge base 'other'"):
        ChromaStore(_spec(chroma_server, chroma_prefix), "kb").open()
    client.create_collection(chroma_prefix + "kc", metadata={"ragproxy_schema": 99, "ragproxy_kb": "kc",
                                                             "ragproxy_role": "chunks"})
    with pytest.raises(VectorStoreError, match="ragproxy_schema 99.*upgrade ragproxy"):
        ChromaStore(_spec(chroma_server, chroma_prefix), "kc").open()


def test_a_dimension_other_than_the_collections_is_refused_before_anything_is_written(chroma_server, chroma_prefix):
    store = ChromaStore(_spec(chroma_server, chroma_prefix), "kb")
    before = _write(store, "a.md", 2, dim=3)
    store.commit()
    fresh = ChromaStore(_spec(chroma_server, chroma_prefix), "kb")
    chunks = _chunks("a.md", 3, word="new")
    with pytest.raises(VectorStoreError, match="3-dimensional vectors.*gives 5-dimensional.*re-index"):
        fresh.replace_file("a.md", _record(chunks, "d2"), chunks, [[1.0] * 5] * 3)
    assert fresh.writes["chunks_upserted"] == 0
    again = ChromaStore(_spec(chroma_server, chroma_prefix), "kb")
    assert again.files() == {"a.md": _record(before)}
    assert again.get_chunks([c["id"] for c in chunks]) == before  # a.md#0 and #1 as they were, no #2
    with pytest.raises(VectorStoreError, match="query embedding has 5"):
        again.dense_search([1.0] * 5, 3)


def test_a_lexical_collection_holds_placeholders_and_refuses_dense_search(chroma_server, chroma_prefix):
    store = ChromaStore(_spec(chroma_server, chroma_prefix), "kb")
    chunks = _chunks("a.md", 2)
    store.replace_file("a.md", _record(chunks), chunks, None)
    store.commit()
    assert store.get_chunks([c["id"] for c in chunks]) == chunks
    with pytest.raises(VectorStoreError, match="holds no vectors"):
        store.dense_search([1.0], 1)
    with pytest.raises(VectorStoreError, match="no vectors \\(a lexical knowledge base\\)"):
        _write(store, "b.md", 1, dim=4)


def test_a_server_that_does_not_answer_is_unreachable_and_the_message_hides_its_address():
    port = _closed_port()
    store = ChromaStore(StoreSpec(type="chroma_http", base_url=f"http://127.0.0.1:{port}", timeout=2), "kb")
    with pytest.raises(VectorStoreError) as info:
        store.open(create=True)
    assert info.value.unreachable
    assert str(port) not in str(info.value) and "127.0.0.1" not in str(info.value)
    check = store.check()
    assert not check["ok"] and str(port) not in check["message"] and check["latency_ms"] is None


@pytest.mark.parametrize("field", ["tenant", "database"])
def test_a_wrong_tenant_or_database_names_the_key_to_fix(chroma_server, chroma_prefix, field):
    store = ChromaStore(_spec(chroma_server, chroma_prefix, **{field: "no_such_" + field}), "kb")
    with pytest.raises(VectorStoreError, match=f"no_such_{field}.*vectorstore.chroma_http.{field}") as info:
        _write(store, "a.md", 1)
    assert not info.value.unreachable
    assert store.writes == {}


def test_a_killed_writer_leaves_whole_files_and_the_next_run_sweeps_the_rest(chroma_server, chroma_prefix, client):
    store = ChromaStore(_spec(chroma_server, chroma_prefix), "kb")
    kept = _write(store, "a.md", 2)
    store.commit({"s": 1})
    # What a writer killed between a file's chunks and its record leaves: chunks no record names, dirty set.
    store.replace_file("b.md", _record(_chunks("b.md", 1)), _chunks("b.md", 1), [[1.0, 0.0, 0.0]])
    chunks_id, files_id = store._ids
    client.upsert(chunks_id, ["c.md#0", "c.md#1"], [[0.0, 1.0, 0.0]] * 2, documents=["orphan", "orphan"])
    # And a record whose chunks are not all there (a hand-deleted chunk).
    client.delete(chunks_id, ids=["b.md#0"])
    after = ChromaStore(_spec(chroma_server, chroma_prefix), "kb")
    commit = after.read_commit()
    assert commit["dirty"] and commit["version"] == 1 and commit["settings"] == {"s": 1}
    after.adopt_dirty()
    assert after.files() == {"a.md": _record(kept)}
    assert sorted(client.get(chunks_id, include=())["ids"]) == ["a.md#0", "a.md#1"]
    assert after.writes["chunks_deleted"] == 2 and after.writes["records_deleted"] == 1
    assert after.commit({"s": 1}) == 2 and not after.read_commit()["dirty"]


def test_replacing_a_file_deletes_only_its_stale_chunks(chroma_server, chroma_prefix):
    store = ChromaStore(_spec(chroma_server, chroma_prefix), "kb")
    _write(store, "a.md", 3)
    _write(store, "b.md", 2)
    store.commit()
    store.writes.clear()
    _write(store, "a.md", 1, digest="d2")
    assert store.writes == {"chunks_upserted": 1, "records_upserted": 1, "chunks_deleted": 2}
    assert store.count() == 3


def test_the_lease_goes_to_one_process_and_passes_on_when_it_expires(chroma_server, chroma_prefix):
    now = [1000.0]
    spec = _spec(chroma_server, chroma_prefix, sync_interval=1.0)
    first = ChromaStore(spec, "kb", clock=lambda: now[0], holder="first")
    second = ChromaStore(spec, "kb", clock=lambda: now[0], holder="second")
    assert first.acquire_lease() and not second.acquire_lease()
    now[0] += first.lease_ttl / 2
    assert first.acquire_lease() and not second.acquire_lease()   # renewed
    now[0] += first.lease_ttl + 1                                 # the first stopped renewing
    assert second.acquire_lease() and not first.acquire_lease()
    # An indexer that lost its lease mid-run stops at its next write instead of writing beside the new one.
    first._leased_at = now[0] - first.lease_ttl
    with pytest.raises(VectorStoreError, match="another process took the indexer lease"):
        _write(first, "a.md", 1)
    assert first.writes == {}
    second.release_lease()
    assert first.acquire_lease()


def test_a_server_too_slow_to_answer_is_unreachable_too():
    import threading

    held = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]

        def accept():   # takes connections and never answers
            while True:
                try:
                    held.append(listener.accept()[0])
                except OSError:
                    return
        threading.Thread(target=accept, daemon=True).start()
        store = ChromaStore(StoreSpec(type="chroma_http", base_url=f"http://127.0.0.1:{port}", timeout=0.3), "kb")
        with pytest.raises(VectorStoreError) as info:
            store.dense_search([1.0, 0.0], 3)
        assert info.value.unreachable and str(port) not in str(info.value)
    for conn in held:
        conn.close()


def test_whole_collections_are_read_in_pages(chroma_server, chroma_prefix, client):
    store = ChromaStore(_spec(chroma_server, chroma_prefix), "kb")
    written = {f"f{i}.md": _write(store, f"f{i}.md", 2) for i in range(5)}
    store.commit()
    chunks_id, _ = store._ids
    client.upsert(chunks_id, ["orphan#0"], [[0.0, 1.0, 0.0]], documents=["left by a killed run"])
    paged = ChromaStore(_spec(chroma_server, chroma_prefix), "kb", read_page=3)   # 5 file records + commit
    assert paged.files() == {s: _record(c) for s, c in written.items()}
    assert paged.sweep() == (1, 0)   # 11 chunks in four pages, the one no record names found
    assert paged.count() == 10
