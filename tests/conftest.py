"""Shared fixtures: a fake upstream LLM server and ragproxy in front of it.

Both run in-process on real sockets (port 0), so the wire is real while the
tests stay fast.  RAGPROXY_PURE=1 in the environment runs everything on the
stdlib fallbacks.  RAGPROXY_CHECK_SHARED=1 is set for every App the tests
make, in this process or a child: a request that edits a parsed value the
proxy shares between bodies (jsonbody.ParseMemo) fails where it happens.
"""
import contextlib
import http.client
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# HERE first (fake_upstream); ROOT last, so a ragproxy.py in the working
# directory (``cd build && python -m pytest ../tests``) wins over the checkout's.
if HERE not in sys.path:
    sys.path.insert(0, HERE)
if ROOT not in sys.path:
    sys.path.append(ROOT)
os.environ["RAGPROXY_CHECK_SHARED"] = "1"

import ragproxy  # noqa: E402
from _ragproxy import deps, http1  # noqa: E402
from _ragproxy.chroma import ChromaClient, ChromaError  # noqa: E402
from fake_upstream import FakeUpstream  # noqa: E402

API_KEY = "rp-test-key-0001"
SCRIPT = os.path.join(ROOT, "ragproxy.py")


def wait_for(condition, what, procs=(), timeout=60.0):
    """condition()'s first truthy value, polled until ``timeout`` s; else fail with the processes' logs."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {p.name} (exit {p.p.poll()}):\n{p.log()[-4000:]}" for p in procs)
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{logs}")
        time.sleep(0.05)


def at_once(work, count=4):
    """work() in ``count`` threads released together (as processes starting at once): their results,
    or the exceptions they raised, in no particular order."""
    barrier = threading.Barrier(count)
    out = []

    def run():
        barrier.wait()
        try:
            out.append(work())
        except Exception as exc:   # the caller says which are wrong
            out.append(exc)

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return out


class ServeProcess:
    """One ``python ragproxy.py --data-dir D --port 0 ARGS`` process, as a user starts it, with
    D/config/config.yaml; its log goes to D/stderr.log (a pipe could fill up)."""

    def __init__(self, name, data_dir, config, args=(), secret_key="serve-process-panel-key-01"):
        self.name = name
        (data_dir / "config").mkdir(parents=True)
        (data_dir / "config" / "config.yaml").write_text(config)
        self.data_dir = data_dir
        self.secret_key = secret_key
        self.log_path = data_dir / "stderr.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAGPROXY_")}
        if os.environ.get("RAGPROXY_PURE"):
            env["RAGPROXY_PURE"] = os.environ["RAGPROXY_PURE"]
        env["RAGPROXY_SECRET_KEY"] = secret_key
        with open(str(self.log_path), "wb") as log:
            # A session of its own: a kill takes serve --workers's workers with it.
            self.p = subprocess.Popen([sys.executable, SCRIPT, "--data-dir", str(data_dir), "--port", "0", *args],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, env=env,
                                      start_new_session=True)
        self.url = None
        self.url = wait_for(self._listening, f"{name} to listen", [self], timeout=30)

    def _listening(self):
        if self.p.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.p.returncode}:\n{self.log()}")
        m = re.search(r"listening on (http://\S+)", self.log())
        return m.group(1) if m else None

    def log(self):
        with open(str(self.log_path), encoding="utf-8", errors="replace") as f:
            return f.read()

    def request(self, path, body=None, token=None, method=None, headers=None):
        """(status, headers, JSON body or text) of one request on a new connection."""
        sent = {"Authorization": "Bearer " + (token or API_KEY), "Content-Type": "application/json",
                **(headers or {})}
        req = urllib.request.Request(self.url + path, data=None if body is None else json.dumps(body).encode(),
                                     headers=sent, method=method or ("GET" if body is None else "POST"))
        try:
            with urllib.request.urlopen(req, timeout=15) as resp:
                data = resp.read()
                kind = resp.headers.get("Content-Type", "")
                return resp.status, resp.headers, json.loads(data) if "json" in kind else data.decode()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read().decode("utf-8", "replace")

    def kill(self):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.p.pid, signal.SIGKILL)
        self.p.wait(10)

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                return self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.p.returncode


class ManualClock:
    """An injectable clock that moves only when told: ``clock()`` is now, ``clock.advance(s)`` moves it."""

    def __init__(self, now=1_000_000.0):
        self.now = now

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds
TLS_DIR = os.path.join(HERE, "data", "tls")  # test-only certificates; data/tls/make.sh made them


def logged_rows(app, count, timeout=5.0):
    """The request log's rows once it holds at least ``count`` (or the timeout passes).

    A proxied call is logged just after its answer is sent, so a client can
    hold the answer a moment before the entry exists.
    """
    deadline = time.monotonic() + timeout
    while True:
        assert app.request_log.flush()
        rows = app.request_log.query()
        if len(rows) >= count or time.monotonic() > deadline:
            return rows
        time.sleep(0.01)


def multipart_body(files, boundary="----ragproxyTestBoundary7MA4YWxkTrZu0gW"):
    """A multipart/form-data body as a browser's FormData sends it, and its Content-Type: [(filename, bytes)]."""
    out = []
    for name, data in files:
        out.append(f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="{name}"\r\n'
                   "Content-Type: application/octet-stream\r\n\r\n".encode() + data + b"\r\n")
    out.append(f"--{boundary}--\r\n".encode())
    return b"".join(out), f"multipart/form-data; boundary={boundary}"


