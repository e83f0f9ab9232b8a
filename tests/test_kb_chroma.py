"""Knowledge bases on Chroma (_ragproxy.kb with chromastore.ChromaKB), against a real Chroma server.

The same corpus and embedder on the built-in store and on Chroma must give
the same hits; re-indexing touches only changed files; a replica's mirror
follows the indexer's commits; a failing server, a wrong tenant, another
dimension or another tool's collection each stop cleanly with nothing lost;
an indexer SIGKILLed at random points always leaves whole files and the
next run converges.  The embedder is the fake upstream's deterministic
feature hashing, in process.
"""
import hashlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

import pytest

import ragproxy
from _ragproxy.chroma import ChromaClient
from _ragproxy.vectorstore import StoreSpec, VectorStoreError
from fake_upstream import embed_text

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
QUERIES = ["alpha port listens", "retry uploads beta", "gamma ray measure", "river stone bridge", "quiet lamp",
           "copper wire signal", "north wind season", "garden seed water", "market price bread", "tower clock bell"]
WORDS = ("alpha beta gamma delta river stone bridge lamp quiet copper wire signal north wind season garden seed "
         "water market price bread tower clock bell port listens retry uploads ray measure glass paper ink "
         "forest cloud thunder valley engine piston harbor sail anchor salt honey wax candle").split()
VOCABULARY = WORDS + [f"w{i}" for i in range(300)]   # wide enough that no two documents embed alike


class Embedder:
    def __init__(self, dims=64):
        self.dims, self.calls = dims, 0

    def embed(self, texts):
        self.calls += 1
        return [embed_text(t, self.dims) for t in texts]

    def embed_query(self, text):
        return embed_text(text, self.dims)


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def corpus(data_dir, n, rng, words=60):
    docs = os.path.join(str(data_dir), "documents", "kb")
    for i in range(n):
        write(os.path.join(docs, f"d{i:03d}.md"),
              f"# Doc {i} {rng.choice(WORDS)}\n\n" + " ".join(rng.choice(VOCABULARY) for _ in range(words)) + "\n")
    return docs


def chroma_spec(server, prefix, **kw):
    kw.setdefault("indexer", "always")
    return StoreSpec(type="chroma_http", base_url=server.url, collection_prefix=prefix, **kw)


def make_kb(data_dir, store=None, embedder=None, retrieval="hybrid", **kw):
    spec = ragproxy.KBSpec(name="kb", retrieval=retrieval, store=store or StoreSpec(), **kw)
    return ragproxy.KnowledgeBase(spec, str(data_dir), embedder=embedder if embedder is not None else Embedder())


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chroma_state(server, prefix):
    """(records {source: record}, {chunk id: metadata}) as the server holds them."""
    client = ChromaClient(server.url)
    try:
        chunks, files = client.get_collection(prefix + "kb"), client.get_collection(prefix + "kb.files")
        got = client.get(files["id"], include=("documents",))
        records = {rid[5:]: json.loads(doc) for rid, doc in zip(got["ids"], got["documents"]) if rid[:5] == "file:"}
        got = client.get(chunks["id"], include=("metadatas",))
        return records, dict(zip(got["ids"], got["metadatas"]))
    finally:
        client.close()


def assert_whole_files(records, stored):
    """Every recorded file is fully there: each chunk it names, from this version of the file."""
    for source, record in records.items():
        for cid in record["chunk_ids"]:
            assert cid in stored, f"{source}: chunk {cid} missing"
            assert stored[cid]["ragproxy_file"] == source and stored[cid]["ragproxy_file_hash"] == record["hash"]


