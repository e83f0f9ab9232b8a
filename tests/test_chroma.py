"""The Chroma HTTP v2 client (_ragproxy/chroma.py) against a real Chroma server (the chroma_server
fixture), and against scripted servers for what a real one will not do on demand (hang, drop a
kept connection, answer garbage)."""
import array
import base64
import json
import os
import socket
import ssl
import sys
import threading
import uuid

import pytest
from conftest import TLS_DIR, brute_force, chroma_client, random_rows, unit

from _ragproxy import deps
from _ragproxy.chroma import HNSW_SETTINGS, ChromaClient, ChromaError


@pytest.fixture
def client(chroma_server):
    c = chroma_client(chroma_server)
    yield c
    c.close()


def assert_no_address(message, url):
    """An error message must not give the server's (internal) address away."""
    host_port = url.split("://", 1)[1]
    assert url not in message and host_port not in message and host_port.split(":")[1] not in message, message


# --- the server ----------------------------------------------------------------

def test_check_reports_the_server_tenant_and_database(client):
    report = client.check()
    assert report["ok"] is True
    assert report["tenant"] == "default_tenant" and report["database"] == "default_database"
    assert isinstance(report["version"], str) and report["version"]
    assert report["latency_ms"] >= 0.0
    assert report["max_batch_size"] == client.max_batch_size() > 0
    first = client.heartbeat()
    assert isinstance(first, int) and client.heartbeat() >= first > 0


def test_check_latency_comes_from_the_injected_clock(chroma_server):
    ticks = iter([100.0, 100.25])
    c = chroma_client(chroma_server, clock=lambda: next(ticks))
    assert c.check()["latency_ms"] == pytest.approx(250.0)
    c.close()


@pytest.mark.parametrize("which", ["tenant", "database"])
def test_check_names_a_missing_tenant_or_database_and_the_key_to_fix(chroma_server, which):
    name = "nosuch_" + uuid.uuid4().hex[:8]
    c = chroma_client(chroma_server, **{which: name})
    with pytest.raises(ChromaError) as err:
        c.check()
    assert err.value.reason == "not_found" and err.value.status == 404 and not err.value.unreachable
    assert f"{which} '{name}' does not exist" in str(err.value)
    assert f"vectorstore.chroma_http.{which}" in str(err.value)
    assert_no_address(str(err.value), chroma_server.url)


def test_creating_a_collection_in_a_missing_database_says_which_keys_to_check(chroma_server, chroma_prefix):
    c = chroma_client(chroma_server, database="nosuch_" + uuid.uuid4().hex[:8])
    with pytest.raises(ChromaError) as err:
        c.create_collection(chroma_prefix + "kb")
    assert err.value.reason == "bad_request"
    assert "vectorstore.chroma_http.database" in str(err.value)
    assert_no_address(str(err.value), chroma_server.url)


# --- collections ---------------------------------------------------------------

def test_collection_lifecycle(client, chroma_prefix):
    name = chroma_prefix + "kb"
    assert client.get_collection(name) is None
    made = client.create_collection(name, metadata={"ragproxy_schema": 1, "ragproxy_kb": "kb"})
    assert made["name"] == name and made["metadata"] == {"ragproxy_schema": 1, "ragproxy_kb": "kb"}
    assert made["space"] == "cosine" and made["dimension"] is None
    hnsw = made["configuration"]["hnsw"]
    assert {k: hnsw[k] for k in HNSW_SETTINGS} == HNSW_SETTINGS
    # get_or_create hands back the collection as it is, metadata and all.
    again = client.create_collection(name, metadata={"other": "x"})
    assert again["id"] == made["id"] and again["metadata"] == made["metadata"]
    with pytest.raises(ChromaError) as err:
        client.create_collection(name, get_or_create=False)
    assert err.value.reason == "conflict" and err.value.status == 409
    got = client.get_collection(name)
    assert got["id"] == made["id"] and got["tenant"] == "default_tenant"
    assert name in [c["name"] for c in client.list_collections()]

    client.modify_collection(made["id"], {"ragproxy_schema": 2})
    assert client.get_collection(name)["metadata"] == {"ragproxy_schema": 2}  # replaced, not merged

    client.upsert(made["id"], ["a"], [[0.1, 0.2, 0.3]])
    assert client.get_collection(name)["dimension"] == 3

    client.delete_collection(name)
    assert client.get_collection(name) is None
    client.delete_collection(name)  # already gone: no error
    with pytest.raises(ChromaError) as err:
        client.count(made["id"])
    assert err.value.reason == "not_found" and err.value.status == 404