def send_slowly(sock, data):
    """Send one byte per segment, so the receiver never has a whole head buffered."""
    try:
        for i in range(len(data)):
            sock.sendall(data[i:i + 1])
            time.sleep(0.0002)
    except (BrokenPipeError, ConnectionResetError):
        pass  # refused before the end: the answer is waiting to be read


@pytest.fixture(scope="session", autouse=True)
def _pyz_cache(tmp_path_factory):
    """A .pyz that a test runs extracts itself into a temporary cache, never the user's ~/.cache."""
    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    if saved is None:
        del os.environ["XDG_CACHE_HOME"]
    else:
        os.environ["XDG_CACHE_HOME"] = saved


@pytest.fixture(scope="session")
def pyz(tmp_path_factory):
    """dist/ragproxy.pyz as tools/build_pyz.py builds it, into a temporary directory, once per run."""
    out = tmp_path_factory.mktemp("dist") / "ragproxy.pyz"
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "build_pyz.py"), "--out", str(out)],
                   check=True, stdout=subprocess.PIPE)
    return str(out)


@pytest.fixture
def fake():
    with FakeUpstream() as upstream:
        yield upstream
        assert upstream.errors == [], "the fake upstream itself failed"


def tls_upstream(ask_client_certificate=False):
    """Run the fake upstream over https with a certificate for 127.0.0.1 from the test CA
    (ca.pem); with ``ask_client_certificate`` it refuses clients without one from that CA."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(os.path.join(TLS_DIR, "server.pem"), os.path.join(TLS_DIR, "server.key"))
    if ask_client_certificate:
        context.load_verify_locations(os.path.join(TLS_DIR, "ca.pem"))
        context.verify_mode = ssl.CERT_REQUIRED
    with FakeUpstream(tls=context) as upstream:
        yield upstream
        assert upstream.errors == [], "the fake upstream itself failed"


@pytest.fixture
def gateway():
    """The fake upstream over https (see tls_upstream)."""
    yield from tls_upstream()


def proxy_config(fake_url, extra="", auth=True, server="  client_timeout: 5"):
    """A config with one provider of each type, all served by the fake upstream."""
    return f"""
server:
{server}
api_key_auth: {'true' if auth else 'false'}
api_keys: [{API_KEY}]
providers:
  llm:
    oa: {{type: openai, base_url: "{fake_url}/v1", api_key: upstream-openai-key, read_timeout: 5}}
    an: {{type: anthropic, base_url: "{fake_url}", api_key: upstream-anthropic-key, read_timeout: 5}}
    ol: {{type: ollama, base_url: "{fake_url}", read_timeout: 5}}