def assert_converged(kb, server, prefix, docs):
    records, stored = chroma_state(server, prefix)
    assert_whole_files(records, stored)
    named = [cid for r in records.values() for cid in r["chunk_ids"]]
    assert len(named) == len(set(named)) and set(stored) == set(named)   # no duplicates, no orphans
    on_disk = {}
    for name in os.listdir(docs):
        with open(os.path.join(docs, name), "rb") as f:
            on_disk["kb/" + name] = hashlib.sha256(f.read()).hexdigest()
    assert {s: r["hash"] for s, r in records.items()} == on_disk
    generation, bm25 = kb.current()
    assert {s: {k: v for k, v in e.items() if k != "row"} for s, e in generation.manifest.items()} == records
    assert len(generation) == len(named) == len(bm25)


def hits(kb, query, mode):
    return [(h.id, h.score) for h in kb.search(query, 10, mode=mode)]


def assert_same_hits(a, b):
    """Same ids in the same order, scores to 1e-3.  Feature hashing gives many equal scores, which each
    store orders its own way: within a tie the ids are compared as a set, and a tie cut at k by its size."""
    assert len(a) == len(b)
    assert all(abs(x - y) < 1e-3 for (_, x), (_, y) in zip(a, b))

    def ties(found):
        out = []
        for cid, score in found:
            if out and abs(out[-1][0] - score) < 1e-5:
                out[-1][1].add(cid)
            else:
                out.append((score, {cid}))
        return out
    ta, tb = ties(a), ties(b)
    assert [ids for _, ids in ta[:-1]] == [ids for _, ids in tb[:-1]]
    assert len(ta) == len(tb) and len(ta[-1][1]) == len(tb[-1][1])


def test_search_on_chroma_gives_the_builtin_stores_hits(tmp_path, chroma_server, chroma_prefix):
    rng = random.Random(3)
    corpus(tmp_path / "builtin", 80, rng)
    rng = random.Random(3)
    corpus(tmp_path / "chroma", 80, rng)
    builtin = make_kb(tmp_path / "builtin")
    builtin.index()
    on_chroma = make_kb(tmp_path / "chroma", chroma_spec(chroma_server, chroma_prefix))
    on_chroma.index()
    replica = make_kb(tmp_path / "replica", chroma_spec(chroma_server, chroma_prefix, indexer="never"))
    assert replica.sync()
    for query in QUERIES:
        for mode in ("lexical", "dense", "hybrid"):
            expected = hits(builtin, query, mode)
            assert expected
            assert_same_hits(hits(on_chroma, query, mode), expected)
            assert_same_hits(hits(replica, query, mode), expected)
    assert on_chroma.current()[0].vectors is None   # the mirror holds no vectors: Chroma does
    assert on_chroma.store_status()["vectors"] == len(builtin.current()[0])


def test_reindexing_touches_only_changed_files(tmp_path, chroma_server, chroma_prefix):
    docs = corpus(tmp_path, 30, random.Random(5))
    kb = make_kb(tmp_path, chroma_spec(chroma_server, chroma_prefix))
    kb.index()
    writes = kb.chroma.store.writes
    version = kb.chroma.store.version
    writes.clear()
    report = kb.index()
    assert not report.committed and report.unchanged == 30
    assert writes == {} and kb.chroma.store.version == version   # an idle poll writes nothing, not even a commit
    write(os.path.join(docs, "d003.md"), "# Changed\n\nriver stone bridge again\n")
    write(os.path.join(docs, "new.md"), "# New\n\ncandle wax honey\n")
    os.unlink(os.path.join(docs, "d007.md"))
    before, _ = chroma_state(chroma_server, chroma_prefix)
    report = kb.index()
    assert (report.added, report.changed, report.deleted, report.unchanged) == (1, 1, 1, 28)
    after, _ = chroma_state(chroma_server, chroma_prefix)
    new_chunks = len(after["kb/d003.md"]["chunk_ids"]) + len(after["kb/new.md"]["chunk_ids"])
    stale = set(before["kb/d003.md"]["chunk_ids"]) - set(after["kb/d003.md"]["chunk_ids"])
    assert writes == {"chunks_upserted": new_chunks, "records_upserted": 2, "records_deleted": 1,
                      "chunks_deleted": len(before["kb/d007.md"]["chunk_ids"]) + len(stale)}
    assert kb.chroma.store.version == version + 1
    assert_converged(kb, chroma_server, chroma_prefix, docs)