def test_list_collections_pages_through_them_all(client, chroma_prefix):
    names = {f"{chroma_prefix}c{i}" for i in range(5)}
    for name in names:
        client.create_collection(name)
    listed = [c["name"] for c in client.list_collections(page=2)]
    assert names <= set(listed) and len(listed) == len(set(listed))


def test_space_can_be_chosen(client, chroma_prefix):
    made = client.create_collection(chroma_prefix + "l2", space="l2")
    assert made["space"] == "l2"
    client.upsert(made["id"], ["a", "b"], [[0.0, 0.0], [3.0, 4.0]])
    assert client.query(made["id"], [0.0, 0.0], 2) == [("a", 0.0), ("b", pytest.approx(25.0))]  # squared L2


# --- records -------------------------------------------------------------------

def embeddings_as(kind, rows):
    if kind == "numpy":
        return deps.np.asarray(rows, dtype="float32")
    if kind == "array":
        return [array.array("f", r) for r in rows]
    return rows


@pytest.mark.parametrize("kind", ["lists", "array", "numpy"])
def test_upsert_get_count_delete(client, chroma_prefix, kind):
    if kind == "numpy" and deps.np is None:
        pytest.skip("numpy disabled (RAGPROXY_PURE=1 or not installed)")
    col = client.create_collection(chroma_prefix + "kb")["id"]
    rows = random_rows(6, 5, seed=3)
    ids = [f"c{i}" for i in range(6)]
    docs = [f"text {i} \u00e9\u4e2d \"quoted\"\n" for i in range(6)]
    metas = [{"source": f"f{i % 2}.md", "line_start": i, "score": i / 4, "code": i % 2 == 0} for i in range(6)]
    client.upsert(col, ids, embeddings_as(kind, rows), documents=docs, metadatas=metas)
    assert client.count(col) == 6

    got = client.get(col, ids=["c4", "c1", "missing"], include=("documents", "metadatas", "embeddings"))
    assert sorted(got["ids"]) == ["c1", "c4"]
    by_id = {i: (d, m, e) for i, d, m, e in zip(got["ids"], got["documents"], got["metadatas"], got["embeddings"])}
    for i in (1, 4):
        doc, meta, emb = by_id[f"c{i}"]
        assert doc == docs[i] and meta == metas[i]
        assert type(meta["code"]) is bool and type(meta["line_start"]) is int
        assert emb == pytest.approx(rows[i], rel=1e-6)  # float32 on the wire

    # Upserting an existing id replaces its embedding and document, but Chroma merges the metadata
    # into the old (and None keeps it): whoever needs a record replaced whole deletes it first.
    client.upsert(col, ["c1"], embeddings_as(kind, [rows[0]]), documents=["new"], metadatas=[{"extra": "x"}])
    got = client.get(col, ids=["c1"], include=("documents", "metadatas", "embeddings"))
    assert got["documents"] == ["new"] and got["metadatas"] == [dict(metas[1], extra="x")]
    assert got["embeddings"][0] == pytest.approx(rows[0], rel=1e-6)
    client.upsert(col, ["c1"], embeddings_as(kind, [rows[1]]), metadatas=[None])
    assert client.get(col, ids=["c1"]) == {"ids": ["c1"], "documents": ["new"], "metadatas": [dict(metas[1], extra="x")],
                                           "embeddings": None}
    client.upsert(col, ["n"], embeddings_as(kind, [rows[2]]))
    assert client.get(col, ids=["n"]) == {"ids": ["n"], "documents": [None], "metadatas": [{}], "embeddings": None}
    client.delete(col, ids=["n"])
    assert client.count(col) == 6

    where = client.get(col, where={"source": "f0.md"}, include=())
    assert sorted(where["ids"]) == ["c0", "c2", "c4"] and where["documents"] is None
    page = client.get(col, include=("documents",), limit=2, offset=1)
    assert len(page["ids"]) == 2

    client.delete(col, ids=["c0", "nope"])
    assert client.count(col) == 5
    client.delete(col, where={"source": "f0.md"})
    assert sorted(client.get(col, include=())["ids"]) == ["c1", "c3", "c5"]
    client.delete(col, ids=[])  # nothing to do
    assert client.count(col) == 3


