"""serve --workers N as a user runs it: one port, N processes on one data directory, and what they share.

Each test starts ``python ragproxy.py --data-dir D --port 0 --workers 2`` in front of the fake upstream.  A
new connection is steered to one worker by stopping the other (SIGSTOP): a stopped process accepts nothing,
so the running one takes every connection from the shared socket until SIGCONT.  Before a worker is
stopped the test waits for it to be idle (its answers read, its request-log rows written), so it is not
stopped holding a lock its sibling needs.  Waits poll a condition with a deadline.

The Supervisor's own tests (back-off, stop timeout, the status file) run it in a child process: forking
the test runner, whose threads may hold locks, would not be a fair test of a single-threaded supervisor.
"""
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT, ServeProcess, proxy_config, wait_for

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="workers are forked processes")

PANEL_KEY = "workers-panel-key-00001"
ZEBRA = "The zebra gateway listens for telemetry on port ZEBRA-4711."
KUMQUAT = "The kumquat ledger closes every night at KUMQUAT-0042."


def config(fake_url, sources):
    return proxy_config(fake_url, extra=f"""
knowledge_bases:
  notes:
    sources: [{json.dumps(str(sources))}]
admin:
  max_login_failures: 2
""", server="  client_timeout: 10").replace('  - {name: "*", upstream: [ol, oa]}',
                                           '  - {name: "*", upstream: oa, kb: notes}')