def test_a_replica_sees_new_content_after_sync(tmp_path, chroma_server, chroma_prefix):
    docs = corpus(tmp_path / "indexer", 10, random.Random(8))
    indexer = make_kb(tmp_path / "indexer", chroma_spec(chroma_server, chroma_prefix))
    replica = make_kb(tmp_path / "replica", chroma_spec(chroma_server, chroma_prefix, indexer="never"))
    assert not replica.sync() and replica.current()[0] is None   # nothing committed yet
    indexer.index()
    assert replica.sync() and not replica.sync()
    write(os.path.join(docs, "zebra.md"), "# Zebra\n\nzebra crossings glow at night\n")
    indexer.index()
    assert replica.search("zebra crossings", 1)[0].chunk["source"] != "kb/zebra.md"
    assert replica.sync()
    for mode in ("lexical", "dense", "hybrid"):
        assert replica.search("zebra crossings", 1, mode=mode)[0].chunk["source"] == "kb/zebra.md"
    status = replica.store_status()
    assert status["reachable"] is True and status["collection"] == chroma_prefix + "kb"
    # The replica never writes: KnowledgeBases' pass skips it, its store made no write.
    assert not replica.chroma.may_index() and replica.store_status()["role"] == "replica"
    assert replica.chroma.store.writes == {}


def test_with_indexer_auto_one_process_takes_the_lease_and_the_other_follows(tmp_path, chroma_server, chroma_prefix):
    corpus(tmp_path / "a", 5, random.Random(1))
    first = make_kb(tmp_path / "a", chroma_spec(chroma_server, chroma_prefix, indexer="auto"))
    second = make_kb(tmp_path / "b", chroma_spec(chroma_server, chroma_prefix, indexer="auto"))
    assert first.chroma.poll(first.sync) is True     # became the indexer
    assert second.chroma.poll(second.sync) is False  # a replica
    assert (first.store_status()["role"], second.store_status()["role"]) == ("indexer", "replica")
    first.index()
    assert second.chroma.poll(second.sync) is False and second.current()[0] is not None
    assert len(second.current()[0]) == len(first.current()[0])
    # The replica opened the collection before it had vectors: it learns their dimension when they come.
    assert hits(second, "doc", "dense") == hits(first, "doc", "dense") != []
    first.chroma.release()
    assert second.chroma.poll(second.sync) is True   # a released lease passes on at the next poll


def test_chroma_down_fails_searches_that_need_it_and_loses_nothing(tmp_path, chroma_server, chroma_prefix):
    docs = corpus(tmp_path, 12, random.Random(4))
    make_kb(tmp_path, chroma_spec(chroma_server, chroma_prefix)).index()
    port = closed_port()
    down = make_kb(tmp_path, StoreSpec(type="chroma_http", base_url=f"http://127.0.0.1:{port}",
                                       collection_prefix=chroma_prefix, indexer="always", timeout=2))
    generation = down.current()[0].name
    assert down.search("doc", 3, mode="lexical")   # the mirror answers alone
    with pytest.raises(VectorStoreError) as info:
        down.search("river stone", 3, mode="hybrid")
    assert info.value.unreachable and str(port) not in str(info.value)
    status = down.store_status()
    assert status["reachable"] is False and str(port) not in status["error"]
    assert down.stats()["store"]["reachable"] is False
    write(os.path.join(docs, "late.md"), "# Late\n\nlate arrival of the night train\n")
    with pytest.raises(VectorStoreError):
        down.index()
    assert down.current()[0].name == generation and down.status["last_error"]
    test = down.test_store()
    assert not test["ok"] and str(port) not in test["message"]
    # Back up: the next run picks the new file up and nothing was lost.
    kb = make_kb(tmp_path, chroma_spec(chroma_server, chroma_prefix))
    assert kb.index().added == 1
    assert_converged(kb, chroma_server, chroma_prefix, docs)
    assert kb.search("night train", 1, mode="hybrid")[0].chunk["source"] == "kb/late.md"