def test_query_is_nearest_first_by_cosine_distance(client, chroma_prefix, mode):
    col = client.create_collection(chroma_prefix + "kb")["id"]
    rows = random_rows(300, 16, seed=7)
    client.upsert(col, [f"r{i}" for i in range(300)], rows, metadatas=[{"half": i % 2} for i in range(300)])
    for q in random_rows(5, 16, seed=8):
        got = client.query(col, q, 10)
        want = brute_force(rows, q, 10)
        assert [i for i, _ in got] == [f"r{i}" for _, i in want]
        assert [d for _, d in got] == pytest.approx([1.0 - s for s, _ in want], abs=1e-5)
        odd = client.query(col, q, 5, where={"half": 1})
        assert [i for i, _ in odd] == [f"r{i}" for _, i in brute_force(rows, q, 300) if i % 2][:5]
    assert client.query(col, rows[0], 0) == []
    assert len(client.query(col, rows[0], 1000)) == 300


def test_unit_vectors_query_as_numpy_rows_too(client, chroma_prefix, mode):
    col = client.create_collection(chroma_prefix + "kb")["id"]
    rows = [unit(r) for r in random_rows(20, 8, seed=1)]
    client.upsert(col, [str(i) for i in range(20)], rows)
    query = deps.np.asarray(rows[3], dtype="float32") if mode == "numpy" else array.array("f", rows[3])
    assert client.query(col, query, 1)[0] == ("3", pytest.approx(0.0, abs=1e-6))


def test_writes_larger_than_max_batch_size_all_land(client, chroma_prefix):
    col = client.create_collection(chroma_prefix + "kb")["id"]
    limit = client.max_batch_size()
    n = 2 * limit + 7
    ids = [f"r{i}" for i in range(n)]
    rows = [[1.0, (i % 97) / 97.0, (i % 89) / 89.0] for i in range(n)]
    client.upsert(col, ids, rows, documents=[f"d{i}" for i in range(n)])
    assert client.count(col) == n
    got = client.get(col, ids=ids, include=("documents",))
    assert len(got["ids"]) == n and dict(zip(got["ids"], got["documents"]))["r10000"] == "d10000"
    client.delete(col, ids=ids[1:])
    assert client.get(col, include=("documents",))["ids"] == ["r0"]


def test_dimension_mismatch_on_upsert_is_a_bad_request(client, chroma_prefix, chroma_server):
    col = client.create_collection(chroma_prefix + "kb")["id"]
    client.upsert(col, ["a"], [[1.0, 0.0, 0.0]])
    with pytest.raises(ChromaError) as err:
        client.upsert(col, ["b"], [[1.0, 0.0]])
    assert err.value.reason == "bad_request" and err.value.status == 400
    assert "dimension" in str(err.value)
    assert_no_address(str(err.value), chroma_server.url)
    with pytest.raises(ChromaError):
        client.query(col, [1.0, 0.0], 3)
    assert client.count(col) == 1


def test_a_missing_collection_is_not_found(client, chroma_server):
    missing = str(uuid.uuid4())
    for call in (lambda: client.count(missing), lambda: client.upsert(missing, ["a"], [[1.0]]),
                 lambda: client.query(missing, [1.0], 1), lambda: client.get(missing, ids=["a"])):
        with pytest.raises(ChromaError) as err:
            call()
        assert err.value.reason == "not_found" and err.value.status == 404 and not err.value.unreachable
        assert_no_address(str(err.value), chroma_server.url)


def test_bad_input_is_refused_before_it_is_sent(client):
    col = str(uuid.uuid4())  # never reached: each call fails first
    with pytest.raises(ValueError, match="2 ids but 1 embeddings"):
        client.upsert(col, ["a", "b"], [[1.0]])
    with pytest.raises(ValueError, match="documents"):
        client.upsert(col, ["a"], [[1.0]], documents=["x", "y"])
    with pytest.raises(ValueError, match="different lengths"):
        client.upsert(col, ["a", "b"], [[1.0], [1.0, 2.0]])
    with pytest.raises(ValueError, match="'headings'"):
        client.upsert(col, ["a"], [[1.0]], metadatas=[{"headings": ["a", "b"]}])
    with pytest.raises(ValueError, match="ids or where"):
        client.delete(col)
    with pytest.raises(ValueError, match="empty"):
        client.modify_collection(col, {})
    for url in ("ftp://x", "localhost:8000", "http://", "http://h:notaport"):
        with pytest.raises(ValueError, match="base_url"):
            ChromaClient(url)


