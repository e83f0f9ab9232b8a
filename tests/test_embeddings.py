"""Embedding and rerank clients against the fake upstream's real endpoints."""
import array
import email.utils
import json
import math
import random
import socket
import threading

import pytest

import ragproxy
from _ragproxy import deps, embeddings
from fake_upstream import OPENAI_RATE_LIMIT_BODY, embed_text


class FakeClock:
    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


class MidpointRng:
    """uniform(a, b) -> the midpoint: backoff without jitter."""

    def uniform(self, a, b):
        return (a + b) / 2


@pytest.fixture
def pool():
    p = ragproxy.make_http_pool()
    yield p
    p.close()


def embedder(fake, kind="openai", **options):
    base = fake.url + "/v1" if kind == "openai" else fake.url
    provider = ragproxy.Provider(
        name="emb", type=kind, base_url=base, model="fake-embed",
        api_key=options.pop("api_key", ""), headers=options.pop("headers", ()),
        connect_timeout=2.0, read_timeout=options.pop("read_timeout", 5.0))
    return ragproxy.EmbeddingClient(provider, options.pop("pool"), **options)


def reranker(fake, kind, pool, **fields):
    base = fake.url + "/v1" if kind == "openai" else fake.url
    fields.setdefault("read_timeout", 5.0)
    provider = ragproxy.Provider(name="rr", type=kind, base_url=base, model="fake-rerank",
                                 connect_timeout=2.0, **fields)
    return ragproxy.RerankClient(provider, pool)


def as_lists(rows):
    return [[float(x) for x in row] for row in rows]


def assert_matches_reference(rows, texts, dims=64):
    assert len(rows) == len(texts)
    for row, text in zip(as_lists(rows), texts):
        assert row == pytest.approx(embed_text(text, dims), abs=1e-6)


def embedding_requests(fake):
    return [r for r in fake.requests if r.path in ("/v1/embeddings", "/api/embed")]


def sent_inputs(fake):
    return [text for r in embedding_requests(fake) for text in r.json["input"]]


TEXTS = ["the quick brown fox", "jumps over the lazy dog", "retrieval augmented generation"]


# --- embedding: wire formats ----------------------------------------------------


def test_openai_embeddings_arrive_as_base64_and_match_the_server(fake, pool):
    client = embedder(fake, pool=pool, api_key="sk-embed", headers=(("X-Team", "search"),))
    rows = client.embed(TEXTS)
    assert_matches_reference(rows, TEXTS)
    request = fake.last
    assert request.path == "/v1/embeddings"
    assert request.json == {"model": "fake-embed", "input": TEXTS, "encoding_format": "base64"}
    assert request.headers["authorization"] == "Bearer sk-embed"
    assert request.headers["x-team"] == "search"


def test_result_type_is_float32_and_rows_are_unit_length(fake, pool):
    rows = embedder(fake, pool=pool).embed(TEXTS)
    if deps.np is not None:
        assert rows.dtype == deps.np.float32 and rows.shape == (3, 64)
    else:
        assert isinstance(rows, list) and all(isinstance(r, array.array) and r.typecode == "f" for r in rows)
    for row in as_lists(rows):
        assert math.sqrt(sum(x * x for x in row)) == pytest.approx(1.0, abs=1e-5)


def test_server_without_base64_support_gets_float_lists(fake, pool):
    fake.fail_next(400, '{"error":{"message":"unsupported value for encoding_format"}}', path="/v1/embeddings")
    client = embedder(fake, pool=pool)
    assert_matches_reference(client.embed(TEXTS), TEXTS)
    assert_matches_reference(client.embed(["a new text"]), ["a new text"])
    first, retried, later = embedding_requests(fake)
    assert first.json["encoding_format"] == "base64"
    assert "encoding_format" not in retried.json and "encoding_format" not in later.json


def test_ollama_native_embed_endpoint(fake, pool):
    client = embedder(fake, "ollama", pool=pool)
    assert_matches_reference(client.embed(TEXTS), TEXTS)
    assert fake.last.path == "/api/embed"
    assert fake.last.json == {"model": "fake-embed", "input": TEXTS}