@pytest.mark.parametrize("field", ["tenant", "database"])
def test_a_wrong_tenant_or_database_is_a_clear_error(tmp_path, chroma_server, chroma_prefix, field):
    corpus(tmp_path, 3, random.Random(2))
    kb = make_kb(tmp_path, chroma_spec(chroma_server, chroma_prefix, **{field: "nope"}))
    with pytest.raises(VectorStoreError, match=f"'nope'.*vectorstore.chroma_http.{field}"):
        kb.index()
    test = kb.test_store()
    assert not test["ok"] and f"vectorstore.chroma_http.{field}" in test["message"]
    assert kb.store_status()["reachable"] is True   # it answered; what it said was no


def test_another_embedding_dimension_is_refused_and_the_kb_keeps_answering(tmp_path, chroma_server, chroma_prefix):
    docs = corpus(tmp_path, 8, random.Random(6))
    kb = make_kb(tmp_path, chroma_spec(chroma_server, chroma_prefix))
    kb.index()
    before = chroma_state(chroma_server, chroma_prefix)
    other = make_kb(tmp_path, chroma_spec(chroma_server, chroma_prefix), embedder=Embedder(dims=32))
    with pytest.raises(VectorStoreError, match="64-dimensional.*32-dimensional.*re-index"):
        other.index(full=True)
    assert chroma_state(chroma_server, chroma_prefix) == before   # nothing half-written
    assert other.search("doc", 3, mode="lexical")
    assert kb.search("river stone", 3, mode="hybrid")
    assert_converged(kb, chroma_server, chroma_prefix, docs)


def test_a_collection_another_tool_wrote_is_refused_and_the_mirror_keeps_answering(tmp_path, chroma_server,
                                                                                   chroma_prefix):
    corpus(tmp_path, 6, random.Random(9))
    make_kb(tmp_path, chroma_spec(chroma_server, chroma_prefix)).index()
    client = ChromaClient(chroma_server.url)
    foreign = client.create_collection("x" + chroma_prefix + "kb", metadata={"made_by": "another tool"})
    client.upsert(foreign["id"], ["t1"], [[0.5] * 64], documents=["theirs"])
    moved = make_kb(tmp_path, chroma_spec(chroma_server, "x" + chroma_prefix))
    with pytest.raises(VectorStoreError, match="not written by ragproxy.*collection_prefix"):
        moved.index()
    assert client.count(foreign["id"]) == 1 and client.get_collection("x" + chroma_prefix + "kb.files") is None
    assert moved.search("doc", 3, mode="lexical")   # the previous mirror
    assert "made_by" in client.get_collection("x" + chroma_prefix + "kb")["metadata"]
    client.close()


def test_a_kb_moved_from_the_builtin_store_to_chroma_is_indexed_whole(tmp_path, chroma_server, chroma_prefix):
    docs = corpus(tmp_path, 10, random.Random(12))
    make_kb(tmp_path).index()
    kb = make_kb(tmp_path, chroma_spec(chroma_server, chroma_prefix))
    report = kb.index()
    assert report.added + report.changed == 10
    assert_converged(kb, chroma_server, chroma_prefix, docs)
    back = make_kb(tmp_path)   # and back: the mirror has no vectors, so every file is indexed again
    assert back.index().added == 10
    assert back.search("river", 1, mode="dense")


def test_a_lexical_kb_on_chroma_needs_no_embedder(tmp_path, chroma_server, chroma_prefix):
    docs = corpus(tmp_path, 5, random.Random(13))
    spec = ragproxy.KBSpec(name="kb", retrieval="lexical", store=chroma_spec(chroma_server, chroma_prefix))
    kb = ragproxy.KnowledgeBase(spec, str(tmp_path))
    kb.index()
    assert len(kb.search("doc", 5)) == 5
    assert_converged(kb, chroma_server, chroma_prefix, docs)
    replica = ragproxy.KnowledgeBase(ragproxy.KBSpec(name="kb", retrieval="lexical", store=chroma_spec(
        chroma_server, chroma_prefix, indexer="never")), str(tmp_path / "replica"))
    assert replica.sync() and hits(replica, "doc 3", "lexical") == hits(kb, "doc 3", "lexical")