def test_threads_each_use_their_own_connection(client, chroma_prefix):
    col = client.create_collection(chroma_prefix + "kb")["id"]
    errors = []

    def work(t):
        try:
            for i in range(20):
                client.upsert(col, [f"{t}-{i}"], [[1.0, float(t), float(i)]])
                assert client.get(col, ids=[f"{t}-{i}"], include=())["ids"] == [f"{t}-{i}"]
        except Exception as exc:  # reported below: an assert in a thread would be lost
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and client.count(col) == 80


def test_close_then_use_again(client):
    client.heartbeat()
    client.close()
    assert client.heartbeat() > 0


# --- failures without a real server ---------------------------------------------

def test_a_closed_port_is_unreachable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        url = f"http://127.0.0.1:{port}"
        c = ChromaClient(url, timeout=5)
        with pytest.raises(ChromaError) as err:
            c.heartbeat()
    assert err.value.reason == "unreachable" and err.value.unreachable and err.value.status is None
    assert "vectorstore.chroma_http.base_url" in str(err.value)
    assert_no_address(str(err.value), url)


# --- scripted servers: what a real Chroma will not do on demand -------------------

class ScriptedServer:
    """A raw HTTP/1.1 server on 127.0.0.1 that treats its requests, in arrival order, as ``script``
    says, then as ``default``: "ok" (answer, keep the connection), "ok-then-close" (answer, then close
    without a Connection: close header, as an idle timeout does), "drop" (read it, close unanswered),
    "hang" (never answer), or (status, body bytes).  ``requests`` records (connection number, method,
    path, headers with lower-case names, body)."""

    def __init__(self, script=(), default="ok", max_batch_size=100, base64=True, tls=None):
        self.script = list(script)
        self.default = default
        self.preflight = {"max_batch_size": max_batch_size, "supports_base64_encoding": base64}
        self.requests = []
        self.connections = 0
        self._tls = tls
        self._lock = threading.Lock()
        self._socks = []
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.port = self._listener.getsockname()[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._listener.close()
        with self._lock:
            for s in self._socks:
                try:
                    s.close()
                except OSError:
                    pass

    def _accept(self):
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                number = self.connections
                self._socks.append(sock)
            threading.Thread(target=self._serve, args=(sock, number), daemon=True).start()

    def _serve(self, sock, number):
        try:
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_side=True)
                with self._lock:
                    self._socks.append(sock)
            rfile = sock.makefile("rb")
            while True:
                line = rfile.readline()
                if not line:
                    return
                method, path, _ = line.decode("latin-1").split(" ", 2)
                headers = {}
                while True:
                    h = rfile.readline().decode("latin-1").strip()
                    if not h:
                        break
                    name, value = h.split(":", 1)
                    headers[name.strip().lower()] = value.strip()
                body = rfile.read(int(headers.get("content-length", 0)))
                with self._lock:
                    self.requests.append((number, method, path, headers, body))
                    action = self.script.pop(0) if self.script else self.default
                if action == "drop":
                    return
                if action == "hang":
                    threading.Event().wait(60)
                    return
                status, payload = action if isinstance(action, tuple) else (200, self._answer(path, body))
                sock.sendall(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                             % (status, len(payload)) + payload)
                if action == "ok-then-close":
                    return
        except (OSError, ValueError):
            return
        finally:
            try:
                sock.close()
            except OSError:
                pass

    def _answer(self, path, body):
        if path.endswith("/heartbeat"):
            doc = {"nanosecond heartbeat": 1234}
        elif path.endswith("/pre-flight-checks"):
            doc = self.preflight
        elif path.endswith("/version"):
            doc = "1.0.0"
        elif path.endswith("/count"):
            doc = 0
        elif path.endswith("/get"):
            ids = json.loads(body).get("ids") or []
            doc = {"ids": ids, "documents": [None] * len(ids), "metadatas": [None] * len(ids)}
        elif path.endswith("/query"):
            doc = {"ids": [["a", "b"]], "distances": [[0.125, 0.5]]}
        elif "/collections/" in path:
            doc = {"id": "abc", "name": path.rsplit("/", 1)[1]}
        else:
            doc = {}
        return json.dumps(doc).encode()

    def paths(self):
        return [r[2] for r in self.requests]

    def bodies(self, tail):
        return [json.loads(r[4]) for r in self.requests if r[2].endswith(tail)]