class Workers(ServeProcess):
    """A ``serve --workers 2``, its workers' pids from run/workers.json, and steering between them."""

    def __init__(self, tmp_path, fake, count=2):
        sources = tmp_path / "sources"
        sources.mkdir()
        (sources / "zebra.md").write_text(f"# Zebra gateway\n\n{ZEBRA}\n")
        self.sources = sources
        super().__init__("serve", tmp_path / "data", config(fake.url, sources), ("--workers", str(count)),
                         secret_key=PANEL_KEY)
        self.count = count
        self.asked = 0
        wait_for(lambda: self.running_pids(), "every worker to be running", [self], timeout=30)
        # Not stopped in its first indexing run either (steering stops a worker wherever it is).
        wait_for(lambda: "[worker 0] indexed notes" in self.log(), "the first index", [self], timeout=30)

    def status(self):
        try:
            with open(str(self.data_dir / "run" / "workers.json"), encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def running_pids(self):
        """Every slot's pid once each serves, else None."""
        status = self.status()
        if not status or len(status["workers"]) != self.count:
            return None
        pids = [w["pid"] for w in status["workers"]]
        running = all(w["state"] == "running" for w in status["workers"])
        return pids if running and all(_alive(pid) for pid in pids) else None

    @contextlib.contextmanager
    def only(self, slot):
        """New connections go to worker ``slot`` alone while the block runs.

        The others are stopped only once every request sent so far is in the shared request log, so that
        none is stopped inside its SQLite write (the running worker's would wait on it).
        """
        self.settle()
        others = [pid for n, pid in enumerate(self.running_pids()) if n != slot]
        for pid in others:
            os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            for pid in others:
                os.kill(pid, signal.SIGCONT)

    def settle(self):
        """Wait until every request sent so far is in the request log: the workers are idle."""
        wait_for(lambda: self.logged() >= self.asked, "the request log to catch up", [self])

    def token(self):
        status, _, body = self.request("/admin/api/login", {"key": PANEL_KEY})
        assert status == 200, body
        return body["token"]

    def logged(self):
        """Proxied requests in the shared request log."""
        if not self.asked:
            return 0
        status, _, body = self.request("/admin/api/logs?limit=200", token=self.token())
        assert status == 200, body
        return len(body["entries"])

    def ask(self, question):
        self.asked += 1
        status, _, body = self.request("/v1/chat/completions", {
            "model": "fake-model", "messages": [{"role": "user", "content": question}]})
        assert status == 200, body
        return body

    def requests_total(self, slot):
        """ragproxy_requests_total summed over its label sets, as /metrics on worker ``slot`` says."""
        with self.only(slot):
            status, _, text = self.request("/metrics")
        assert status == 200, text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("ragproxy_requests_total{"))


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:   # a zombie is not a running worker
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _parent(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


@pytest.fixture
def serve(tmp_path, fake):
    proc = Workers(tmp_path, fake)
    try:
        yield proc
    finally:
        for pid in (proc.running_pids() or []):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        proc.stop()


def test_workers_share_the_port_a_killed_one_is_restarted_and_sigterm_stops_them_all(serve):
    first = serve.running_pids()
    assert len(set(first)) == 2 and all(_parent(pid) == serve.p.pid for pid in first)
    placed = []
    for slot in (0, 1):
        with serve.only(slot):
            assert serve.ask("hello")["choices"][0]["message"]["content"]
            overview = serve.request("/admin/api/overview", token=serve.token())[2]
            assert overview["workers"]["this"] == {"slot": slot, "pid": first[slot]}
            placed.append(overview["cpu_placement"])
    if len(os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else ()) >= 2:
        # Each worker's connections start on a CPU of their own (and stay there unless a busy
        # machine moved one).
        assert None not in [p["cpu"] for p in placed]
        if not any(p["moves"] for p in placed):
            assert placed[0]["cpu"] != placed[1]["cpu"]

    serve.settle()   # a row still in worker 1's queue would die with it
    os.kill(first[1], signal.SIGKILL)
    restarted = wait_for(lambda: (serve.running_pids() or [None, first[1]])[1] != first[1] and serve.status(),
                         "slot 1 to run again", [serve])
    slot1 = restarted["workers"][1]
    assert slot1["restarts"] == 1 and slot1["last_exit"] == "was killed by SIGKILL" and slot1["state"] == "running"
    assert restarted["workers"][0]["pid"] == first[0] and restarted["workers"][0]["restarts"] == 0
    assert f"worker 1 (pid {first[1]}) was killed by SIGKILL" in serve.log()
    with serve.only(1):   # the new worker serves, and the admin API tells of the restart
        assert serve.ask("hello again")["choices"]
        shown = serve.request("/admin/api/overview", token=serve.token())[2]["workers"]
        assert shown["count"] == 2 and shown["this"]["slot"] == 1
        assert [w["restarts"] for w in shown["workers"]] == [0, 1]

    pids = serve.running_pids()
    assert serve.stop() == 0
    assert not any(_alive(pid) for pid in pids)
    assert serve.status()["stopped"] is True
    assert "ragproxy stopped" in serve.log() and "Traceback" not in serve.log()


def test_a_second_serve_on_the_same_data_directory_is_refused_and_touches_nothing(serve):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGPROXY_")}
    for args in (["--workers", "2"], []):
        second = subprocess.run([sys.executable, os.path.join(ROOT, "ragproxy.py"), "--data-dir",
                                 str(serve.data_dir), "--port", "0", *args], stdin=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, universal_newlines=True, env=env, timeout=30)
        assert second.returncode == 2
        assert "another 'ragproxy serve' is running on the data directory" in second.stderr
    assert not (serve.data_dir / "config" / "secret_key.yaml").exists()  # the first one's key is from the env
    assert serve.running_pids()   # the first one serves on
    assert serve.ask("still there")["choices"]


def test_an_mcp_session_opened_on_one_worker_is_served_by_the_other(serve):
    headers = {"Accept": "application/json, text/event-stream"}
    with serve.only(0):
        status, got, body = serve.request("/mcp", {
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "test", "version": "1"}}}, headers=headers)
        assert status == 200, body
        session = got["Mcp-Session-Id"]
    with serve.only(1):
        status, _, body = serve.request("/mcp", {"jsonrpc": "2.0", "method": "notifications/initialized"},
                                        headers={**headers, "Mcp-Session-Id": session})
        assert status == 202, body
        status, _, body = serve.request("/mcp", {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                                        headers={**headers, "Mcp-Session-Id": session,
                                                 "MCP-Protocol-Version": "2025-06-18"})
        assert status == 200, body
        assert "search" in [tool["name"] for tool in body["result"]["tools"]]
        forged = session[:-1] + ("A" if session[-1] != "A" else "B")
        status, _, body = serve.request("/mcp", {"jsonrpc": "2.0", "id": 3, "method": "tools/list"},
                                        headers={**headers, "Mcp-Session-Id": forged})
        assert status == 404, body


def test_metrics_from_either_worker_count_both_workers_requests(serve):
    with serve.only(0):
        for n in range(3):
            serve.ask(f"question {n}")
    # Each worker writes its counts for the others at most a second after they change.
    wait_for(lambda: serve.requests_total(1) == 3, "worker 1 to count worker 0's requests", [serve])
    with serve.only(1):
        for n in range(2):
            serve.ask(f"more {n}")
    assert serve.requests_total(1) == 5
    wait_for(lambda: serve.requests_total(0) == 5, "worker 0 to count worker 1's requests", [serve])
    assert serve.requests_total(1) == 5


def test_failed_logins_on_one_worker_throttle_the_other(serve):
    with serve.only(0):
        for _ in range(3):
            status, _, _ = serve.request("/admin/api/login", {"key": "wrong-key-000000"})
            assert status in (401, 429)
    with serve.only(1):
        status, got, body = serve.request("/admin/api/login", {"key": PANEL_KEY})
        assert status == 429, body
        assert int(got["Retry-After"]) >= 1


def test_one_worker_indexes_and_the_others_requests_reach_it(serve, fake):
    token = serve.token()

    def found(text):
        status, _, body = serve.request("/admin/api/kbs/notes/search", {"query": text}, token=token)
        return status == 200 and any(text in hit["text"] for hit in body["hits"])

    wait_for(lambda: found("ZEBRA-4711"), "the first index", [serve])
    (serve.sources / "kumquat.md").write_text(f"# Kumquat ledger\n\n{KUMQUAT}\n")
    with serve.only(1):
        status, _, body = serve.request("/admin/api/kbs/notes/reindex", {}, token=token)
        assert status == 202, body
    wait_for(lambda: found("KUMQUAT-0042"), "worker 0 to index the request worker 1 took", [serve])
    indexed = [line for line in serve.log().splitlines() if " indexed notes" in line or "] indexed" in line]
    assert indexed and all("[worker 0]" in line for line in indexed), indexed


SUPERVISED = textwrap.dedent("""
    import os, signal, sys, time
    sys.path.insert(0, {root!r})
    from _ragproxy.workers import Supervisor
    mode = sys.argv[1]

    def run_worker(slot, ready):
        with open(os.path.join({out!r}, "started-%d-%d" % (slot, os.getpid())), "w"):
            pass
        if mode == "crash":
            return 3
        if mode == "slow" and slot == 1:
            time.sleep(3600)   # never ready
        ready()
        if mode == "stubborn":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(0.05)

    failures = [OSError(11, "Resource temporarily unavailable")] * (2 if mode == "forkfail" else 0)

    def fork():
        if failures:
            raise failures.pop()
        return os.fork()

    sys.exit(Supervisor(run_worker, 2, os.path.join({out!r}, "workers.json"), stop_timeout=1.0,
                        max_backoff=0.4, fork=fork).run())
""")


def _supervised(tmp_path, mode):
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "supervised.py"
    script.write_text(SUPERVISED.format(root=ROOT, out=str(out)))
    log = open(str(tmp_path / "stderr.log"), "wb")
    proc = subprocess.Popen([sys.executable, str(script), mode], stderr=log, stdout=subprocess.DEVNULL,
                            start_new_session=True)
    log.close()
    return proc, out


@pytest.fixture
def supervised(tmp_path):
    """_supervised(mode); whatever it started is gone after the test, passed or not."""
    started = []

    def start(mode):
        proc, out = _supervised(tmp_path, mode)
        started.append(proc)
        return proc, out

    yield start
    for proc in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def _status_of(out):
    try:
        return json.loads((out / "workers.json").read_text())
    except (OSError, ValueError):
        return None


def _both_running(out):
    """The two workers' pids once both have said they serve."""
    status = _status_of(out)
    workers = status["workers"] if status else []
    return [w["pid"] for w in workers] if len(workers) == 2 and all(w["state"] == "running" for w in workers) \
        else None


def test_a_worker_that_keeps_failing_is_restarted_with_a_growing_wait_and_visibly(tmp_path, supervised):
    proc, out = supervised("crash")
    try:
        status = wait_for(lambda: (_status_of(out) or {"workers": [{"restarts": 0}]})["workers"][0]["restarts"] >= 3
                          and _status_of(out), "three restarts")
        assert status["workers"][0]["last_exit"] == "exited with status 3"
        log = (tmp_path / "stderr.log").read_text()
        assert "worker 0 (pid" in log and "exited with status 3" in log and "starting it again in" in log
        # The back-off is capped (0.4 s here), so the restarts go on rather than give up.
        assert len([name for name in os.listdir(str(out)) if name.startswith("started-0-")]) >= 3
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    assert _status_of(out)["stopped"] is True


def test_a_worker_that_ignores_sigterm_is_killed_after_the_stop_timeout(tmp_path, supervised):
    proc, out = supervised("stubborn")
    pids = wait_for(lambda: _both_running(out), "both to run")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0
    assert not any(_alive(pid) for pid in pids)
    log = (tmp_path / "stderr.log").read_text()
    assert "did not stop within 1 s; killing it" in log
    assert [w["last_exit"] for w in _status_of(out)["workers"]] == ["was killed by SIGKILL"] * 2


def test_sighup_reaches_every_worker(tmp_path, supervised):
    proc, out = supervised("run")
    try:
        pids = wait_for(lambda: _both_running(out), "both to run")
        proc.send_signal(signal.SIGHUP)
        # The workers keep SIGHUP's default action here (run_worker sets no handler), so passing it on ends them:
        # each is seen to exit by SIGHUP and is started again.
        status = wait_for(lambda: all(w["restarts"] == 1 and w["pid"] for w in _status_of(out)["workers"])
                          and _status_of(out), "both to be restarted after SIGHUP")
        assert [w["last_exit"] for w in status["workers"]] == ["was killed by SIGHUP"] * 2
        assert all(w["pid"] not in pids for w in status["workers"])
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0


def test_a_worker_that_cannot_be_forked_is_tried_again(tmp_path, supervised):
    proc, out = supervised("forkfail")
    pids = wait_for(lambda: _both_running(out), "both to run once fork works again")
    assert len(set(pids)) == 2
    log = (tmp_path / "stderr.log").read_text()
    assert "cannot start worker 0: Resource temporarily unavailable; trying again in 0.4 s" in log
    assert "cannot start worker 1: Resource temporarily unavailable; trying again in 0.4 s" in log
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0


def test_a_worker_is_starting_until_it_says_it_serves(tmp_path, supervised):
    proc, out = supervised("slow")
    status = wait_for(lambda: (_status_of(out) or {"workers": [{}]})["workers"][0].get("state") == "running"
                      and _status_of(out), "worker 0 to serve")
    assert status["workers"][1]["state"] == "starting" and status["workers"][1]["pid"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0