def wait_for_dirty(server, prefix, proc, limit=60):
    """Until the commit record says a run is writing (or the run ended)."""
    client = ChromaClient(server.url)
    deadline = time.monotonic() + limit
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            files = client.get_collection(prefix + "kb.files")
            got = client.get(files["id"], ids=["ragproxy:commit"], include=("metadatas",)) if files else None
            if got and got["ids"] and got["metadatas"][0].get("dirty"):
                return
            time.sleep(0.005)
    finally:
        client.close()


_INDEXER = """
import sys
sys.path[:0] = [{root!r}, {here!r}]
import ragproxy
from _ragproxy.vectorstore import StoreSpec
from test_kb_chroma import Embedder
spec = ragproxy.KBSpec(name="kb", retrieval="hybrid", store=StoreSpec(
    type="chroma_http", base_url={url!r}, collection_prefix={prefix!r}, indexer="always"))
kb = ragproxy.KnowledgeBase(spec, {data!r}, embedder=Embedder())
def progress(n, total, source):
    sys.stderr.write("%d/%d\\n" % (n, total))
    sys.stderr.flush()
kb.index(progress=progress)
sys.stderr.write("done\\n")
"""


def test_sigkill_at_random_points_always_leaves_whole_files_and_the_next_run_converges(tmp_path, chroma_server,
                                                                                        chroma_prefix):
    rng = random.Random(16)
    n = 120
    docs = corpus(tmp_path, n, rng, words=300)
    script = tmp_path / "indexer.py"
    script.write_text(_INDEXER.format(root=ROOT, here=HERE, url=chroma_server.url, prefix=chroma_prefix,
                                      data=str(tmp_path)))
    landed = mid_write = 0
    # At least 20 rounds; more, up to 40, while fewer than 12 kills have landed inside a run: on a fast
    # machine a run can finish within the random delay, and the rounds it does so in test nothing.
    for round_ in range(40):
        if round_ >= 20 and landed >= 12:
            break
        rounds = round_ + 1
        if round_:   # every run has work: some files changed, one gone, one new
            for i in rng.sample(range(n), 25):
                write(os.path.join(docs, f"d{i:03d}.md"), f"# Doc {i} v{round_}\n\nmark{round_}x{i} " +
                      " ".join(rng.choice(WORDS) for _ in range(300)) + "\n")
            gone = rng.choice(sorted(os.listdir(docs)))
            os.unlink(os.path.join(docs, gone))
            write(os.path.join(docs, f"new{round_}.md"), f"# New {round_}\n\nfresh{round_} " +
                  " ".join(rng.choice(WORDS) for _ in range(200)) + "\n")
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                universal_newlines=True)
        # A handshake, then a random delay: on even rounds on the run's progress lines (the kill lands
        # while files are read and embedded), on odd ones on the dirty flag in Chroma's commit record
        # (the run has begun writing: the kill lands among its writes or its commit).
        at = rng.randrange(1, n + 1)
        try:
            if round_ % 2 == 0:
                for line in proc.stderr:
                    if line.strip() == "done" or (line.split("/")[0].isdigit() and int(line.split("/")[0]) >= at):
                        break
            else:
                wait_for_dirty(chroma_server, chroma_prefix, proc)
            time.sleep(rng.uniform(0.0, 0.3))
            proc.send_signal(signal.SIGKILL)
            landed += proc.wait(60) == -signal.SIGKILL
        finally:
            proc.kill()
            proc.stderr.close()
        records, stored = chroma_state(chroma_server, chroma_prefix)
        assert_whole_files(records, stored)   # after the kill, before any clean-up
        kb = make_kb(tmp_path, chroma_spec(chroma_server, chroma_prefix))   # a fresh process's view
        mid_write += bool((kb.chroma.store.read_commit() or {}).get("dirty"))
        kb.index()
        assert_converged(kb, chroma_server, chroma_prefix, docs)
        assert not kb.chroma.store.read_commit()["dirty"]
        if round_:
            assert kb.search(f"fresh{round_}", 1, mode="lexical")[0].chunk["source"] == f"kb/new{round_}.md"
            assert len(kb.search(f"fresh{round_}", 5, mode="hybrid")) == 5
    print(f"{landed} of {rounds} kills landed in a run, {mid_write} while it was writing to Chroma")
    assert landed >= 12     # the kills did land inside the runs,
    assert mid_write >= 3   # and some between a run's first write to Chroma and its commit