def test_a_server_that_never_answers_times_out():
    with ScriptedServer(default="hang") as server:
        c = ChromaClient(server.url, timeout=0.3)
        with pytest.raises(ChromaError) as err:
            c.heartbeat()
    assert err.value.reason == "timeout" and err.value.unreachable and err.value.status is None
    assert "vectorstore.chroma_http.timeout" in str(err.value)
    assert_no_address(str(err.value), server.url)
    assert len(server.requests) == 1  # a timeout is not retried: it would only double the wait


def test_calls_reuse_one_kept_connection_per_thread():
    with ScriptedServer() as server:
        c = ChromaClient(server.url)
        for _ in range(5):
            c.heartbeat()
        assert server.connections == 1 and len(server.requests) == 5
        other = threading.Thread(target=c.heartbeat)
        other.start()
        other.join()
        c.heartbeat()
        assert server.connections == 2 and [r[0] for r in server.requests] == [1] * 5 + [2, 1]
        c.close()
        c.heartbeat()
        assert server.connections == 3


def test_a_stale_kept_connection_is_reopened_and_the_call_sent_once_more():
    with ScriptedServer(["ok-then-close"]) as server:
        c = ChromaClient(server.url)
        assert c.heartbeat() == 1234
        assert c.count("some-id") == 0  # its kept connection was closed under it
    assert server.connections == 2
    assert [(r[0], r[2].rsplit("/", 1)[1]) for r in server.requests] == [(1, "heartbeat"), (2, "count")]


def test_a_stale_connection_is_retried_once_only():
    with ScriptedServer(["ok", "drop", "drop"]) as server:
        c = ChromaClient(server.url)
        c.heartbeat()
        with pytest.raises(ChromaError) as err:
            c.heartbeat()
    assert err.value.reason == "unreachable" and err.value.unreachable
    assert_no_address(str(err.value), server.url)
    assert [r[0] for r in server.requests] == [1, 1, 2]


def test_a_fresh_connection_that_fails_is_not_retried():
    with ScriptedServer(["drop"]) as server:
        with pytest.raises(ChromaError) as err:
            ChromaClient(server.url).heartbeat()
    assert err.value.reason == "unreachable" and len(server.requests) == 1


def test_a_call_that_is_not_safe_to_repeat_is_not_retried():
    with ScriptedServer(["ok-then-close"]) as server:
        c = ChromaClient(server.url)
        c.heartbeat()
        with pytest.raises(ChromaError) as err:
            c.create_collection("kb", get_or_create=False)  # a repeat could answer "already exists"
        assert err.value.reason == "unreachable"
        assert len(server.requests) == 1
        c.heartbeat()  # the next call reconnects
    assert server.connections == 2


def test_writes_and_reads_are_split_at_max_batch_size():
    with ScriptedServer(max_batch_size=3) as server:
        c = ChromaClient(server.url)
        ids = [f"r{i}" for i in range(8)]
        rows = [[float(i), 0.5, -1.25] for i in range(8)]
        c.upsert("col", ids, rows, documents=[f"d{i}" for i in range(8)], metadatas=[{"n": i} for i in range(8)])
        c.get("col", ids=ids)
        c.delete("col", ids=ids)
        c.get("col", ids=ids, limit=5)  # a limit applies to the whole answer: one request
    upserts = server.bodies("/upsert")
    assert [b["ids"] for b in upserts] == [ids[0:3], ids[3:6], ids[6:8]]
    assert [b["documents"] for b in upserts][2] == ["d6", "d7"] and upserts[1]["metadatas"][0] == {"n": 3}
    sent = [array.array("f", base64.b64decode(e)) for b in upserts for e in b["embeddings"]]
    if sys.byteorder == "big":
        for a in sent:
            a.byteswap()
    assert [list(a) for a in sent] == rows  # exact: these values are float32 already
    assert [len(b["ids"]) for b in server.bodies("/get")] == [3, 3, 2, 8]
    assert [b["ids"] for b in server.bodies("/delete")] == [ids[0:3], ids[3:6], ids[6:8]]
    assert server.paths().count("/api/v2/pre-flight-checks") == 1  # asked once


def test_writes_go_in_requests_of_at_most_write_batch_records():
    with ScriptedServer(max_batch_size=100) as server:
        c = ChromaClient(server.url)
        c.write_batch = 4
        ids = [str(i) for i in range(10)]
        c.upsert("col", ids, [[1.0]] * 10)
        c.delete("col", ids=ids)
        c.get("col", ids=ids)
    assert [len(b["ids"]) for b in server.bodies("/upsert")] == [4, 4, 2]
    assert [len(b["ids"]) for b in server.bodies("/delete")] == [4, 4, 2]
    assert [len(b["ids"]) for b in server.bodies("/get")] == [10]  # reads are cheap: max_batch_size