models:
  - {{name: "claude-*", upstream: an}}
  - {{name: "gpt-renamed", upstream: oa, upstream_model: real-model-name}}
  - {{name: "gpt-*", upstream: oa}}
  - {{name: "via-openai", upstream: oa}}
  - {{name: "*", upstream: [ol, oa]}}
{extra}
"""


class RunningProxy:
    def __init__(self, app, server):
        self.app, self.server = app, server
        self.port = server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.app.close()


@pytest.fixture
def _running():
    """Starts apps on port 0 and closes them after the test: ``_running(app) -> RunningProxy``."""
    proxies = []

    def run(app):
        proxies.append(RunningProxy(app, ragproxy.make_server(app, "127.0.0.1", 0)))
        return proxies[-1]

    yield run
    for proxy in proxies:
        proxy.close()


@pytest.fixture
def make_proxy(fake, _running):
    """make_proxy(config_text=None, data_dir=None, **proxy_config_kwargs) -> RunningProxy on port 0.

    With a data_dir the app has its knowledge bases; tests index them explicitly
    (app.knowledge_bases.index_all()) instead of starting the background indexer.
    """
    def start(config_text=None, data_dir=None, **kwargs):
        config = ragproxy.Config.from_text(config_text or proxy_config(fake.url, **kwargs))
        return _running(ragproxy.App(config, data_dir=None if data_dir is None else str(data_dir)))

    return start


@pytest.fixture
def proxy(make_proxy):
    return make_proxy()


@pytest.fixture
def openai_client(proxy):
    return openai_for(proxy)


def openai_for(proxy):
    """The official OpenAI SDK pointed at a running proxy, with the test key and no retries."""
    import openai
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key=API_KEY, max_retries=0, timeout=10)


@pytest.fixture
def anthropic_client(proxy):
    import anthropic
    return anthropic.Anthropic(base_url=proxy.url, api_key=API_KEY, max_retries=0, timeout=10)


ADMIN_KEY = "panel-secret-key-0001"


class AdminClient:
    """A minimal JSON client for /admin/api/ (http.client: the wire as a browser sends it)."""

    def __init__(self, url, token=None):
        self.host, self.port = url.split("//", 1)[1].split(":")
        self.token = token

    def request(self, method, path, body=None, headers=None, raw=None):
        import http.client
        import json
        conn = http.client.HTTPConnection(self.host, int(self.port), timeout=30)
        hdrs = dict(headers or {})
        if self.token and "Authorization" not in hdrs:
            hdrs["Authorization"] = "Bearer " + self.token
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        try:
            conn.request(method, path, body=data, headers=hdrs)
            resp = conn.getresponse()
            payload = resp.read()
        finally:
            conn.close()
        ctype = resp.getheader("Content-Type", "")
        parsed = json.loads(payload) if ctype.startswith("application/json") and payload else payload
        return resp.status, resp, parsed

    def login(self, key=ADMIN_KEY):
        status, _, body = self.request("POST", "/admin/api/login", {"key": key})
        assert status == 200, body
        self.token = body["token"]
        return self

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, body=None, **kw):
        return self.request("POST", path, body, **kw)

    def put(self, path, body=None, **kw):
        return self.request("PUT", path, body, **kw)

    def delete(self, path, **kw):
        return self.request("DELETE", path, **kw)


@pytest.fixture
def make_admin_proxy(fake, tmp_path, _running):
    """make_admin_proxy(config_text=None, **proxy_config_kwargs) -> RunningProxy with the admin API.

    Like ``ragproxy serve``: the config lives in DATA_DIR/config/config.yaml,
    the panel key is ADMIN_KEY and the background indexer runs.  Extra
    attributes: data_dir (pathlib), config_path, admin_key, admin() -> a
    logged-in AdminClient.
    """
    started = []

    def start(config_text=None, **kwargs):
        data_dir = tmp_path / f"data{len(started)}"
        (data_dir / "config").mkdir(parents=True)
        config_path = data_dir / "config" / "config.yaml"
        config_path.write_text(config_text or proxy_config(fake.url, **kwargs))
        config_file = ragproxy.ConfigFile(str(config_path), environ={})
        app = ragproxy.App(config_file.load(), data_dir=str(data_dir))
        app.admin = ragproxy.Admin(app, ADMIN_KEY, config_file)
        app.knowledge_bases.start()
        proxy = _running(app)
        proxy.data_dir, proxy.config_path, proxy.admin_key = data_dir, config_path, ADMIN_KEY
        proxy.admin = lambda: AdminClient(proxy.url).login()
        started.append(proxy)
        return proxy

    return start


@pytest.fixture
def admin_proxy(make_admin_proxy):
    return make_admin_proxy()


@pytest.fixture(params=["kernel", "python"])
def timeouts(request, monkeypatch):
    """Run a test with socket timeouts kept by the kernel (Linux) and by Python (elsewhere)."""
    if request.param == "kernel" and not http1.KERNEL_TIMEOUTS:
        pytest.skip("kernel socket timeouts are used on Linux only")
    monkeypatch.setattr(http1, "KERNEL_TIMEOUTS", request.param == "kernel")
    return request.param


# --- dense vectors (test_dense, test_store) -------------------------------------

@pytest.fixture(params=["numpy", "pure"])
def mode(request, monkeypatch):
    """Run a test with ragproxy's numpy path and with its stdlib fallback.

    The switch is ``deps.np``; it reaches every module only because none keeps
    numpy in its own namespace, which is checked here for every module loaded.
    """
    if request.param == "numpy":
        if deps.np is None:
            pytest.skip("numpy disabled (RAGPROXY_PURE=1 or not installed)")
    else:
        monkeypatch.setattr(deps, "np", None)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        kept = [f"{name}.{attr}" for name, module in list(sys.modules.items()) if name.startswith("_ragproxy")
                for attr, value in vars(module).items() if value is numpy and (name, attr) != ("_ragproxy.deps", "np")]
        assert not kept, f"numpy is kept outside deps, so the pure switch misses it: {kept}"
    return request.param


def random_rows(n, dim, seed=0):
    rng = random.Random(seed)
    return [[rng.gauss(0.0, 1.0) for _ in range(dim)] for _ in range(n)]


def unit(row):
    norm = math.sqrt(sum(x * x for x in row))
    return [x / norm for x in row]


def brute_force(rows, query, k):
    q = unit(query)
    scored = [(sum(a * b for a, b in zip(unit(r), q)), i) for i, r in enumerate(rows)]
    scored.sort(key=lambda t: (-t[0], t[1]))
    return scored[:k]


# --- a real Chroma server (issue 16: tests/test_chroma.py, the Chroma store) ----

class ChromaServer:
    """A running Chroma server: ``url`` (http://127.0.0.1:PORT) and ``path``, its data directory
    (None for a server given by $RAGPROXY_CHROMA_URL, whose directory is not ours)."""

    def __init__(self, url, path=None, log=None):
        self.url = url
        self.path = path
        self.log = log

    def log_tail(self, lines=30):
        """The end of the server's output, for a failure message."""
        if not self.log or not os.path.exists(self.log):
            return ""
        with open(self.log, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])