def _config(server, prefix, indexer, interval=3600):
    return ragproxy.Config.from_text(f"""
providers:
  llm: {{o: {{type: ollama, base_url: "http://127.0.0.1:1"}}}}
models: [{{name: "*", upstream: o}}]
rag: {{index_interval: {interval}}}
vectorstore:
  type: simple
  chroma_http: {{base_url: "{server.url}", collection_prefix: "{prefix}", indexer: {indexer}, sync_interval: 0.2}}
knowledge_bases:
  small: {{retrieval: lexical}}
  big: {{retrieval: lexical, vectorstore: chroma_http}}
""", environ={})


def test_one_proxy_keeps_small_kbs_built_in_and_a_big_one_on_chroma_and_replicas_follow(tmp_path, chroma_server,
                                                                                         chroma_prefix):
    for name in ("small", "big"):
        write(str(tmp_path / "indexer" / "documents" / name / "a.md"), f"# {name}\n\n{name} lanterns glow\n")
    indexer = ragproxy.KnowledgeBases(_config(chroma_server, chroma_prefix, "always"), str(tmp_path / "indexer"))
    big = indexer.get("big")
    assert indexer.get("small").spec.store == StoreSpec()
    assert (big.spec.store.type, big.spec.store.base_url, big.spec.store.collection_prefix) == (
        "chroma_http", chroma_server.url, chroma_prefix)
    assert sorted(r.kb for r in indexer.index_all() if r.committed) == ["big", "small"]
    assert indexer.get("small").store_status()["type"] == "simple"
    replicas = ragproxy.KnowledgeBases(_config(chroma_server, chroma_prefix, "never"), str(tmp_path / "replica"))
    assert [r.kb for r in replicas.index_all()] == ["small"]   # a replica never indexes its Chroma KB
    replicas.start()
    try:
        deadline = time.monotonic() + 30
        while replicas.get("big").current()[0] is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert replicas.get("big").search("lanterns", 1)[0].chunk["source"] == "big/a.md"
        write(str(tmp_path / "indexer" / "documents" / "big" / "b.md"), "# more\n\nmoths circle the lanterns\n")
        indexer.index_all()
        while len(replicas.get("big").current()[0]) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert {h.chunk["source"] for h in replicas.get("big").search("lanterns", 3)} == {"big/a.md", "big/b.md"}
        assert replicas.get("big").store_status()["role"] == "replica"
    finally:
        replicas.stop(wait=10)


def _proxy_config(fake, base_url, prefix, policy):
    from conftest import proxy_config
    text = proxy_config(fake.url, extra=f"""
vectorstore:
  type: chroma_http
  chroma_http: {{base_url: "{base_url}", collection_prefix: "{prefix}", indexer: always, timeout: 2}}
knowledge_bases:
  vec: {{retrieval: hybrid, embedding: emb}}
rag:
  on_failure: {policy}
""")
    text = text.replace('  - {name: "*", upstream: [ol, oa]}', '  - {name: "*", upstream: [ol, oa], kb: [vec]}')
    return text.replace("providers:\n", f'providers:\n  embedding:\n    emb: {{type: openai, base_url: '
                                        f'"{fake.url}/v1", model: fake-embed, read_timeout: 2}}\n', 1)