def test_embeddings_go_as_json_numbers_to_a_server_without_base64():
    with ScriptedServer(base64=False) as server:
        ChromaClient(server.url).upsert("col", ["a"], [array.array("f", [0.5, -2.0])])
    assert server.bodies("/upsert")[0]["embeddings"] == [[0.5, -2.0]]


def test_query_sends_one_vector_and_returns_id_distance_pairs():
    with ScriptedServer() as server:
        got = ChromaClient(server.url).query("col", [0.25, 1.0], 2, where={"source": "a.md"})
    assert got == [("a", 0.125), ("b", 0.5)]
    body = server.bodies("/query")[0]
    assert body["query_embeddings"] == [[0.25, 1.0]] and body["n_results"] == 2
    assert body["where"] == {"source": "a.md"} and "distances" in body["include"]


def test_the_token_goes_in_x_chroma_token():
    with ScriptedServer() as server:
        ChromaClient(server.url, token="s3cret").heartbeat()
        ChromaClient(server.url).heartbeat()
    assert server.requests[0][3]["x-chroma-token"] == "s3cret"
    assert "x-chroma-token" not in server.requests[1][3]


def test_paths_carry_tenant_database_and_a_url_prefix():
    with ScriptedServer() as server:
        c = ChromaClient(server.url + "/chroma/", tenant="team a", database="db/1")
        c.count("abc")
        c.get_collection("kb.v2")
    assert server.paths() == ["/chroma/api/v2/tenants/team%20a/databases/db%2F1/collections/abc/count",
                              "/chroma/api/v2/tenants/team%20a/databases/db%2F1/collections/kb.v2"]


@pytest.mark.parametrize("answer, reason, words", [
    ((500, b'{"error":"InternalError","message":"disk full"}'), "server_error", "disk full"),
    ((503, b"<html>Service Unavailable</html>"), "server_error", "HTTP 503"),
    ((401, b'{"error":"AuthError","message":"no"}'), "bad_request", "vectorstore.chroma_http.token"),
    ((200, b"<html>not json</html>"), "bad_response", "vectorstore.chroma_http.base_url"),
    ((200, b'{"something": "else"}'), "bad_response", "Chroma 1.x"),
])
def test_bad_answers_are_clear_errors(answer, reason, words):
    with ScriptedServer([answer]) as server:
        with pytest.raises(ChromaError) as err:
            ChromaClient(server.url).heartbeat()
    assert err.value.reason == reason and words in str(err.value) and not err.value.unreachable
    assert err.value.status == answer[0]
    assert_no_address(str(err.value), server.url)


def test_a_server_message_that_names_the_address_is_scrubbed():
    with ScriptedServer() as server:
        echo = json.dumps({"error": "X", "message": f"cannot reach {server.url}/api/v2 (127.0.0.1:{server.port})"})
        server.script.append((500, echo.encode()))
        with pytest.raises(ChromaError) as err:
            ChromaClient(server.url).count("col")
    assert_no_address(str(err.value), server.url)
    assert "<chroma server>" in str(err.value)


def test_check_says_when_no_v2_api_answers():
    with ScriptedServer([(404, b"<html>Not Found</html>")]) as server:
        with pytest.raises(ChromaError) as err:
            ChromaClient(server.url).check()
    assert err.value.reason == "bad_response" and "v2" in str(err.value)


def tls_context():
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(os.path.join(TLS_DIR, "server.pem"), os.path.join(TLS_DIR, "server.key"))
    return context


def test_https_with_a_trusted_certificate():
    trust = ssl.create_default_context(cafile=os.path.join(TLS_DIR, "ca.pem"))
    with ScriptedServer(tls=tls_context()) as server:
        c = ChromaClient(server.url, ssl_context=trust)
        assert c.heartbeat() == 1234 and c.heartbeat() == 1234
    assert server.connections == 1


def test_https_with_an_untrusted_certificate_is_unreachable_naming_the_certificate():
    with ScriptedServer(tls=tls_context()) as server:
        with pytest.raises(ChromaError) as err:
            ChromaClient(server.url).heartbeat()
    assert err.value.reason == "unreachable" and "certificate" in str(err.value)
    assert_no_address(str(err.value), server.url)
