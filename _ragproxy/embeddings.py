"""Clients of the embedding and rerank servers, and the embedding cache.

Dense vectors come from a local embedding server (any OpenAI-compatible
/v1/embeddings, or Ollama's /api/embed); retrieved passages may be reordered
by a cross-encoder rerank server.  Neither client sleeps or retries on its
own: errors are classified (rate limited / transient / fatal) and the caller
decides, while a BackoffGate remembers rate limits.  Every vector the server
returns is written to a disk cache (SQLite, imported on first use) at once,
so an indexing run that fails half way resumes without paying again for the
half that succeeded.

May import: deps, upstream.
"""
from __future__ import annotations

import array
import base64
import collections
import contextlib
import contextvars
import datetime
import email.utils
import hashlib
import json
import logging
import math
import operator
import os
import random
import re
import sys
import threading
import time

from . import __version__, deps
from .upstream import UpstreamError

log = logging.getLogger("ragproxy")


# Large enough for a batch of 64 inputs x 4096 dims as JSON floats, with room.
_EMBED_MAX_BODY = 256 * 1024 * 1024
_RERANK_MAX_BODY = 16 * 1024 * 1024
_BIG_ENDIAN = sys.byteorder == "big"
# A 400 that says the input is too big is about this input, not the setup.
_INPUT_TOO_LARGE = re.compile(r"too (large|long|many)|exceed|context (length|size|window)|maximum", re.I)


class EmbeddingError(Exception):
    """The embedding server could not embed the texts; see the subclasses."""

    def __init__(self, message, status=None, retry_after=None):
        super().__init__(message)
        self.status = status            # HTTP status, or None when there was no answer
        self.retry_after = retry_after  # seconds, when known


class EmbeddingRateLimited(EmbeddingError):
    """HTTP 429, or a call made while the client's BackoffGate is still closed.

    ``retry_after`` is the server's Retry-After in seconds (None if it sent
    none) or, when the gate refused the call, the time left until it opens.
    """


class EmbeddingTransient(EmbeddingError):
    """408, 5xx, unreachable or timed out: trying again later may work."""


class EmbeddingFatal(EmbeddingError):
    """Retrying will not help until the configuration or server changes."""


class RerankError(Exception):
    """The rerank server failed.  ``permanent`` means a configuration problem:
    the caller should stop using the reranker until the config is reloaded."""

    def __init__(self, message, permanent, status=None):
        super().__init__(message)
        self.permanent = permanent
        self.status = status


def parse_retry_after(value, now=None):
    """Seconds to wait from a Retry-After value (delta-seconds or HTTP date), or None."""
    value = (value or "").strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when is None:
            return None
        if when.tzinfo is None:  # RFC 9110 dates are GMT; "-0000" parses as naive
            when = when.replace(tzinfo=datetime.timezone.utc)
        seconds = when.timestamp() - (time.time() if now is None else now)
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


class BackoffGate:
    """Closed for a while after each rate-limit answer.

    Delays grow 15 s, 30 s, 60 s ... up to 5 minutes, with +-20 % jitter so
    several indexers do not come back in lockstep; a longer Retry-After from
    the server wins (but at most an hour: a bogus header must not stall
    indexing for days).  ``success()`` resets the sequence.
    """

    MAX_RETRY_AFTER = 3600.0

    def __init__(self, clock=time.monotonic, rng=None, base=15.0, cap=300.0, jitter=0.2):
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        self.base, self.cap, self.jitter = base, cap, jitter
        self.failures = 0
        self._until = None
        self._lock = threading.Lock()

    def open(self):
        with self._lock:
            return self._until is None or self._clock() >= self._until

    def wait_time(self):
        """Seconds until the gate opens (0.0 when open)."""
        with self._lock:
            return 0.0 if self._until is None else max(0.0, self._until - self._clock())

    def failure(self, retry_after=None):
        """Close the gate; returns the delay chosen, in seconds."""
        with self._lock:
            self.failures += 1
            delay = min(self.cap, self.base * 2.0 ** min(self.failures - 1, 30))
            delay = min(self.cap, delay * self._rng.uniform(1.0 - self.jitter, 1.0 + self.jitter))
            if retry_after is not None:
                delay = max(delay, min(float(retry_after), self.MAX_RETRY_AFTER))
            until = self._clock() + delay
            # A second failure reported late must not shorten a longer wait.
            self._until = until if self._until is None else max(self._until, until)
            return delay

    def success(self):
        with self._lock:
            self.failures = 0
            self._until = None


