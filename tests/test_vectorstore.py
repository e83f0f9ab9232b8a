"""The vector store interface (_ragproxy.vectorstore): one test body run on the built-in store and on Chroma.

The Chroma half runs against a real server (conftest's chroma_server); what
only Chroma does (markers, sweeps, the lease) is test_chromastore's.
"""
import math

import pytest

from _ragproxy.npy import StoreError
from _ragproxy.vectorstore import BuiltinStore, StoreSpec, VectorStoreError


def _chunk(source, n, text):
    return {"id": f"{source}#{n}", "text": text, "source": source, "title": source.upper(), "headings": ["H", str(n)],
            "symbol": f"s{n}", "line_start": n, "line_end": n + 1, "hash": f"h{n}", "context": f"ctx {n}"}


def _vector(seed, dim=4):
    return [math.sin(seed * (i + 1)) + 0.1 * i for i in range(dim)]


def _record(chunks, digest="d"):
    return {"size": 10, "mtime": 1, "hash": digest, "chunk_ids": [c["id"] for c in chunks]}


def _cosine(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


@pytest.fixture(params=["simple", "chroma_http"])
def store(request, tmp_path):
    if request.param == "simple":
        yield BuiltinStore(str(tmp_path / "kb"))
        return
    from _ragproxy.chromastore import ChromaStore
    server = request.getfixturevalue("chroma_server")
    prefix = request.getfixturevalue("chroma_prefix")
    spec = StoreSpec(type="chroma_http", base_url=server.url, collection_prefix=prefix)
    s = ChromaStore(spec, "kb")
    yield s
    s.close()


def test_files_are_replaced_deleted_and_searched_the_same_on_both_stores(store):
    a = [_chunk("a.md", i, f"alpha {i}") for i in range(3)]
    b = [_chunk("b.md", i, f"beta {i}") for i in range(2)]
    vectors = {c["id"]: _vector(i + 1) for i, c in enumerate(a + b)}
    store.replace_file("a.md", _record(a), a, [vectors[c["id"]] for c in a])
    store.replace_file("b.md", _record(b), b, [vectors[c["id"]] for c in b])
    first = store.commit({"k": 1})
    assert store.count() == 5
    assert store.files() == {"a.md": _record(a), "b.md": _record(b)}
    # Chunks come back as they were given, in the order asked, unknown ids left out.
    assert store.get_chunks(["b.md#1", "nope", "a.md#0"]) == [b[1], a[0]]
    query = _vector(2.5)
    expected = sorted(((cid, _cosine(query, v)) for cid, v in vectors.items()), key=lambda p: -p[1])[:3]
    found = store.dense_search(query, 3)
    assert [cid for cid, _ in found] == [cid for cid, _ in expected]
    assert all(abs(s - e) < 1e-4 for (_, s), (_, e) in zip(found, expected))

    # A file replaced by fewer chunks keeps none of its old ones; a deleted file leaves nothing.
    a2 = [_chunk("a.md", 7, "alpha again")]
    store.replace_file("a.md", _record(a2, "d2"), a2, [_vector(9)])
    store.delete_file("b.md")
    store.delete_file("never-there.md")
    second = store.commit({"k": 1})
    assert second > first
    assert store.files() == {"a.md": _record(a2, "d2")}
    assert store.count() == 1
    assert store.get_chunks([c["id"] for c in a + b]) == []
    assert store.get_chunks(["a.md#7"]) == a2
    assert [cid for cid, _ in store.dense_search(query, 5)] == ["a.md#7"]
    stats = store.stats()
    assert stats["type"] == store.kind and stats["chunks"] == 1 and stats["files"] == 1 and stats["dim"] == 4
    check = store.check()
    assert check["ok"] and check["vectors"] == 1 and isinstance(check["message"], str) and check["latency_ms"] >= 0


def test_a_record_that_does_not_name_its_chunks_is_refused_on_both(store):
    a = [_chunk("a.md", 0, "alpha")]
    with pytest.raises(VectorStoreError, match="chunk_ids"):
        store.replace_file("a.md", {"hash": "d", "chunk_ids": ["other"]}, a, [_vector(1)])
    with pytest.raises(VectorStoreError, match="1 chunks"):
        store.replace_file("a.md", _record(a), a, [_vector(1), _vector(2)])
    store.commit()
    assert store.files() == {} and store.count() == 0


def test_an_empty_store_answers_empty(store):
    assert store.files() == {}
    assert store.count() == 0
    assert store.get_chunks(["x"]) == []


def test_builtin_store_stages_writes_until_commit(tmp_path):
    store = BuiltinStore(str(tmp_path / "kb"))
    a = [_chunk("a.md", 0, "alpha")]
    store.replace_file("a.md", _record(a), a, [_vector(1)])
    assert store.files() == {"a.md": _record(a)}  # the staged view
    assert store.count() == 0                      # nothing a reader sees yet
    store.commit()
    assert store.count() == 1 and store.store.current().manifest["a.md"]["row"] == 0


def test_store_spec_from_the_config_blocks():
    stores = {"type": "simple", "chroma_http": {"base_url": "http://c:8000", "tenant": "t", "database": "d",
                                                "collection_prefix": "p_", "indexer": "never", "timeout": 3,
                                                "sync_interval": 0.5, "token": "s3cret"}}
    assert StoreSpec.from_config("", stores) == StoreSpec()
    spec = StoreSpec.from_config("chroma_http", stores)
    assert (spec.type, spec.base_url, spec.tenant, spec.database, spec.collection_prefix, spec.indexer,
            spec.timeout, spec.sync_interval, spec.token) == ("chroma_http", "http://c:8000", "t", "d", "p_", "never",
                                                              3, 0.5, "s3cret")
    assert "s3cret" not in repr(spec)
    assert StoreSpec.from_config("", dict(stores, type="chroma_http")).type == "chroma_http"
    assert StoreSpec.from_config("simple", dict(stores, type="chroma_http")) == StoreSpec()
    with pytest.raises(ValueError, match="indexer"):
        StoreSpec(type="chroma_http", indexer="sometimes")
    with pytest.raises(ValueError, match="simple, chroma_http"):
        StoreSpec(type="chroma")


def test_a_store_error_is_what_retrieval_policies_catch():
    err = VectorStoreError("down", unreachable=True)
    assert isinstance(err, StoreError) and err.unreachable and str(err) == "down"
    assert not VectorStoreError("bad").unreachable