@pytest.mark.parametrize("policy", ["degrade", "fail_closed"])
def test_the_routes_failure_policy_applies_when_chroma_is_down(make_proxy, fake, tmp_path, chroma_server,
                                                                chroma_prefix, policy):
    import openai
    from conftest import API_KEY

    secret = "ELEPHANT-7731"
    write(str(tmp_path / "documents" / "vec" / "guide.md"), f"# Elephants\n\nThe purple elephant sings {secret}.\n")
    fake.secrets = [secret]
    question = [{"role": "user", "content": "what does the purple elephant sing"}]
    up = make_proxy(_proxy_config(fake, chroma_server.url, chroma_prefix, policy), data_dir=tmp_path)
    up.app.knowledge_bases.index_all()
    client = openai.OpenAI(base_url=up.url + "/v1", api_key=API_KEY, max_retries=0)
    assert client.chat.completions.create(model="llama3", messages=question).choices[0].message.content \
        == "FOUND: " + secret
    port = closed_port()
    down = make_proxy(_proxy_config(fake, f"http://127.0.0.1:{port}", chroma_prefix, policy), data_dir=tmp_path)
    client = openai.OpenAI(base_url=down.url + "/v1", api_key=API_KEY, max_retries=0)
    if policy == "fail_closed":
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(model="llama3", messages=question)
        assert info.value.status_code == 502 and info.value.body["code"] == "rag_retrieval_failed"
        assert str(port) not in json.dumps(info.value.body)
    else:
        reply = client.chat.completions.create(model="llama3", messages=question)
        assert reply.choices[0].message.content.startswith("ECHO")   # forwarded without context
    status = down.app.knowledge_bases.get("vec").store_status()
    assert status["reachable"] is False and str(port) not in status["error"]


def test_collections_deleted_to_change_the_embedding_model_are_rebuilt_whole(tmp_path, chroma_server, chroma_prefix):
    docs = corpus(tmp_path, 6, random.Random(21))
    kb = make_kb(tmp_path, chroma_spec(chroma_server, chroma_prefix))
    kb.index()
    replica = make_kb(tmp_path / "replica", chroma_spec(chroma_server, chroma_prefix, indexer="never"))
    assert replica.sync()
    client = ChromaClient(chroma_server.url)
    for name in ("kb", "kb.files"):   # what the dimension error tells an operator to do
        client.delete_collection(chroma_prefix + name)
    client.close()
    smaller = make_kb(tmp_path, chroma_spec(chroma_server, chroma_prefix), embedder=Embedder(dims=32))
    assert smaller.index().added == 6   # the mirror named the old collection: everything is written anew
    assert_converged(smaller, chroma_server, chroma_prefix, docs)
    assert kb.index().unchanged == 6   # it held the old collections' ids: they are looked up again
    assert replica.sync()
    replica.embedder = Embedder(dims=32)
    assert len(replica.search("doc", 3, mode="dense")) == 3


def test_a_clean_stop_hands_the_lease_on_at_once(tmp_path, chroma_server, chroma_prefix):
    for d in ("one", "two"):
        write(str(tmp_path / d / "documents" / "big" / "a.md"), "# big\n\nlanterns\n")
    one = ragproxy.KnowledgeBases(_config(chroma_server, chroma_prefix, "auto"), str(tmp_path / "one"))
    one.start()
    try:
        deadline = time.monotonic() + 30
        while one.get("big").store_status()["role"] != "indexer" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert one.get("big").store_status()["role"] == "indexer"
    finally:
        one.stop(wait=10)
    two = ragproxy.KnowledgeBases(_config(chroma_server, chroma_prefix, "auto"), str(tmp_path / "two"))
    big = two.get("big")
    assert big.chroma.store.lease_ttl == 30.0      # no waiting for that: the lease was released
    assert big.chroma.poll(big.sync) is True and big.store_status()["role"] == "indexer"
