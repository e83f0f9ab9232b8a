"""Several ragproxy processes sharing one Chroma server (the team set-up), as real processes.

Each process is started as a user starts it (``python ragproxy.py --data-dir D``
with D/config/config.yaml), all on one Chroma server (the conftest fixture) and
one collection prefix, in front of the fake upstream.  What the proxy injected
is seen at the upstream: the fake answers "FOUND: <secrets>" naming the secrets
planted in source files that reached it in the request, so an answer proves that
this process retrieved that file's chunk.  Waits poll a condition with a
deadline; no sleep stands in for an assertion.
"""
import json
import time

from conftest import API_KEY, ServeProcess, wait_for

PANEL_KEY = "replicas-panel-key-0001"
KB = "team"
# A short interval, so a replica sees a commit soon.  A short lease (vectorstore.chroma_http.lease_ttl), so a
# survivor takes over soon after the holder dies without releasing it; long enough that a holder on a loaded
# machine still renews it (every ttl/3) before it runs out.
SYNC_INTERVAL = 0.2
LEASE_TTL = 10.0

ZEBRA = ("zebra.md", "# Zebra gateway\n\nThe zebra gateway listens for telemetry on port ZEBRA-4711.\n",
         "Which port does the zebra gateway listen on?", "ZEBRA-4711")
KUMQUAT = ("kumquat.md", "# Kumquat ledger\n\nThe kumquat ledger closes every night at KUMQUAT-0042.\n",
           "When does the kumquat ledger close?", "KUMQUAT-0042")
QUINCE = ("quince.md", "# Quince rota\n\nThe quince rota is kept by QUINCE-7731 on the third floor.\n",
          "Who keeps the quince rota?", "QUINCE-7731")


def config_text(fake_url, chroma_url, prefix, sources, indexer):
    return f"""
server:
  host: 127.0.0.1
  client_timeout: 10
api_key_auth: true
api_keys: [{API_KEY}]
providers:
  llm:
    oa: {{type: openai, base_url: "{fake_url}/v1", api_key: upstream-key, read_timeout: 10}}
  embedding:
    emb: {{type: openai, base_url: "{fake_url}/v1", model: fake-embedding}}
models:
  - {{name: "*", upstream: oa, kb: [{KB}]}}
knowledge_bases:
  {KB}:
    sources: [{json.dumps(str(sources))}]
    retrieval: hybrid
    embedding: emb
rag:
  top_k: 2
  index_interval: {SYNC_INTERVAL}
vectorstore:
  type: chroma_http
  chroma_http:
    base_url: "{chroma_url}"
    collection_prefix: "{prefix}"
    indexer: {indexer}
    sync_interval: {SYNC_INTERVAL}
    lease_ttl: {LEASE_TTL}
"""


class Proxy(ServeProcess):
    """One replica: a ServeProcess on the team's Chroma set-up."""

    def __init__(self, name, data_dir, config):
        super().__init__(name, data_dir, config, secret_key=PANEL_KEY)
        self._token = None

    def _request(self, path, body=None, token=None):
        return self.request(path, body, token)

    def ask(self, question):
        """The upstream's answer to one chat request through this proxy ("" on an error status)."""
        status, _, body = self._request("/v1/chat/completions", {
            "model": "fake-model", "messages": [{"role": "user", "content": question}]})
        return body["choices"][0]["message"]["content"] if status == 200 else ""

    def answers(self, item):
        """True when this proxy's answer to item's question shows that item's file was injected."""
        return item[3] in self.ask(item[2]).split()

    def store(self):
        """The KB's vector-store status from the admin API (role, reachable, vectors ...)."""
        if self._token is None:
            status, _, body = self._request("/admin/api/login", {"key": PANEL_KEY})
            assert status == 200, body
            self._token = body["token"]
        status, _, body = self._request(f"/admin/api/kbs/{KB}", token=self._token)
        assert status == 200, body
        return body["store"]

    def role(self):
        return self.store().get("role")


def injected_secrets(recorded):
    """The fake upstream's answer: which planted secrets reached it in this request."""
    body = recorded.body.decode("utf-8", "replace")
    return "FOUND: " + " ".join(item[3] for item in (ZEBRA, KUMQUAT, QUINCE) if item[3] in body)


