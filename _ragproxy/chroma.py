"""A client for a Chroma server's HTTP API (v2), with the standard library.

ChromaClient speaks the v2 REST API that ``chroma run`` serves (chromadb
1.x): heartbeat, version, pre-flight checks, tenants and databases (for
check()), collections by name, and the record calls (upsert, get, delete,
query, count) by collection id.  It never needs the ``chromadb`` package,
so the .pyz stays one file.

Each thread keeps one keep-alive connection (http.client, http or https);
a call that finds its kept connection closed by the server (the idle
timeout of Chroma or a proxy in front of it) reconnects and sends once
more, if the call is safe to repeat.  The timeout bounds the connect and
every read.  Embeddings go as base64 little-endian float32 when the server
says it takes them (pre-flight ``supports_base64_encoding``): a quarter of
the bytes of decimal JSON and no float formatting on either side.

Every failure is a ChromaError whose message names what to fix and never
the server's address: it is an internal address, and the message may reach
a proxy client or a log line; a caller that wants it logs ``base_url``.

May import: deps.
"""
from __future__ import annotations

import array
import base64
import http.client
import json
import socket
import ssl
import sys
import threading
import time
import urllib.parse

from . import deps

#: The HNSW settings of the collections create_collection() makes.  Measured
#: on bench/perf.py's 384-d vectors at 100k: Chroma's defaults (100/100/16)
#: found 0.999 of the true top-10, these 1.000 at ~1.8x the indexing time;
#: max_neighbors 32 also gave 1.000 but indexed slower still and takes more
#: memory.  Chroma fixes them when the collection is made: a later change
#: of ef_search did not change results on a running server.
HNSW_SETTINGS = {"ef_construction": 200, "ef_search": 200, "max_neighbors": 16}

_CONFIG = "vectorstore.chroma_http"
_REASONS = ("unreachable", "timeout", "not_found", "bad_request", "conflict", "server_error", "bad_response")
# A kept connection the server has closed fails on its next use in one of
# these ways, before the request reached the server's handler.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)
_METADATA_TYPES = (str, int, float, bool)


class ChromaError(Exception):
    """A Chroma call failed: ``status`` (HTTP, None when no answer) and ``reason`` (see _REASONS)."""

    def __init__(self, reason, message, status=None):
        super().__init__(message)
        self.reason = reason
        self.status = status

    @property
    def unreachable(self):
        """True when the server did not answer at all (down, or slower than the timeout)."""
        return self.reason in ("unreachable", "timeout")


def _one_line(text, limit=300):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