def test_zero_vector_stays_zero_and_empty_input_sends_nothing(fake, pool):
    client = embedder(fake, pool=pool)
    assert as_lists(client.embed(["", "word"]))[0] == [0.0] * 64
    assert len(client.embed([])) == 0
    assert len(embedding_requests(fake)) == 1


# --- embedding: batching, concurrency, cache -----------------------------------------


def test_batches_split_inputs_and_results_keep_input_order(fake, pool):
    texts = [f"document number {i} about topic {i % 3}" for i in range(10)]
    client = embedder(fake, pool=pool, batch_size=3, max_concurrency=2)
    assert_matches_reference(client.embed(texts), texts)
    requests = embedding_requests(fake)
    assert len(requests) == 4  # ceil(10 / 3)
    assert all(len(r.json["input"]) <= 3 for r in requests)
    assert sorted(sent_inputs(fake)) == sorted(texts)


def test_repeated_texts_are_sent_once(fake, pool):
    texts = ["same", "other", "same", "same"]
    rows = embedder(fake, pool=pool).embed(texts)
    assert_matches_reference(rows, texts)
    assert sent_inputs(fake) == ["same", "other"]


class CountingPool:
    """Wraps a pool to see how many requests are in flight at once."""

    def __init__(self, inner):
        self.inner, self.in_flight, self.peak, self.threads = inner, 0, 0, set()
        self.lock = threading.Lock()

    def request(self, *args, **kwargs):
        with self.lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            self.threads.add(threading.get_ident())
        try:
            return self.inner.request(*args, **kwargs)
        finally:
            with self.lock:
                self.in_flight -= 1


def test_concurrency_is_bounded(fake, pool):
    fake.delay = 0.1
    counting = CountingPool(pool)
    texts = [f"text {i}" for i in range(12)]
    client = embedder(fake, pool=counting, batch_size=2, max_concurrency=2)
    assert_matches_reference(client.embed(texts), texts)
    assert len(embedding_requests(fake)) == 6
    assert counting.peak <= 2
    assert len(counting.threads) == 2


def test_cache_hits_skip_the_server_and_survive_a_new_client(fake, pool, tmp_path):
    with embedder(fake, pool=pool, cache_dir=str(tmp_path)) as client:
        first = as_lists(client.embed(TEXTS))
        assert len(embedding_requests(fake)) == 1
        assert as_lists(client.embed(TEXTS)) == first
        assert len(embedding_requests(fake)) == 1
    with embedder(fake, pool=pool, cache_dir=str(tmp_path)) as again:
        assert as_lists(again.embed(TEXTS)) == first
        assert len(embedding_requests(fake)) == 1
        mixed = TEXTS[:1] + ["brand new words"] + TEXTS[1:]
        assert_matches_reference(again.embed(mixed), mixed)
        assert sent_inputs(fake) == TEXTS + ["brand new words"]
        assert again.stats["cache_hits"] == 3 + 3


def test_cache_is_per_model(fake, pool, tmp_path):
    embedder(fake, pool=pool, cache_dir=str(tmp_path)).embed(TEXTS)
    provider = ragproxy.Provider(name="emb2", type="openai", base_url=fake.url + "/v1", model="other-model")
    ragproxy.EmbeddingClient(provider, pool, cache_dir=str(tmp_path)).embed(TEXTS)
    assert len(embedding_requests(fake)) == 2