def chroma_client(server, **kwargs):
    """A ChromaClient for ``server`` (the chroma_server fixture); the timeout allows for a loaded machine."""
    kwargs.setdefault("timeout", 30.0)
    return ChromaClient(server.url, **kwargs)


def _chroma_missing(why):
    """Skip, or fail when CI says the tests must have a Chroma server (RAGPROXY_REQUIRE_CHROMA=1)."""
    if os.environ.get("RAGPROXY_REQUIRE_CHROMA", "") not in ("", "0"):
        pytest.fail(f"{why}; RAGPROXY_REQUIRE_CHROMA=1 says the Chroma tests must run", pytrace=False)
    pytest.skip(why)


def chroma_binary():
    """The `chroma` command: $RAGPROXY_CHROMA_BIN, else the one beside this Python (the chromadb that
    requirements-test.txt installs), else the first on PATH; None when there is none."""
    explicit = os.environ.get("RAGPROXY_CHROMA_BIN", "")
    if explicit:
        return explicit
    beside = os.path.join(os.path.dirname(sys.executable), "chroma")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    return shutil.which("chroma")


def _chroma_answers(url, timeout=2.0):
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    try:
        conn.request("GET", parts.path.rstrip("/") + "/api/v2/heartbeat")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_chroma(binary, path, log, startup=120.0):
    """(process, url) of `chroma run` on a free port, once its heartbeat answers; (None, reason) if not."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, ANONYMIZED_TELEMETRY="False")  # a test run reports nothing to anyone
    with open(log, "ab") as out:
        proc = subprocess.Popen([binary, "run", "--path", path, "--host", "127.0.0.1", "--port", str(port)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + startup
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return None, f"`{binary} run` exited with status {proc.returncode}"
        if _chroma_answers(url):
            return proc, url
        time.sleep(0.1)
    _stop(proc)
    return None, f"`{binary} run` did not answer /api/v2/heartbeat within {startup:g}s"


def _stop(proc):
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def chroma_server(tmp_path_factory):
    """A Chroma server for the whole run: $RAGPROXY_CHROMA_URL if set, else `chroma run` started here
    (chroma_binary()) on a free port with a fresh data directory, stopped at the end of the session.

    None to be had: a skip, or a failure when RAGPROXY_REQUIRE_CHROMA=1 (CI).  A `chroma` that is found
    but does not start is a failure either way: a broken install should be seen, not skipped over.
    """
    url = os.environ.get("RAGPROXY_CHROMA_URL", "").rstrip("/")
    if url:
        if not _chroma_answers(url, timeout=10.0):
            _chroma_missing("no Chroma server answers at $RAGPROXY_CHROMA_URL")
        yield ChromaServer(url)
        return
    binary = chroma_binary()
    if not binary:
        _chroma_missing("no `chroma` command ($RAGPROXY_CHROMA_BIN, beside sys.executable or on PATH):"
                        " pip install -r requirements-test.txt")
    root = tmp_path_factory.mktemp("chroma")
    log = str(root / "chroma.log")
    for _attempt in range(3):  # the free port can be taken before the server binds it
        proc, url = _start_chroma(binary, str(root / "data"), log)
        if proc is not None:
            break
    if proc is None:
        pytest.fail(f"{url}; its output ends:\n{ChromaServer(None, log=log).log_tail()}", pytrace=False)
    try:
        yield ChromaServer(url, str(root / "data"), log)
    finally:
        _stop(proc)


@pytest.fixture
def chroma_prefix(chroma_server):
    """A collection prefix of this test's own, so tests share one server without meeting; the test's
    collections are deleted after it."""
    prefix = f"t{uuid.uuid4().hex[:12]}_"
    yield prefix
    client = chroma_client(chroma_server)
    try:
        for col in client.list_collections():
            if col["name"].startswith(prefix):
                client.delete_collection(col["name"])
    except ChromaError:
        pass  # a test that stopped the server or broke it has said so itself
    finally:
        client.close()


# --- a real redis-server (issue 18: summary_buffer's shared session state) ------

def _redis_missing(why):
    """Skip, or fail when CI says the Redis tests must run (RAGPROXY_REQUIRE_REDIS=1)."""
    if os.environ.get("RAGPROXY_REQUIRE_REDIS", "") not in ("", "0"):
        pytest.fail(f"{why}; RAGPROXY_REQUIRE_REDIS=1 says the Redis tests must run", pytrace=False)
    pytest.skip(why)


def _redis_pings(port, password=None, timeout=1.0):
    """True when a RESP PING (after AUTH, if given) on 127.0.0.1:port answers +PONG."""
    def command(*args):
        return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            out = (command(b"AUTH", password.encode()) if password else b"") + command(b"PING")
            s.sendall(out)
            data = b""
            while b"PONG" not in data and not data.startswith(b"-") and len(data) < 4096:
                piece = s.recv(4096)
                if not piece:
                    break
                data += piece
            return b"+PONG" in data
    except OSError:
        return False


class RedisServer:
    """A redis-server of this test run on 127.0.0.1: ``url`` (redis://[:password@]127.0.0.1:PORT/0),
    ``port``, ``password``.  ``kill()`` stops it hard (SIGKILL, as a crash); ``start()`` starts it again
    on the same port, empty (no persistence: --save '' --appendonly no).  ``another(password=...)``
    starts a second, separate server, stopped at the end of the session."""

    def __init__(self, binary, root, password=None, startup=30.0):
        self.binary, self.root, self.password, self.startup = binary, root, password, startup
        self.port = None
        self.proc = None
        self.log = os.path.join(root, "redis.log")
        self._others = []

    @property
    def url(self):
        auth = f":{urllib.parse.quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, attempts=3):
        last = "not started"
        for _attempt in range(1 if self.port else attempts):  # a fresh free port can be taken before we bind
            port = self.port or _free_port()
            args = [self.binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                    "--dir", self.root, "--protected-mode", "no"]
            if self.password:
                args += ["--requirepass", self.password]
            with open(self.log, "ab") as out:
                proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + self.startup
            while time.monotonic() < deadline and proc.poll() is None:
                if _redis_pings(port, self.password):
                    self.proc, self.port = proc, port
                    return self
                time.sleep(0.05)
            last = (f"redis-server exited with status {proc.returncode}" if proc.poll() is not None
                    else f"redis-server did not answer PING within {self.startup:g}s")
            _stop(proc)
        pytest.fail(f"{last}; its output ends:\n{self.log_tail()}", pytrace=False)

    def kill(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def stop(self):
        for other in self._others:
            other.stop()
        if self.proc is not None:
            _stop(self.proc)
            self.proc = None

    def another(self, password=None):
        root = os.path.join(self.root, f"other{len(self._others)}")
        os.makedirs(root)
        other = RedisServer(self.binary, root, password, self.startup)
        self._others.append(other)
        return other.start()

    def log_tail(self, lines=30):
        if not os.path.exists(self.log):
            return ""
        with open(self.log, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """A redis-server for the whole run (the Debian package's binary, or $RAGPROXY_REDIS_BIN) on a free port
    with its own directory, stopped at the end of the session.  Tests share it: each uses keys of its own;
    a test that kills it starts it again.  None on PATH: a skip, or a failure when RAGPROXY_REQUIRE_REDIS=1
    (CI); one that is found but does not start is a failure either way."""
    binary = os.environ.get("RAGPROXY_REDIS_BIN", "") or shutil.which("redis-server")
    if not binary:
        _redis_missing("no `redis-server` on PATH ($RAGPROXY_REDIS_BIN): apt-get install redis-server")
    server = RedisServer(binary, str(tmp_path_factory.mktemp("redis")))
    server.start()
    try:
        yield server
    finally:
        server.stop()