class ChromaClient:
    """One Chroma server, tenant and database; safe to share between threads."""

    def __init__(self, base_url, tenant="default_tenant", database="default_database", timeout=10.0,
                 token="", clock=time.monotonic, ssl_context=None):
        parts = urllib.parse.urlsplit(str(base_url).strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{_CONFIG}.base_url must be an http:// or https:// URL with a host")
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"{_CONFIG}.base_url has an invalid port") from None
        if not tenant or not database:
            raise ValueError(f"{_CONFIG}.tenant and .database must not be empty")
        if not timeout or timeout <= 0:
            raise ValueError(f"{_CONFIG}.timeout must be a number > 0")
        self.base_url = base_url
        self.tenant = tenant
        self.database = database
        self.timeout = float(timeout)
        self._token = token or ""
        self._clock = clock
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        # Strings that would give the address away if a server echoed them in an error.
        self._secrets = {s for s in (str(base_url).strip().rstrip("/"), parts.netloc, self._host) if s}
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections = set()
        self._preflight = None
        # Records per write request, at most the server's max_batch_size: one request must be answered
        # within the timeout, and a loaded server took ~2 ms per 384-d record (5461 would be ~11 s).
        self.write_batch = 1000
        # The system's trust store (or SSL_CERT_FILE) unless the caller brings its own context.
        self._ssl_context = ssl_context or (ssl.create_default_context() if self._https else None)
        base = "/api/v2/tenants/" + _quote(tenant)
        self._tenant_path = base
        self._database_path = base + "/databases/" + _quote(database)

    # -- the wire ------------------------------------------------------------

    def _connection(self):
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self._https:
                conn = http.client.HTTPSConnection(self._host, self._port, timeout=self.timeout,
                                                   context=self._ssl_context)
            else:
                conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)
            self._local.conn = conn
            with self._lock:
                self._connections.add(conn)
        return conn

    def _drop_connection(self):
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            self._local.conn = None
            with self._lock:
                self._connections.discard(conn)
            conn.close()

    def _headers(self, body):
        headers = {"Accept": "application/json", "User-Agent": "ragproxy"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self._token:
            headers["X-Chroma-Token"] = self._token
        return headers

    def _exchange(self, method, path, body, idempotent):
        """(status, body bytes) of one request, reconnecting once when a kept connection went stale."""
        headers = self._headers(body)
        for attempt in (1, 2):
            conn = self._connection()
            kept = conn.sock is not None  # a connection that served an earlier call
            try:
                conn.request(method, self._prefix + path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                if resp.will_close:
                    self._drop_connection()
                return resp.status, data
            except socket.timeout:
                self._drop_connection()
                raise ChromaError("timeout", f"the Chroma server did not answer within {self.timeout:g}s: check that"
                                  f" it is running and not overloaded, or raise {_CONFIG}.timeout") from None
            except _STALE as exc:
                self._drop_connection()
                if kept and idempotent and attempt == 1:
                    continue
                raise ChromaError("unreachable", "the connection to the Chroma server was lost"
                                  f" ({type(exc).__name__}): check that it is running") from None
            except ssl.SSLError as exc:
                self._drop_connection()
                what = "its certificate was refused" if isinstance(exc, ssl.SSLCertVerificationError) else \
                    "the TLS handshake failed"
                raise ChromaError("unreachable", f"cannot connect to the Chroma server: {what}: check"
                                  f" {_CONFIG}.base_url (http or https) and the server's certificate") from None
            except http.client.HTTPException as exc:
                self._drop_connection()
                raise ChromaError("bad_response", f"the Chroma server sent a broken HTTP reply ({type(exc).__name__}):"
                                  f" check that {_CONFIG}.base_url points at a Chroma server") from None
            except OSError as exc:
                self._drop_connection()
                raise ChromaError("unreachable", f"the Chroma server is unreachable ({_os_reason(exc)}): start it or"
                                  f" fix {_CONFIG}.base_url") from None
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def _call(self, method, path, payload=None, idempotent=True, what="", missing=None):
        """The decoded JSON answer to one API call; ``missing`` is returned on 404 when not None."""
        body = None if payload is None else json.dumps(payload, separators=(",", ":")).encode()
        status, data = self._exchange(method, path, body, idempotent)
        if 200 <= status < 300:
            try:
                return json.loads(data) if data else None
            except ValueError:
                raise ChromaError("bad_response", f"the Chroma server sent a reply that is not JSON (HTTP {status}):"
                                  f" check that {_CONFIG}.base_url points at a Chroma server", status) from None
        if status == 404 and missing is not None:
            return missing
        raise self._error(status, data, what)

    def _error(self, status, data, what):
        message = ""
        try:
            doc = json.loads(data)
            if isinstance(doc, dict):
                message = str(doc.get("message") or doc.get("error") or "")
        except ValueError:
            pass
        message = self._scrub(_one_line(message)) if message else f"HTTP {status}"
        if "does not exist" in message and ("Database [" in message or "Tenant [" in message):
            message += f": check {_CONFIG}.tenant and {_CONFIG}.database"
        context = f"{what}: " if what else ""
        if status in (401, 403):
            return ChromaError("bad_request", f"the Chroma server refused the request (HTTP {status}, {message}):"
                               f" check {_CONFIG}.token", status)
        if status == 404:
            return ChromaError("not_found", f"Chroma: {context}{message}", status)
        if status == 409:
            return ChromaError("conflict", f"Chroma: {context}{message}", status)
        if 400 <= status < 500:
            return ChromaError("bad_request", f"Chroma refused {what or 'the request'}: {message}", status)
        return ChromaError("server_error", f"the Chroma server failed (HTTP {status}) on {what or 'a request'}:"
                           f" {message}", status)

    def _scrub(self, text):
        for secret in sorted(self._secrets, key=len, reverse=True):  # the whole URL before its host alone
            text = text.replace(secret, "<chroma server>")
        return text

    # -- server --------------------------------------------------------------

    def heartbeat(self):
        """The server's clock in nanoseconds (its liveness probe)."""
        doc = self._call("GET", "/api/v2/heartbeat", what="heartbeat")
        try:
            return int(doc["nanosecond heartbeat"])
        except (TypeError, KeyError, ValueError):
            raise ChromaError("bad_response", "the server's heartbeat is not Chroma's v2 heartbeat: check that"
                              f" {_CONFIG}.base_url points at a Chroma 1.x server", 200) from None

    def version(self):
        """The server's version string."""
        return str(self._call("GET", "/api/v2/version", what="version"))

    def _preflight_checks(self):
        if self._preflight is None:
            doc = self._call("GET", "/api/v2/pre-flight-checks", what="pre-flight checks")
            try:
                size = int(doc["max_batch_size"])
            except (TypeError, KeyError, ValueError):
                raise ChromaError("bad_response", "the server's pre-flight checks carry no max_batch_size: check that"
                                  f" {_CONFIG}.base_url points at a Chroma 1.x server", 200) from None
            self._preflight = {"max_batch_size": max(size, 1),
                               "base64": bool(doc.get("supports_base64_encoding", False))}
        return self._preflight

    def max_batch_size(self):
        """The most records one write may carry (asked once, then cached)."""
        return self._preflight_checks()["max_batch_size"]

    def check(self):
        """A live test of the server, tenant and database; raises ChromaError naming what to fix."""
        start = self._clock()
        try:
            self.heartbeat()
        except ChromaError as exc:
            if exc.reason == "not_found":
                raise ChromaError("bad_response", "no Chroma v2 API answers there (HTTP 404 on the heartbeat):"
                                  f" check {_CONFIG}.base_url (Chroma 0.x servers speak only v1)", 404) from None
            raise
        latency_ms = (self._clock() - start) * 1000.0
        version = self.version()
        if self._call("GET", self._tenant_path, what="tenant", missing=False) is False:
            raise ChromaError("not_found", f"tenant '{self.tenant}' does not exist: fix {_CONFIG}.tenant or create it",
                              404)
        if self._call("GET", self._database_path, what="database", missing=False) is False:
            raise ChromaError("not_found", f"database '{self.database}' does not exist in tenant '{self.tenant}':"
                              f" fix {_CONFIG}.database or create it", 404)
        return {"ok": True, "version": version, "tenant": self.tenant, "database": self.database,
                "latency_ms": latency_ms, "max_batch_size": self.max_batch_size()}

    # -- collections ---------------------------------------------------------

    def _collections(self, tail=""):
        return self._database_path + "/collections" + tail

    def get_collection(self, name):
        """The collection called ``name``, or None when there is none."""
        doc = self._call("GET", self._collections("/" + _quote(name)), what=f"collection '{name}'", missing=False)
        return None if doc is False else _collection(doc)

    def list_collections(self, page=1000):
        """Every collection in the database (as get_collection() gives them), in pages of ``page``."""
        out = []
        while True:
            docs = self._call("GET", self._collections(f"?limit={int(page)}&offset={len(out)}"),
                              what="listing collections")
            if not isinstance(docs, list):
                raise ChromaError("bad_response", "the Chroma server's collection list is not a list: check that"
                                  f" {_CONFIG}.base_url points at a Chroma 1.x server", 200)
            out.extend(_collection(doc) for doc in docs)
            if len(docs) < page:
                return out

    def create_collection(self, name, metadata=None, get_or_create=True, space="cosine"):
        """Create the collection (or, with get_or_create, return the existing one as it is)."""
        payload = {"name": name, "get_or_create": bool(get_or_create),
                   "metadata": _check_metadata(metadata, "collection metadata") or None,
                   "configuration": {"hnsw": dict(HNSW_SETTINGS, space=space)}}
        doc = self._call("POST", self._collections(), payload, idempotent=bool(get_or_create),
                         what=f"creating collection '{name}'")
        return _collection(doc)

    def modify_collection(self, collection_id, metadata):
        """Replace the collection's metadata (Chroma keeps none of the old keys)."""
        if not metadata:
            raise ValueError("Chroma cannot hold an empty collection metadata")
        self._call("PUT", self._collections("/" + _quote(collection_id)),
                   {"new_metadata": _check_metadata(metadata, "collection metadata")}, what="updating a collection")

    def delete_collection(self, name):
        """Delete the collection called ``name``; one already gone is no error."""
        self._call("DELETE", self._collections("/" + _quote(name)), what=f"deleting collection '{name}'", missing=True)

    # -- records -------------------------------------------------------------

    def _records(self, collection_id, op):
        return self._collections(f"/{_quote(collection_id)}/{op}")

    def count(self, collection_id):
        """How many records the collection holds."""
        return int(self._call("GET", self._records(collection_id, "count"), what="count"))

    def upsert(self, collection_id, ids, embeddings, documents=None, metadatas=None):
        """Insert or update records, in requests of at most max_batch_size() (and write_batch) records.

        An id already present gets the new embedding and document, but Chroma merges the new metadata
        into the old (keys not given stay) and keeps the old document or metadata where None is given:
        a caller that needs a record replaced whole deletes it first.
        """
        ids = list(ids)
        n = len(ids)
        rows = _rows(embeddings)
        if len(rows) != n:
            raise ValueError(f"upsert: {n} ids but {len(rows)} embeddings")
        if documents is not None:
            documents = list(documents)
            if len(documents) != n:
                raise ValueError(f"upsert: {n} ids but {len(documents)} documents")
        if metadatas is not None:
            metadatas = [_check_metadata(m, f"metadata of '{i}'") or None for i, m in zip(ids, metadatas)]
            if len(metadatas) != n:
                raise ValueError(f"upsert: {n} ids but {len(metadatas)} metadatas")
        if not n:
            return
        dims = {len(row) for row in rows}
        if len(dims) != 1:
            raise ValueError(f"upsert: embeddings of different lengths {sorted(dims)}")
        checks = self._preflight_checks()
        step = max(1, min(checks["max_batch_size"], self.write_batch))
        encode = _b64_row if checks["base64"] else _list_row
        path = self._records(collection_id, "upsert")
        for lo in range(0, n, step):
            hi = min(lo + step, n)
            payload = {"ids": ids[lo:hi], "embeddings": [encode(row) for row in rows[lo:hi]]}
            if documents is not None:
                payload["documents"] = documents[lo:hi]
            if metadatas is not None:
                payload["metadatas"] = metadatas[lo:hi]
            self._call("POST", path, payload, what="upsert")

    def get(self, collection_id, ids=None, where=None, include=("documents", "metadatas"), limit=None, offset=None):
        """Records by id and/or metadata filter: {"ids", "documents", "metadatas", "embeddings"}."""
        include = list(include)
        path = self._records(collection_id, "get")
        out = {"ids": [], "documents": [] if "documents" in include else None,
               "metadatas": [] if "metadatas" in include else None,
               "embeddings": [] if "embeddings" in include else None}
        if ids is not None:
            ids = list(ids)
            if not ids:
                return out
        # Many ids go in several requests, as writes do; a limit or offset
        # applies to the whole answer, so then it is one request.
        if ids is not None and limit is None and offset is None:
            step = self.max_batch_size()
            batches = [ids[lo:lo + step] for lo in range(0, len(ids), step)]
        else:
            batches = [ids]
        for batch in batches:
            payload = {"include": include}
            if batch is not None:
                payload["ids"] = batch
            if where:
                payload["where"] = where
            if limit is not None:
                payload["limit"] = int(limit)
            if offset is not None:
                payload["offset"] = int(offset)
            doc = self._call("POST", path, payload, what="get")
            try:
                out["ids"].extend(doc["ids"])
                for key in ("documents", "metadatas", "embeddings"):
                    if out[key] is not None:
                        values = doc.get(key) or [None] * len(doc["ids"])
                        if key == "metadatas":
                            values = [m or {} for m in values]
                        out[key].extend(values)
            except (TypeError, KeyError, AttributeError):
                raise ChromaError("bad_response", "the Chroma server's answer to get has no ids: check that"
                                  f" {_CONFIG}.base_url points at a Chroma 1.x server", 200) from None
        return out

    def delete(self, collection_id, ids=None, where=None):
        """Delete records by id and/or metadata filter (one of them is required)."""
        if ids is None and not where:
            raise ValueError("delete needs ids or where: an empty filter would delete nothing or everything")
        path = self._records(collection_id, "delete")
        if ids is None:
            self._call("POST", path, {"where": where}, what="delete")
            return
        ids = list(ids)
        step = max(1, min(self.max_batch_size(), self.write_batch))
        for lo in range(0, len(ids), step):
            payload = {"ids": ids[lo:lo + step]}
            if where:
                payload["where"] = where
            self._call("POST", path, payload, what="delete")

    def query(self, collection_id, embedding, n_results, include=("distances",), where=None):
        """The nearest records to one vector: [(id, distance)], nearest first."""
        n_results = int(n_results)
        if n_results <= 0:
            return []
        include = list(include)
        if "distances" not in include:
            include.append("distances")
        payload = {"query_embeddings": [_list_row(_rows([embedding])[0])], "n_results": n_results,
                   "include": include}
        if where:
            payload["where"] = where
        doc = self._call("POST", self._records(collection_id, "query"), payload, what="query")
        try:
            return list(zip(doc["ids"][0], [float(d) for d in doc["distances"][0]]))
        except (TypeError, KeyError, IndexError, ValueError):
            raise ChromaError("bad_response", "the Chroma server's answer to a query has no ids and distances:"
                              f" check that {_CONFIG}.base_url points at a Chroma 1.x server", 200) from None

    def close(self):
        """Close every thread's kept connection (a later call opens a new one)."""
        with self._lock:
            conns, self._connections = self._connections, set()
        for conn in conns:
            conn.close()
        self._local = threading.local()


def _quote(segment):
    return urllib.parse.quote(str(segment), safe="")


def _os_reason(exc):
    """A short, address-free name for a socket error (OSError's text can carry the host name)."""
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.gaierror):
        return "host name not found"
    name = getattr(exc, "errno", None)
    return type(exc).__name__ if name is None else f"{type(exc).__name__}, errno {name}"


def _collection(doc):
    if not isinstance(doc, dict) or "id" not in doc:
        raise ChromaError("bad_response", "the Chroma server's collection has no id: check that"
                          f" {_CONFIG}.base_url points at a Chroma 1.x server", 200)
    config = doc.get("configuration_json") or {}
    hnsw = config.get("hnsw") or {}
    spann = config.get("spann") or {}
    return {"id": doc["id"], "name": doc.get("name"), "metadata": doc.get("metadata") or {},
            "dimension": doc.get("dimension"), "space": hnsw.get("space") or spann.get("space"),
            "configuration": config, "tenant": doc.get("tenant"), "database": doc.get("database")}


def _check_metadata(metadata, what):
    if not metadata:
        return {}
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, _METADATA_TYPES):
            raise ValueError(f"{what}: key {key!r} must be a string with a str, int, float or bool value,"
                             f" not {type(value).__name__}")
    return metadata


def _rows(embeddings):
    """The embeddings as a list of rows (array('f'), numpy rows or sequences of floats)."""
    np = deps.np
    if np is not None and isinstance(embeddings, np.ndarray):
        if embeddings.ndim != 2:
            raise ValueError(f"embeddings must be a 2-D array, not {embeddings.ndim}-D")
        return list(np.ascontiguousarray(embeddings, dtype="<f4"))
    return list(embeddings)


def _f32(row):
    """``row`` as array('f') (or a little-endian float32 numpy row, which has tobytes() too)."""
    np = deps.np
    if np is not None and isinstance(row, np.ndarray):
        return row.astype("<f4", copy=False)
    if isinstance(row, array.array) and row.typecode == "f":
        return row
    return array.array("f", row)


def _b64_row(row):
    row = _f32(row)
    if sys.byteorder == "big" and isinstance(row, array.array):
        row = array.array("f", row)
        row.byteswap()
    return base64.b64encode(row.tobytes()).decode("ascii")


def _list_row(row):
    np = deps.np
    if np is not None and isinstance(row, np.ndarray):
        return row.astype("f8").tolist()
    return [float(x) for x in row]