# --- disk cache -------------------------------------------------------------


class EmbeddingCache:
    """Unit vectors by (model, text) in one SQLite file.

    Rows are looked up by the first 8 bytes of sha256(model, text) through a
    unique index; the full digest is stored too and checked, so a 64-bit
    collision costs a recomputation, never a wrong vector.  Row ids are
    sequential because random ones make inserts of ~3 KB rows 4x slower
    (each lands in a different page of a large file).  WAL mode
    lets other processes (a second proxy, the CLI) read while one writes.
    Rows are float32 little-endian blobs, ~3 KB for 768 dimensions.
    """

    FILENAME = "embeddings.sqlite3"
    _CHUNK = 500  # bound parameters per query; old SQLite builds allow 999

    def __init__(self, directory):
        import sqlite3  # here, not at the top: some Python builds lack it and the proxy must still start
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, self.FILENAME)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(self.path, timeout=30.0, check_same_thread=False, isolation_level=None)
        try:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")  # losing the last commits of a cache is harmless
            self._conn.execute("CREATE TABLE IF NOT EXISTS vectors (id INTEGER PRIMARY KEY, "
                               "short INTEGER NOT NULL UNIQUE, digest BLOB NOT NULL, vector BLOB NOT NULL)")
        except Exception:
            self._conn.close()
            raise

    @staticmethod
    def key(model, text):
        """The digest identifying text embedded by model."""
        h = hashlib.sha256(model.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
        h.update(text.encode("utf-8", "surrogatepass"))
        return h.digest()

    def get_many(self, digests):
        """{digest: blob} for the digests present."""
        wanted = {int.from_bytes(d[:8], "big", signed=True): d for d in digests}
        ids = list(wanted)
        found = {}
        with self._lock:
            for start in range(0, len(ids), self._CHUNK):
                part = ids[start:start + self._CHUNK]
                sql = "SELECT short, digest, vector FROM vectors WHERE short IN (%s)" % ",".join("?" * len(part))
                for short, digest, blob in self._conn.execute(sql, part):
                    if wanted.get(short) == digest:
                        found[digest] = blob
        return found

    def put_many(self, items):
        """Store [(digest, blob), ...] in one transaction."""
        rows = [(int.from_bytes(d[:8], "big", signed=True), d, blob) for d, blob in items]
        if not rows:
            return
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.executemany(
                    "INSERT OR REPLACE INTO vectors (short, digest, vector) VALUES (?, ?, ?)", rows)
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def __len__(self):
        with self._lock:
            return self._conn.execute("SELECT COUNT(*) FROM vectors").fetchone()[0]

    def close(self):
        with self._lock:
            self._conn.close()


# --- shared HTTP plumbing -----------------------------------------------------


def _service_json_bytes(obj):
    try:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates from a badly decoded file: let JSON escape them
        return json.dumps(obj, separators=(",", ":")).encode("ascii")


def _service_headers(provider, body_length):
    headers = {
        "content-type": "application/json",
        "content-length": str(body_length),
        "accept": "application/json",
        "accept-encoding": "identity",
        "user-agent": "ragproxy/" + __version__,
    }
    if provider.api_key:
        headers["authorization"] = "Bearer " + provider.api_key
    extra = provider.headers.items() if isinstance(provider.headers, dict) else provider.headers
    for name, value in extra:
        headers[name.lower()] = value
    return headers


class Deadline:
    """A time by which work must be done, ``seconds`` from now on ``clock``'s scale."""

    def __init__(self, seconds, clock=time.monotonic):
        self._clock = clock
        self.seconds = seconds
        self.at = clock() + seconds

    def remaining(self):
        return self.at - self._clock()


# The deadline of the calls made in this context.  A context variable rather
# than an argument: the query embedding is asked for inside kb.search, which
# has no business with time limits; and no thread per request is needed to
# enforce one, since each call's socket timeouts are cut to what is left.
_DEADLINE = contextvars.ContextVar("ragproxy_deadline", default=None)


@contextlib.contextmanager
def time_limit(limit):
    """Within the block, embedding and rerank calls end by ``limit`` (a Deadline, or
    None for no limit): their connect and read timeouts are at most what is left,
    and a call with nothing left fails at once, as a timeout, without being sent."""
    token = _DEADLINE.set(limit)
    try:
        yield limit
    finally:
        _DEADLINE.reset(token)


def _timeouts(provider):
    limit = _DEADLINE.get()
    if limit is None:
        return provider.connect_timeout, provider.read_timeout
    left = limit.remaining()
    if left <= 0:
        raise UpstreamError("timeout", f"not sent: the time limit of {limit.seconds:g} s is spent")
    return min(provider.connect_timeout, left), min(provider.read_timeout, left)


def _post_json(pool, provider, url, payload, limit):
    """(status, response headers object, body bytes); raises UpstreamError."""
    body = _service_json_bytes(payload)
    connect_timeout, read_timeout = _timeouts(provider)
    resp = pool.request("POST", url, _service_headers(provider, len(body)), body,
                        connect_timeout, read_timeout, provider.tls)
    try:
        return resp.status, resp, resp.read_all(limit)
    finally:
        resp.close()


def _upstream_message(data):
    """The human part of an error body, shortened for a log line."""
    text = data.decode("utf-8", "replace")
    try:
        obj = json.loads(text)
    except ValueError:
        obj = None
    for _ in range(3):  # {"error": {"message": ...}}, {"error": "..."}, {"detail": ...}
        if not isinstance(obj, dict):
            break
        inner = next((obj[k] for k in ("error", "message", "detail") if obj.get(k)), None)
        if isinstance(inner, str):
            text = inner
            break
        obj = inner
    text = " ".join(text.split())
    return text[:300] + ("..." if len(text) > 300 else "") if text else "(empty body)"


def _parse_json(data):
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None


# --- vectors with or without numpy -------------------------------------------


def _decode_base64_f32(text):
    np = deps.np
    raw = base64.b64decode(text, validate=True)
    if len(raw) % 4:
        raise ValueError("base64 embedding is not a whole number of float32 values")
    if np is not None:
        return np.frombuffer(raw, dtype="<f4").astype(np.float64)
    row = array.array("f", raw)
    if _BIG_ENDIAN:
        row.byteswap()
    return row


def _wire_vector(value):
    """A vector from a JSON float list or base64 float32 string; ValueError if neither."""
    np = deps.np
    if isinstance(value, str):
        return _decode_base64_f32(value)
    if not isinstance(value, list):
        raise ValueError("embedding is neither a list of numbers nor a base64 string")
    if value and isinstance(value[0], list):
        raise ValueError("the server returned one vector per token, not one per text "
                         "(llama.cpp: start llama-server with --pooling mean, cls or last)")
    if not all(type(x) in (float, int) for x in value):
        raise ValueError("embedding contains something other than numbers")
    return np.asarray(value, dtype=np.float64) if np is not None else value


def _unit_f32(vector):
    """L2-normalised float32 copy; zero and non-finite vectors become zeros."""
    np = deps.np
    if np is not None:
        vector = np.asarray(vector, dtype=np.float64)
        norm = float(np.sqrt(vector @ vector)) if len(vector) else 0.0
        if norm == 0.0 or not math.isfinite(norm):
            return np.zeros(len(vector), dtype=np.float32)
        return (vector / norm).astype(np.float32)
    total = sum(map(operator.mul, vector, vector))
    if total == 0.0 or not math.isfinite(total):
        return array.array("f", bytes(4 * len(vector)))
    inv = 1.0 / math.sqrt(total)
    return array.array("f", [x * inv for x in vector])


def _row_to_blob(row):
    if deps.np is not None:
        return row.astype("<f4", copy=False).tobytes()
    if _BIG_ENDIAN:
        row = array.array("f", row)
        row.byteswap()
    return row.tobytes()


def _blob_to_row(blob):
    np = deps.np
    if np is not None:
        return np.frombuffer(blob, dtype="<f4")  # a read-only view: embed() copies once, into its matrix
    row = array.array("f", blob)
    if _BIG_ENDIAN:
        row.byteswap()
    return row


# --- embedding client ---------------------------------------------------------


def _embedding_error_rank(exc):
    """The most actionable error first: a config problem hides a rate limit."""
    for rank, kind in enumerate((EmbeddingFatal, EmbeddingRateLimited, EmbeddingTransient)):
        if isinstance(exc, kind):
            return rank
    return 3


class EmbeddingClient:
    """Embeds texts through one embedding provider, with batching and a disk cache.

    ``embed`` returns L2-normalised float32 rows in input order: a 2-D numpy
    array when numpy is present, else a list of ``array('f')``.  Texts seen
    before (same model, same text) come from the cache without any request;
    repeated texts within one call are sent once.

    ``query_prefix`` / ``document_prefix`` are prepended before embedding, for
    models trained with them (nomic-embed-text "search_query: ", e5 "query: ").
    """

    def __init__(self, provider, pool, cache_dir=None, batch_size=64, max_concurrency=2, dims=None,
                 gate=None, query_prefix="", document_prefix=""):
        if provider.type not in ("openai", "ollama"):
            raise EmbeddingFatal(
                f"embedding provider {provider.name!r} has type {provider.type!r}; embeddings need "
                f"type openai (an OpenAI-compatible server, base_url ending in /v1) or ollama")
        self.provider = provider
        self.pool = pool
        self.batch_size = max(1, int(batch_size))
        self.max_concurrency = max(1, int(max_concurrency))
        self.dims = int(dims) if dims else None
        self._dims_fixed = self.dims is not None
        self.gate = gate if gate is not None else BackoffGate()
        self.query_prefix = query_prefix
        self.document_prefix = document_prefix
        self.stats = {"requests": 0, "texts_sent": 0, "cache_hits": 0}
        base = provider.base_url.rstrip("/")
        self.url = base + ("/embeddings" if provider.type == "openai" else "/api/embed")
        # The cache is shared by every provider serving the same model name;
        # with no model name the server decides, so key by its address.
        self._cache_model = provider.model or provider.base_url
        self._base64 = provider.type == "openai"
        self._lock = threading.Lock()
        self._query_memo = collections.OrderedDict()
        self.cache = None
        if cache_dir:
            try:
                self.cache = EmbeddingCache(cache_dir)
            except Exception as exc:  # ImportError, a corrupt or unwritable file: run uncached
                log.warning("embedding cache in %s unusable, running without it: %s", cache_dir, exc)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def close(self):
        if self.cache is not None:
            self.cache.close()
            self.cache = None

    # -- public

    def embed(self, texts):
        """Unit float32 rows for texts, in order (see the class docstring)."""
        np = deps.np
        prefix = self.document_prefix
        rows = self._embed_rows([prefix + t for t in texts] if prefix else list(texts))
        if np is None:
            return rows
        if not rows:
            return np.zeros((0, self.dims or 0), dtype=np.float32)
        return np.stack(rows).astype(np.float32, copy=False)

    def embed_query(self, text):
        """One unit float32 row (1-D numpy array, or array('f')) for a search query."""
        np = deps.np
        text = self.query_prefix + text
        with self._lock:
            row = self._query_memo.get(text)
            if row is not None and (self.dims is None or len(row) == self.dims):
                self._query_memo.move_to_end(text)
                return row
        row = self._embed_rows([text])[0]
        if np is not None:
            row = np.array(row, dtype=np.float32)  # writable and native-endian, like embed()'s rows
        with self._lock:
            self._query_memo[text] = row
            while len(self._query_memo) > 256:
                self._query_memo.popitem(last=False)
        return row

    # -- internals

    def _embed_rows(self, texts):
        model = self._cache_model
        keys = [EmbeddingCache.key(model, t) for t in texts]
        unique = dict(zip(keys, texts))  # first text per key; duplicates go once
        found = self._cache_lookup(list(unique))
        with self._lock:
            self.stats["cache_hits"] += sum(1 for k in keys if k in found)
        missing = [k for k in unique if k not in found]
        if missing:
            if not self.gate.open():
                wait = self.gate.wait_time()
                raise EmbeddingRateLimited(
                    f"embedding provider {self.provider.name!r} is rate limited; "
                    f"waiting {wait:.0f} s before asking again", status=429, retry_after=wait)
            fetched = self._fetch([unique[k] for k in missing])
            found.update(zip(missing, fetched))
            self.gate.success()
        rows = [found[k] for k in keys]
        self._check_same_dims(rows)
        return rows

    def _cache_lookup(self, keys):
        cache = self.cache
        if cache is None or not keys:
            return {}
        try:
            blobs = cache.get_many(keys)
        except Exception as exc:
            self._cache_failed(exc)
            return {}
        rows = {}
        for key, blob in blobs.items():
            if len(blob) % 4 == 0 and (self.dims is None or len(blob) == 4 * self.dims):
                rows[key] = _blob_to_row(blob)  # a row of another size is stale: embed again
        return rows

    def _cache_store(self, texts, rows):
        cache = self.cache
        if cache is None:
            return
        try:
            model = self._cache_model
            cache.put_many([(EmbeddingCache.key(model, t), _row_to_blob(r)) for t, r in zip(texts, rows)])
        except Exception as exc:
            self._cache_failed(exc)

    def _cache_failed(self, exc):
        log.warning("embedding cache %s failed, continuing without it: %s",
                    getattr(self.cache, "path", ""), exc)
        with self._lock:
            cache, self.cache = self.cache, None
        if cache is not None:
            with contextlib.suppress(Exception):
                cache.close()

    def _check_same_dims(self, rows):
        with self._lock:
            expected = self.dims
            if expected is None and rows:
                expected = self.dims = len(rows[0])
        for row in rows:
            if len(row) != expected:
                raise self._dims_error(len(row), expected)

    def _dims_error(self, got, expected):
        why = ("the configured dims" if self._dims_fixed else "earlier vectors from this provider")
        return EmbeddingFatal(
            f"embedding provider {self.provider.name!r} (model {self.provider.model!r}) returned "
            f"{got}-dimensional vectors, but {why} have {expected} dimensions; use the model the "
            f"knowledge base was built with, or rebuild the index")

    def _fetch(self, texts):
        """Embed texts (all cache misses) in batches on up to max_concurrency threads."""
        results = [None] * len(texts)
        with self._lock:
            size = self.batch_size
        pending = collections.deque(range(0, len(texts), size))
        errors = []
        crashed = []
        guard = threading.Lock()

        def work():
            while True:
                with guard:
                    if errors or crashed or not pending:
                        return
                    start = pending.popleft()
                batch = texts[start:start + size]
                try:
                    rows = self._embed_batch(batch)
                except EmbeddingError as exc:
                    with guard:
                        errors.append(exc)
                    return
                except BaseException as exc:  # a bug: re-raised in the calling thread
                    with guard:
                        crashed.append(exc)
                    return
                results[start:start + len(rows)] = rows
                self._cache_store(batch, rows)

        workers = min(self.max_concurrency, len(pending))
        # Each worker runs in a copy of this context: a deadline set around embed() holds there too.
        threads = [threading.Thread(target=contextvars.copy_context().run, args=(work,), name="ragproxy-embed",
                                    daemon=True) for _ in range(workers - 1)]
        for thread in threads:
            thread.start()
        work()
        for thread in threads:
            thread.join()
        if crashed:
            raise crashed[0]
        if errors:
            limited = [e for e in errors if isinstance(e, EmbeddingRateLimited)]
            if limited:  # one gate step per call, however many workers saw the 429
                hints = [e.retry_after for e in limited if e.retry_after is not None]
                self.gate.failure(max(hints) if hints else None)
            raise min(errors, key=_embedding_error_rank)
        return results

    def _embed_batch(self, texts):
        """Unit rows for one batch; splits the batch if the server says it is too large."""
        provider = self.provider
        if provider.type == "openai":
            payload = {"model": provider.model, "input": texts}
            if self._base64:
                payload["encoding_format"] = "base64"  # a quarter of the bytes, and no float parsing
        else:
            payload = {"model": provider.model, "input": texts}
        try:
            status, resp, data = _post_json(self.pool, provider, self.url, payload, _EMBED_MAX_BODY)
        except UpstreamError as exc:
            raise EmbeddingTransient(f"embedding provider {provider.name!r} at {self.url}: {exc}") from None
        with self._lock:
            self.stats["requests"] += 1
            self.stats["texts_sent"] += len(texts)
        if status == 413 and len(texts) > 1:
            half = (len(texts) + 1) // 2
            with self._lock:
                if self.batch_size > half:
                    log.info("embedding provider %r: batch of %d too large, using batches of %d",
                             provider.name, len(texts), half)
                    self.batch_size = half
            return self._embed_batch(texts[:half]) + self._embed_batch(texts[half:])
        if status == 400 and self._base64 and b"encoding_format" in data:
            self._base64 = False  # a server that only speaks float lists
            return self._embed_batch(texts)
        if not 200 <= status < 300:
            raise self._http_error(status, resp, data)
        rows = self._parse(data, len(texts))
        with self._lock:
            expected = self.dims
            if expected is None:
                expected = self.dims = len(rows[0])
        for row in rows:
            if len(row) != expected:
                raise self._dims_error(len(row), expected)
        return rows

    def _parse(self, data, count):
        provider = self.provider
        obj = _parse_json(data)
        if provider.type == "openai":
            items = obj.get("data") if isinstance(obj, dict) else None
            where = "'data'"
        else:
            items = obj.get("embeddings") if isinstance(obj, dict) else None
            where = "'embeddings'"
        if not isinstance(items, list) or len(items) != count:
            got = f"{len(items)} vectors" if isinstance(items, list) else "no " + where
            raise self._malformed(f"sent {count} texts but the response has {got}")
        vectors = [None] * count
        try:
            for position, item in enumerate(items):
                if provider.type == "openai":
                    if not isinstance(item, dict):
                        raise ValueError("an item of 'data' is not an object")
                    index = item.get("index", position)
                    if type(index) is not int or not 0 <= index < count or vectors[index] is not None:
                        raise ValueError(f"bad or repeated index {index!r}")
                    value = item.get("embedding")
                else:
                    index, value = position, item
                vectors[index] = _wire_vector(value)
        except (ValueError, TypeError) as exc:  # binascii.Error is a ValueError
            raise self._malformed(str(exc)) from None
        if any(len(v) == 0 for v in vectors):
            raise self._malformed("an embedding is empty")
        return [_unit_f32(v) for v in vectors]

    def _malformed(self, detail):
        where = ("an OpenAI-compatible embeddings server; an openai base_url ends in /v1"
                 if self.provider.type == "openai" else "an Ollama server root")
        return EmbeddingFatal(f"embedding provider {self.provider.name!r} at {self.url} gave an unusable "
                              f"response ({detail}); check that base_url points at {where}")

    def _http_error(self, status, resp, data):
        provider = self.provider
        message = _upstream_message(data)
        head = f"embedding provider {provider.name!r} at {self.url} answered HTTP {status}: {message}"
        retry_after = parse_retry_after(resp.header("retry-after"))
        if status == 429:
            return EmbeddingRateLimited(head, status=status, retry_after=retry_after)
        if status == 408 or status >= 500:
            return EmbeddingTransient(head, status=status, retry_after=retry_after)
        setting = f"providers.embedding.{provider.name}"
        if status in (401, 403):
            fix = f"check {setting}.api_key (and headers)"
        elif status == 404:
            fix = (f"check {setting}.base_url (an openai base_url ends in /v1) and that model "
                   f"{provider.model!r} is served there" if provider.type == "openai" else
                   f"check {setting}.base_url (the server root) and run `ollama pull {provider.model}`")
        elif status == 413:
            fix = "a single chunk is too large for the server; lower the chunk size"
        elif 300 <= status < 400:
            fix = f"set {setting}.base_url to the address it redirects to: {resp.header('location')}"
        else:
            fix = (f"check {setting}.model; if the message is about length, lower the chunk size "
                   f"or raise the server's context/batch size")
        return EmbeddingFatal(f"{head}; {fix}", status=status)


# --- reranking ------------------------------------------------------------------


class RerankClient:
    """Scores documents against a query with a cross-encoder server.

    type ``openai``: POST base_url/rerank {model, query, documents, top_n} ->
    {results: [{index, relevance_score}]} (Jina, Cohere, llama.cpp, vLLM);
    type ``tei``: POST base_url/rerank {query, texts} -> [{index, score}].
    """

    def __init__(self, provider, pool):
        if provider.type not in ("openai", "tei"):
            raise RerankError(f"rerank provider {provider.name!r} has type {provider.type!r}; "
                              f"rerankers need type openai (Jina/Cohere-style /rerank) or tei", permanent=True)
        self.provider = provider
        self.pool = pool
        self.url = provider.base_url.rstrip("/") + "/rerank"
        self.max_documents = None  # learned from a 413: the server's batch limit
        self._lock = threading.Lock()

    def rerank(self, query, documents, top_n=None):
        """[(document index, score), ...] best first, at most top_n of them."""
        documents = list(documents)
        top_n = len(documents) if top_n is None else max(0, min(int(top_n), len(documents)))
        if top_n == 0:
            return []
        scored = self._score(query, documents, 0, top_n)
        scored.sort(key=lambda pair: (-pair[1], pair[0]))
        return scored[:top_n]

    def _score(self, query, documents, offset, top_n):
        limit = self.max_documents
        if limit is not None and len(documents) > limit:
            # The top_n overall are each among the top_n of their own slice.
            out = []
            for start in range(0, len(documents), limit):
                part = documents[start:start + limit]
                out += self._score(query, part, offset + start, min(top_n, len(part)))
            return out
        provider = self.provider
        if provider.type == "tei":
            payload = {"query": query, "texts": documents, "truncate": True}
        else:
            payload = {"model": provider.model, "query": query, "documents": documents, "top_n": top_n}
        try:
            status, resp, data = _post_json(self.pool, provider, self.url, payload, _RERANK_MAX_BODY)
        except UpstreamError as exc:
            raise RerankError(f"rerank provider {provider.name!r} at {self.url}: {exc}", permanent=False) from None
        if status == 413 and len(documents) > 1:
            with self._lock:
                half = (len(documents) + 1) // 2
                if self.max_documents is None or self.max_documents > half:
                    self.max_documents = half
            return self._score(query, documents, offset, top_n)
        if not 200 <= status < 300:
            raise self._http_error(status, data)
        return [(offset + index, score) for index, score in self._parse(data, len(documents))]

    def _parse(self, data, count):
        obj = _parse_json(data)
        items = obj.get("results") if isinstance(obj, dict) else obj
        if not isinstance(items, list):
            raise self._malformed("no 'results' list")
        pairs, seen = [], set()
        for item in items:
            if not isinstance(item, dict):
                raise self._malformed("a result is not an object")
            index = item.get("index")
            score = item.get("relevance_score", item.get("score"))
            if type(index) is not int or not 0 <= index < count or index in seen:
                raise self._malformed(f"bad or repeated index {index!r} for {count} documents")
            if type(score) not in (int, float) or not math.isfinite(score):
                raise self._malformed(f"bad score {score!r}")
            seen.add(index)
            pairs.append((index, float(score)))
        return pairs

    def _malformed(self, detail):
        shape = "TEI's native /rerank" if self.provider.type == "tei" else "a Jina/Cohere-style /rerank"
        return RerankError(f"rerank provider {self.provider.name!r} at {self.url} gave an unusable response "
                           f"({detail}); check that base_url points at {shape} endpoint", permanent=True)

    def _http_error(self, status, data):
        message = _upstream_message(data)
        head = f"rerank provider {self.provider.name!r} at {self.url} answered HTTP {status}: {message}"
        if status in (401, 403):
            return RerankError(f"{head}; check providers.rerank.{self.provider.name}.api_key", True, status)
        if status == 404:
            return RerankError(f"{head}; check providers.rerank.{self.provider.name}.base_url and model", True, status)
        if 300 <= status < 400 or (status == 400 and not _INPUT_TOO_LARGE.search(message)):
            return RerankError(head, True, status)
        return RerankError(head, False, status)