def test_two_clients_share_one_cache_file_concurrently(fake, pool, tmp_path):
    a = embedder(fake, pool=pool, cache_dir=str(tmp_path), batch_size=4)
    b = embedder(fake, pool=pool, cache_dir=str(tmp_path), batch_size=4)
    texts_a = [f"alpha {i}" for i in range(40)]
    texts_b = [f"beta {i}" for i in range(40)]
    threads = [threading.Thread(target=a.embed, args=(texts_a,)), threading.Thread(target=b.embed, args=(texts_b,))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    count = len(embedding_requests(fake))
    c = embedder(fake, pool=pool, cache_dir=str(tmp_path))
    assert_matches_reference(c.embed(texts_a + texts_b), texts_a + texts_b)
    assert len(embedding_requests(fake)) == count
    for client in (a, b, c):
        client.close()


def test_unusable_cache_file_means_running_uncached(fake, pool, tmp_path, caplog):
    (tmp_path / "embeddings.sqlite3").write_bytes(b"this is not a database" * 100)
    client = embedder(fake, pool=pool, cache_dir=str(tmp_path))
    assert_matches_reference(client.embed(TEXTS), TEXTS)
    assert client.cache is None
    assert "embedding cache" in caplog.text


def test_embed_query_is_cached(fake, pool, tmp_path):
    client = embedder(fake, pool=pool, cache_dir=str(tmp_path))
    row = client.embed_query("how does the fox jump")
    assert [float(x) for x in row] == pytest.approx(embed_text("how does the fox jump"), abs=1e-6)
    client.embed_query("how does the fox jump")
    fresh = embedder(fake, pool=pool, cache_dir=str(tmp_path))
    fresh.embed_query("how does the fox jump")
    assert len(embedding_requests(fake)) == 1


def test_prefixes_are_sent_and_keyed(fake, pool):
    client = embedder(fake, pool=pool, query_prefix="search_query: ", document_prefix="search_document: ")
    client.embed(["fox"])
    client.embed_query("fox")
    assert sent_inputs(fake) == ["search_document: fox", "search_query: fox"]


def test_batch_too_large_is_split_and_remembered(fake, pool):
    fake.fail_next(413, '{"error":{"message":"batch size 8 > maximum allowed batch size 4"}}')
    texts = [f"item {i}" for i in range(8)]
    client = embedder(fake, pool=pool, batch_size=8)
    assert_matches_reference(client.embed(texts), texts)
    assert [len(r.json["input"]) for r in embedding_requests(fake)] == [8, 4, 4]
    assert client.batch_size == 4


# --- embedding: errors and backoff -------------------------------------------------------


def test_429_with_retry_after_closes_the_gate_for_that_long(fake, pool):
    clock = FakeClock()
    client = embedder(fake, pool=pool, gate=ragproxy.BackoffGate(clock=clock, rng=MidpointRng()))
    fake.fail_next(429, OPENAI_RATE_LIMIT_BODY, headers={"Retry-After": "120"})
    with pytest.raises(ragproxy.EmbeddingRateLimited) as caught:
        client.embed(TEXTS)
    assert caught.value.retry_after == 120
    assert not client.gate.open() and client.gate.wait_time() == pytest.approx(120)
    clock.advance(119)
    with pytest.raises(ragproxy.EmbeddingRateLimited) as still:
        client.embed(TEXTS)
    assert still.value.retry_after == pytest.approx(1)
    assert len(embedding_requests(fake)) == 1  # the closed gate sent nothing
    clock.advance(2)
    assert_matches_reference(client.embed(TEXTS), TEXTS)
    assert client.gate.open() and client.gate.failures == 0


def test_429_without_retry_after_uses_exponential_backoff(fake, pool):
    clock = FakeClock()
    client = embedder(fake, pool=pool, gate=ragproxy.BackoffGate(clock=clock, rng=MidpointRng()))
    for expected in (15, 30):
        fake.fail_next(429)
        with pytest.raises(ragproxy.EmbeddingRateLimited) as caught:
            client.embed(TEXTS)
        assert caught.value.retry_after is None
        assert client.gate.wait_time() == pytest.approx(expected)
        clock.advance(expected)


def test_cached_texts_are_served_while_rate_limited(fake, pool, tmp_path):
    clock = FakeClock()
    client = embedder(fake, pool=pool, cache_dir=str(tmp_path), gate=ragproxy.BackoffGate(clock=clock))
    client.embed(TEXTS)
    fake.fail_next(429, headers={"Retry-After": "60"})
    with pytest.raises(ragproxy.EmbeddingRateLimited):
        client.embed(["not cached yet"])
    assert_matches_reference(client.embed(TEXTS), TEXTS)


def test_503_is_transient_and_does_not_close_the_gate(fake, pool):
    client = embedder(fake, pool=pool)
    fake.fail_next(503, '{"error":"server busy, please try again"}')
    with pytest.raises(ragproxy.EmbeddingTransient) as caught:
        client.embed(TEXTS)
    assert caught.value.status == 503 and "server busy" in str(caught.value)
    assert client.gate.open()
    assert_matches_reference(client.embed(TEXTS), TEXTS)


def test_unreachable_and_timeout_are_transient(fake, pool):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    provider = ragproxy.Provider(name="gone", type="openai", base_url=f"http://127.0.0.1:{port}/v1",
                                 model="m", connect_timeout=2.0, read_timeout=2.0)
    with pytest.raises(ragproxy.EmbeddingTransient) as caught:
        ragproxy.EmbeddingClient(provider, pool).embed(["x"])
    assert caught.value.status is None and "'gone'" in str(caught.value)
    fake.delay = 1.0
    with pytest.raises(ragproxy.EmbeddingTransient):
        embedder(fake, pool=pool, read_timeout=0.2).embed(["x"])


@pytest.mark.parametrize("status, hint", [(401, "api_key"), (403, "api_key"), (404, "base_url"), (400, "model")])
def test_client_errors_are_fatal_and_say_what_to_fix(fake, pool, status, hint):
    fake.fail_next(status)
    with pytest.raises(ragproxy.EmbeddingFatal) as caught:
        embedder(fake, pool=pool).embed(TEXTS)
    message = str(caught.value)
    assert caught.value.status == status
    assert "'emb'" in message and f"HTTP {status}" in message and hint in message


def test_ollama_404_suggests_pulling_the_model(fake, pool):
    fake.fail_next(404, '{"error":"model \\"fake-embed\\" not found, try pulling it first"}')
    with pytest.raises(ragproxy.EmbeddingFatal, match="ollama pull fake-embed"):
        embedder(fake, "ollama", pool=pool).embed(TEXTS)


def test_dimension_differs_from_configured_dims(fake, pool):
    with pytest.raises(ragproxy.EmbeddingFatal) as caught:
        embedder(fake, pool=pool, dims=32).embed(TEXTS)
    assert "64" in str(caught.value) and "32" in str(caught.value) and "'emb'" in str(caught.value)


def test_dimension_change_between_calls_is_fatal(fake, pool):
    client = embedder(fake, pool=pool)
    client.embed(TEXTS)
    fake.embedding_dims = 48
    with pytest.raises(ragproxy.EmbeddingFatal, match=r"48-dimensional.*64"):
        client.embed(["a text the cache has not seen"])


def test_cached_vectors_of_another_size_are_recomputed_with_dims(fake, pool, tmp_path):
    embedder(fake, pool=pool, cache_dir=str(tmp_path)).embed(TEXTS)  # 64 dims cached
    fake.embedding_dims = 48
    rows = embedder(fake, pool=pool, cache_dir=str(tmp_path), dims=48).embed(TEXTS)
    assert_matches_reference(rows, TEXTS, dims=48)


@pytest.mark.parametrize("body", [
    b"<html>Open WebUI</html>",
    b'{"object":"list","data":[]}',
    b'{"data":[{"index":0,"embedding":"!!notbase64"}]}',
    b'{"data":[{"index":0,"embedding":[[0.1,0.2],[0.3,0.4]]}]}',
])
def test_malformed_responses_are_fatal(fake, pool, body):
    fake.fail_next(200, body)
    with pytest.raises(ragproxy.EmbeddingFatal, match="'emb'.*unusable"):
        embedder(fake, pool=pool).embed(["one text"])


def test_out_of_order_indexes_are_mapped_back(fake, pool):
    a, b = embed_text("first"), embed_text("second")
    fake.fail_next(200, json.dumps({"data": [{"index": 1, "embedding": b}, {"index": 0, "embedding": a}]}))
    rows = embedder(fake, pool=pool).embed(["first", "second"])
    assert_matches_reference(rows, ["first", "second"])


def test_wrong_provider_type_is_refused(pool):
    provider = ragproxy.Provider(name="claude", type="anthropic", base_url="http://127.0.0.1:1")
    with pytest.raises(ragproxy.EmbeddingFatal, match="'claude'.*openai.*ollama"):
        ragproxy.EmbeddingClient(provider, pool)


# --- BackoffGate and Retry-After ------------------------------------------------------------


def test_gate_delays_double_up_to_five_minutes():
    clock = FakeClock()
    gate = ragproxy.BackoffGate(clock=clock, rng=MidpointRng())
    assert gate.open() and gate.wait_time() == 0
    delays = [gate.failure() for _ in range(7)]
    assert delays == [15, 30, 60, 120, 240, 300, 300]
    gate.success()
    assert gate.open() and gate.failure() == 15


def test_gate_jitter_stays_within_twenty_percent():
    gate = ragproxy.BackoffGate(clock=FakeClock(), rng=random.Random(7))
    assert 12 <= gate.failure() <= 18
    samples = set()
    for _ in range(50):
        gate.success()
        samples.add(gate.failure())
    assert all(12 <= s <= 18 for s in samples) and len(samples) > 10


def test_gate_longer_retry_after_wins_shorter_does_not():
    clock = FakeClock()
    gate = ragproxy.BackoffGate(clock=clock, rng=MidpointRng())
    assert gate.failure(retry_after=90) == 90
    gate.success()
    assert gate.failure(retry_after=3) == 15
    clock.advance(14.5)
    assert not gate.open() and gate.wait_time() == pytest.approx(0.5)
    clock.advance(0.5)
    assert gate.open()


def test_parse_retry_after():
    now = 1_700_000_000.0
    assert ragproxy.parse_retry_after("120") == 120
    assert ragproxy.parse_retry_after(" 1.5 ") == 1.5
    assert ragproxy.parse_retry_after(email.utils.formatdate(now + 45, usegmt=True), now=now) == pytest.approx(45)
    assert ragproxy.parse_retry_after(email.utils.formatdate(now - 45, usegmt=True), now=now) == 0
    for junk in (None, "", "soon", "nan", "inf"):
        assert ragproxy.parse_retry_after(junk) is None


# --- reranking -------------------------------------------------------------------------------------

DOCS = [
    "bananas are yellow",                       # 0 of 3 query words
    "the fox jumps over things",                # 2
    "a quick brown fox jumps",                  # 3
    "brown paper bags",                         # 1
]
QUERY = "quick brown fox jumps"


def test_rerank_openai_shape_maps_indexes_and_cuts_to_top_n(fake, pool):
    client = reranker(fake, "openai", pool)
    result = client.rerank(QUERY, DOCS, top_n=2)
    assert [i for i, _ in result] == [2, 1]
    assert [s for _, s in result] == pytest.approx([1.0, 0.5])
    request = fake.last
    assert request.path == "/v1/rerank"
    assert request.json == {"model": "fake-rerank", "query": QUERY, "documents": DOCS, "top_n": 2}


def test_rerank_tei_shape(fake, pool):
    client = reranker(fake, "tei", pool)
    result = client.rerank(QUERY, DOCS, top_n=3)
    assert [i for i, _ in result] == [2, 1, 3]
    assert fake.last.path == "/rerank"
    assert fake.last.json["texts"] == DOCS and fake.last.json["query"] == QUERY
    assert [i for i, _ in client.rerank(QUERY, DOCS)] == [2, 1, 3, 0]


def test_rerank_sorts_results_the_server_left_unsorted(fake, pool):
    fake.fail_next(200, '{"results":[{"index":0,"relevance_score":0.1},{"index":2,"relevance_score":0.9},'
                        '{"index":1,"relevance_score":0.5}]}')
    assert reranker(fake, "openai", pool).rerank("q", ["a", "b", "c"], top_n=2) == [(2, 0.9), (1, 0.5)]


def test_rerank_empty_documents_sends_nothing(fake, pool):
    assert reranker(fake, "openai", pool).rerank(QUERY, [], top_n=5) == []
    assert fake.requests == []


def test_rerank_splits_documents_after_413(fake, pool):
    fake.fail_next(413, '{"error":"batch size 4 > maximum allowed batch size 2"}')
    client = reranker(fake, "tei", pool)
    assert [i for i, _ in client.rerank(QUERY, DOCS, top_n=2)] == [2, 1]
    assert [len(r.json["texts"]) for r in fake.requests] == [4, 2, 2]
    assert client.max_documents == 2


@pytest.mark.parametrize("status, body, permanent", [
    (400, None, True),
    (401, None, True),
    (403, None, True),
    (404, None, True),
    (400, '{"error":{"message":"input is too large to process. increase the physical batch size"}}', False),
    (429, None, False),
    (500, None, False),
    (503, None, False),
    (200, "<html>not a reranker</html>", True),
])
def test_rerank_errors_are_permanent_only_for_configuration_problems(fake, pool, status, body, permanent):
    fake.fail_next(status, body)
    with pytest.raises(ragproxy.RerankError) as caught:
        reranker(fake, "openai", pool).rerank(QUERY, DOCS, top_n=2)
    assert caught.value.permanent is permanent
    assert "'rr'" in str(caught.value)


def test_rerank_unreachable_and_timeout_are_not_permanent(fake, pool):
    fake.delay = 1.0
    with pytest.raises(ragproxy.RerankError) as caught:
        reranker(fake, "tei", pool, read_timeout=0.2).rerank(QUERY, DOCS)
    assert caught.value.permanent is False


def test_rerank_wrong_provider_type_is_refused(pool):
    provider = ragproxy.Provider(name="ol", type="ollama", base_url="http://127.0.0.1:1")
    with pytest.raises(ragproxy.RerankError) as caught:
        ragproxy.RerankClient(provider, pool)
    assert caught.value.permanent and "tei" in str(caught.value)


# --- a time limit on the calls of one retrieval ----------------------------------

class TimeoutsPool:
    """Passes each request on to a real pool, noting the timeouts it was given."""

    def __init__(self, pool):
        self.pool, self.timeouts = pool, []

    def request(self, method, url, headers, body, connect_timeout, read_timeout, tls=None):
        self.timeouts.append((connect_timeout, read_timeout))
        return self.pool.request(method, url, headers, body, connect_timeout, read_timeout, tls)


def test_a_time_limit_caps_each_calls_timeouts_in_every_worker(fake, pool):
    clock = FakeClock()
    spy = TimeoutsPool(pool)
    client = embedder(fake, pool=spy, read_timeout=600.0, batch_size=1, max_concurrency=3)
    fake.delay = 0.05  # long enough that every worker takes a batch
    with embeddings.time_limit(embeddings.Deadline(1.5, clock)):
        client.embed(["one", "two", "three", "four", "five", "six"])
        reranker(fake, "openai", spy, read_timeout=600.0).rerank(QUERY, DOCS)
    assert spy.timeouts == [(1.5, 1.5)] * 7   # the limit was under both provider timeouts
    fake.delay = 0.0
    client.embed(["seven"])
    assert spy.timeouts[-1] == (2.0, 600.0)  # outside the block: the provider's own


def test_a_spent_time_limit_sends_nothing_and_is_a_transient_failure(fake, pool):
    clock = FakeClock()
    limit = embeddings.Deadline(0.3, clock)
    clock.advance(0.3)
    with embeddings.time_limit(limit):
        with pytest.raises(ragproxy.EmbeddingTransient) as caught:
            embedder(fake, pool=pool).embed_query("what does the elephant do")
        with pytest.raises(ragproxy.RerankError) as rerank:
            reranker(fake, "tei", pool).rerank(QUERY, DOCS)
    assert "time limit of 0.3 s" in str(caught.value) and rerank.value.permanent is False
    assert fake.requests == []


def test_a_time_limit_ends_a_call_to_a_server_that_does_not_answer(fake, pool):
    fake.delay = 30.0  # the fake gives up waiting as soon as the client leaves
    with embeddings.time_limit(embeddings.Deadline(0.2)):
        with pytest.raises(ragproxy.EmbeddingTransient) as caught:
            embedder(fake, pool=pool, read_timeout=600.0).embed(["x"])
    assert "did not answer" in str(caught.value)