def write(sources, item):
    (sources / item[0]).write_text(item[1])


def start_pair(tmp_path, fake, chroma_server, prefix, indexers):
    sources = tmp_path / "sources"   # one folder both see, as a shared checkout would be
    sources.mkdir()
    write(sources, ZEBRA)
    fake.reply_fn = injected_secrets
    procs = []
    try:
        for name, indexer in zip("AB", indexers):
            procs.append(Proxy(name, tmp_path / name, config_text(fake.url, chroma_server.url, prefix, sources,
                                                                  indexer)))
    except BaseException:
        for p in procs:
            p.kill()
        raise
    return sources, procs


def test_pinned_indexer_commits_replica_serves_it_and_outlives_the_indexer(tmp_path, fake, chroma_server,
                                                                           chroma_prefix):
    sources, (a, b) = start_pair(tmp_path, fake, chroma_server, chroma_prefix, ("always", "never"))
    try:
        # B never indexes: what it answers with came from A's commit in Chroma.
        wait_for(lambda: b.answers(ZEBRA), "the replica to answer from the indexer's first commit", [a, b])
        assert a.answers(ZEBRA)
        assert (a.role(), b.role()) == ("indexer", "replica")
        assert b.store()["reachable"] is True
        assert not b.answers(KUMQUAT)

        write(sources, KUMQUAT)
        wait_for(lambda: b.answers(KUMQUAT), "the replica to answer with a file added to the indexer's source",
                 [a, b])

        a.kill()
        # The replica keeps serving, with both files, at once.
        assert b.answers(ZEBRA) and b.answers(KUMQUAT)
        assert b.role() == "replica"
        assert "Traceback" not in b.log()
    finally:
        a.stop()
        assert b.stop() == 0


def test_auto_lease_moves_to_a_survivor_when_the_indexer_dies(tmp_path, fake, chroma_server, chroma_prefix):
    sources, procs = start_pair(tmp_path, fake, chroma_server, chroma_prefix, ("auto", "auto"))
    try:
        roles = wait_for(lambda: sorted(p.role() or "" for p in procs) == ["indexer", "replica"] and
                         {p.name: p.role() for p in procs}, "one indexer and one replica", procs)
        indexer = next(p for p in procs if roles[p.name] == "indexer")
        survivor = next(p for p in procs if p is not indexer)
        wait_for(lambda: all(p.answers(ZEBRA) for p in procs), "both to answer from the shared KB", procs)
        # The lease is held while the indexer lives: the other stays a replica across many polls.
        deadline = time.monotonic() + 20 * SYNC_INTERVAL
        while time.monotonic() < deadline:
            assert survivor.role() == "replica"
            time.sleep(0.1)

        indexer.kill()
        assert survivor.answers(ZEBRA)   # serving goes on while the lease runs out
        wait_for(lambda: survivor.role() == "indexer", "the survivor to take the lease over", procs,
                 timeout=LEASE_TTL + 30)
        # And it indexes: a new file reaches its answers.
        write(sources, QUINCE)
        wait_for(lambda: survivor.answers(QUINCE), "the new indexer to index a new file", procs)
        assert survivor.answers(ZEBRA)
    finally:
        for p in procs:
            p.stop()


def test_a_clean_shutdown_hands_the_lease_over_without_waiting_for_it_to_expire(tmp_path, fake, chroma_server,
                                                                               chroma_prefix):
    _, procs = start_pair(tmp_path, fake, chroma_server, chroma_prefix, ("auto", "auto"))
    try:
        roles = wait_for(lambda: sorted(p.role() or "" for p in procs) == ["indexer", "replica"] and
                         {p.name: p.role() for p in procs}, "one indexer and one replica", procs)
        indexer = next(p for p in procs if roles[p.name] == "indexer")
        survivor = next(p for p in procs if p is not indexer)
        assert indexer.stop() == 0   # SIGTERM: it releases the lease on the way out
        # Well inside the lease's lifetime: only a released lease can be taken this soon.
        wait_for(lambda: survivor.role() == "indexer", "the survivor to take the released lease", procs,
                 timeout=LEASE_TTL / 2)
        assert survivor.answers(ZEBRA)
    finally:
        for p in procs:
            p.stop()
